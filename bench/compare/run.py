#!/usr/bin/env python3
"""metrale vs llama.cpp vs HF transformers on the CPU, side by side, in one command.

    python3 bench/compare/run.py --model-shape qwen3-0.6b [--threads 1,2] [--reps 5] \
        [--out out/compare]

Builds whatever is missing (metrale's release build, llama.cpp's bench tools from the
llama-cpp-python sdist, the random-weight checkpoint, its GGUF), then runs the engines in
interleaved rounds — in each round, for each thread count: bandwidth probe, then every engine
once (starting engine rotated per round) — so slow phases of a noisy VM hit all engines alike.
Each engine run is a fresh process printing one JSON object; its peak RSS is taken from
wait4() (max over the process and the children it waited for). Medians over rounds go to
<out>/table.md, results.json (every sample too) and chart.png. See docs/performance.md.
"""

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import statistics
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import llama_cpp_peer  # noqa: E402
import make_random_checkpoint  # noqa: E402
import report  # noqa: E402

RELEASE = REPO / "build" / "release"


def log(msg: str) -> None:
    print(f"[compare] {msg}", file=sys.stderr, flush=True)


def int_list(text: str) -> list[int]:
    return llama_cpp_peer.int_list(text)


def run_json(cmd: list[str], timeout: float, measure_rss: bool = False) -> tuple[dict | None, int, str]:
    """Runs cmd (under with_rss() if measure_rss); returns (the last stdout line that is a
    JSON object, or None; peak RSS bytes or 0; error text)."""
    log("$ " + shlex.join(cmd))
    if measure_rss:
        cmd = with_rss(cmd)
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return None, 0, f"timed out after {timeout:.0f} s"
    # Peak RSS arrives as a marker line from the with_rss() wrapper.
    rss = 0
    marker = "METRALE_COMPARE_MAXRSS_KB="
    lines = []
    for line in stderr.splitlines():
        if line.startswith(marker):
            rss = int(line[len(marker):]) * 1024
        else:
            lines.append(line)
    if proc.returncode != 0:
        tail = "\n".join(lines[-15:])
        return None, rss, f"exit status {proc.returncode} after {time.monotonic() - start:.0f} s:\n{tail}"
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line), rss, ""
            except json.JSONDecodeError as e:
                return None, rss, f"unparseable JSON ({e}): {line[:200]}"
    return None, rss, f"no JSON object on stdout: {stdout[-400:]!r}"


def with_rss(cmd: list[str]) -> list[str]:
    """Wraps cmd so the peak RSS of it and its descendants is printed on stderr: wait4()'s
    ru_maxrss of the direct child covers the waited-for grandchildren on Linux."""
    code = ("import os,subprocess,sys,resource\n"
            "p=subprocess.Popen(sys.argv[1:])\n"
            "_,st,ru=os.wait4(p.pid,0)\n"
            "print('METRALE_COMPARE_MAXRSS_KB=%d'%ru.ru_maxrss,file=sys.stderr)\n"
            "sys.exit(os.waitstatus_to_exitcode(st))\n")
    return [sys.executable, "-c", code, *cmd]


def build_release(targets: list[str]) -> bool:
    """cmake --preset release, then the given targets; False (with the reason logged) if not."""
    if shutil.which("cmake") is None:
        log("cmake not found")
        return False
    if not (RELEASE / "build.ninja").is_file():
        r = subprocess.run(["cmake", "--preset", "release"], cwd=REPO, stdout=sys.stderr)
        if r.returncode != 0:
            log("cmake --preset release failed")
            return False
    r = subprocess.run(["cmake", "--build", str(RELEASE), "--target", *targets, "-j2"],
                       cwd=REPO, stdout=sys.stderr)
    if r.returncode != 0:
        log(f"building {targets} failed")
        return False
    return True


def ensure_probe(cache: Path) -> Path:
    """The release build's bandwidth_probe if it is up to date, else one compiled directly
    (it is a single self-contained file), so the peers can run without a metrale build."""
    src = REPO / "bench" / "bandwidth_probe.cc"
    probe = RELEASE / "bench" / "bandwidth_probe"
    if probe.is_file() and probe.stat().st_mtime >= src.stat().st_mtime:
        return probe
    fallback = cache / "bandwidth_probe"
    if not fallback.is_file() or fallback.stat().st_mtime < src.stat().st_mtime:
        log(f"building {fallback} directly from {src}")
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(["c++", "-std=c++20", "-O2", "-pthread", str(src), "-o", str(fallback)],
                       check=True)
    return fallback


