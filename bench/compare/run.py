#!/usr/bin/env python3
"""metrale vs llama.cpp vs HF transformers on the CPU, side by side, in one command.

    python3 bench/compare/run.py --model-shape qwen3-0.6b [--threads 1,2] [--reps 5] \
        [--out out/compare]
    python3 bench/compare/run.py --model-shape qwen3-30b-a3b-L6 --engines metrale,llama.cpp
    python3 bench/compare/run.py --model-shape qwen3-next-L2 --engines metrale,llama.cpp \
        --prefill 128,512,2048 --batch 1,4,16
    python3 bench/compare/run.py --model-shape qwen3-0.6b --engines metrale,llama.cpp \
        --formats bf16,w4a16,w8a16,fp8,nvfp4 --llama-formats bf16,q4_0-bf16head,q8_0-bf16head,q4_0,q8_0
    python3 bench/compare/run.py --model-shape deepseek-v2-lite-L4 --engines metrale,llama.cpp \
        --prefill 128,512 --batch 1,4,16
    python3 bench/compare/run.py --model-shape qwen3-0.6b --engines metrale,llama.cpp \
        --threads 1,2 --batch 1 --prefill 1 --decode-tokens 32 --depth 4096 \
        --metrale-args='--kv-dtype bf16'
    python3 bench/compare/run.py --model-shape qwen3-0.6b --engines metrale,llama.cpp \
        --prepare-only          # make everything the run needs, time nothing

First checks what the run needs (Python modules from tools/bench/requirements.txt, Debian
packages) and installs what is missing, printing each command — or, with --no-install, stops
naming the exact commands before doing anything. Then builds whatever is missing (metrale's
release build, llama.cpp's bench tools from the pinned llama-cpp-python sdist, the
random-weight checkpoint, its GGUF), then runs the engines in
interleaved rounds — in each round, for each thread count: bandwidth probe, then every engine
once (starting engine rotated per round) — so slow phases of a noisy VM hit all engines alike.
Before the rounds, where metrale and llama.cpp both run, a greedy check: each decodes
--greedy-tokens (16) tokens by argmax after the same 8 prompt ids, on the same weights
(llama.cpp through tools/bench/llama_greedy.cpp, built against the pinned build's libraries),
and results.json records both id lists, llama.cpp's top-1 minus top-2 logit at each step and
the first step where they differ (--no-greedy skips it; a difference never fails the run).
The table also gets each engine's KV cache bytes per token (all layers): metrale bench's own
figure (its f32 pages; an MLA layer keeps the latent + rope key), llama.cpp's computed from
the GGUF as its llama_kv_cache sizes it (deepseek2: the latent + rope key as K in f16, no V),
and the greedy check records llama.cpp's own log line on the cache it allocated.

Decode at depth (--depth N): every timed decode step follows N tokens of context in each
sequence (`metrale bench --depth N`; llama.cpp: `llama-bench -p 0 -n T -d N` at batch 1, the
N-token prompt processed before its clock starts, and `llama-batched-bench -npp N` for wider
batches; hf: `--decode-prompt N`). Prefill stays from an empty cache in every engine (llama.cpp's
prefill tests run in a llama-bench call of their own, without -d). Without --depth decode
starts as before: after 16 tokens (metrale, llama-batched-bench, hf), from an empty cache
(llama-bench's tg). KV cache element types: llama.cpp's comes from --llama-kv-type (-ctk / -ctv
on every timing call; default f16, its own default), metrale's from --metrale-args
(`--kv-dtype f32|f16|bf16`; its default otherwise), hf keeps bf16 (the model's dtype); each
row's type is the table's KV column, from what the engine reported. At depth the roofline adds
the KV bytes a step reads (depth x batch x that row's KV bytes per token) to the weight bytes.
--prepare-only stops after preparing (prerequisites, checkpoint, llama.cpp build and tools,
GGUFs, adapters, probe, and metrale's release build unless --no-build) and times nothing.
Each engine run is a fresh process printing one JSON object; its peak RSS is taken from
wait4() (max over the process and the children it waited for). Medians over rounds go to
<out>/table.md, results.json (every sample too) and chart.png. See docs/performance.md.

Weight formats (bench/compare/formats.py): every row of the table is one engine on one format.
--formats picks metrale's: bf16 and/or w4a16, w8a16, fp8, nvfp4, ... (the same checkpoint
quantized by llm-compressor) or modelopt-fp8, modelopt-nvfp4 (by NVIDIA ModelOpt), made by
tools/bench/quantize_checkpoint.py with each producer in its own pinned venv under
--cache-dir (made through prereqs like everything else), loaded as the producer wrote it.
--llama-formats picks llama.cpp's: bf16, q4_0, q8_0 (the pinned llama-quantize of the bf16
GGUF), q4_0-pure, q4_0-bf16head / q8_0-bf16head (embedding / output head kept bf16, as the
llm-compressor checkpoints keep theirs), q8_0-convert. Each metrale row is compared with every
llama.cpp row of its weight bit width (4 or 8 or 16), and greedy-checked against the first;
with different quantizers a token difference is expected and reported as such. Each row's
roofline divides by the bytes a decode step reads from its own checkpoint or GGUF. A format
that fails to prepare or to run becomes a failed row; the others go on.

Many LoRA adapters per batch (--lora-mix 0,1,4,16, --lora-rank 16): --lora-count (the largest
mix) random rank-r PEFT adapters on every attention and MLP projection, made once into
<cache>/lora/<checkpoint>[-r<rank>]/lora-<i> by tools/bench/make_lora_adapters.py (seeded:
the same bytes every time), are given to every metrale row (`metrale bench --lora l<i>=DIR
... --lora-dtype bf16 --lora-mix ...`: decode at each --batch width with rows cycling through
the first N adapters, 0 = base-model rows through the adapter pool, beside the plain base
decode in the same process). llama.cpp serves one adapter for all rows: lora-0 converted by the
vendored convert_lora_to_gguf.py (bf16) and timed with and without it in one process by
tools/bench/llama_lora_bench.cpp (the pinned llama-batched-bench accepts --lora but never
applies it; see tools/bench/llama_cpp_peer.py). A second greedy check runs both engines with
lora-0 applied. results.json: config.lora; each sample's decode_lora; greedy_lora.
"""

