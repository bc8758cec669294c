#!/usr/bin/env python3
"""metrale's OpenAI-compatible server vs llama.cpp's llama-server, side by side, in one run.

    python3 bench/compare/serve_bench.py --engines metrale,llama.cpp --model-shape qwen3-0.6b \
        --hybrid-shape qwen3-next-L2 --threads 2 --clients 1,8,32 --requests-per-client 4 \
        --prompt-tokens 128 --max-tokens 64 --prefix-tokens 1500 --out out/serve

Both engines serve the same weights (metrale: the safetensors checkpoint directory; llama.cpp:
its bf16 GGUF made by the pinned converter) with the same thread count, one engine at a time,
each server a fresh process started for one part of the run, checked with /health, sent one
warm-up request, measured, then stopped (SIGTERM). Every request goes to /v1/completions with
`prompt` as a list of token ids, so both engines see the same tokens (no tokenizer, chat
template or BOS is involved), greedy (temperature 0) and `ignore_eos: true` so every request
generates exactly max_tokens tokens in both engines.

(a) Throughput: for each --clients level C, a server with C sequences (metrale --max-seqs C;
    llama-server --parallel C, -c C x the per-slot context, --cont-batching) and C client
    threads, each sending --requests-per-client streaming requests back to back, all starting
    together. Each request: --prompt-tokens fixed random token ids (seeded; the same ids for
    both engines, a different prompt per request), --max-tokens generated. Reported: total
    generated tokens / wall time (first send to last response), TTFT p50 / p99 (send to the
    first SSE event with text: see stream_completion()), time per output token p50 ((last
    text event - first) / (text events - 1)), request count and errors. Percentiles are
    nearest-rank over all requests of the level (with few requests p99 is the maximum).
(b) Shared-prefix TTFT, for the dense --model-shape and the hybrid --hybrid-shape: a server
    with one sequence and one client sending requests one at a time, each a --prefix-tokens
    prefix + a distinct --suffix-tokens suffix, --prefix-max-tokens generated. Cold: a fresh
    random prefix every request. Warm: one untimed request primes the cache with the shared
    prefix, then every timed request repeats that prefix with a suffix of its own. Reported:
    TTFT p50 cold and warm, warm / cold (< 1: the prefix cache pays off), and the cached
    prompt tokens each engine reports (usage.prompt_tokens_details.cached_tokens, when it
    does). llama-server gets `cache_prompt: true` (its default too); its slot keeps the last
    prompt's KV and reuses the longest common prefix; for a hybrid (recurrent) model it can
    only resume from one of the context checkpoints it saves near the end of each prompt
    (4 + ubatch and 4 tokens before it, this version's rule), not at the prefix boundary.
    metrale's prefix cache is on unless --metrale-args=--no-prefix-cache (a hybrid model
    resumes from the recurrent-state snapshots its prefix cache keeps, --state-snapshots).
(c) Greedy check: on each model, one non-streaming request (--greedy-tokens generated from a
    --prompt-tokens prompt of its own) per engine: metrale's /v1/completions with logprobs: 1
    (each token's text in logprobs.tokens; ids where a reply carries them), llama-server's
    native /completion with return_tokens: true (every generated id; its OpenAI logprobs skip
    tokens that end inside a UTF-8 character). The ids are compared where both have ids,
    else each token's text (llama.cpp's ids rendered through the checkpoint's tokenizer.json
    as metrale renders them), else the text, and the first differing step reported
    (results.json says which). Random weights give nearly flat logits, so an early
    difference at a near-tie is possible; it never fails the run. llama-server's
    ignore_eos also bans end-of-generation tokens (logit bias -inf); an engine that merely
    keeps going after one would differ where the argmax is an eos id.

Flags (each recorded in results.json, with the full server command lines):
  metrale serve:  --model DIR --host 127.0.0.1 --port P --threads T --max-seqs C
                  --compute bf16 (as run.py), --kv-budget BYTES when given, else --kv-tokens
                  (C + 1) x the per-slot context (llama-server's -c, plus one context's room
                  for the prefix cache, which shares metrale's KV pool), then --metrale-args.
                  Everything else at serve's defaults (results.json keeps `serve --help`):
                  --max-rows, its prefill chunk, is 128 where llama-server's ubatch is 512;
                  --metrale-args='--max-rows 512' gives it llama-server's.
  llama-server:   -m GGUF --host 127.0.0.1 --port P --threads T --threads-batch T --parallel C
                  -c C x (the longest request of the part + 64) --cont-batching -lm none (weights
                  in anonymous memory, as run.py's llama-bench; metrale's default --weights copy)
                  --metrics, then --llama-args. Everything else is this version's default
                  (batch 2048, ubatch 512, f16 KV cache, flash attention auto, --cache-ram 8192
                  MiB host prompt cache, 32 context checkpoints per slot).

Outputs in --out: results.json (the command, every option, each server's command, log file,
peak RSS (VmHWM) and /metrics text at the end, each engine's version / commit, machine facts
as run.py records them, every request's timings) and table.md (headed by the command that
produced it; also printed). Server logs: <out>/logs/. See docs/performance.md ("Serving").
"""

import argparse
import http.client
import json
import os
import random
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools" / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import llama_cpp_peer  # noqa: E402
import make_random_checkpoint  # noqa: E402
import prereqs  # noqa: E402
import run as compare  # noqa: E402  (bench/compare/run.py: build, machine and git helpers)

RELEASE = compare.RELEASE
ENGINES = ("metrale", "llama.cpp")
HOST = "127.0.0.1"
CTX_MARGIN = 64  # per-slot context beyond the longest request of a part (llama-server -c)
# Token ids the random prompts draw from: below Qwen3's special tokens (151643+), above the
# byte-level singletons, valid in every Qwen3 / Qwen3-Next vocabulary.
TOKEN_RANGE = (1000, 151000)


