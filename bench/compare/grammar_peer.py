#!/usr/bin/env python3
"""Structured outputs' cost per output token, metrale serve beside llama-server, in one run:
the same greedy chat decode unconstrained and constrained by the same JSON schema
(`response_format: {"type": "json_schema", ...}` on /v1/chat/completions, both servers), at 1
and 16 concurrent requests, on the same weights.

    python3 bench/compare/grammar_peer.py --models demo,random-qwen3 --threads 2 \
        --concurrency 1,16 --tokens 128 --rounds 3 --passes 3 --out out/grammar_peer

Models (--models, comma-separated): `demo` is models/demo (1M parameters, 2,048-id vocabulary);
`random-qwen3` a one-layer Qwen3 (hidden 16) with seeded random bf16 weights beside the real
Qwen3 tokenizer (151,936 ids; tests/python/random_qwen3.py, seed --seed): its forward costs
next to nothing, so the mask over 151,936 ids is as large a share of a step as it can be;
any shape of tools/bench/make_random_checkpoint.py (e.g. qwen3-0.6b) works too. llama.cpp gets
the checkpoint's bf16 GGUF made by the pinned converter (tools/bench/llama_cpp_peer.py, as
serve_bench.py; a Qwen3 tokenizer whose pre-tokenizer hash the converter does not know, the
demo's, is recorded as qwen2's: see llama_cpp_peer.converter_options).

The schema (SCHEMA): an object with one free string, {"verse": string}, no other property.
A model writing inside the string can go on for as long as the budget allows (the demo model
writes King James text, which has no double quote; the random model's greedy pick closes the
string only if its argmax over the allowed ids lands on one of the few ids that start with a
quote and fit the grammar; see PROMPTS). Every request decodes exactly --tokens tokens: plain
ones with `ignore_eos: true`; constrained ones end inside the string, where the grammar allows
no eos, so the budget ends them too (they leave ignore_eos off: llama-server bans eos under
ignore_eos, and a document that closed early then left no token its grammar allowed, which it
answered with a 500). Both engines thus do the same steps in both modes; each reply's
usage.completion_tokens and finish_reason ("length") are checked, and a reply that ends
otherwise is counted in the table (`short`).

Validation of every constrained reply (both engines): a reply cut by the budget is a prefix
of a document, so it is checked strictly as one: the shortest closing (one of `""`, `"}"`,
`"\\"}"`, `"\\\\\\"}"`, `0..0"}` after a cut \\u escape) must make text that json.loads parses and
the `jsonschema` package validates against SCHEMA, and the text must be the reply's whole
content. Besides, each server first answers --check-requests untimed requests with
SCHEMA_BOUNDED (the same object, the string at most 24 characters), ignore_eos off: those
replies must end by themselves (finish_reason "stop") as complete documents that parse and
validate; their count is in the table too.

Timing: one server per engine, model and pass (metrale --max-seqs 16; llama-server --parallel
16; the same --threads for everything else), checked with /health, warmed up (one plain and
one constrained request), then for each --concurrency C, --rounds rounds, each a plain and a
constrained batch (which goes first alternates by round): C requests sent together,
each with a prompt of its own (PROMPTS; the same C prompts in both modes). Per batch: ms per
output token of one stream = wall time (first send to last byte) / (generated tokens / C), the
way grammar_overhead.py counts; tokens/s = generated tokens / wall. The engines alternate
which goes first in each pass, so a slow phase of the machine hits both; the load average is
recorded at the start of every batch. Reported per engine, model and C: the median over all
rounds of all passes of each mode, the overhead (constrained median / plain median - 1), and
the per-pass overheads (each pass's medians), whose spread shows the noise, and the same from
the fastest batch of each mode (on a shared machine, other work only adds time). Beside them:
the server process's CPU time (user + system, all threads, /proc/PID/stat) over all batches of
a mode / all tokens generated in them (threads that spin while waiting count too).

Server flags (serve_bench.Engines, all recorded in results.json): metrale serve --model DIR
--host 127.0.0.1 --port P --threads T --max-seqs 16 --compute bf16 --kv-tokens 17 x ctx
--chat-template bench/compare/chatml.jinja; llama-server -m GGUF --host 127.0.0.1 --port P
--threads T --threads-batch T --parallel 16 -c 16 x ctx --cont-batching -lm none --metrics
--no-jinja --chat-template chatml; ctx = --tokens + 128. Both render ChatML (the prompt token
counts in results.json agree). llama-server's legacy (non-Jinja) template path is deliberate:
there its response_format becomes json_schema_to_grammar's grammar of the schema and the reply's
content is the generated text; on its Jinja path (this version's default) the schema is wrapped
in its response-format parser (free whitespace before the document, an optional json fence),
the demo model spent its whole budget on that whitespace, and a reply cut by the budget comes
back as the part that parser accepted, not the text. Requests: temperature 0, max_tokens
--tokens, not streamed (the reply and its usage block in one response,
so the Python client's work per token does not dilute the figures; --stream streams them, with
include_usage), llama-server also cache_prompt (its default).

Outputs in --out: results.json (the command, every option, both servers' command lines and
logs, metrale's commit and `serve --help`, the llama-cpp-python pin, the vendored llama.cpp
commit and `llama-server --version`, the machine, every batch's timings, load average, every
reply's token count, finish reason and validation) and table.md (headed by the command).
See docs/performance.md ("Structured outputs beside llama-server").
"""