import argparse
import json
import os
import re
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

import formats  # noqa: E402
import llama_cpp_peer  # noqa: E402
import make_random_checkpoint  # noqa: E402
import prereqs  # noqa: E402
import report  # noqa: E402
from formats import checkpoint_weight_bytes  # noqa: E402,F401  (its old home; scripts import it)

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
    (one file plus the header-only read kernels of src/engine/bandwidth.h), so the peers can
    run without a metrale build."""
    srcs = [REPO / "bench" / "bandwidth_probe.cc", REPO / "src" / "engine" / "bandwidth.h"]
    newest = max(p.stat().st_mtime for p in srcs)
    probe = RELEASE / "bench" / "bandwidth_probe"
    if probe.is_file() and probe.stat().st_mtime >= newest:
        return probe
    fallback = cache / "bandwidth_probe"
    if not fallback.is_file() or fallback.stat().st_mtime < newest:
        log(f"building {fallback} directly from {srcs[0]}")
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run(["c++", "-std=c++20", "-O2", "-pthread", "-I", str(REPO / "src"),
                        str(srcs[0]), "-o", str(fallback)], check=True)
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


def git_state() -> dict:
    """The metrale commit the run measured, and whether the tree had local changes."""
    def git(*a: str) -> str:
        r = subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True)
        return r.stdout.rstrip("\n") if r.returncode == 0 else ""
    changed = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": git("rev-parse", "HEAD").strip() or None,
            "modified_files": changed.splitlines() if changed else []}


def metrale_bench_options(binary: Path) -> list[str]:
    """The long options `metrale bench --help` lists (so results.json can say which ones the
    run left at metrale's defaults)."""
    r = subprocess.run([str(binary), "bench", "--help"], capture_output=True, text=True)
    return sorted(set(re.findall(r"(?m)^\s+(?:-\w,)?(--[a-z][a-z0-9-]*)", r.stdout)))


def split_flags(argv: list[str]) -> dict[str, str | bool]:
    """['--a', '1', '--b', '--c=2'] -> {'--a': '1', '--b': True, '--c': '2'}."""
    out: dict[str, str | bool] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a.startswith("--") and "=" in a:
            k, v = a.split("=", 1)
            out[k] = v
        elif a.startswith("-") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[a] = argv[i + 1]
            i += 1
        else:
            out[a] = True
        i += 1
    return out


def thp_setting() -> dict:
    try:
        return {"transparent_hugepage": Path(
            "/sys/kernel/mm/transparent_hugepage/enabled").read_text().strip()}
    except OSError:
        return {}


def lscpu_summary() -> dict:
    out = {}
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    except FileNotFoundError:
        return out
    keep = ("Model name", "CPU family", "Model", "CPU(s)", "Thread(s) per core", "L1d cache",
            "L2 cache", "L3 cache", "Flags")
    for line in text.splitlines():
        k, _, v = line.partition(":")
        if k.strip() in keep:
            v = v.strip()
            if k.strip() == "Flags":
                v = " ".join(f for f in v.split() if f.startswith(("avx", "amx", "fma")))
            out[k.strip()] = v
    return out


def shape_arg(text: str) -> str:
    try:
        return make_random_checkpoint.canonical_shape(text)
    except SystemExit as e:
        raise argparse.ArgumentTypeError(str(e))


# The greedy check's prompt: 8 fixed ids below 1000 (random.Random(0).sample(range(1, 1000), 8)),
# given to both engines as they are (no bos or other special token added by either).
GREEDY_PROMPT = [865, 395, 777, 912, 431, 42, 266, 989]


def metrale_generate_ids(binary: Path, model_dir: Path, ids: list[int], n: int, threads: int,
                         flags: list[str], timeout: float) -> tuple[dict | None, list[str], str]:
    """Greedy ids from `metrale generate --json` ({"prompt_ids", "ids", "stop"} or None, the
    command, error text)."""
    cmd = [str(binary), "generate", "--model", str(model_dir), "--ids", ",".join(map(str, ids)),
           "--no-special", "-n", str(n), "--temperature", "0", "--ignore-eos", "--threads",
           str(threads), *flags, "--json"]
    out, _, err = run_json(cmd, timeout)
    if out is not None and not isinstance(out.get("ids"), list):
        return None, cmd, f"`generate --json` printed no \"ids\" list: {out}"
    return out, cmd, err


def greedy_check(metrale: Path, model_dir: Path, cache: Path, gguf: Path, threads: int,
                 n: int, metrale_flags: list[str], precision: str, timeout: float,
                 pair: tuple[str, str] = ("bf16", "bf16"), quantizers: str = "",
                 lora: Path | None = None) -> dict:
    """Both engines decode n greedy tokens after GREEDY_PROMPT, one engine at a time. Returns
    what results.json keeps for one (metrale format, llama.cpp format) pair under "greedy":
    each engine's ids and command, llama.cpp's top-1 minus top-2 logit at each of its steps,
    and the first index where the ids differ (None when identical). Random weights give nearly
    flat logits, so an early difference at a small margin is expected; with weights quantized
    by different quantizers (llm-compressor vs llama-quantize) the ids may differ at any
    margin. The run records it and goes on. `lora`: llama.cpp's adapter GGUF (metrale's
    adapter comes in metrale_flags)."""
    out = {"prompt": GREEDY_PROMPT, "tokens": n, "threads": threads, "precision": precision,
           "metrale_format": pair[0], "llama_format": pair[1], "quantizers": quantizers,
           "metrale": None, "llama.cpp": None, "first_difference": None, "errors": {}}
    lcmd = llama_cpp_peer.greedy_command(cache, gguf, GREEDY_PROMPT, n, threads, lora=lora)
    res, _, err = run_json(lcmd, timeout)
    out["llama.cpp"] = {"command": lcmd, **(res or {})}
    if res is None:
        out["errors"]["llama.cpp"] = err
    mres, mcmd, err = metrale_generate_ids(metrale, model_dir, GREEDY_PROMPT, n, threads,
                                           metrale_flags, timeout)
    out["metrale"] = {"command": mcmd, **(mres or {})}
    if mres is None:
        out["errors"]["metrale"] = err
    a, b = (out["metrale"].get("ids"), out["llama.cpp"].get("ids"))
    if a is not None and b is not None:
        diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if diff is None and len(a) != len(b):
            diff = min(len(a), len(b))
        out["first_difference"] = diff
        margins = out["llama.cpp"].get("top2_margins") or []
        out["llama_cpp_margin_at_difference"] = (margins[diff] if diff is not None and
                                                 diff < len(margins) else None)
        # Whether metrale's pick there was llama.cpp's runner-up (a near-tie resolved the
        # other way) rather than a token llama.cpp ranked lower.
        runners_up = out["llama.cpp"].get("top2_ids") or []
        out["metrale_took_llama_cpp_runner_up"] = (
            a[diff] == runners_up[diff] if diff is not None and diff < min(len(a), len(b),
                                                                          len(runners_up))
            else None)
        log(f"greedy {pair[0]} vs {pair[1]}{' with LoRA' if lora else ''}: "
            + ("identical" if diff is None else
            f"first differ at step {diff} (llama.cpp margin "
            f"{out['llama_cpp_margin_at_difference']})"))
    for engine, e in out["errors"].items():
        log(f"greedy check: {engine} failed: {e}")
    return out


def adapter_effect(base: dict, with_lora: dict) -> dict:
    """Whether the adapter changed what each engine decoded (the same prompt and token count
    without it: the base greedy check), and by how much it moved llama.cpp's top-1 minus top-2
    logit margins: identical ids with the adapter only show the two engines apply it alike
    when the adapter changed something. Random adapters of make_lora_adapters.py are mild
    (B ~ N(0, 0.02 / sqrt(r))), so the ids may well stay the base model's."""
    out = {}
    for engine in ("metrale", "llama.cpp"):
        a, b = (base.get(engine) or {}).get("ids"), (with_lora.get(engine) or {}).get("ids")
        out[f"{engine}_ids_differ_from_base"] = (a != b) if a is not None and b is not None \
            else None
    m0 = (base.get("llama.cpp") or {}).get("top2_margins") or []
    m1 = (with_lora.get("llama.cpp") or {}).get("top2_margins") or []
    steps = [i for i in range(min(len(m0), len(m1)))
             if base["llama.cpp"]["ids"][:i + 1] == with_lora["llama.cpp"]["ids"][:i + 1]]
    # Over the steps where both runs had decoded the same tokens so far (same context).
    out["llama_cpp_margin_max_change"] = (max(abs(m1[i] - m0[i]) for i in steps)
                                          if steps else None)
    return out


def mix_list(text: str) -> list[int]:
    """--lora-mix: comma-separated adapter counts, 0 allowed (base-model rows)."""
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, found {text!r}")
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 0, found {text!r}")
    return list(dict.fromkeys(values))


def lora_dir(cache: Path, model_dir: Path, rank: int) -> Path:
    """Where the random adapters of this checkpoint and rank are cached (rank 16 without a
    suffix)."""
    return cache / "lora" / (model_dir.name + ("" if rank == 16 else f"-r{rank}"))


def lora_ready(adapter: Path, rank: int) -> bool:
    """Whether make_lora_adapters.py finished this adapter (it writes adapter_config.json
    after the weights) with this rank."""
    cfg = adapter / "adapter_config.json"
    return cfg.is_file() and (adapter / "adapter_model.safetensors").is_file() and \
        json.loads(cfg.read_text()).get("r") == rank


def ensure_lora_adapters(cache: Path, model_dir: Path, count: int, rank: int) -> list[Path]:
    """lora-0 .. lora-<count-1> of tools/bench/make_lora_adapters.py for this checkpoint,
    made once each (seeded per index, so a rerun writes the same bytes)."""
    out = lora_dir(cache, model_dir, rank)
    dirs = [out / f"lora-{i}" for i in range(count)]
    missing = [i for i, d in enumerate(dirs) if not lora_ready(d, rank)]
    if missing:
        import make_lora_adapters  # numpy, torch, safetensors: only when something is missing
        log(f"making LoRA adapters {missing} (rank {rank}) in {out}")
        for i in missing:
            make_lora_adapters.make(model_dir, out, i, rank)
    return dirs


def metrale_lora_flags(adapters: list[Path], dtype: str, mix: list[int]) -> list[str]:
    """The flags `metrale bench` gets for --lora-mix: every adapter, its slot dtype, the mix."""
    out = []
    for i, d in enumerate(adapters):
        out += ["--lora", f"l{i}={d}"]
    return out + ["--lora-dtype", dtype, "--lora-mix", ",".join(map(str, mix))]


def plan_prerequisites(args, engines: list[str], build: bool,
                       rows: list[formats.Row]) -> tuple[list[str], list[str], list[str]]:
    """(Python modules, Debian packages, the quantizers whose venvs are needed: names of
    quantize_checkpoint.PRODUCERS) that the steps this run will take need. Steps whose output
    is cached (checkpoint, GGUFs, quantized checkpoints, llama.cpp build, probe) need
    nothing."""
    modules, debian = [], []
    if not args.no_chart:
        modules += prereqs.CHART
    ckpt_ready = True
    if args.model_shape:
        ckpt_ready = make_random_checkpoint.is_ready(args.model_shape, args.cache_dir / "checkpoints")
        if not ckpt_ready:
            modules += make_random_checkpoint.python_needs(args.model_shape)
    model_dir = (args.cache_dir / "checkpoints" / args.model_shape if args.model_shape
                 else args.model)
    if "hf" in engines:
        modules += prereqs.HF_PEER
    if "llama.cpp" in engines:
        if not llama_cpp_peer.sdist_path(args.cache_dir).is_file():
            modules.append("pip")
        convert, quantize = formats.llama_needs(rows, args.cache_dir, model_dir)
        if not llama_cpp_peer.is_built(args.cache_dir) or quantize:
            debian += list(prereqs.BUILD_TOOLS.values())
        elif not args.no_greedy and "metrale" in engines and \
                not llama_cpp_peer.greedy_tool_path(args.cache_dir).is_file():
            debian += [prereqs.BUILD_TOOLS["c++"]]
        if not ckpt_ready or convert:
            modules += prereqs.GGUF_CONVERSION
    if args.lora_mix:
        count = args.lora_count or max(max(args.lora_mix), 1)
        adir = lora_dir(args.cache_dir, model_dir, args.lora_rank)
        if not all(lora_ready(adir / f"lora-{i}", args.lora_rank) for i in range(count)):
            modules += ["numpy", "torch", "transformers"]  # safetensors comes with transformers
        if "llama.cpp" in engines:
            # The adapter's GGUF is keyed by the adapter files, which may not exist yet: a
            # missing adapter means a conversion too.
            a0 = adir / "lora-0"
            if not lora_ready(a0, args.lora_rank) or not llama_cpp_peer.lora_gguf_path(
                    args.cache_dir, model_dir, a0).is_file():
                modules += prereqs.GGUF_CONVERSION
            if not llama_cpp_peer.lora_bench_tool_path(args.cache_dir).is_file():
                debian += [prereqs.BUILD_TOOLS["c++"]]
    venvs = (formats.quantizers(rows) if not ckpt_ready else
             formats.quantized_missing(rows, args.cache_dir, model_dir))
    if "metrale" in engines and build and args.metrale_bin == RELEASE / "src" / "metrale":
        debian += prereqs.metrale_debian_packages()
    if not (RELEASE / "bench" / "bandwidth_probe").is_file():
        debian += ["g++"]
    return modules, debian, venvs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model-shape", type=shape_arg, metavar="SHAPE",
                     help="random-weight checkpoint with this model's shapes (made on demand): "
                          f"one of {sorted(make_random_checkpoint.SHAPES)}, or "
                          f"{make_random_checkpoint.QWEN3_MOE_BASE}-L<layers> (Qwen3-30B-A3B "
                          "with that many of its 48 layers), or "
                          f"{make_random_checkpoint.QWEN3_NEXT_BASE}-L<layers> "
                          "(Qwen3-Next-80B-A3B with that many of its 48 layers, >= 2)")
    src.add_argument("--model", type=Path, help="an existing HF checkpoint directory (bf16)")
    ap.add_argument("--threads", type=int_list, default=[1, 2])
    ap.add_argument("--reps", type=int, default=5, help="interleaved rounds (medians reported)")
    ap.add_argument("--out", type=Path, default=REPO / "out" / "compare")
    ap.add_argument("--engines", default="metrale,llama.cpp,hf",
                    help="comma-separated subset of metrale,llama.cpp,hf")
    ap.add_argument("--prefill", type=int_list, default=[128, 512])
    ap.add_argument("--batch", type=int_list, default=[1, 4, 16])
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--depth", type=llama_cpp_peer.positive_int, default=None, metavar="N",
                    help="tokens of context before the timed decode steps, in every engine: "
                         "metrale bench --depth N, llama-bench -d N (batch 1) / "
                         "llama-batched-bench -npp N, hf_peer --decode-prompt N (default: none, "
                         "decode after 16 tokens, llama-bench's tg from an empty cache)")
    ap.add_argument("--llama-kv-type", choices=list(llama_cpp_peer.KV_TYPES), default="f16",
                    help="llama.cpp's KV cache type (-ctk / -ctv; default f16, llama.cpp's own "
                         "default). metrale's: --metrale-args='--kv-dtype bf16'")
    ap.add_argument("--hf-decode-tokens", type=int, default=None,
                    help="decode steps for HF (default: --decode-tokens); fewer shorten a round "
                         "when torch is slow, without changing its per-step cost")
    ap.add_argument("--formats", default="bf16",
                    help="metrale's weight formats, one table row each: bf16 (the checkpoint) "
                         "and/or " + ", ".join(formats.METRALE_FORMATS[1:]) + " (the "
                         "checkpoint quantized by llm-compressor, or by ModelOpt for "
                         "modelopt-*: tools/bench/quantize_checkpoint.py, each in its own "
                         "venv under --cache-dir)")
    ap.add_argument("--llama-formats", default=None,
                    help="llama.cpp's GGUF formats, one row each: " +
                         ", ".join(formats.LLAMA_FORMATS) + " (q*: the pinned llama-quantize "
                         "of the bf16 GGUF; -pure: --pure; -bf16head: embedding/output kept "
                         "bf16 as in the llm-compressor checkpoints; q8_0-convert: the "
                         "converter's own q8_0). Each metrale row's ratios divide by every one "
                         "of these at its weight bit width; the first is its greedy-check "
                         "peer (default: bf16)")
    ap.add_argument("--llama-outtype", choices=["bf16", "q8_0"], default=None,
                    help="the former single-format option: bf16 = --llama-formats bf16, q8_0 "
                         "= --llama-formats q8_0-convert")
    ap.add_argument("--compute", choices=["bf16", "int8", "f32"], default="bf16",
                    help="metrale's --compute: bf16 (default; the precision of llama.cpp's BF16 "
                         "and HF's bf16 run), int8 (bf16 weights as bf16; int4 / int8 / nvfp4 "
                         "weights meet activations quantized to int8 per 32, as llama.cpp's "
                         "Q4_0 / Q8_0 do) or f32 (metrale's HF-parity path)")
    ap.add_argument("--weights", choices=["copy", "mmap"], default="copy",
                    help="metrale's --weights (llama.cpp always runs with -lm none, i.e. copied)")
    ap.add_argument("--metrale-bin", type=Path, default=RELEASE / "src" / "metrale")
    ap.add_argument("--metrale-args", default="",
                    help="further flags for `metrale bench` (split on spaces); write it with "
                         "'=': --metrale-args='--max-rows 64'. A --compute or --weights here "
                         "replaces the option of the same name above")
    ap.add_argument("--cache-dir", type=Path, default=llama_cpp_peer.DEFAULT_CACHE)
    ap.add_argument("--no-build", action="store_true",
                    help="do not build metrale (use the binary that exists); llama.cpp's "
                         "pinned build, its tools and the probe are still made when missing")
    ap.add_argument("--prepare-only", action="store_true",
                    help="prepare everything the run needs (as without it), then stop before "
                         "the greedy check and the timed rounds")
    ap.add_argument("--no-install", action="store_true",
                    help="do not install missing Python/Debian packages: name them and stop")
    ap.add_argument("--no-chart", action="store_true", help="skip chart.png (no matplotlib)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per engine run")
    ap.add_argument("--no-greedy", action="store_true",
                    help="skip the greedy check (metrale and llama.cpp decode the same "
                         "prompt once, before the timed rounds, and their token ids are compared)")
    ap.add_argument("--greedy-tokens", type=int, default=16,
                    help="tokens each engine decodes in the greedy check")
    ap.add_argument("--lora-mix", type=mix_list, default=None,
                    help="time decode with LoRA adapters too: per count N, metrale's rows cycle "
                         "through the first N adapters (0 = base-model rows through the "
                         "adapter pool), e.g. 0,1,4,16; llama.cpp runs lora-0 on every row")
    ap.add_argument("--lora-rank", type=int, default=16,
                    help="rank (and lora_alpha) of the random adapters (--lora-mix)")
    ap.add_argument("--lora-count", type=int, default=None,
                    help="adapters to make and load (default: the largest --lora-mix)")
    ap.add_argument("--lora-dtype", choices=["bf16", "f32"], default="bf16",
                    help="metrale's --lora-dtype, the adapter slots' storage (default bf16: the "
                         "adapters' own dtype, as llama.cpp's bf16 adapter GGUF)")
    args = ap.parse_args()
    # The command exactly as typed (run from the repository root), for results.json and the
    # table; `args` in results.json spells out every default it relied on.
    invoked = ["python3", os.path.relpath(Path(__file__).resolve(), Path.cwd()), *sys.argv[1:]]

    engines = [e for e in args.engines.split(",") if e]
    unknown = sorted(set(engines) - set(report.ENGINES))
    if unknown or not engines:
        sys.exit(f"--engines: unknown {unknown}; expected a subset of {list(report.ENGINES)}")
    if args.reps < 1:
        sys.exit("--reps: expected >= 1")
    if args.greedy_tokens < 1:
        sys.exit("--greedy-tokens: expected >= 1")
    if args.model and not (args.model.resolve() / "config.json").is_file():
        sys.exit(f"--model: {args.model.resolve()}/config.json not found")
    if args.lora_mix is not None:
        if args.lora_rank < 1:
            sys.exit("--lora-rank: expected >= 1")
        if args.lora_count is not None and args.lora_count < max(max(args.lora_mix), 1):
            sys.exit(f"--lora-count {args.lora_count}: --lora-mix needs "
                     f"{max(max(args.lora_mix), 1)}")
    elif args.lora_count is not None:
        sys.exit("--lora-count: give --lora-mix too")
    if args.lora_mix is not None and "llama.cpp" in engines and args.llama_kv_type != "f16":
        sys.exit(f"--llama-kv-type {args.llama_kv_type} with --lora-mix: llama.cpp's LoRA timing "
                 "tool (tools/bench/llama_lora_bench.cpp) keeps llama.cpp's default f16 KV cache")
    if args.llama_outtype and args.llama_formats:
        sys.exit("--llama-outtype and --llama-formats: give one (--llama-formats supersedes it)")
    metrale_formats = formats.format_list(args.formats, formats.METRALE_FORMATS, "--formats")
    llama_formats = formats.format_list(
        args.llama_formats or {"q8_0": "q8_0-convert"}.get(args.llama_outtype,
                                                           args.llama_outtype or "bf16"),
        formats.LLAMA_FORMATS, "--llama-formats")
    rows = formats.plan_rows(engines, metrale_formats, llama_formats)
    build = not args.no_build
    extra = shlex.split(args.metrale_args)
    extra_flags = split_flags(extra)
    metrale_flags = {"--compute": args.compute, "--weights": args.weights}
    for k in list(metrale_flags):
        if k in extra_flags:
            log(f"--metrale-args sets {k} {extra_flags[k]}; it replaces {k} {metrale_flags[k]}")
            del metrale_flags[k]
    metrale_fixed = [a for k, v in metrale_flags.items() for a in (k, v)] + extra

    # --- prerequisites: checked (and installed, or named) before any work ---
    modules, debian, venvs = plan_prerequisites(args, engines, build, rows)
    prereqs.ensure(modules, debian, install=not args.no_install)
    for producer in venvs:  # each quantizer's own venv (made once, or named and stopped)
        formats.quantize_checkpoint.ensure_venv(args.cache_dir, producer,
                                                install=not args.no_install)

    # --- prepare everything before the first timed run ---
    if args.model_shape:
        model_dir = make_random_checkpoint.ensure(args.model_shape,
                                                  args.cache_dir / "checkpoints")
    else:
        model_dir = args.model.resolve()
    metrale = None
    if "metrale" in engines:
        if build and args.metrale_bin == RELEASE / "src" / "metrale":
            # Incremental: a no-op when up to date, a rebuild when the sources moved on.
            build_release(["metrale", "bandwidth_probe"])
        metrale = ensure_metrale(args.metrale_bin)
        if metrale is not None and args.depth and "--depth" not in metrale_bench_options(metrale):
            log(f"metrale skipped: `{metrale} bench --help` lists no --depth (a binary from "
                "before it); rebuild it or leave --depth out")
            metrale = None
        if metrale is None:
            engines.remove("metrale")
            rows = [r for r in rows if r.engine != "metrale"]
            log("continuing with the peers only")
    probe = ensure_probe(args.cache_dir)
    lsrc = None
    if "llama.cpp" in engines:
        lsrc = llama_cpp_peer.ensure_source(args.cache_dir)
        llama_cpp_peer.ensure_build(args.cache_dir, lsrc)
        if not args.no_greedy and "metrale" in engines:
            llama_cpp_peer.ensure_greedy_tool(args.cache_dir, lsrc)
    lora = None  # --lora-mix: what results.json keeps (config.lora)
    if args.lora_mix is not None:
        count = args.lora_count or max(max(args.lora_mix), 1)
        adapters = ensure_lora_adapters(args.cache_dir, model_dir, count, args.lora_rank)
        lora = {"mix": args.lora_mix, "rank": args.lora_rank, "count": count,
                "dtype": args.lora_dtype, "adapters": [str(d) for d in adapters],
                "generator": ["python3", "tools/bench/make_lora_adapters.py", "--model",
                              str(model_dir), "--out",
                              str(lora_dir(args.cache_dir, model_dir, args.lora_rank)),
                              "--count", str(count), "--rank", str(args.lora_rank)],
                "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                            "down_proj"],
                "metrale_flags": metrale_lora_flags(adapters, args.lora_dtype, args.lora_mix),
                "llama_cpp": None}
        if lsrc is not None:
            try:
                gguf = llama_cpp_peer.ensure_lora_gguf(args.cache_dir, lsrc, model_dir,
                                                       adapters[0])
                llama_cpp_peer.ensure_lora_bench_tool(args.cache_dir, lsrc)
                lora["llama_cpp"] = {
                    "adapter": str(adapters[0]), "gguf": str(gguf),
                    "gguf_bytes": gguf.stat().st_size,
                    "convert_command": llama_cpp_peer.lora_convert_command(
                        lsrc, model_dir, adapters[0], gguf),
                    "timing_tool": "tools/bench/llama_lora_bench.cpp (llama-batched-bench's "
                                   "decode loop; the pinned llama-batched-bench ignores --lora)",
                    "mode": "one adapter applied to every row (llama_set_adapters_lora)"}
            except (Exception, SystemExit) as e:  # noqa: BLE001 — the base rows still run
                log(f"llama.cpp LoRA adapter not prepared: {e}")
                lora["llama_cpp"] = {"error": str(e)}
    batches_all = sorted(set(args.batch) | {1})
    formats.prepare(rows, args.cache_dir, model_dir, lsrc, batches_all, not args.no_install, log)
    runnable = [r for r in rows if not r.error]
    if args.prepare_only:
        for r in rows:
            log(f"{r.id}: " + (f"not prepared: {r.error}" if r.error else
                               str(r.gguf or r.model_dir or model_dir)))
        log(f"prepared (--prepare-only; nothing timed): checkpoint {model_dir}"
            + (f"; metrale {metrale}" if metrale else "")
            + (f"; llama.cpp {llama_cpp_peer.build_dir(args.cache_dir)}" if lsrc else "")
            + f"; probe {probe}")
        return
    if not runnable:
        sys.exit("no engine left to run")
    by_id = {r.id: r for r in rows}

    prefill = ",".join(map(str, args.prefill))
    batch = ",".join(map(str, args.batch))
    hf_steps = args.hf_decode_tokens or args.decode_tokens

    depth = ["--depth", str(args.depth)] if args.depth else []

    def command(row: formats.Row, threads: int) -> list[str]:
        if row.engine == "metrale":
            return [str(metrale), "bench", "--model", str(row.model_dir), "--threads",
                    str(threads), "--prefill", prefill, "--batch", batch, "--decode-tokens",
                    str(args.decode_tokens), *depth, "--reps", "1", "--json", "--no-bandwidth",
                    *metrale_fixed,  # the round's probe measures bandwidth
                    *(lora["metrale_flags"] if lora else [])]
        if row.engine == "llama.cpp":
            with_lora = lora and lora["llama_cpp"] and "error" not in lora["llama_cpp"]
            return [sys.executable, str(REPO / "tools/bench/llama_cpp_peer.py"), "--model",
                    str(row.model_dir), "--threads", str(threads), "--prefill", prefill,
                    "--batch", batch, "--decode-tokens", str(args.decode_tokens), *depth,
                    "--kv-type", args.llama_kv_type, "--outtype",
                    row.format, "--cache-dir", str(args.cache_dir), "--json",
                    *(["--lora", lora["llama_cpp"]["adapter"]] if with_lora else [])]
        return [sys.executable, str(REPO / "tools/bench/hf_peer.py"), "--model",
                str(row.model_dir), "--threads", str(threads), "--prefill", prefill, "--batch",
                batch, "--decode-tokens", str(hf_steps),
                *(["--decode-prompt", str(args.depth)] if args.depth else []), "--reps", "1",
                "--json"]

    def probe_command(threads: int) -> list[str]:
        return [str(probe), "--threads", str(threads), "--reps", "5", "--json"]

    metrale_info = None
    metrale_row = next((r for r in runnable if r.engine == "metrale"), None)
    if metrale and metrale_row:
        flags = split_flags(command(metrale_row, args.threads[0])[2:])
        flags["--threads"] = "per row of the table"
        flags["--model"] = "per row of the table (config.rows)"
        if lora:
            flags["--lora"] = lora["metrale_flags"][1:2 * lora["count"]:2]  # repeated: all
        known = metrale_bench_options(metrale)
        metrale_info = {
            "binary": str(metrale),
            "binary_mtime": time.strftime("%Y-%m-%d %H:%M:%S",
                                          time.localtime(metrale.stat().st_mtime)),
            # The tree run.py ran from; it built the binary unless --metrale-bin named another.
            "git": git_state(),
            "built_from_this_tree": args.metrale_bin == RELEASE / "src" / "metrale" and build,
            # every option of `metrale bench`: the value passed, or metrale's own default
            "flags": {k: flags.get(k, "(metrale default)") for k in sorted(set(known) | set(flags))
                      if k not in ("--help",)},
            "compute": flags.get("--compute", "(metrale default)"),
            "weights": flags.get("--weights", "(metrale default)"),
            "kv_dtype": flags.get("--kv-dtype", "(metrale default)")}
    weight_bytes = checkpoint_weight_bytes(model_dir, batches_all)
    mcompute = metrale_info["compute"] if metrale_info else args.compute
    results = {
        "command": shlex.join(invoked),
        "config": {"model": args.model_shape or str(model_dir), "model_dir": str(model_dir),
                   "model_description": make_random_checkpoint.shape_spec(
                       args.model_shape).get("description") if args.model_shape else None,
                   "precision": (f"metrale {', '.join(metrale_formats)} (--compute {mcompute}); "
                                 f"llama.cpp GGUF {', '.join(llama_formats)}"
                                 if metrale_formats != ["bf16"] or llama_formats != ["bf16"]
                                 else f"bf16 weights; metrale --compute {mcompute}; "
                                      f"llama.cpp GGUF bf16"),
                   "llama_outtype": llama_formats[0], "formats": metrale_formats,
                   "llama_formats": llama_formats, "threads": args.threads,
                   "reps": args.reps, "prefill": args.prefill, "batch": args.batch,
                   "decode_tokens": args.decode_tokens, "hf_decode_tokens": hf_steps,
                   # tokens of context before the timed decode steps (None: as before --depth)
                   "depth": args.depth,
                   # KV cache element type per engine as asked; each sample's own kv_dtype /
                   # kv_type says what the engine used
                   "kv_dtype": {e: {"metrale": metrale_info["kv_dtype"] if metrale_info
                                    else None,
                                    "llama.cpp": args.llama_kv_type, "hf": "bf16"}[e]
                                for e in engines},
                   "engines": engines, "rows": [r.record() for r in rows],
                   "gguf": {r.format: str(r.gguf) for r in rows if r.gguf} or None,
                   "args": {k: (str(v) if isinstance(v, Path) else v)
                            for k, v in vars(args).items()},
                   "argv": [sys.executable, *sys.argv], "cwd": str(Path.cwd()),
                   "engine_commands": {str(t): {r.id: command(r, t) for r in runnable}
                                       for t in args.threads},
                   "probe_command": {str(t): probe_command(t) for t in args.threads},
                   "metrale": metrale_info,
                   "lora": lora,
                   "llama_cpp": llama_cpp_peer.source_info(args.cache_dir)
                   if "llama.cpp" in engines else None,
                   "python": {"executable": sys.executable, "version": sys.version.split()[0],
                              "packages": prereqs.installed_versions()},
                   "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                   "loadavg_start": os.getloadavg()},
        "machine": lscpu_summary() | thp_setting(),
        # "bf16": batch-1 bytes of the bf16 checkpoint; per_step: every width. Each row's own
        # bytes (quantized checkpoint or GGUF): config.rows[i].weight_bytes.
        "weight_bytes": {"bf16": weight_bytes["per_step"]["1"], **weight_bytes},
        "bandwidth_samples": {str(t): [] for t in args.threads},
        "bandwidth_runs": {str(t): [] for t in args.threads},
        "samples": {str(t): {r.id: [] for r in runnable} for t in args.threads},
        "failures": [{"round": None, "threads": None, "engine": r.id, "error": r.error}
                     for r in rows if r.error],
    }

    # --- greedy check: each metrale format against its llama.cpp peer (before the rounds) ---
    pairs = [(r, by_id[r.peer]) for r in runnable
             if r.engine == "metrale" and r.peer and not by_id[r.peer].error]
    if args.no_greedy:
        results["greedy"] = {"skipped": "--no-greedy"}
    elif not pairs:
        results["greedy"] = {"skipped": "needs both metrale and llama.cpp among the engines"}
    else:
        mflags = [a for k, v in metrale_flags.items() for a in (k, v)]
        for k in ("--compute", "--weights", "--kv-dtype"):  # as the timed runs, also when --metrale-args set it
            if k in extra_flags and extra_flags[k] is not True:
                mflags += [k, str(extra_flags[k])]
        gcompute = dict(zip(mflags[::2], mflags[1::2])).get("--compute", "(metrale default)")
        results["greedy"] = {"pairs": []}
        for mrow, lrow in pairs:
            bf16_both = gcompute in ("bf16", "int8") and mrow.format == lrow.format == "bf16"
            precision = ("bf16 both" if bf16_both else
                         f"metrale {mrow.format} --compute {gcompute}, llama.cpp {lrow.format}")
            results["greedy"]["pairs"].append(greedy_check(
                metrale, mrow.model_dir, args.cache_dir, lrow.gguf, max(args.threads),
                args.greedy_tokens, mflags, precision, args.timeout, (mrow.format, lrow.format),
                formats.quantizer_note(mrow, lrow)))

    # --- greedy check with lora-0 applied in both engines (the same adapter weights) ---
    lora_llama = (lora or {}).get("llama_cpp") or {}
    if lora is None:
        pass
    elif args.no_greedy:
        results["greedy_lora"] = {"skipped": "--no-greedy"}
    elif not pairs or not lora_llama.get("gguf"):
        results["greedy_lora"] = {"skipped": "needs metrale and llama.cpp, and lora-0's GGUF"
                                  + (f" ({lora_llama['error']})" if "error" in lora_llama
                                     else "")}
    else:
        mrow, lrow = pairs[0]
        lflags = mflags + ["--lora", f"l0={lora['adapters'][0]}", "--lora-dtype",
                           args.lora_dtype]
        bf16_both = gcompute in ("bf16", "int8") and mrow.format == lrow.format == "bf16"
        precision = ((f"bf16 both, adapter lora-0 (rank {args.lora_rank}, bf16; metrale "
                      f"--lora-dtype {args.lora_dtype})") if bf16_both else
                     f"metrale {mrow.format} --compute {gcompute} --lora-dtype "
                     f"{args.lora_dtype}, llama.cpp {lrow.format}; adapter lora-0")
        g = greedy_check(metrale, mrow.model_dir, args.cache_dir, lrow.gguf, max(args.threads),
                         args.greedy_tokens, lflags, precision, args.timeout,
                         (mrow.format, lrow.format), formats.quantizer_note(mrow, lrow),
                         lora=Path(lora_llama["gguf"]))
        g["adapter"] = lora["adapters"][0]
        g["adapter_effect"] = adapter_effect(results["greedy"]["pairs"][0], g)
        log(f"greedy with LoRA: {g['adapter_effect']}")
        results["greedy_lora"] = {"pairs": [g]}

    # --- interleaved rounds ---
    for rnd in range(args.reps):
        for threads in args.threads:
            t = str(threads)
            bw, _, err = run_json(probe_command(threads), 600)
            if bw:
                results["bandwidth_samples"][t].append(bw["threads"][t]["median_gbs"])
                results["bandwidth_runs"][t].append(bw["threads"][t])
            else:
                results["failures"].append({"round": rnd, "threads": threads,
                                            "engine": "bandwidth_probe", "error": err})
            order = runnable[rnd % len(runnable):] + runnable[:rnd % len(runnable)]
            for row in order:
                log(f"round {rnd + 1}/{args.reps}, {threads} thread(s): {row.id}")
                out, rss, err = run_json(command(row, threads), args.timeout, measure_rss=True)
                if out is None:
                    log(f"{row.id} failed: {err}")
                    results["failures"].append({"round": rnd, "threads": threads,
                                                "engine": row.id, "error": err})
                    continue
                out["peak_rss_bytes"] = rss or out.get("peak_rss_bytes")
                results["samples"][t][row.id].append(out)
    results["config"]["loadavg_end"] = os.getloadavg()
    results["config"]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    results["bandwidth"] = {
        t: {"median_gbs": statistics.median(v), "samples_gbs": v} if v else {}
        for t, v in results["bandwidth_samples"].items()}
    md = report.write(results, args.out, chart_png=not args.no_chart)
    print(md)
    if results["failures"]:
        log(f"{len(results['failures'])} run(s) failed; see failures in {args.out}/results.json")
    log(f"wrote {args.out}/table.md, results.json" + ("" if args.no_chart else ", chart.png"))


if __name__ == "__main__":
    main()
