#!/usr/bin/env python3
"""Peer figure for bench/tokenizer_bench.cc: HF `tokenizers` encode MB/s on the same corpus.

    RAYON_NUM_THREADS=1 python3 tools/bench/tokenizer_peer.py      # single thread (compare)
    python3 tools/bench/tokenizer_peer.py                          # library default threads

Same text as the C++ bench: the valid-UTF-8 cases of tests/data/tokenizers/golden.json.gz,
repeated to >= 1 MB. "lines" encodes one case per call (no encode_batch); "document" encodes
all of it joined by newlines in one call; "batch" is encode_batch over the lines, which uses
the rayon pool (all cores unless RAYON_NUM_THREADS is set).
"""
import gzip
import json
import os
import time

from tokenizers import Tokenizer

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(ROOT, "tests", "data", "tokenizers")


def corpus_lines():
    golden = json.loads(gzip.open(os.path.join(DATA, "golden.json.gz")).read())
    base = [bytes.fromhex(c["hex"]).decode("utf-8") for c in golden["cases"] if not c["name"].startswith("invalid")]
    out, total = [], 0
    while total < (1 << 20):
        for s in base:
            out.append(s)
            total += len(s.encode("utf-8")) + 1
    return out


def rate(fn, nbytes, min_time=2.0):
    """(wall MB/s, CPU MB/s). CPU time is what Google Benchmark reports by default and is the
    fair figure on a shared machine; it sums all threads, so it is per-core only when
    RAYON_NUM_THREADS=1."""
    fn()  # warm the BPE cache, as the C++ bench's first iteration does
    reps, start, cpu0 = 0, time.perf_counter(), time.process_time()
    while True:
        fn()
        reps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            cpu = time.process_time() - cpu0
            return nbytes * reps / elapsed / 1e6, nbytes * reps / cpu / 1e6


def main():
    lines = corpus_lines()
    doc = "".join(l + "\n" for l in lines)
    line_bytes = sum(len(l.encode("utf-8")) for l in lines)
    threads = os.environ.get("RAYON_NUM_THREADS", f"default ({os.cpu_count()} cores)")
    print(f"tokenizers peer, RAYON_NUM_THREADS={threads}, corpus {len(doc.encode('utf-8')) / 1e6:.2f} MB")
    for name in ("qwen3", "deepseek_v3"):
        tok = Tokenizer.from_str(gzip.open(os.path.join(DATA, name, "tokenizer.json.gz")).read().decode("utf-8"))
        lines_rate = rate(lambda: [tok.encode(l, add_special_tokens=False) for l in lines], line_bytes)
        doc_rate = rate(lambda: tok.encode(doc, add_special_tokens=False), len(doc.encode("utf-8")))
        batch_rate = rate(lambda: tok.encode_batch(lines, add_special_tokens=False), line_bytes)
        fmt = lambda r: f"{r[0]:6.2f} wall / {r[1]:6.2f} cpu MB/s"
        print(f"{name:12s} lines {fmt(lines_rate)} | document {fmt(doc_rate)} | batch {fmt(batch_rate)}")


if __name__ == "__main__":
    main()
