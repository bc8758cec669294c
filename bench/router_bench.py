#!/usr/bin/env python3
"""`metrale serve` replicas behind the real vllm-router (tests/python/router-requirements.txt,
installed by scripts/router-venv.sh) against one replica, on the demo model, on loopback:

    build/venv/bin/python bench/router_bench.py --replicas 1,2,4 --clients 8,32 \
        --requests-per-client 8 --max-tokens 32

(a) For each replica count N and client level C: N fresh replicas (--max-seqs 16,
    --kv-tokens 32768) behind the
    router with its cache_aware policy (and, for N = 1, the replica alone, without the router),
    C client threads each sending --requests-per-client streaming chat requests back to back
    (greedy, ignore_eos, a distinct question per request under one short system prompt).
    Reported: output tokens / wall time, TTFT p50 / p99 (send to the first SSE event with text;
    nearest rank), errors.
(b) Cache-aware vs round-robin on a shared-system-prompt workload: 4 replicas, --shared-prompts
    distinct long system prompts, C = the largest level, each request a random one of them and
    a random question. Reported per policy: each replica's prefix-cache hit rate as the share of
    its prompt tokens served from the cache (metrale_prefix_cache_tokens_saved_total /
    metrale_prompt_tokens_total from its /metrics, this part only; a lookup-level rate says
    little here, since any shared first page counts as a hit), overall, and TTFT p50 / p99.
Prints markdown tables, the command line first. The replicas and the router share the
machine's cores with the clients, so the point is the router's overhead and routing, not more
throughput.
"""
import argparse
import http.client
import json
import pathlib
import random
import shlex
import statistics
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "python"))
from metrale_server import Server  # noqa: E402
from test_router import Router  # noqa: E402

WORDS = ("the LORD and Moses and the law of Egypt and David sang of Israel whence Abraham "
         "went out unto the land of Canaan and Jacob").split()


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(p / 100 * len(xs) + 0.5)) - 1))] if xs else 0.0


