#!/usr/bin/env python3
"""Batch-1 decode of metrale (layer loop and circuit executor) beside llama.cpp, with every run
labelled by the state the host's memory system was in around it.

    python3 bench/compare/decode_states.py --model-shape qwen3-0.6b \\
        --cache-dir build/bench-cache --rounds 10 --threads 1,2 --out build/bench/states-qwen3

On the shared 2-vCPU guests this project is measured on, two-thread decode is fast or slow for
minutes at a time, in every engine alike, and a plain C probe shows why: two threads' read
bandwidth switches between about one thread's and about twice it (docs/performance.md, "Why two
threads are fast or slow"). So before every engine run (and after the last one) this script
runs bench/memory_links_probe (one thread's and two threads' read GB/s; two threads' FMA rate
over one's), labels each run "two paths" when the probes before and after it both read >= 1.5x
one thread's bandwidth with two threads, "one path" when both read less, and "changed" when
they disagree, and reports each engine's median per label, with the ratios within a label.

Each run is a fresh process: `metrale bench -t T --executor layers|circuit --prefill 16 --batch
1 --decode-tokens N --reps R --no-bandwidth --json` (decode after 16 tokens of context) and
`llama-bench -m GGUF -t T -p 0 -n N -r R -o json` (llama.cpp's tg: decode from an empty cache,
its default f16 KV and mmap'd weights; metrale keeps f32 KV and copies the weights into memory
on 2 MiB pages); the engines' order rotates per round. The checkpoint, GGUF and llama.cpp build
are bench/compare/run.py's (`run.py --model-shape S --engines metrale,llama.cpp --prepare-only`
makes them in the same --cache-dir); before the rounds both engines decode 16 greedy tokens
from the same prompt on the same weights (run.py's greedy check) and results.json keeps both id
lists. Writes <out>/results.json (every sample, every probe, the flags, both engines' versions)
and <out>/table.md.
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "bench"))
sys.path.insert(0, str(REPO / "bench" / "compare"))

import llama_cpp_peer  # noqa: E402
import run as compare  # noqa: E402  (bench/compare/run.py: the greedy check, run_json)

TWO_PATHS = 1.5  # two threads' read GB/s over one thread's, at or above which: "two paths"
ENGINES = ("metrale-layers", "metrale-circuit", "llama.cpp")


def log(msg: str) -> None:
    print(f"[states] {msg}", file=sys.stderr, flush=True)


def ensure_probe(cache: Path) -> Path:
    src = REPO / "bench" / "memory_links_probe.cc"
    exe = cache / "memory_links_probe"
    if not exe.is_file() or exe.stat().st_mtime < src.stat().st_mtime:
        cache.mkdir(parents=True, exist_ok=True)
        cmd = ["c++", "-std=c++20", "-O2", "-mavx512f", "-pthread", str(src), "-o", str(exe)]
        log("$ " + shlex.join(cmd))
        subprocess.run(cmd, check=True)
    return exe


def probe(exe: Path) -> dict:
    out = subprocess.run([str(exe), "--reps", "3"], check=True, capture_output=True, text=True)
    p = json.loads(out.stdout.strip().splitlines()[-1])
    p["time"] = time.time()
    p["state"] = "two paths" if p["read_scaling"] >= TWO_PATHS else "one path"
    return p


def engine_command(engine: str, args, threads: int) -> list[str]:
    if engine == "llama.cpp":
        depth = ["-d", str(args.depth)] if args.depth else []
        return [str(llama_cpp_peer.build_dir(args.cache_dir) / "bin" / "llama-bench"), "-m",
                str(args.gguf), "-t", str(threads), "-p", "0", "-n", str(args.decode_tokens),
                *depth, "-r", str(args.reps), "-o", "json", *shlex.split(args.llama_args)]
    executor = engine.removeprefix("metrale-")
    cmd = [str(args.metrale_bin), "bench", "-m", str(args.model_dir), "-t", str(threads),
           "--executor", executor, "--prefill", "16", "--batch", "1",
           "--decode-tokens", str(args.decode_tokens), "--reps", str(args.reps),
           "--no-bandwidth", "--json", *shlex.split(args.metrale_args)]
    if args.depth:
        cmd += ["--depth", str(args.depth)]
    if executor == "circuit":
        cmd += ["--fusion", args.fusion]
    return cmd


def run_engine(engine: str, cmd: list[str], timeout: float) -> dict:
    log("$ " + shlex.join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{engine} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    if engine == "llama.cpp":
        rows = json.loads(proc.stdout)
        return {"tps": rows[0]["avg_ts"], "runs": rows[0].get("samples_ts", []),
                "build_commit": rows[0].get("build_commit"), "kv": rows[0].get("type_k")}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    d = json.loads(lines[-1])
    return {"tps": d["decode"]["1"], "runs": d.get("decode_runs", {}).get("1", []),
            "barriers_per_step": d.get("barriers_per_step"), "kv": d.get("kv_dtype"),
            "active_weight_bytes": d.get("active_weight_bytes"),
            "kv_bytes_per_token": d.get("kv_bytes_per_token")}


def roofline_fraction(s: dict, bytes_per_token: float) -> float:
    """tokens/s x the weight bytes a step reads, over the read bandwidth the probes before and
    after the run measured with as many threads as the run used (their mean)."""
    key = "read_gbs_1" if s["threads"] == 1 else "read_gbs_2"
    gbs = (s["probe_before"][key] + s["probe_after"][key]) / 2
    return s["tps"] * bytes_per_token / (gbs * 1e9)


def summarize(samples: list[dict], threads: list[int]) -> tuple[dict, str]:
    """Medians per (threads, label, engine), and the markdown table."""
    summary: dict = {}
    # The weights a step reads (metrale's count; llama.cpp reads the same bf16 weights), and at
    # depth the KV cache (metrale's bytes per token: with --kv-dtype bf16 as many as
    # llama.cpp's f16).
    step_bytes = next((s["active_weight_bytes"] for s in samples
                       if s.get("active_weight_bytes")), None)
    kv = next((s["kv_bytes_per_token"] for s in samples if s.get("kv_bytes_per_token")), 0)
    if step_bytes:
        step_bytes += kv * max((s.get("depth", 0) for s in samples), default=0)
    lines = ["| threads | host state | runs per engine | metrale layers | metrale circuit | "
             "llama.cpp | layers / llama.cpp | circuit / llama.cpp | of the probe's roofline "
             "(layers, circuit, llama.cpp) | spread within the state (max / min - 1: layers, "
             "circuit, llama.cpp) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for t in threads:
        for label in ("two paths", "one path", "changed", "all"):
            cell = {}
            for e in ENGINES:
                v = [s["tps"] for s in samples if s["threads"] == t and s["engine"] == e and
                     (label == "all" or s["label"] == label)]
                if v:
                    cell[e] = {"n": len(v), "median": statistics.median(v), "min": min(v),
                               "max": max(v)}
                    if step_bytes:
                        cell[e]["roofline_fraction"] = statistics.median(
                            roofline_fraction(s, step_bytes) for s in samples
                            if s["threads"] == t and s["engine"] == e and
                            (label == "all" or s["label"] == label))
            if not cell:
                continue
            summary.setdefault(str(t), {})[label] = cell

            def med(e):
                return f"{cell[e]['median']:.1f}" if e in cell else "-"

            def ratio(a, b):
                return (f"{cell[a]['median'] / cell[b]['median']:.2f}"
                        if a in cell and b in cell else "-")

            def roof(e):
                f = cell.get(e, {}).get("roofline_fraction")
                return f"{f:.0%}" if f is not None else "-"

            def spread(e):
                return f"{cell[e]['max'] / cell[e]['min'] - 1:.0%}" if e in cell else "-"

            ns = "/".join(str(cell[e]["n"]) if e in cell else "0" for e in ENGINES)
            lines.append(f"| {t} | {label} | {ns} | {med('metrale-layers')} | "
                         f"{med('metrale-circuit')} | {med('llama.cpp')} | "
                         f"{ratio('metrale-layers', 'llama.cpp')} | "
                         f"{ratio('metrale-circuit', 'llama.cpp')} | "
                         f"{roof('metrale-layers')}, {roof('metrale-circuit')}, "
                         f"{roof('llama.cpp')} | "
                         f"{spread('metrale-layers')}, {spread('metrale-circuit')}, "
                         f"{spread('llama.cpp')} |")
    return summary, "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-shape", required=True, help="a run.py shape (its cached checkpoint)")
    ap.add_argument("--cache-dir", type=Path, default=REPO / "build" / "bench-cache")
    ap.add_argument("--metrale-bin", type=Path, default=REPO / "build/release/src/metrale")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--decode-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--fusion", default="default", help="the circuit's fusion policy")
    ap.add_argument("--depth", type=int, default=0,
                    help="tokens of context before the timed steps (metrale --depth, llama-bench "
                         "-d); 0: metrale after 16, llama.cpp from an empty cache")
    ap.add_argument("--metrale-args", default="", help="more flags for every metrale bench")
    ap.add_argument("--llama-args", default="", help="more flags for every llama-bench")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--summarize", action="store_true",
                    help="only remake <out>/table.md from <out>/results.json")
    args = ap.parse_args()
    if args.summarize:
        results = json.loads((args.out / "results.json").read_text())
        threads = sorted({s["threads"] for s in results["samples"]})
        results["summary"], table = summarize(results["samples"], threads)
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
        (args.out / "table.md").write_text(table)
        print(table)
        return 0
    threads = [int(t) for t in args.threads.split(",")]
    args.cache_dir = args.cache_dir.resolve()
    args.model_dir = args.cache_dir / "checkpoints" / args.model_shape
    ggufs = sorted((args.cache_dir / "gguf").glob(
        f"{args.model_shape}-*-bf16-lcp{llama_cpp_peer.VERSION}.gguf"))
    if not args.model_dir.is_dir() or not ggufs:
        sys.exit(f"no checkpoint / bf16 GGUF for {args.model_shape} under {args.cache_dir}: run "
                 f"python3 bench/compare/run.py --model-shape {args.model_shape} --engines "
                 f"metrale,llama.cpp --cache-dir {args.cache_dir} --prepare-only")
    args.gguf = ggufs[-1]
    exe = ensure_probe(args.cache_dir)
    args.out.mkdir(parents=True, exist_ok=True)

    greedy = compare.greedy_check(args.metrale_bin, args.model_dir, args.cache_dir, args.gguf,
                                  max(threads), 16, [], "bf16", args.timeout)
    log(f"greedy: first difference at {greedy.get('first_difference')}")
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    results = {"command": shlex.join([sys.executable, *sys.argv]), "flags": vars(args) | {
        "cache_dir": str(args.cache_dir), "metrale_bin": str(args.metrale_bin),
        "model_dir": str(args.model_dir), "gguf": str(args.gguf), "out": str(args.out)},
        "metrale_head": head, "llama_cpp": llama_cpp_peer.source_info(args.cache_dir),
        "two_paths_threshold": TWO_PATHS, "greedy": greedy, "probes": [], "samples": []}
    results["flags"].pop("model_dir", None)
    last = probe(exe)
    results["probes"].append(last)
    for r in range(args.rounds):
        for t in threads:
            order = ENGINES[r % 3:] + ENGINES[:r % 3]
            for e in order:
                cmd = engine_command(e, args, t)
                load = Path("/proc/loadavg").read_text().split()[0]
                res = run_engine(e, cmd, args.timeout)
                after = probe(exe)
                results["probes"].append(after)
                label = last["state"] if last["state"] == after["state"] else "changed"
                results["samples"].append({"round": r, "threads": t, "engine": e, "label": label,
                                           "probe_before": last, "probe_after": after,
                                           "command": cmd, "load_1min": float(load),
                                           "depth": args.depth, **res})
                log(f"round {r} t={t} {e}: {res['tps']:.1f} tok/s ({label}; read x2 "
                    f"{last['read_scaling']:.2f} -> {after['read_scaling']:.2f})")
                last = after
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
    results["summary"], table = summarize(results["samples"], threads)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    (args.out / "table.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