def ensure_metrale(binary: Path) -> Path | None:
    """Returns the metrale binary if it exists and has a `bench` command, else None (logged)."""
    if not binary.is_file():
        log(f"metrale skipped: {binary} not found (build it with `cmake --preset release && "
            f"cmake --build build/release --target metrale`)")
        return None
    r = subprocess.run([str(binary), "bench", "--help"], capture_output=True, text=True)
    if r.returncode != 0 or "--json" not in r.stdout:
        log(f"metrale skipped: `{binary} bench --help` failed or lacks --json "
            f"(status {r.returncode}): {(r.stderr or r.stdout)[-300:]}")
        return None
    return binary


def checkpoint_weight_bytes(model_dir: Path) -> int:
    """Bytes of weights one decode step reads: every tensor, except that an untied input
    embedding is only gathered (a few rows), not streamed."""
    import struct
    config = json.loads((model_dir / "config.json").read_text())
    tied = config.get("tie_word_embeddings", False)
    total = 0
    for f in sorted(model_dir.glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            size = meta["data_offsets"][1] - meta["data_offsets"][0]
            if name.endswith("embed_tokens.weight") and not tied:
                continue
            total += size
    return total


def lscpu_summary() -> dict:
    out = {}
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except FileNotFoundError:
        return out
    keep = ("Model name", "CPU(s)", "Thread(s) per core", "L2 cache", "L3 cache", "Flags")
    for line in text.splitlines():
        k, _, v = line.partition(":")
        if k.strip() in keep:
            v = v.strip()
            if k.strip() == "Flags":
                v = " ".join(f for f in v.split() if f.startswith(("avx", "amx", "fma")))
            out[k.strip()] = v
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model-shape", choices=sorted(make_random_checkpoint.SHAPES),
                     help="random-weight checkpoint with this model's shapes (made on demand)")
    src.add_argument("--model", type=Path, help="an existing HF checkpoint directory (bf16)")
    ap.add_argument("--threads", type=int_list, default=[1, 2])
    ap.add_argument("--reps", type=int, default=5, help="interleaved rounds (medians reported)")
    ap.add_argument("--out", type=Path, default=REPO / "out" / "compare")
    ap.add_argument("--engines", default="metrale,llama.cpp,hf",
                    help="comma-separated subset of metrale,llama.cpp,hf")
    ap.add_argument("--prefill", type=int_list, default=[128, 512])
    ap.add_argument("--batch", type=int_list, default=[1, 4, 16])
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--hf-decode-tokens", type=int, default=None,
                    help="decode steps for HF (default: --decode-tokens); fewer shorten a round "
                         "when torch is slow, without changing its per-step cost")
    ap.add_argument("--llama-outtype", choices=["bf16", "q8_0"], default="bf16",
                    help="GGUF precision for llama.cpp (q8_0 beside metrale's 8-bit path)")
    ap.add_argument("--metrale-bin", type=Path, default=RELEASE / "src" / "metrale")
    ap.add_argument("--metrale-args", default="",
                    help="extra flags for `metrale bench` (split on spaces); write it with '=': "
                         "--metrale-args='--compute bf16'")
    ap.add_argument("--cache-dir", type=Path, default=llama_cpp_peer.DEFAULT_CACHE)
    ap.add_argument("--no-build", action="store_true", help="never build; use what exists")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per engine run")
    args = ap.parse_args()

    engines = [e for e in args.engines.split(",") if e]
    unknown = sorted(set(engines) - set(report.ENGINES))
    if unknown or not engines:
        sys.exit(f"--engines: unknown {unknown}; expected a subset of {list(report.ENGINES)}")
    if args.reps < 1:
        sys.exit("--reps: expected >= 1")
    build = not args.no_build

    # --- prepare everything before the first timed run ---
    if args.model_shape:
        model_dir = make_random_checkpoint.ensure(args.model_shape,
                                                  args.cache_dir / "checkpoints")
    else:
        model_dir = args.model.resolve()
        if not (model_dir / "config.json").is_file():
            sys.exit(f"--model: {model_dir}/config.json not found")
    metrale = None
    if "metrale" in engines:
        if build and args.metrale_bin == RELEASE / "src" / "metrale":
            # Incremental: a no-op when up to date, a rebuild when the sources moved on.
            build_release(["metrale", "bandwidth_probe"])
        metrale = ensure_metrale(args.metrale_bin)
        if metrale is None:
            engines.remove("metrale")
            log("continuing with the peers only")
    probe = ensure_probe(args.cache_dir)
    gguf = None
    if "llama.cpp" in engines:
        lsrc = llama_cpp_peer.ensure_source(args.cache_dir)
        llama_cpp_peer.ensure_build(args.cache_dir, lsrc)
        gguf = llama_cpp_peer.ensure_gguf(args.cache_dir, lsrc, model_dir, args.llama_outtype)
    if not engines:
        sys.exit("no engine left to run")

    prefill = ",".join(map(str, args.prefill))
    batch = ",".join(map(str, args.batch))
    hf_steps = args.hf_decode_tokens or args.decode_tokens

    def command(engine: str, threads: int) -> list[str]:
        if engine == "metrale":
            return [str(metrale), "bench", "--model", str(model_dir), "--threads", str(threads),
                    "--prefill", prefill, "--batch", batch, "--decode-tokens",
                    str(args.decode_tokens), "--reps", "1", "--json", "--no-bandwidth",
                    *args.metrale_args.split()]  # the round's probe measures bandwidth
        if engine == "llama.cpp":
            return [sys.executable, str(REPO / "tools/bench/llama_cpp_peer.py"), "--model",
                    str(model_dir), "--threads", str(threads), "--prefill", prefill, "--batch",
                    batch, "--decode-tokens", str(args.decode_tokens), "--outtype",
                    args.llama_outtype, "--cache-dir", str(args.cache_dir), "--json"]
        return [sys.executable, str(REPO / "tools/bench/hf_peer.py"), "--model", str(model_dir),
                "--threads", str(threads), "--prefill", prefill, "--batch", batch,
                "--decode-tokens", str(hf_steps), "--reps", "1", "--json"]

    results = {
        "config": {"model": args.model_shape or str(model_dir), "model_dir": str(model_dir),
                   "precision": f"bf16 (llama.cpp GGUF {args.llama_outtype})",
                   "llama_outtype": args.llama_outtype, "threads": args.threads,
                   "reps": args.reps, "prefill": args.prefill, "batch": args.batch,
                   "decode_tokens": args.decode_tokens, "hf_decode_tokens": hf_steps,
                   "engines": engines, "gguf": str(gguf) if gguf else None,
                   "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                   "loadavg_start": os.getloadavg()},
        "machine": lscpu_summary(),
        "weight_bytes": {"bf16": checkpoint_weight_bytes(model_dir)},
        "bandwidth_samples": {str(t): [] for t in args.threads},
        "samples": {str(t): {e: [] for e in engines} for t in args.threads},
        "failures": [],
    }
    if gguf and args.llama_outtype != "bf16":
        results["weight_bytes"]["llama.cpp"] = gguf.stat().st_size

    # --- interleaved rounds ---
    for rnd in range(args.reps):
        for threads in args.threads:
            t = str(threads)
            bw, _, err = run_json([str(probe), "--threads", t, "--reps", "5", "--json"], 600)
            if bw:
                results["bandwidth_samples"][t].append(bw["threads"][t]["median_gbs"])
            else:
                results["failures"].append({"round": rnd, "threads": threads,
                                            "engine": "bandwidth_probe", "error": err})
            order = engines[rnd % len(engines):] + engines[:rnd % len(engines)]
            for engine in order:
                log(f"round {rnd + 1}/{args.reps}, {threads} thread(s): {engine}")
                out, rss, err = run_json(command(engine, threads), args.timeout, measure_rss=True)
                if out is None:
                    log(f"{engine} failed: {err}")
                    results["failures"].append({"round": rnd, "threads": threads,
                                                "engine": engine, "error": err})
                    continue
                out["peak_rss_bytes"] = rss or out.get("peak_rss_bytes")
                results["samples"][t][engine].append(out)
    results["config"]["loadavg_end"] = os.getloadavg()
    results["bandwidth"] = {
        t: {"median_gbs": statistics.median(v), "samples_gbs": v} if v else {}
        for t, v in results["bandwidth_samples"].items()}
    md = report.write(results, args.out)
    print(md)
    if results["failures"]:
        log(f"{len(results['failures'])} run(s) failed; see failures in {args.out}/results.json")
    log(f"wrote {args.out}/table.md, results.json, chart.png")


if __name__ == "__main__":
    main()