def stream_chat(host, system, question, max_tokens):
    """(TTFT s, completion tokens) of one streaming chat request."""
    conn = http.client.HTTPConnection(host, timeout=300)
    body = {"model": "demo", "messages": [{"role": "system", "content": system},
                                          {"role": "user", "content": question}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    t0 = time.monotonic()
    conn.request("POST", "/v1/chat/completions", json.dumps(body),
                 {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    ttft, tokens = None, 0
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            tokens = ev["usage"]["completion_tokens"]
        for c in ev.get("choices", []):
            if ttft is None and (c.get("delta") or {}).get("content"):
                ttft = time.monotonic() - t0
    conn.close()
    return ttft if ttft is not None else time.monotonic() - t0, tokens


def drive(host, clients, per_client, make, max_tokens):
    ttfts, tokens, errors = [], [0], [0]
    lock = threading.Lock()

    def client(c):
        rng = random.Random(c)
        for _ in range(per_client):
            system, q = make(rng)
            try:
                t, n = stream_chat(host, system, q, max_tokens)
            except Exception:  # counted
                with lock:
                    errors[0] += 1
                continue
            with lock:
                ttfts.append(t)
                tokens[0] += n

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    return {"requests": len(ttfts), "tok_s": tokens[0] / wall, "p50": pct(ttfts, 50) * 1000,
            "p99": pct(ttfts, 99) * 1000, "errors": errors[0]}


def hits(replica):
    """(prompt tokens served from the prefix cache, prompt tokens) so far."""
    m = replica.metrics()
    return m["metrale_prefix_cache_tokens_saved_total"], m["metrale_prompt_tokens_total"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", default="1,2,4")
    ap.add_argument("--clients", default="8,32")
    ap.add_argument("--requests-per-client", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--shared-prompts", type=int, default=32)
    ap.add_argument("--shared-requests-per-client", type=int, default=8)
    ap.add_argument("--parts", default="a,b", help="which of the two parts to run")
    ap.add_argument("--kv-tokens", type=int, default=32768,
                    help="each replica's KV capacity (room for every shared prompt's pages)")
    args = ap.parse_args()
    print("Command: `build/venv/bin/python bench/router_bench.py " +
          " ".join(shlex.quote(a) for a in sys.argv[1:]) + "`\n")
    levels = [int(c) for c in args.clients.split(",")]
    short = "Thou art a scribe. Answer in the manner of the Scriptures."

    def distinct(rng):
        return short, " ".join(rng.choice(WORDS) for _ in range(12)) + "?"

    if "a" in args.parts:
        print("(a) Streaming chat, output tokens/s and TTFT; demo model, --max-seqs 16 per "
              f"replica; {args.requests_per_client} requests per client, {args.max_tokens} "
              "tokens each (greedy, ignore_eos)\n")
        print("| replicas | route | clients | requests | output tok/s | TTFT p50 ms | "
              "TTFT p99 ms | errors |")
        print("|---|---|---|---|---|---|---|---|")
    for n in [int(r) for r in args.replicas.split(",")] if "a" in args.parts else []:
        replicas = [Server("--max-seqs", "16", "--kv-tokens", str(args.kv_tokens))
                    for _ in range(n)]
        router = None
        try:
            router = Router(replicas, "cache_aware")
            targets = [("vllm-router cache_aware", router.url.split("//")[1])]
            if n == 1:
                targets.insert(0, ("direct", replicas[0].url.split("//")[1]))
            for name, host in targets:
                stream_chat(host, short, "warm up", 4)
                for c in levels:
                    r = drive(host, c, args.requests_per_client, distinct, args.max_tokens)
                    print(f"| {n} | {name} | {c} | {r['requests']} | {r['tok_s']:.1f} | "
                          f"{r['p50']:.1f} | {r['p99']:.1f} | {r['errors']} |", flush=True)
        finally:
            if router is not None:
                router.stop()
            for s in replicas:
                s.stop()

    rng0 = random.Random(7)
    systems = [f"Thou art scribe number {i}. " + " ".join(rng0.choice(WORDS) for _ in range(240))
               for i in range(args.shared_prompts)]

    def shared(rng):
        return rng.choice(systems), " ".join(rng.choice(WORDS) for _ in range(6)) + "?"

    c = max(levels)
    if "b" not in args.parts:
        return
    print(f"\n(b) Shared system prompts: {args.shared_prompts} distinct ~250-word system prompts, "
          f"4 replicas, {c} clients x {args.shared_requests_per_client} requests, each a random "
          "prompt and question\n")
    print("| policy | cached prompt tokens per replica | overall | prompt tokens per replica | "
          "TTFT p50 ms | TTFT p99 ms | errors |")
    print("|---|---|---|---|---|---|---|")
    for policy in ("cache_aware", "round_robin"):
        replicas = [Server("--max-seqs", "16", "--kv-tokens", str(args.kv_tokens))
                    for _ in range(4)]
        router = None
        try:
            router = Router(replicas, policy)
            host = router.url.split("//")[1]
            before = [hits(s) for s in replicas]
            r = drive(host, c, args.shared_requests_per_client, shared, args.max_tokens)
            after = [hits(s) for s in replicas]
            per = [(a[0] - b[0], a[1] - b[1]) for a, b in zip(after, before)]
            rates = " / ".join(f"{h / l:.2f}" if l else "-" for h, l in per)
            overall = sum(h for h, _ in per) / max(1, sum(l for _, l in per))
            counts = " / ".join(f"{l:.0f}" for _, l in per)
            print(f"| {policy} | {rates} | {overall:.2f} | {counts} | {r['p50']:.1f} | "
                  f"{r['p99']:.1f} | {r['errors']} |", flush=True)
        finally:
            if router is not None:
                router.stop()
            for s in replicas:
                s.stop()


if __name__ == "__main__":
    main()
