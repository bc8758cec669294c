"""What bench/compare/run.py needs from Python and Debian, checked before it does any work.

    python3 tools/bench/prereqs.py [--engines metrale,llama.cpp,hf] [--no-install]

A run asks for the steps it will actually take (a cached checkpoint, GGUF or build needs
nothing), then `ensure()` either installs what is missing, printing each command before it
runs it, or (install=False, or where installing cannot work) stops naming the exact commands.
Python packages come from tools/bench/requirements.txt (pinned; only missing modules are
installed, nothing is upgraded); Debian packages through apt-get as scripts/bootstrap.sh does.
"""

import argparse
import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REQUIREMENTS = Path(__file__).resolve().parent / "requirements.txt"

# import name -> (PyPI name in requirements.txt, what needs it)
MODULES = {
    "numpy": ("numpy", "checkpoint writer, GGUF conversion"),
    "torch": ("torch", "dense random checkpoints, HF peer, GGUF conversion"),
    "transformers": ("transformers", "dense random checkpoints, HF peer, GGUF conversion"),
    "sentencepiece": ("sentencepiece", "GGUF conversion (llama.cpp's convert_hf_to_gguf.py)"),
    "yaml": ("pyyaml", "GGUF conversion (gguf-py)"),
    "tqdm": ("tqdm", "GGUF conversion (gguf-py)"),
    "requests": ("requests", "GGUF conversion (gguf-py)"),
    "matplotlib": ("matplotlib", "chart.png"),
    "pip": ("pip", "downloading the pinned llama-cpp-python sdist"),
    "jsonschema": ("jsonschema", "validating constrained replies (bench/compare/grammar_peer.py)"),
}
GGUF_CONVERSION = ["numpy", "torch", "transformers", "sentencepiece", "yaml", "tqdm", "requests"]
HF_PEER = ["torch", "transformers"]
CHART = ["matplotlib"]
# Debian packages by the command they provide (for the llama.cpp build and the probe).
BUILD_TOOLS = {"cmake": "cmake", "ninja": "ninja-build", "c++": "g++"}


def pinned() -> dict[str, str]:
    """PyPI name (lower case) -> the requirement line of requirements.txt."""
    out = {}
    for line in REQUIREMENTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name = line.split("=", 1)[0].split(">", 1)[0].split("<", 1)[0].strip().lower()
            out[name] = line
    return out


def missing_modules(modules: list[str]) -> list[str]:
    return [m for m in dict.fromkeys(modules) if importlib.util.find_spec(m) is None]


def missing_debian(packages: list[str]) -> list[str]:
    """The packages dpkg does not list as installed ([] off Debian, where it cannot tell)."""
    if not packages:
        return []
    if shutil.which("dpkg-query") is None:
        log(f"no dpkg-query (not Debian?): not checking for {' '.join(packages)}")
        return []
    out = []
    for pkg in dict.fromkeys(packages):
        r = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True,
                           text=True)
        if r.stdout.strip() != "install ok installed":
            out.append(pkg)
    return out


def metrale_debian_packages() -> list[str]:
    lines = (REPO / "scripts" / "debian-packages.txt").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def externally_managed() -> bool:
    """PEP 668: the system Python of Debian 12 refuses `pip install` outside a venv."""
    in_venv = sys.prefix != sys.base_prefix
    marker = Path(sysconfig.get_paths()["stdlib"]) / "EXTERNALLY-MANAGED"
    return not in_venv and marker.is_file()


def installed_versions() -> dict[str, str | None]:
    """Version of every package in requirements.txt (None when absent), for results.json."""
    from importlib import metadata
    out = {}
    for name in pinned():
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def log(msg: str) -> None:
    print(f"[prereqs] {msg}", file=sys.stderr, flush=True)