def log(msg: str) -> None:
    print(f"[serve] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- prompts


def random_ids(seed: str, n: int) -> list[int]:
    """n token ids, a pure function of the string seed (the same for both engines)."""
    rng = random.Random(seed)
    return [rng.randrange(*TOKEN_RANGE) for _ in range(n)]


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    s = sorted(values)
    k = max(1, int(-(-q * len(s) // 100)))  # ceil(q/100 * n), at least 1
    return s[min(k, len(s)) - 1]


# --------------------------------------------------------------------------- HTTP


def http_json(port: int, method: str, path: str, body: dict | None = None,
              timeout: float = 30) -> tuple[int, dict | str]:
    """(status, parsed JSON or text) of one plain request."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data,
                     headers={"Content-Type": "application/json"} if data else {})
        resp = conn.getresponse()
        raw = resp.read().decode("utf-8", "replace")
        try:
            return resp.status, json.loads(raw)
        except json.JSONDecodeError:
            return resp.status, raw
    finally:
        conn.close()


def event_text(obj: dict) -> str:
    """The text one SSE event carries: a completion choice's `text`, or a chat choice's
    `delta.content`."""
    return "".join(ch.get("text") or (ch.get("delta") or {}).get("content") or ""
                   for ch in obj.get("choices") or [])


def is_closing(obj: dict) -> bool:
    """The event that ends a completion: a choice with a finish_reason."""
    return any(ch.get("finish_reason") for ch in obj.get("choices") or [])


def stream_completion(port: int, body: dict, timeout: float, path: str = "/v1/completions",
                      keep_text: bool = False) -> dict:
    """Sends one streaming request to `path` (/v1/completions, or /v1/chat/completions: its
    delta.content is the text); returns its timings, in seconds after t_send (monotonic): ttft
    (the first event with text), text_events (events with text) and the time of each, total;
    the completion / cached tokens of the usage block, finish reason, error (None when it went
    well); with keep_text, the whole text as "text".

    Why text: the engines send events for different tokens. Both hold back a token that ends
    inside a UTF-8 character until the character is whole; a token that renders as nothing
    (a special or unused id, which random weights do pick) gets an empty-text event from
    llama-server and none from metrale. Timing the first event with text treats both alike.
    A stream with no text before its closing event (every token rendered as nothing or never
    completed a character) takes the closing event as its TTFT, flagged
    ttft_from_closing_event; with max_tokens 1 (part (b)'s default) that is exact."""
    out = {"t_send": None, "ttft": None, "ttft_from_closing_event": False, "first_event": None,
           "total": None, "text_events": 0, "events": 0, "chunk_times": [],
           "completion_tokens": None, "prompt_tokens": None, "cached_tokens": None,
           "finish_reason": None, "text_chars": 0, "error": None}
    if keep_text:
        out["text"] = ""
    closing = None
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        data = json.dumps(body).encode()
        t0 = time.monotonic()
        out["t_send"] = t0
        conn.request("POST", path, body=data,
                      headers={"Content-Type": "application/json",
                               "Accept": "text/event-stream"})
        resp = conn.getresponse()
        if resp.status != 200:
            out["error"] = f"HTTP {resp.status}: {resp.read()[:500].decode('utf-8', 'replace')}"
            return out
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            now = time.monotonic() - t0
            try:
                obj = json.loads(payload)
            except json.JSONDecodeError:
                out["error"] = f"unparseable SSE data: {payload[:200]!r}"
                break
            if "error" in obj:
                out["error"] = f"error event: {json.dumps(obj['error'])[:300]}"
                break
            if obj.get("choices"):
                out["events"] += 1
                if out["first_event"] is None:
                    out["first_event"] = now
            text = event_text(obj)
            if text:
                if out["ttft"] is None:
                    out["ttft"] = now
                out["text_events"] += 1
                out["chunk_times"].append(now)
                out["text_chars"] += len(text)
                if keep_text:
                    out["text"] += text
            if is_closing(obj):
                closing = now if closing is None else closing
                out["finish_reason"] = next(ch["finish_reason"] for ch in obj["choices"]
                                            if ch.get("finish_reason"))
            usage = obj.get("usage")
            if usage:
                out["completion_tokens"] = usage.get("completion_tokens")
                out["prompt_tokens"] = usage.get("prompt_tokens")
                out["cached_tokens"] = (usage.get("prompt_tokens_details") or {}).get(
                    "cached_tokens")
        out["total"] = time.monotonic() - t0
        if out["ttft"] is None and out["error"] is None:
            if closing is None:
                out["error"] = "the stream ended without text or a closing event"
            else:
                out["ttft"] = closing
                out["ttft_from_closing_event"] = True
    except (OSError, http.client.HTTPException) as e:
        out["error"] = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    return out


def generated_tokens(r: dict, max_tokens: int) -> int:
    """Tokens a finished request generated: the usage block's count (both engines send it
    with stream_options.include_usage), else max_tokens (ignore_eos)."""
    if r["completion_tokens"] is not None:
        return int(r["completion_tokens"])
    return max_tokens


# --------------------------------------------------------------------------- servers


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def help_options(cmd: list[str]) -> list[str]:
    """The long options a --help output lists."""
    r = subprocess.run(cmd, capture_output=True, text=True)
    return sorted(set(re.findall(r"(?m)^\s+(?:-\w+,\s*)?(--[a-z][a-z0-9-]*)", r.stdout + r.stderr)))


class Server:
    """One server process: started, waited for (/health), stopped; its log in a file."""

    def __init__(self, engine: str, cmd: list[str], port: int, log_path: Path):
        self.engine, self.cmd, self.port, self.log_path = engine, cmd, port, log_path
        self.proc: subprocess.Popen | None = None
        self.model_id = "default"
        self.peak_rss = None
        self.metrics_text = None
        self.load_seconds = None

    def start(self, timeout: float) -> None:
        log(f"$ {shlex.join(self.cmd)}  (log: {self.log_path})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.log_path, "w")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, stdout=fh, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        fh.close()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.engine} server exited with status "
                                   f"{self.proc.returncode} before it was ready:\n"
                                   + self.log_tail())
            try:
                status, _ = http_json(self.port, "GET", "/health", timeout=5)
                if status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() - t0 > timeout:
                self.stop()
                raise RuntimeError(f"{self.engine} server not ready after {timeout:.0f} s:\n"
                                   + self.log_tail())
            time.sleep(0.25)
        self.load_seconds = time.monotonic() - t0
        try:
            status, models = http_json(self.port, "GET", "/v1/models")
            if status == 200 and isinstance(models, dict) and models.get("data"):
                self.model_id = models["data"][0].get("id", self.model_id)
        except OSError:
            pass
        log(f"{self.engine} ready on port {self.port} after {self.load_seconds:.1f} s "
            f"(model id {self.model_id!r})")

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def snapshot(self) -> None:
        """Peak RSS so far (VmHWM) and the /metrics text, before stopping."""
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    self.peak_rss = int(line.split()[1]) * 1024
        except OSError:
            pass
        try:
            status, text = http_json(self.port, "GET", "/metrics", timeout=10)
            self.metrics_text = (text if isinstance(text, str) else json.dumps(text))[:20000] \
                if status == 200 else f"HTTP {status}"
        except OSError as e:
            self.metrics_text = f"unavailable: {e}"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            log(f"{self.engine} server ignored SIGTERM for 30 s; killing it")
            self.proc.kill()
            self.proc.wait()

    def record(self) -> dict:
        return {"command": self.cmd, "port": self.port, "log": str(self.log_path),
                "model_id": self.model_id, "ready_seconds": self.load_seconds,
                "peak_rss_bytes": self.peak_rss, "metrics_at_end": self.metrics_text,
                "exit_status": self.proc.returncode if self.proc else None}


class Engines:
    """How each engine's server is started, and what each request carries for it."""

    def __init__(self, args, metrale_bin: Path | None, llama_server: Path | None):
        self.args = args
        self.metrale_bin = metrale_bin
        self.llama_server = llama_server
        self.metrale_help = (help_options([str(metrale_bin), "serve", "--help"])
                             if metrale_bin else [])
        self.metrale_extra = shlex.split(args.metrale_args)
        self.llama_extra = shlex.split(args.llama_args)

    def command(self, engine: str, model: dict, seqs: int, ctx_per_seq: int,
                port: int) -> list[str]:
        a = self.args
        if engine == "metrale":
            cmd = [str(self.metrale_bin), "serve", "--model", str(model["dir"]), "--host", HOST,
                   "--port", str(port), "--threads", str(a.threads), "--max-seqs", str(seqs)]
            given = set(self.metrale_extra)
            if "--compute" not in given:
                cmd += ["--compute", a.compute]
            if a.kv_budget:
                cmd += ["--kv-budget", a.kv_budget]
            elif "--kv-tokens" in self.metrale_help and not given & {"--kv-tokens",
                                                                      "--kv-budget"}:
                # every sequence's context, as llama-server's -c, plus one more for the
                # prefix cache: metrale keeps cached prefixes in the same KV pool (llama-server
                # keeps its slot's KV and a --cache-ram host copy besides), and with no room
                # beyond the running sequences it evicts the prefix to admit the next request
                cmd += ["--kv-tokens", str((seqs + 1) * ctx_per_seq)]
            return cmd + self.metrale_extra
        return [str(self.llama_server), "-m", str(model["gguf"]), "--host", HOST, "--port",
                str(port), "--threads", str(a.threads), "--threads-batch", str(a.threads),
                "--parallel", str(seqs), "-c", str(seqs * ctx_per_seq), "--cont-batching",
                "-lm", "none", "--metrics", *self.llama_extra]

    @staticmethod
    def request_extra(engine: str) -> dict:
        """Fields one engine's requests carry beyond the common OpenAI ones."""
        return {"cache_prompt": True} if engine == "llama.cpp" else {}

    def body(self, engine: str, model_id: str, prompt: list[int], max_tokens: int,
             stream: bool = True) -> dict:
        b = {"model": model_id, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
             "ignore_eos": True, "stream": stream, **self.request_extra(engine)}
        if stream:
            b["stream_options"] = {"include_usage": True}
        return b


def prepare_binaries(args, engines: list[str], failures: list[dict]
                     ) -> tuple[Path | None, Path | None, Path | None]:
    """(metrale binary, llama-server binary, vendored llama.cpp source) for the engines asked
    for: metrale's release build made unless --no-build or --metrale-bin names another binary,
    and checked to answer `serve --help`; llama-server built once from the pinned source
    (llama_cpp_peer.ensure_server_tool). An engine that cannot run is removed from `engines`
    with a failure recorded; none left stops the run. args: metrale_bin, no_build, cache_dir."""
    metrale = llama_server = None
    if "metrale" in engines:
        if not args.no_build and args.metrale_bin == RELEASE / "src" / "metrale":
            compare.build_release(["metrale"])
        if not args.metrale_bin.is_file():
            why = f"{args.metrale_bin} not found"
        else:
            r = subprocess.run([str(args.metrale_bin), "serve", "--help"], capture_output=True,
                               text=True)
            why = None if r.returncode == 0 and "--port" in r.stdout + r.stderr else \
                f"`{args.metrale_bin} serve --help` failed or lists no --port (status " \
                f"{r.returncode}): {(r.stderr or r.stdout)[-300:]}"
        if why:
            log(f"metrale skipped: {why}")
            failures.append({"engine": "metrale", "part": "setup", "error": why})
            engines.remove("metrale")
        else:
            metrale = args.metrale_bin
    lsrc = None
    if "llama.cpp" in engines:
        lsrc = llama_cpp_peer.ensure_source(args.cache_dir)
        tool = llama_cpp_peer.server_tool_path(args.cache_dir)
        if not tool.is_file() and not args.no_build:
            llama_cpp_peer.ensure_server_tool(args.cache_dir, lsrc)
        if tool.is_file():
            llama_server = tool
        else:
            why = f"{tool} not found (--no-build)"
            log(f"llama.cpp skipped: {why}")
            failures.append({"engine": "llama.cpp", "part": "setup", "error": why})
            engines.remove("llama.cpp")
    if not engines:
        sys.exit("no engine left to run")
    return metrale, llama_server, lsrc


def engine_versions(args, eng: Engines) -> dict:
    """What results.json records of each engine's binary: metrale's commit (git_state: no
    --version; the commit it was built from identifies it), binary mtime and `serve --help`;
    llama-server's pin (llama_cpp_peer.server_info) and `--version` output."""
    versions = {}
    metrale, llama_server = eng.metrale_bin, eng.llama_server
    if metrale:
        versions["metrale"] = {
            "binary": str(metrale),
            "binary_mtime": time.strftime("%Y-%m-%d %H:%M:%S",
                                          time.localtime(metrale.stat().st_mtime)),
            "git": compare.git_state(),
            "built_from_this_tree": args.metrale_bin == RELEASE / "src" / "metrale"
            and not args.no_build,
            "serve_options": eng.metrale_help,
            # every option's default as this binary states it (--max-rows: its prefill chunk;
            # llama-server's is its ubatch, 512)
            "serve_help": subprocess.run([str(metrale), "serve", "--help"], capture_output=True,
                                         text=True).stdout}
    if llama_server:
        r = subprocess.run([str(llama_server), "--version"], capture_output=True, text=True)
        versions["llama.cpp"] = {**llama_cpp_peer.server_info(args.cache_dir),
                                 "version_output": (r.stdout + r.stderr).strip()[-300:]}
    return versions


# --------------------------------------------------------------------------- parts


def warm_up(srv: Server, eng: Engines, engine: str, timeout: float) -> dict:
    r = stream_completion(srv.port, eng.body(engine, srv.model_id, random_ids("warmup", 16), 4),
                          timeout)
    if r["error"]:
        raise RuntimeError(f"{engine} warm-up request failed: {r['error']}")
    return {k: r[k] for k in ("ttft", "total", "error")}


def run_clients(srv: Server, eng: Engines, engine: str, clients: int, per_client: int,
                prompt_tokens: int, max_tokens: int, timeout: float) -> dict:
    """Part (a) at one concurrency level."""
    results: list[list[dict]] = [[] for _ in range(clients)]
    barrier = threading.Barrier(clients + 1)

    def client(i: int) -> None:
        barrier.wait()
        for j in range(per_client):
            ids = random_ids(f"throughput/{clients}/{i}/{j}", prompt_tokens)
            r = stream_completion(srv.port, eng.body(engine, srv.model_id, ids, max_tokens),
                                  timeout)
            r["client"], r["index"] = i, j
            results[i].append(r)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join()
    reqs = [r for rs in results for r in rs]
    ends = [r["t_send"] + r["total"] for r in reqs if r["total"] is not None]
    wall = (max(ends) if ends else time.monotonic()) - t0
    ok = [r for r in reqs if not r["error"]]
    tokens = sum(generated_tokens(r, max_tokens) for r in ok)
    ttft = [r["ttft"] for r in ok]
    tpot = [(r["chunk_times"][-1] - r["chunk_times"][0]) / (len(r["chunk_times"]) - 1)
            for r in ok if len(r["chunk_times"]) > 1]
    short = [r for r in ok if generated_tokens(r, max_tokens) != max_tokens]
    for r in reqs:  # keep the JSON small: per-chunk times only as a count
        r["t_send"] = round(r["t_send"] - t0, 6) if r["t_send"] is not None else None
        r.pop("chunk_times")
    if short:
        log(f"{engine}: {len(short)} request(s) generated other than {max_tokens} tokens "
            f"(ignore_eos not honoured?)")
    return {"clients": clients, "requests": len(reqs), "errors": len(reqs) - len(ok),
            "wall_seconds": wall, "generated_tokens": tokens,
            "output_tokens_per_second": tokens / wall if wall > 0 and ok else None,
            "requests_per_second": len(ok) / wall if wall > 0 and ok else None,
            "ttft_p50_ms": 1e3 * percentile(ttft, 50) if ttft else None,
            "ttft_p99_ms": 1e3 * percentile(ttft, 99) if ttft else None,
            "tpot_p50_ms": 1e3 * percentile(tpot, 50) if tpot else None,
            "requests_not_max_tokens": len(short),
            "ttft_from_closing_event": sum(1 for r in ok if r["ttft_from_closing_event"]),
            "first_errors": [r["error"] for r in reqs if r["error"]][:5],
            "samples": reqs}


def run_prefix(srv: Server, eng: Engines, engine: str, shape: str, a) -> dict:
    """Part (b) on one server: cold requests, then the warm series."""
    t0 = time.monotonic()

    def one(kind: str, prefix: list[int], i: int) -> dict:
        ids = prefix + random_ids(f"prefix/{shape}/{kind}/suffix/{i}", a.suffix_tokens)
        r = stream_completion(srv.port, eng.body(engine, srv.model_id, ids, a.prefix_max_tokens),
                              a.request_timeout)
        r.pop("chunk_times")
        r["t_send"] = round(r["t_send"] - t0, 6)
        r["kind"], r["index"] = kind, i
        if r["error"]:
            log(f"{engine} {kind} request {i} failed: {r['error']}")
        return r

    cold = [one("cold", random_ids(f"prefix/{shape}/cold/{i}", a.prefix_tokens), i)
            for i in range(a.prefix_requests)]
    shared = random_ids(f"prefix/{shape}/shared", a.prefix_tokens)
    prime = one("prime", shared, -1)
    warm = [one("warm", shared, i) for i in range(a.prefix_requests)]
    c = [r["ttft"] for r in cold if not r["error"]]
    w = [r["ttft"] for r in warm if not r["error"]]
    cold_p50, warm_p50 = percentile(c, 50), percentile(w, 50)
    return {"prefix_tokens": a.prefix_tokens, "suffix_tokens": a.suffix_tokens,
            "max_tokens": a.prefix_max_tokens,
            "cold_ttft_p50_ms": 1e3 * cold_p50 if c else None,
            "warm_ttft_p50_ms": 1e3 * warm_p50 if w else None,
            "cold_ttft_ms": [1e3 * v for v in c], "warm_ttft_ms": [1e3 * v for v in w],
            "warm_over_cold": warm_p50 / cold_p50 if c and w and cold_p50 > 0 else None,
            "warm_cached_tokens": [r["cached_tokens"] for r in warm],
            "cold_cached_tokens": [r["cached_tokens"] for r in cold],
            "errors": sum(1 for r in cold + warm + [prime] if r["error"]),
            "ttft_from_closing_event": sum(1 for r in cold + warm if r["ttft_from_closing_event"]),
            "samples": cold + [prime] + warm}


def token_record(choice: dict) -> dict:
    """What a non-streaming completion choice says about its tokens: ids (llama-server's
    logprobs.content[i].id, or a token_ids list), token strings, and the text."""
    lp = choice.get("logprobs") or {}
    ids = strings = None
    if isinstance(lp, dict) and isinstance(lp.get("content"), list) and lp["content"]:
        content = lp["content"]
        if all(isinstance(c, dict) and isinstance(c.get("id"), int) for c in content):
            ids = [c["id"] for c in content]
        strings = [c.get("token") for c in content]
    if ids is None and isinstance(choice.get("token_ids"), list):
        ids = choice["token_ids"]
    if strings is None and isinstance(lp, dict) and isinstance(lp.get("tokens"), list):
        strings = lp["tokens"]  # the legacy OpenAI completions logprobs layout
    return {"ids": ids, "tokens": strings, "text": choice.get("text")}


def greedy_request(srv: Server, eng: Engines, engine: str, shape: str, a) -> dict:
    """Part (c): one engine's greedy tokens for the model's check prompt. llama-server: its
    native /completion with return_tokens (same slot, sampler and fields otherwise), the only
    reply of this version listing every generated id: its OpenAI logprobs leave out tokens
    that end inside a UTF-8 character. metrale: /v1/completions with logprobs."""
    ids = random_ids(f"greedy/{shape}", a.prompt_tokens)
    if engine == "llama.cpp":
        body = {"prompt": ids, "n_predict": a.greedy_tokens, "temperature": 0,
                "ignore_eos": True, "cache_prompt": True, "return_tokens": True}
        status, res = http_json(srv.port, "POST", "/completion", body, a.request_timeout)
        if status == 200 and isinstance(res, dict) and isinstance(res.get("tokens"), list):
            return {"ids": res["tokens"], "tokens": None, "text": res.get("content"),
                    "endpoint": "/completion", "body_fields": sorted(body),
                    "usage": {"tokens_predicted": res.get("tokens_predicted"),
                              "tokens_evaluated": res.get("tokens_evaluated")}}
        log(f"llama.cpp: /completion with return_tokens got HTTP {status}; trying "
            "/v1/completions")
    body = eng.body(engine, srv.model_id, ids, a.greedy_tokens, stream=False)
    body["logprobs"] = 1
    status, res = http_json(srv.port, "POST", "/v1/completions", body, a.request_timeout)
    if status != 200:  # an engine that refuses logprobs: the text alone, then
        log(f"{engine}: greedy request with logprobs got HTTP {status}; retrying without")
        body.pop("logprobs")
        status, res = http_json(srv.port, "POST", "/v1/completions", body, a.request_timeout)
    if status != 200 or not isinstance(res, dict) or not res.get("choices"):
        return {"body_fields": sorted(body), "error": f"HTTP {status}: {str(res)[:500]}"}
    rec = token_record(res["choices"][0])
    rec["endpoint"] = "/v1/completions"
    rec["body_fields"] = sorted(body)
    rec["usage"] = res.get("usage")
    return rec


def byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte: the inverse of transformers'
    bytes_to_unicode (transformers is a bench requirement: tools/bench/requirements.txt)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    return {c: b for b, c in bytes_to_unicode().items()}


def vocab_texts(model_dir: Path) -> dict[int, str] | None:
    """Each token id's text as a server renders one token alone (metrale's logprobs.tokens:
    the tokenizer's decode of that id, special tokens kept, invalid UTF-8 replaced), from the
    checkpoint's tokenizer.json (byte-level BPE); None when it is not that kind."""
    try:
        t = json.loads((model_dir / "tokenizer.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if (t.get("decoder") or {}).get("type") != "ByteLevel":
        return None
    dec = byte_level_decoder()
    out = {}
    for piece, i in (t.get("model") or {}).get("vocab", {}).items():
        if all(c in dec for c in piece):
            out[i] = bytes(dec[c] for c in piece).decode("utf-8", "replace")
        else:
            out[i] = piece
    for added in t.get("added_tokens") or []:
        out[added["id"]] = added["content"]
    return out


def same_text(a: str | None, b: str | None) -> bool:
    """Token texts equal, a run of replacement characters counting as one (servers replace
    the invalid bytes of a partial UTF-8 character in different numbers)."""
    def norm(x):
        return re.sub("\ufffd+", "\ufffd", x or "")
    return norm(a) == norm(b)


def compare_greedy(per_engine: dict, model_dir: Path) -> dict:
    """First differing step between the engines' greedy outputs: by ids where both gave ids;
    else by each token's text, llama.cpp's ids rendered through the checkpoint's
    tokenizer.json as metrale renders its logprobs.tokens; else by the text."""
    m, l = per_engine.get("metrale") or {}, per_engine.get("llama.cpp") or {}
    out = {"compared_by": None, "equal": None, "first_difference": None}

    def first_diff(a, b, eq):
        d = next((i for i, (x, y) in enumerate(zip(a, b)) if not eq(x, y)), None)
        return min(len(a), len(b)) if d is None and len(a) != len(b) else d

    if m.get("ids") is not None and l.get("ids") is not None:
        d = first_diff(m["ids"], l["ids"], lambda x, y: x == y)
        out.update(compared_by="ids", equal=d is None, first_difference=d)
        return out
    texts = vocab_texts(model_dir) if l.get("ids") is not None else None
    if m.get("tokens") is not None and texts is not None:
        lt = [texts.get(i, "") for i in l["ids"]]
        d = first_diff(m["tokens"], lt, same_text)
        out.update(compared_by="token text (llama.cpp's ids through tokenizer.json)",
                   equal=d is None, first_difference=d, llama_cpp_token_texts=lt)
        return out
    if m.get("text") is not None and l.get("text") is not None:
        d = first_diff(m["text"], l["text"], lambda x, y: x == y)
        out.update(compared_by="text (first differing character)", equal=d is None,
                   first_difference=d)
    return out


# --------------------------------------------------------------------------- report


def fmt(v, digits: int = 1) -> str:
    return "—" if v is None else f"{v:.{digits}f}"


def markdown(results: dict) -> str:
    cfg = results["config"]
    lines = [f"```sh\n{results['command']}\n```", "",
             f"Dense model: {cfg['model_shape']}; hybrid: {cfg['hybrid_shape'] or '(none)'}; "
             f"{cfg['threads']} thread(s) per engine; bf16 weights (metrale --compute "
             f"{cfg['compute']}; llama.cpp GGUF BF16); llama.cpp "
             f"{(cfg.get('llama_cpp') or {}).get('llama_cpp_commit', '—')} "
             f"(llama-cpp-python {llama_cpp_peer.VERSION}); metrale "
             f"{((cfg.get('metrale') or {}).get('git') or {}).get('commit', '—')}; "
             f"{results['machine'].get('Model name', '')}.", ""]
    tp = results.get("throughput") or []
    if tp:
        lines += [f"(a) Streaming clients, each sending {cfg['requests_per_client']} requests "
                  f"back to back: {cfg['prompt_tokens']} prompt tokens, {cfg['max_tokens']} "
                  "generated (greedy, ignore_eos).", "",
                  "| clients | engine | requests | output tok/s | TTFT p50 ms | TTFT p99 ms | "
                  "TPOT p50 ms | errors | output tok/s vs llama.cpp |",
                  "|---|---|---|---|---|---|---|---|---|"]
        by = {(r["clients"], r["engine"]): r for r in tp}
        for r in sorted(tp, key=lambda r: (r["clients"], ENGINES.index(r["engine"]))):
            base = by.get((r["clients"], "llama.cpp"))
            ratio = (r["output_tokens_per_second"] / base["output_tokens_per_second"]
                     if r["engine"] != "llama.cpp" and base and base.get(
                         "output_tokens_per_second") and r.get("output_tokens_per_second")
                     else None)
            err = r.get("error")
            lines.append(
                f"| {r['clients']} | {r['engine']} | {r.get('requests', 0)} | "
                f"{fmt(r.get('output_tokens_per_second'))} | {fmt(r.get('ttft_p50_ms'))} | "
                f"{fmt(r.get('ttft_p99_ms'))} | {fmt(r.get('tpot_p50_ms'))} | "
                f"{'failed: ' + err.splitlines()[0][:80] if err else r.get('errors', 0)} | "
                f"{fmt(ratio, 2)} |")
        lines.append("")
    px = results.get("prefix") or []
    if px:
        lines += [f"(b) TTFT after a {cfg['prefix_tokens']}-token shared prefix + "
                  f"{cfg['suffix_tokens']}-token distinct suffix, one client, "
                  f"{cfg['prefix_requests']} requests each: cold = a fresh prefix every "
                  "request, warm = the same prefix again (after one priming request).", "",
                  "| model | engine | cold TTFT p50 ms | warm TTFT p50 ms | warm / cold | "
                  "cached prompt tokens (warm, reported) |",
                  "|---|---|---|---|---|---|"]
        for r in px:
            cached = [c for c in r.get("warm_cached_tokens") or [] if c is not None]
            err = r.get("error")
            lines.append(
                f"| {r['model']} | {r['engine']} | {fmt(r.get('cold_ttft_p50_ms'))} | "
                f"{fmt(r.get('warm_ttft_p50_ms'))} | {fmt(r.get('warm_over_cold'), 3)} | "
                + (f"failed: {err.splitlines()[0][:80]}" if err else
                   (f"{statistics.median(cached):.0f}" if cached else "—")) + " |")
        lines.append("")
    gr = results.get("greedy") or []
    if gr:
        lines += [f"(c) Greedy tokens of one request ({cfg['prompt_tokens']}-token prompt, "
                  f"{cfg['greedy_tokens']} tokens), metrale vs llama.cpp.", "",
                  "| model | equal | first differing step | compared by |", "|---|---|---|---|"]
        for g in gr:
            c = g.get("comparison") or {}
            eq = {True: "yes", False: "no", None: "—"}[c.get("equal")]
            lines.append(f"| {g['model']} | {eq} | {fmt(c.get('first_difference'), 0)} | "
                         f"{c.get('compared_by') or 'not compared: ' + g.get('why', '')} |")
        lines.append("")
    fallbacks = sum(r.get("ttft_from_closing_event") or 0 for r in tp + px)
    if fallbacks:
        lines += [f"TTFT of {fallbacks} request(s) is their closing event: every token they "
                  "generated ended inside a UTF-8 character (results.json: "
                  "ttft_from_closing_event).", ""]
    if results.get("failures"):
        lines += [f"{len(results['failures'])} failure(s): see failures in results.json.", ""]
    return "\n".join(lines)


def write(results: dict, out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    md = markdown(results)
    (out / "table.md").write_text(md + "\n")
    return md


# --------------------------------------------------------------------------- main


def shape_or_none(text: str) -> str | None:
    return None if text.lower() in ("", "none") else compare.shape_arg(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default="metrale,llama.cpp",
                    help="comma-separated subset of metrale,llama.cpp")
    ap.add_argument("--model-shape", type=compare.shape_arg, default="qwen3-0.6b",
                    help="the dense random-weight checkpoint of parts (a), (b), (c) (made on "
                         "demand by tools/bench/make_random_checkpoint.py)")
    ap.add_argument("--hybrid-shape", type=shape_or_none, default="qwen3-next-L2",
                    help="the hybrid checkpoint of parts (b) and (c), or none (qwen3-next-L2: "
                         "7.8 GB of safetensors + 7.8 GB of GGUF, made on demand)")
    ap.add_argument("--threads", type=int, default=2, help="compute threads of each server")
    ap.add_argument("--clients", type=compare.int_list, default=[1, 8, 32],
                    help="part (a)'s concurrency levels (server sequences = clients)")
    ap.add_argument("--requests-per-client", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--prefix-tokens", type=int, default=1500,
                    help="part (b)'s shared prefix (0 skips part (b))")
    ap.add_argument("--suffix-tokens", type=int, default=16)
    ap.add_argument("--prefix-requests", type=int, default=5,
                    help="part (b): cold requests, and warm requests after the priming one")
    ap.add_argument("--prefix-max-tokens", type=int, default=1,
                    help="tokens generated per part (b) request (only the first is timed; 1 "
                         "makes TTFT exact even when the token ends inside a UTF-8 character)")
    ap.add_argument("--greedy-tokens", type=int, default=32, help="part (c); 0 skips it")
    ap.add_argument("--compute", choices=["bf16", "int8", "f32"], default="bf16",
                    help="metrale serve --compute (bf16: the precision of llama.cpp's BF16)")
    ap.add_argument("--kv-budget", default=None, help="metrale serve --kv-budget BYTES")
    ap.add_argument("--metrale-args", default="",
                    help="further `metrale serve` flags, e.g. --metrale-args='--no-prefix-cache'")
    ap.add_argument("--llama-args", default="", help="further llama-server flags")
    ap.add_argument("--metrale-bin", type=Path, default=RELEASE / "src" / "metrale")
    ap.add_argument("--cache-dir", type=Path, default=llama_cpp_peer.DEFAULT_CACHE)
    ap.add_argument("--out", type=Path, default=REPO / "out" / "serve")
    ap.add_argument("--no-build", action="store_true",
                    help="never build metrale or llama-server; use what exists")
    ap.add_argument("--no-install", action="store_true",
                    help="do not install missing Python/Debian packages: name them and stop")
    ap.add_argument("--ready-timeout", type=float, default=900,
                    help="seconds a server may take to load and answer /health")
    ap.add_argument("--request-timeout", type=float, default=900, help="seconds per request")
    args = ap.parse_args()
    invoked = ["python3", os.path.relpath(Path(__file__).resolve(), Path.cwd()), *sys.argv[1:]]

    engines = [e for e in args.engines.split(",") if e]
    if not engines or set(engines) - set(ENGINES):
        sys.exit(f"--engines: expected a subset of {list(ENGINES)}, found {args.engines!r}")
    for name in ("threads", "requests_per_client", "prompt_tokens", "max_tokens",
                 "suffix_tokens", "prefix_requests", "prefix_max_tokens"):
        if getattr(args, name) < 1:
            sys.exit(f"--{name.replace('_', '-')}: expected >= 1")
    shapes = [args.model_shape] + ([args.hybrid_shape] if args.hybrid_shape and
                                   args.prefix_tokens > 0 else [])

    # --- prerequisites (only for what is missing) ---
    ckpt_dir = args.cache_dir / "checkpoints"
    modules, debian = [], []
    for s in shapes:
        if not make_random_checkpoint.is_ready(s, ckpt_dir):
            modules += make_random_checkpoint.python_needs(s)
    if "llama.cpp" in engines:
        if not llama_cpp_peer.sdist_path(args.cache_dir).is_file():
            modules.append("pip")
        if any(not llama_cpp_peer.gguf_path(args.cache_dir, ckpt_dir / s, "bf16").is_file()
               for s in shapes):
            modules += prereqs.GGUF_CONVERSION
        if not args.no_build and not llama_cpp_peer.server_tool_path(args.cache_dir).is_file():
            debian += list(prereqs.BUILD_TOOLS.values())
    if "metrale" in engines and not args.no_build and \
            args.metrale_bin == RELEASE / "src" / "metrale":
        debian += prereqs.metrale_debian_packages()
    prereqs.ensure(modules, debian, install=not args.no_install)

    # --- binaries ---
    failures = []
    metrale, llama_server, lsrc = prepare_binaries(args, engines, failures)

    # --- weights ---
    models = {}
    for s in shapes:
        d = make_random_checkpoint.ensure(s, ckpt_dir)
        models[s] = {"dir": d, "gguf": None}
        if "llama.cpp" in engines:
            models[s]["gguf"] = llama_cpp_peer.ensure_gguf(args.cache_dir, lsrc, d, "bf16")

    eng = Engines(args, metrale, llama_server)
    versions = engine_versions(args, eng)
    results = {
        "command": shlex.join(invoked),
        "config": {"engines": engines, "model_shape": args.model_shape,
                   "hybrid_shape": args.hybrid_shape, "threads": args.threads,
                   "clients": args.clients, "requests_per_client": args.requests_per_client,
                   "prompt_tokens": args.prompt_tokens, "max_tokens": args.max_tokens,
                   "prefix_tokens": args.prefix_tokens, "suffix_tokens": args.suffix_tokens,
                   "prefix_requests": args.prefix_requests,
                   "prefix_max_tokens": args.prefix_max_tokens,
                   "greedy_tokens": args.greedy_tokens, "compute": args.compute,
                   "models": {s: {"dir": str(m["dir"]),
                                  "gguf": str(m["gguf"]) if m["gguf"] else None,
                                  "description": make_random_checkpoint.shape_spec(s).get(
                                      "description")} for s, m in models.items()},
                   "request_fields": {e: sorted(eng.body(e, "<id>", [0], 1)) for e in engines},
                   "token_id_range": list(TOKEN_RANGE),
                   "args": {k: (str(v) if isinstance(v, Path) else v)
                            for k, v in vars(args).items()},
                   "argv": [sys.executable, *sys.argv], "cwd": str(Path.cwd()),
                   "metrale": versions.get("metrale"), "llama_cpp": versions.get("llama.cpp"),
                   "python": {"executable": sys.executable,
                              "version": sys.version.split()[0]},
                   "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                   "loadavg_start": os.getloadavg()},
        "machine": compare.lscpu_summary() | compare.thp_setting(),
        "throughput": [], "prefix": [], "greedy": [], "servers": [], "failures": failures,
    }
    logs = args.out / "logs"

    def with_server(engine: str, shape: str, seqs: int, ctx: int, tag: str, work) -> dict:
        """Starts one server, warms it up, runs work(srv), stops it; returns work's dict (or
        one with "error")."""
        port = free_port()
        srv = Server(engine, eng.command(engine, models[shape], seqs, ctx, port), port,
                     logs / f"{engine}-{shape}-{tag}.log")
        rec = {"engine": engine, "model": shape, "part": tag}
        try:
            srv.start(args.ready_timeout)
            rec["warm_up"] = warm_up(srv, eng, engine, args.request_timeout)
            rec.update(work(srv))
        except Exception as e:  # noqa: BLE001 — one failed server does not stop the run
            log(f"{engine} {shape} {tag} failed: {e}")
            rec["error"] = str(e)
            failures.append({"engine": engine, "model": shape, "part": tag, "error": str(e)})
        finally:
            if srv.proc is not None and srv.proc.poll() is None:
                srv.snapshot()
            srv.stop()
            results["servers"].append({"engine": engine, "model": shape, "part": tag,
                                       **srv.record()})
        return rec

    greedy_ids: dict[str, dict] = {s: {} for s in shapes}

    def maybe_greedy(srv: Server, engine: str, shape: str) -> None:
        if args.greedy_tokens > 0 and engine not in greedy_ids[shape]:
            greedy_ids[shape][engine] = greedy_request(srv, eng, engine, shape, args)

    # --- (a) throughput at each concurrency level, engines alternating who goes first ---
    ctx_a = args.prompt_tokens + max(args.max_tokens, args.greedy_tokens) + CTX_MARGIN
    for k, clients in enumerate(args.clients):
        order = engines[k % len(engines):] + engines[:k % len(engines)]
        for engine in order:
            log(f"(a) {engine}: {clients} client(s) x {args.requests_per_client} request(s)")

            def work(srv, engine=engine, clients=clients):
                out = run_clients(srv, eng, engine, clients, args.requests_per_client,
                                  args.prompt_tokens, args.max_tokens, args.request_timeout)
                log(f"(a) {engine} {clients} client(s): "
                    f"{fmt(out['output_tokens_per_second'])} tok/s, TTFT p50 "
                    f"{fmt(out['ttft_p50_ms'])} ms, {out['errors']} error(s)")
                if args.prefix_tokens <= 0:
                    maybe_greedy(srv, engine, args.model_shape)
                return out
            results["throughput"].append(with_server(engine, args.model_shape, clients, ctx_a,
                                                     f"clients{clients}", work))
            write(results, args.out)

    # --- (b) shared-prefix TTFT and (c) greedy check, per model ---
    if args.prefix_tokens > 0:
        ctx_b = max(args.prefix_tokens + args.suffix_tokens + args.prefix_max_tokens,
                    args.prompt_tokens + args.greedy_tokens) + CTX_MARGIN
        for s in shapes:
            for engine in engines:
                log(f"(b) {engine} on {s}: cold, then warm")

                def work(srv, engine=engine, s=s):
                    maybe_greedy(srv, engine, s)
                    out = run_prefix(srv, eng, engine, s, args)
                    log(f"(b) {engine} {s}: cold {fmt(out['cold_ttft_p50_ms'])} ms, warm "
                        f"{fmt(out['warm_ttft_p50_ms'])} ms, warm/cold "
                        f"{fmt(out['warm_over_cold'], 3)}")
                    return out
                results["prefix"].append(with_server(engine, s, 1, ctx_b, "prefix", work))
                write(results, args.out)

    for s in shapes:
        if args.greedy_tokens <= 0:
            break
        g = {"model": s, "per_engine": greedy_ids[s]}
        if set(greedy_ids[s]) >= set(ENGINES):
            g["comparison"] = compare_greedy(greedy_ids[s], models[s]["dir"])
            c = g["comparison"]
            log(f"(c) greedy {s}: " + ("equal" if c["equal"] else
                                        f"first difference at step {c['first_difference']}")
                + f" (compared by {c['compared_by']})")
        else:
            g["why"] = "needs both engines"
        results["greedy"].append(g)

    results["config"]["loadavg_end"] = os.getloadavg()
    results["config"]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    md = write(results, args.out)
    print(md)
    if failures:
        log(f"{len(failures)} failure(s); see failures in {args.out}/results.json")
    log(f"wrote {args.out}/table.md, results.json")


if __name__ == "__main__":
    main()
