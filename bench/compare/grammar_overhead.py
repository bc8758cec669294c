"""Structured outputs' cost per output token: the same greedy decode through `metrale serve`,
unconstrained and constrained by a grammar, at 1 and 16 concurrent requests; prints the
per-token time of each and the overhead.

    python3 bench/compare/grammar_overhead.py --model models/demo [--bin build/release/src/metrale]
    python3 bench/compare/grammar_overhead.py --model DIR --bin OLD/metrale --bin NEW/metrale
    python3 bench/compare/grammar_overhead.py --model random-qwen3 --tokens 32 ...

--model random-qwen3: the one-layer random Qwen3 beside the real Qwen3 tokenizer (151,936 ids;
tests/python/random_qwen3.py, seeded by --seed), written to a temporary directory.
bench/compare/grammar_peer.py measures the same beside llama-server, with a JSON schema.

With several --bin, each binary's server is measured in turn, the whole sequence --passes
times (interleaved, so a change in the machine's load hits each alike), and every line is
labelled with its binary and the load average when it started.

Every request decodes --tokens tokens (ignore_eos; the regex never reaches an accept state),
so both runs do the same steps and differ only by the mask (filled by the grammar's mask
workers from the accept, beside the next forward, and applied to the logits before the pick;
METRALE_GRAMMAR_THREADS=0 fills it at the pick on the scheduler's thread instead).
"""
import argparse
import concurrent.futures
import json
import os
import pathlib
import random
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests" / "python"))
from metrale_server import Server  # noqa: E402
from random_qwen3 import random_qwen3  # noqa: E402

REGEX = "([A-Za-z,.;:' ]|\\n)*#"


def run(server, concurrency, tokens, grammar, rounds):
    body = {"prompt": "And God said", "max_tokens": tokens, "temperature": 0, "ignore_eos": True}
    if grammar:
        body["guided_regex"] = REGEX

    def one(_):
        req = urllib.request.Request(server.url + "/v1/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())["usage"]["completion_tokens"]

    one(0)  # warm (compiles the grammar once)
    best = None
    for _ in range(rounds):
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            n = sum(pool.map(one, range(concurrency)))
        dt = time.perf_counter() - t0
        per = dt / (n / concurrency)  # seconds per output token of one stream
        best = per if best is None else min(best, per)
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/demo")
    ap.add_argument("--bin", action="append", default=[])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--passes", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0, help="--model random-qwen3's weights")
    a = ap.parse_args()
    if a.model == "random-qwen3":
        tmp = tempfile.TemporaryDirectory()
        random_qwen3(pathlib.Path(tmp.name), random.Random(a.seed).randbytes)
        a.model = tmp.name
    for p in range(a.passes):
        for b in a.bin or [None]:
            if b:
                os.environ["METRALE_BIN"] = b
            label = f"[{b or 'METRALE_BIN'}, pass {p + 1}, load {os.getloadavg()[0]:.1f}] "
            server = Server("--max-seqs", "16", model=pathlib.Path(a.model), chat_template=None)
            try:
                for c in (1, 16):
                    plain = run(server, c, a.tokens, False, a.rounds)
                    constrained = run(server, c, a.tokens, True, a.rounds)
                    print(f"{label}batch {c:2d}: {plain * 1e3:.3f} ms/token unconstrained, "
                          f"{constrained * 1e3:.3f} ms/token constrained: "
                          f"{(constrained / plain - 1) * 100:+.1f}%", flush=True)
            finally:
                server.stop()


if __name__ == "__main__":
    main()