def ensure(modules: list[str], debian: list[str], install: bool = True) -> None:
    """Makes sure every module imports and every Debian package is installed; installs what is
    missing (printing the command first) or exits naming the exact commands to run."""
    req = pinned()
    mods = missing_modules(modules)
    debs = missing_debian(debian)
    if not mods and not debs:
        return
    python = shlex.quote(sys.executable)
    pip_args = [req.get(MODULES[m][0], MODULES[m][0]) for m in mods if m != "pip"]
    if "pip" in mods:
        debs = list(dict.fromkeys(debs + ["python3-pip"]))
    apt = ["apt-get", "install", "-y", "--no-install-recommends", *debs]
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    blockers = []
    if debs and sudo and shutil.which("sudo") is None:
        blockers.append("not root and no sudo for apt-get")
    if pip_args and externally_managed():
        blockers.append("this Python is externally managed (PEP 668): pip installs only into a "
                        "virtual environment")
    for m in mods:
        log(f"missing Python module {m!r} ({MODULES[m][1]})")
    for d in debs:
        log(f"missing Debian package {d!r}")
    if not install or blockers:
        lines = []
        if debs:
            lines.append(shlex.join(sudo + ["apt-get", "update"]))
            lines.append(shlex.join(sudo + apt))
        if pip_args and externally_managed():
            venv = "~/.venvs/metrale-bench"
            lines += [f"{shlex.join(sudo + ['apt-get', 'install', '-y', 'python3-venv'])}",
                      f"python3 -m venv {venv}",
                      f"{venv}/bin/pip install {shlex.join(pip_args)}",
                      f"# then run the benchmark with {venv}/bin/python instead of python3"]
        elif pip_args:
            lines.append(f"{python} -m pip install {shlex.join(pip_args)}")
        why = "; ".join(blockers) if blockers else "--no-install was given"
        sys.exit("bench prerequisites missing (" + why + "); nothing was done. Run:\n    " +
                 "\n    ".join(lines) + "\nor the same command without --no-install to let it "
                 "install them.")
    if debs:
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        for cmd in (sudo + ["apt-get", "update", "-qq"], sudo + apt):
            log("installing: " + shlex.join(cmd))
            subprocess.run(cmd, check=True, env=env, stdout=sys.stderr)
    if pip_args:
        cmd = [sys.executable, "-m", "pip", "install", *pip_args]
        log("installing: " + shlex.join(cmd))
        subprocess.run(cmd, check=True, stdout=sys.stderr)
        importlib.invalidate_caches()
    still = missing_modules(modules) + missing_debian(debian)
    if still:
        sys.exit(f"bench prerequisites still missing after installing: {still}")


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def venv_stamp(requirements: Path) -> dict:
    """What a venv made from `requirements` records (venv/metrale-venv.json): the lock's
    sha256 and the interpreter that made it; a venv whose stamp differs is made anew."""
    import hashlib
    return {"requirements": str(requirements.name),
            "requirements_sha256": hashlib.sha256(requirements.read_bytes()).hexdigest(),
            "base_python": sys.version.split()[0]}


def venv_ready(venv: Path, requirements: Path) -> bool:
    """Whether `venv` holds the lock: its stamp says so, or (a venv made by hand with
    venv_commands) `pip freeze` lists every pinned line, and then the stamp is written."""
    import json
    stamp = venv / "metrale-venv.json"
    if not venv_python(venv).is_file():
        return False
    if stamp.is_file() and json.loads(stamp.read_text()) == venv_stamp(requirements):
        return True
    r = subprocess.run([str(venv_python(venv)), "-m", "pip", "freeze"], capture_output=True,
                       text=True)
    have = {ln.strip().lower().replace("_", "-") for ln in r.stdout.splitlines()}
    want = {ln.split("#", 1)[0].strip().lower().replace("_", "-")
            for ln in requirements.read_text().splitlines()} - {""}
    if r.returncode != 0 or not want <= have:
        return False
    stamp.write_text(json.dumps(venv_stamp(requirements), indent=2))
    return True


def venv_commands(venv: Path, requirements: Path) -> list[list[str]]:
    """The commands that make `venv` from the lock file `requirements` (every package pinned)."""
    py = str(venv_python(venv))
    return [[sys.executable, "-m", "venv", "--clear", str(venv)],
            [py, "-m", "pip", "install", "--no-input", "-r", str(requirements)]]


def ensure_venv(venv: Path, requirements: Path, install: bool = True) -> Path:
    """A virtual environment holding exactly the pinned `requirements` (a full lock), made
    once (printing each command before it runs) and reused while its stamp matches; with
    install=False a missing one stops the run naming the commands. Returns its python."""
    import json
    if venv_ready(venv, requirements):
        return venv_python(venv)
    cmds = venv_commands(venv, requirements)
    if not install:
        sys.exit(f"bench prerequisites missing: the virtual environment {venv} (from "
                 f"{requirements}); nothing was done. Run:\n    " +
                 "\n    ".join(shlex.join(c) for c in cmds) +
                 "\nor the same command without --no-install to let it make the venv.")
    venv.parent.mkdir(parents=True, exist_ok=True)
    for cmd in cmds:
        log("installing: " + shlex.join(cmd))
        subprocess.run(cmd, check=True, stdout=sys.stderr)
    (venv / "metrale-venv.json").write_text(json.dumps(venv_stamp(requirements), indent=2))
    return venv_python(venv)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--engines", default="metrale,llama.cpp,hf")
    ap.add_argument("--no-install", action="store_true", help="only check; name what is missing")
    args = ap.parse_args()
    engines = args.engines.split(",")
    modules = CHART + (GGUF_CONVERSION + ["pip"] if "llama.cpp" in engines else []) + \
        (HF_PEER if "hf" in engines else [])
    debian = (metrale_debian_packages() if "metrale" in engines else []) + \
        (list(BUILD_TOOLS.values()) if "llama.cpp" in engines else [])
    ensure(modules, debian, install=not args.no_install)
    log("everything is there")


if __name__ == "__main__":
    main()