import argparse
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "bench"))
sys.path.insert(0, str(REPO / "tests" / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import llama_cpp_peer  # noqa: E402
import make_random_checkpoint  # noqa: E402
import prereqs  # noqa: E402
import run as compare  # noqa: E402  (bench/compare/run.py: build, machine and git helpers)
import serve_bench as sb  # noqa: E402  (servers, streaming requests, binaries, versions)
from random_qwen3 import random_qwen3  # noqa: E402

CHAT_TEMPLATE = Path(__file__).resolve().parent / "chatml.jinja"  # metrale's copy of chatml
SCHEMA = {"type": "object", "properties": {"verse": {"type": "string"}},
          "required": ["verse"], "additionalProperties": False}
SCHEMA_BOUNDED = {"type": "object", "properties": {"verse": {"type": "string", "maxLength": 24}},
                  "required": ["verse"], "additionalProperties": False}
# One prompt per concurrent request: the first 16 of 44 King James openings with which neither
# engine's greedy constrained reply on random-qwen3 (seed 0) closed the string within 128
# tokens (one request at a time); the other 15 closed it after 7 to 64 tokens on one engine or
# both (the demo model never writes a double quote). Every reply is checked anyway (short).
PROMPTS = ["In the beginning", "The LORD is my shepherd", "And it came to pass",
           "And Jesus answered", "Thus saith the LORD", "Praise ye the LORD", "Behold, I send",
           "For God so loved", "Let there be light", "Blessed are the meek",
           "The heavens declare", "Comfort ye my people", "Give ear, O ye heavens",
           "Vanity of vanities", "Love thy neighbour", "Seek ye first the kingdom"]
CTX_EXTRA = 128  # per-slot context beyond --tokens (the prompt and a margin)
RANDOM_QWEN3 = "random-qwen3"
CHECK_TOKENS = 64  # at least this budget for the complete-document checks (24 characters + {})
MODES = ("plain", "constrained")


def log(msg: str) -> None:
    print(f"[grammar] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- models


def ensure_xgrammar() -> None:
    """xgrammar's sources for metrale's structured outputs (scripts/fetch-xgrammar.sh; quick
    when present), and the release build reconfigured when it was configured without them
    (cmake/xgrammar.cmake looks for them at configure time; without them every constrained
    request is a 400): its build.ninja then has no metrale_xgrammar target."""
    subprocess.run(["bash", str(REPO / "scripts" / "fetch-xgrammar.sh")], check=True)
    ninja = sb.RELEASE / "build.ninja"
    if ninja.is_file() and "metrale_xgrammar" not in ninja.read_text():
        subprocess.run(["cmake", "--preset", "release"], cwd=REPO, check=True, stdout=sys.stderr)


def model_dir(name: str, cache: Path, seed: int) -> Path:
    """The checkpoint directory of a --models name, made on demand."""
    if name == "demo":
        return REPO / "models" / "demo"
    if name == RANDOM_QWEN3:
        d = cache / "checkpoints" / f"{RANDOM_QWEN3}-1L-seed{seed}"
        if not (d / "config.json").is_file():
            log(f"writing {d} (random_qwen3, seed {seed})")
            d.mkdir(parents=True, exist_ok=True)
            random_qwen3(d, random.Random(seed).randbytes)
        return d
    return make_random_checkpoint.ensure(compare.shape_arg(name), cache / "checkpoints", seed)


def vocab_size(d: Path) -> int | None:
    return json.loads((d / "config.json").read_text()).get("vocab_size")


# --------------------------------------------------------------------------- validation


# Closings tried on a reply the budget cut: nothing (complete), the object, the string and the
# object, a dangling backslash's escape, a \u escape's missing hex digits.
CLOSINGS = ["", "}", '"}', '\\"}'] + ["0" * k + '"}' for k in range(1, 4)]


def validate(text: str, finish_reason: str | None, schema: dict) -> dict:
    """Whether a constrained reply is valid: a complete reply (finish "stop") must parse and
    validate as it is; one the budget cut (finish "length") must be a prefix of a valid
    document, closed by the first of CLOSINGS that makes it parse and validate."""
    import jsonschema
    closings = [""] if finish_reason == "stop" else CLOSINGS
    last = None
    for c in closings:
        try:
            doc = json.loads(text + c)
        except json.JSONDecodeError as e:
            last = f"JSON: {e}"
            continue
        try:
            jsonschema.validate(doc, schema)
        except jsonschema.ValidationError as e:
            last = f"schema: {e.message}"
            continue
        return {"valid": True, "closing": c, "complete": c == "" and finish_reason == "stop"}
    return {"valid": False, "why": last, "text_head": text[:200]}


# --------------------------------------------------------------------------- requests


def chat_body(eng: sb.Engines, engine: str, model_id: str, prompt: str, max_tokens: int,
              schema: dict | None, ignore_eos: bool = True, stream: bool = False) -> dict:
    b = {"model": model_id, "messages": [{"role": "user", "content": prompt}],
         "max_tokens": max_tokens, "temperature": 0, "ignore_eos": ignore_eos, "stream": stream,
         **eng.request_extra(engine)}
    if stream:
        b["stream_options"] = {"include_usage": True}
    if schema is not None:
        b["response_format"] = {"type": "json_schema",
                                "json_schema": {"name": "verse", "schema": schema,
                                                "strict": True}}
    return b


def chat(srv: sb.Server, body: dict, timeout: float) -> dict:
    """One /v1/chat/completions request (streaming if the body says so): t_send (monotonic),
    total seconds, ttft (streaming only), the reply's text, finish reason, usage counts and
    error (None when it went well)."""
    if body["stream"]:
        r = sb.stream_completion(srv.port, body, timeout, path="/v1/chat/completions",
                                 keep_text=True)
        r.pop("chunk_times")
        return r
    out = {"t_send": time.monotonic(), "ttft": None, "text": "", "finish_reason": None,
           "completion_tokens": None, "prompt_tokens": None, "error": None}
    try:
        status, obj = sb.http_json(srv.port, "POST", "/v1/chat/completions", body, timeout)
    except OSError as e:
        status, obj = None, f"{type(e).__name__}: {e}"
    out["total"] = time.monotonic() - out["t_send"]
    if status != 200 or not isinstance(obj, dict) or not obj.get("choices"):
        out["error"] = f"HTTP {status}: {str(obj)[:500]}"
        return out
    choice = obj["choices"][0]
    out["text"] = (choice.get("message") or {}).get("content") or ""
    out["finish_reason"] = choice.get("finish_reason")
    usage = obj.get("usage") or {}
    out["completion_tokens"] = usage.get("completion_tokens")
    out["prompt_tokens"] = usage.get("prompt_tokens")
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and all its threads so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def batch(srv: sb.Server, eng: sb.Engines, engine: str, concurrency: int, tokens: int,
          constrained: bool, timeout: float, stream: bool) -> dict:
    """One batch: `concurrency` chat requests sent together."""
    results: list[dict | None] = [None] * concurrency
    barrier = threading.Barrier(concurrency + 1)
    schema = SCHEMA if constrained else None

    def client(i: int) -> None:
        barrier.wait()
        results[i] = chat(srv, chat_body(eng, engine, srv.model_id, PROMPTS[i % len(PROMPTS)],
                                         tokens, schema, ignore_eos=not constrained,
                                         stream=stream), timeout)

    threads = [threading.Thread(target=client, args=(i,), daemon=True)
               for i in range(concurrency)]
    for t in threads:
        t.start()
    load = os.getloadavg()
    cpu0 = cpu_seconds(srv.proc.pid)
    barrier.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join()
    cpu = cpu_seconds(srv.proc.pid) - cpu0
    ends = [r["t_send"] + r["total"] for r in results if r["total"] is not None]
    wall = (max(ends) if ends else time.monotonic()) - t0
    ok = [r for r in results if not r["error"]]
    generated = sum(int(r["completion_tokens"] or 0) for r in ok)
    short = [r for r in ok if r["completion_tokens"] != tokens or r["finish_reason"] != "length"]
    checks = [validate(r["text"], r["finish_reason"], SCHEMA) for r in ok] if constrained else []
    per_stream = generated / concurrency
    return {"mode": "constrained" if constrained else "plain", "concurrency": concurrency,
            "loadavg": load, "wall_seconds": wall, "generated_tokens": generated,
            "ms_per_token": 1e3 * wall / per_stream if per_stream else None,
            "tokens_per_second": generated / wall if wall > 0 else None,
            "server_cpu_seconds": cpu,
            "errors": len(results) - len(ok), "short": len(short),
            "valid": sum(1 for c in checks if c["valid"]),
            "replies": [{"completion_tokens": r["completion_tokens"],
                         "prompt_tokens": r["prompt_tokens"], "finish_reason": r["finish_reason"],
                         "ttft": r["ttft"], "total": r["total"], "error": r["error"],
                         "text": r["text"][:400], **({"check": checks[k]} if checks else {})}
                        for k, r in enumerate(ok)],
            "first_errors": [r["error"] for r in results if r["error"]][:3]}


def completion_checks(srv: sb.Server, eng: sb.Engines, engine: str, n: int, tokens: int,
                      timeout: float) -> dict:
    """n untimed requests with SCHEMA_BOUNDED and ignore_eos off: each must end by itself as a
    complete document that validates."""
    out = []
    for i in range(n):
        r = chat(srv, chat_body(eng, engine, srv.model_id, PROMPTS[i % len(PROMPTS)], tokens,
                                SCHEMA_BOUNDED, ignore_eos=False), timeout)
        check = validate(r["text"], r["finish_reason"], SCHEMA_BOUNDED) if not r["error"] else \
            {"valid": False, "why": r["error"]}
        out.append({"completion_tokens": r["completion_tokens"],
                    "finish_reason": r["finish_reason"], "text": r["text"],
                    "error": r["error"], "check": check})
    return {"requests": n, "complete_and_valid": sum(1 for o in out if o["check"]["valid"] and
                                                     o["check"].get("complete")),
            "replies": out}


# --------------------------------------------------------------------------- summary


def summarize(results: dict) -> list[dict]:
    """Per (model, engine, concurrency): medians over every round of every pass of each mode,
    the overhead, each pass's overhead, counts of replies and checks."""
    rows = []
    cfg = results["config"]
    for model in cfg["models"]:
        for engine in cfg["engines"]:
            for c in cfg["concurrency"]:
                runs = [r for r in results["runs"] if r["model"] == model and
                        r["engine"] == engine and "batches" in r]
                bs = {m: [b for r in runs for b in r["batches"]
                          if b["concurrency"] == c and b["mode"] == m] for m in MODES}
                if not bs["plain"] or not bs["constrained"]:
                    continue
                med = {m: statistics.median(b["ms_per_token"] for b in bs[m]
                                            if b["ms_per_token"]) for m in MODES}
                best = {m: min(b["ms_per_token"] for b in bs[m] if b["ms_per_token"])
                        for m in MODES}
                tps = {m: statistics.median(b["tokens_per_second"] for b in bs[m]
                                            if b["tokens_per_second"]) for m in MODES}
                cpu = {m: 1e3 * sum(b["server_cpu_seconds"] for b in bs[m]) /
                       max(1, sum(b["generated_tokens"] for b in bs[m])) for m in MODES}
                per_pass = []
                for r in runs:
                    p = {m: [b["ms_per_token"] for b in r["batches"]
                             if b["concurrency"] == c and b["mode"] == m and b["ms_per_token"]]
                         for m in MODES}
                    if p["plain"] and p["constrained"]:
                        per_pass.append(100 * (statistics.median(p["constrained"]) /
                                               statistics.median(p["plain"]) - 1))
                loads = [b["loadavg"][0] for m in MODES for b in bs[m]]
                replies = [x for b in bs["constrained"] for x in b["replies"]]
                rows.append({
                    "model": model, "engine": engine, "concurrency": c,
                    "batches_per_mode": len(bs["plain"]),
                    "plain_ms_per_token": med["plain"],
                    "constrained_ms_per_token": med["constrained"],
                    "overhead_pct": 100 * (med["constrained"] / med["plain"] - 1),
                    "overhead_pct_per_pass": per_pass,
                    "plain_best_ms_per_token": best["plain"],
                    "constrained_best_ms_per_token": best["constrained"],
                    "overhead_pct_best": 100 * (best["constrained"] / best["plain"] - 1),
                    "plain_cpu_ms_per_token": cpu["plain"],
                    "constrained_cpu_ms_per_token": cpu["constrained"],
                    "plain_tokens_per_second": tps["plain"],
                    "constrained_tokens_per_second": tps["constrained"],
                    "loadavg_1min_range": [min(loads), max(loads)],
                    "constrained_replies": len(replies),
                    "constrained_valid": sum(1 for x in replies if x["check"]["valid"]),
                    "short": sum(b["short"] for m in MODES for b in bs[m]),
                    "errors": sum(b["errors"] for m in MODES for b in bs[m]),
                    "replies": sum(len(b["replies"]) for m in MODES for b in bs[m])})
    return rows


def markdown(results: dict) -> str:
    cfg = results["config"]
    ver = cfg.get("llama_cpp") or {}
    met = (cfg.get("metrale") or {}).get("git") or {}
    lines = [f"    {results['command']}", "",
             f"{cfg['threads']} thread(s) per server, 16 sequences each (metrale --max-seqs 16, "
             f"llama-server --parallel 16); {cfg['tokens']} tokens per request, greedy (plain: "
             f"ignore_eos; constrained: the budget ends them inside the string); {cfg['rounds']} round(s) x {cfg['passes']} pass(es); schema "
             f"`{json.dumps(SCHEMA, separators=(',', ':'))}`; metrale "
             f"{(met.get('commit') or '?')[:10]}"
             + (" (modified)" if met.get("modified_files") else "")
             + f"; llama.cpp {ver.get('llama_cpp_commit', '—')} ({ver.get('package', '—')}); "
             f"load average {cfg['loadavg_start'][0]:.1f} at the start, "
             f"{cfg.get('loadavg_end', [float('nan')])[0]:.1f} at the end.", "",
             "Medians over every batch of every pass (best: the fastest batch of each mode); "
             "ms per output token of one stream; tok/s: all streams' tokens / wall time.", "",
             "| model | engine | concurrent | plain ms/token | constrained ms/token | overhead "
             "(each pass's) | best: plain / constrained, overhead | plain tok/s | constrained "
             "tok/s | server CPU ms/token: plain / constrained | load (1 min) | valid "
             "constrained replies | short / errors |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results["summary"]:
        passes = ", ".join(f"{v:+.1f}" for v in r["overhead_pct_per_pass"])
        lines.append(
            f"| {r['model']} | {r['engine']} | {r['concurrency']} | "
            f"{r['plain_ms_per_token']:.3f} | {r['constrained_ms_per_token']:.3f} | "
            f"**{r['overhead_pct']:+.1f}%** ({passes}) | {r['plain_best_ms_per_token']:.3f} / "
            f"{r['constrained_best_ms_per_token']:.3f}, {r['overhead_pct_best']:+.1f}% | "
            f"{r['plain_tokens_per_second']:.0f} | "
            f"{r['constrained_tokens_per_second']:.0f} | "
            f"{r['plain_cpu_ms_per_token']:.3f} / {r['constrained_cpu_ms_per_token']:.3f} | "
            f"{r['loadavg_1min_range'][0]:.1f}-{r['loadavg_1min_range'][1]:.1f} | "
            f"{r['constrained_valid']} / {r['constrained_replies']} | "
            f"{r['short']} / {r['errors']} |")
    checks = [f"{c['model']} {c['engine']}: {c['complete_and_valid']} / {c['requests']}"
              for c in results["completion_checks"]]
    if checks:
        lines += ["", "Complete replies (SCHEMA_BOUNDED, ignore_eos off) that ended by "
                  "themselves and validate: " + "; ".join(checks) + "."]
    if results["failures"]:
        lines += ["", f"{len(results['failures'])} failure(s): see failures in results.json."]
    return "\n".join(lines)


def write(results: dict, out: Path) -> str:
    results["summary"] = summarize(results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    md = markdown(results)
    (out / "table.md").write_text(md + "\n")
    return md


# --------------------------------------------------------------------------- main


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default="metrale,llama.cpp",
                    help="comma-separated subset of metrale,llama.cpp")
    ap.add_argument("--models", default=f"demo,{RANDOM_QWEN3}",
                    help=f"comma-separated: demo, {RANDOM_QWEN3}, or make_random_checkpoint "
                         "shapes")
    ap.add_argument("--seed", type=int, default=0, help="random weights' seed")
    ap.add_argument("--threads", type=int, default=2, help="compute threads of each server")
    ap.add_argument("--concurrency", type=compare.int_list, default=[1, 16])
    ap.add_argument("--tokens", type=int, default=128, help="tokens every request decodes")
    ap.add_argument("--rounds", type=int, default=3,
                    help="plain + constrained batches per concurrency per server")
    ap.add_argument("--passes", type=int, default=3,
                    help="servers per engine and model, the engines interleaved")
    ap.add_argument("--check-requests", type=int, default=4,
                    help="untimed complete-document requests per server (first pass)")
    ap.add_argument("--stream", action="store_true",
                    help="streaming requests (the client then parses every token's event)")
    ap.add_argument("--compute", choices=["bf16", "int8", "f32"], default="bf16",
                    help="metrale serve --compute")
    ap.add_argument("--metrale-args", default="", help="further `metrale serve` flags")
    ap.add_argument("--llama-args", default="", help="further llama-server flags")
    ap.add_argument("--metrale-bin", type=Path, default=sb.RELEASE / "src" / "metrale")
    ap.add_argument("--cache-dir", type=Path, default=llama_cpp_peer.DEFAULT_CACHE)
    ap.add_argument("--out", type=Path, default=REPO / "out" / "grammar_peer")
    ap.add_argument("--no-build", action="store_true",
                    help="never build metrale or llama-server; use what exists")
    ap.add_argument("--no-install", action="store_true",
                    help="do not install missing Python/Debian packages: name them and stop")
    ap.add_argument("--ready-timeout", type=float, default=600)
    ap.add_argument("--request-timeout", type=float, default=600)
    args = ap.parse_args()
    invoked = ["python3", os.path.relpath(Path(__file__).resolve(), Path.cwd()), *sys.argv[1:]]
    engines = [e for e in args.engines.split(",") if e]
    if not engines or set(engines) - set(sb.ENGINES):
        sys.exit(f"--engines: expected a subset of {list(sb.ENGINES)}, found {args.engines!r}")
    models = [m for m in args.models.split(",") if m]
    seqs = max(args.concurrency)
    ctx = args.tokens + CTX_EXTRA
    # serve_bench.Engines reads kv_budget and the extra flags from args; both servers render
    # ChatML (see the docstring: llama-server's legacy template path, not its Jinja one)
    args.kv_budget = None
    args.metrale_args = shlex.join(["--chat-template", str(CHAT_TEMPLATE)]) + " " + \
        args.metrale_args
    args.llama_args = "--no-jinja --chat-template chatml " + args.llama_args

    modules, debian = ["jsonschema"], []
    for m in models:
        if m not in ("demo", RANDOM_QWEN3) and not make_random_checkpoint.is_ready(
                compare.shape_arg(m), args.cache_dir / "checkpoints", args.seed):
            modules += make_random_checkpoint.python_needs(compare.shape_arg(m))
    if "llama.cpp" in engines:
        if not llama_cpp_peer.sdist_path(args.cache_dir).is_file():
            modules.append("pip")
        if not args.no_build and not llama_cpp_peer.server_tool_path(args.cache_dir).is_file():
            debian += list(prereqs.BUILD_TOOLS.values())
    if "metrale" in engines and not args.no_build and \
            args.metrale_bin == sb.RELEASE / "src" / "metrale":
        debian += prereqs.metrale_debian_packages()
    prereqs.ensure(modules, debian, install=not args.no_install)

    failures: list[dict] = []
    if "metrale" in engines and not args.no_build and \
            args.metrale_bin == sb.RELEASE / "src" / "metrale":
        ensure_xgrammar()
    metrale, llama_server, lsrc = sb.prepare_binaries(args, engines, failures)
    dirs = {m: model_dir(m, args.cache_dir, args.seed) for m in models}
    if "llama.cpp" in engines and any(
            not llama_cpp_peer.gguf_path(args.cache_dir, d, "bf16").is_file() for d in dirs.values()):
        prereqs.ensure(prereqs.GGUF_CONVERSION, [], install=not args.no_install)
    ggufs = {m: llama_cpp_peer.ensure_gguf(args.cache_dir, lsrc, d, "bf16")
             if "llama.cpp" in engines else None for m, d in dirs.items()}
    eng = sb.Engines(args, metrale, llama_server)
    versions = sb.engine_versions(args, eng)
    results = {
        "command": shlex.join(invoked),
        "config": {"engines": engines, "models": {m: {"dir": str(dirs[m]),
                                                       "gguf": str(ggufs[m]) if ggufs[m] else None,
                                                       "vocab_size": vocab_size(dirs[m])}
                                                   for m in models},
                   "threads": args.threads, "concurrency": args.concurrency,
                   "tokens": args.tokens, "rounds": args.rounds, "passes": args.passes,
                   "sequences_per_server": seqs, "context_per_sequence": ctx,
                   "schema": SCHEMA, "schema_bounded": SCHEMA_BOUNDED, "prompts": PROMPTS,
                   "chat_template": CHAT_TEMPLATE.read_text(),
                   "request_fields": {e: sorted(chat_body(eng, e, "<id>", "", 1, SCHEMA))
                                      for e in engines},
                   "args": {k: (str(v) if isinstance(v, Path) else v)
                            for k, v in vars(args).items()},
                   "argv": [sys.executable, *sys.argv], "cwd": str(Path.cwd()),
                   "metrale": versions.get("metrale"), "llama_cpp": versions.get("llama.cpp"),
                   "metrale_grammar_threads": os.environ.get("METRALE_GRAMMAR_THREADS"),
                   "python": {"executable": sys.executable, "version": sys.version.split()[0]},
                   "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                   "loadavg_start": os.getloadavg()},
        "machine": compare.lscpu_summary() | compare.thp_setting(),
        "runs": [], "completion_checks": [], "servers": [], "failures": failures,
    }
    logs = args.out / "logs"
    for p in range(args.passes):
        for model in models:
            order = engines[p % len(engines):] + engines[:p % len(engines)]
            for engine in order:
                port = sb.free_port()
                srv = sb.Server(engine, eng.command(engine, {"dir": dirs[model],
                                                             "gguf": ggufs[model]},
                                                    seqs, ctx, port), port,
                                logs / f"{engine}-{model}-pass{p + 1}.log")
                rec = {"engine": engine, "model": model, "pass": p + 1}
                try:
                    srv.start(args.ready_timeout)
                    for schema in (None, SCHEMA):  # warm-up (metrale compiles the grammar once)
                        w = chat(srv, chat_body(eng, engine, srv.model_id, PROMPTS[0], 8, schema),
                                 args.request_timeout)
                        if w["error"]:
                            raise RuntimeError(f"warm-up failed: {w['error']}")
                    if p == 0 and args.check_requests > 0:
                        cc = completion_checks(srv, eng, engine, args.check_requests,
                                               max(args.tokens, CHECK_TOKENS),
                                               args.request_timeout)
                        results["completion_checks"].append({"model": model, "engine": engine,
                                                             **cc})
                    rec["batches"] = []
                    for c in args.concurrency:
                        for r in range(args.rounds):
                            modes = (False, True) if (r + p) % 2 == 0 else (True, False)
                            for constrained in modes:
                                b = batch(srv, eng, engine, c, args.tokens, constrained,
                                          args.request_timeout, args.stream)
                                b["round"] = r + 1
                                rec["batches"].append(b)
                                log(f"pass {p + 1} {model} {engine} C={c} round {r + 1} "
                                    f"{b['mode']}: {b['ms_per_token']:.3f} ms/token, "
                                    f"{b['tokens_per_second']:.0f} tok/s, load "
                                    f"{b['loadavg'][0]:.1f}, short {b['short']}, errors "
                                    f"{b['errors']}"
                                    + (f", valid {b['valid']}/{c}" if constrained else ""))
                except Exception as e:  # noqa: BLE001 — one failed server does not stop the run
                    log(f"{engine} {model} pass {p + 1} failed: {e}")
                    rec["error"] = str(e)
                    failures.append({**rec})
                finally:
                    if srv.proc is not None and srv.proc.poll() is None:
                        srv.snapshot()
                    srv.stop()
                    results["servers"].append({**rec, **srv.record()})
                results["runs"].append(rec)
                write(results, args.out)
    results["config"]["loadavg_end"] = os.getloadavg()
    results["config"]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    md = write(results, args.out)
    print(md)
    log(f"wrote {args.out}/table.md, results.json")


if __name__ == "__main__":
    main()
