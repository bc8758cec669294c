#!/usr/bin/env python3
"""Embeddings: sequences/s of `metrale embed` beside sentence-transformers (torch CPU) on the
same weights, the same texts and the same thread count, in one run.

    python3 bench/compare/embed_bench.py --threads 2 --texts 32 --words 48 --rounds 3 --passes 2 \
        --out out/embed

The checkpoint (made once, cached under build/bench/): a random-weight Qwen3-Embedding-0.6B --
the shape of the published Qwen/Qwen3-Embedding-0.6B config.json (28 layers, hidden 1024,
16 query / 8 key-value heads of 128, intermediate 3072, vocabulary 151669, tied embeddings,
rope theta 1e6) -- built by transformers' Qwen3ForCausalLM and saved in bf16 (as the release
ships) with save_pretrained, with the real Qwen3 tokenizer (tests/data/tokenizers/qwen3) given
Qwen3-Embedding's post-processor (every input ends with <|endoftext|>, the token it pools) and
Qwen3-Embedding's sentence-transformers files (last-token pooling, then Normalize).

The texts: --texts passages of KJV verses (Debian's bible-kjv, as tools/demo uses), each
consecutive verses from Genesis 1:1 on until it has at least --words words; one per line of the
file `metrale embed --input-file` reads, the same list for sentence-transformers.

Each pass (--passes, interleaved so the machine's load hits every row alike) times:
  - metrale, once per --metrale-compute: `metrale embed --model DIR --input-file TEXTS --json
    --threads T --compute C --rounds R` (one untimed warm-up pass over all texts, then R timed
    ones; the median; tokenization once, outside the clock);
  - sentence-transformers, once per --st-dtype: SentenceTransformer(DIR, model_kwargs={"dtype":
    D}) with torch.set_num_threads(T), one untimed encode() of all texts, then R timed ones
    (batch_size --st-batch, its default 32; it sorts by length and pads each batch; the
    median; tokenization inside its clock, as encode() does it).
metrale packs the inputs' rows into its steps without padding (--max-rows rows a step, default
128); sentence-transformers pads each batch to its longest text. Both compute in what their
row says: metrale --compute f32 (bf16 weights widened in the kernels, f32 activations) or
bf16 (bf16 activations); torch in the dtype it loaded the weights in.

Agreement: every text's embedding from each metrale row against sentence-transformers' f32
row (cosine similarity, the minimum reported); a run whose minimum is below --min-cosine fails.
results.json records every flag, the versions (metrale commit, torch, transformers,
sentence-transformers), the load average before each measurement, and every round's time.
"""

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHAPE = {  # Qwen/Qwen3-Embedding-0.6B's config.json
    "vocab_size": 151669, "hidden_size": 1024, "intermediate_size": 3072,
    "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
    "head_dim": 128, "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True, "rope_theta": 1000000.0,
}
EOT = "<|endoftext|>"


def log(msg: str) -> None:
    print(f"[embed_bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def make_checkpoint(out: Path) -> None:
    """The random Qwen3-Embedding-0.6B directory (see the module's doc)."""
    import gzip

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if (out / "done").exists():
        return
    log(f"making the checkpoint in {out}")
    shutil.rmtree(out, ignore_errors=True)
    src = REPO / "tests" / "data" / "tokenizers" / "qwen3"
    tok = json.loads(gzip.decompress((src / "tokenizer.json.gz").read_bytes()))
    eot = next(t["id"] for t in tok["added_tokens"] if t["content"] == EOT)
    tok["post_processor"] = {  # Qwen3-Embedding's tokenizer.json
        "type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": EOT, "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": EOT, "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}},
                 {"SpecialToken": {"id": EOT, "type_id": 1}}],
        "special_tokens": {EOT: {"id": EOT, "ids": [eot], "tokens": [EOT]}},
    }
    s = dict(SHAPE)
    theta = s.pop("rope_theta")
    cfg = Qwen3Config(**s, hidden_act="silu", attention_bias=False, bos_token_id=eot,
                      eos_token_id=eot, pad_token_id=eot,
                      rope_parameters=dict(rope_type="default", rope_theta=theta))
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).eval()
    with torch.no_grad():  # transformers' init leaves norms at 1; give them spread too
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn_like(p))
    model.to(torch.bfloat16).save_pretrained(out)
    (out / "generation_config.json").unlink(missing_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False))
    tcfg = json.loads((src / "tokenizer_config.json").read_text())
    tcfg.update({"padding_side": "left", "pad_token": EOT, "eos_token": EOT,
                 "model_max_length": 32768})
    tcfg.pop("chat_template", None)
    dump(out / "tokenizer_config.json", tcfg)
    dump(out / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"}])
    (out / "1_Pooling").mkdir()
    dump(out / "1_Pooling" / "config.json", {
        "word_embedding_dimension": SHAPE["hidden_size"], "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False, "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": True, "include_prompt": True})
    (out / "2_Normalize").mkdir()
    dump(out / "sentence_bert_config.json", {"max_seq_length": 32768, "do_lower_case": False})
    (out / "done").write_text("")


def dump(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def kjv_passages(count: int, words: int) -> list[str]:
    """`count` passages of consecutive verses from Genesis 1:1, each >= `words` words."""
    if shutil.which("bible") is None:
        sys.exit("embed_bench: the KJV text comes from Debian's bible-kjv: "
                 "apt-get install bible-kjv bible-kjv-text")
    raw = subprocess.run(["bible", "-l", "100000", "gen1:1-gen50:26"], check=True,
                         capture_output=True, text=True).stdout
    verses = [m.group(1).strip() for line in raw.splitlines()
              if (m := re.match(r"^\s+\d+ (.*)$", line))]
    out, cur = [], []
    for v in verses:
        cur.append(v)
        if sum(len(x.split()) for x in cur) >= words:
            out.append(" ".join(cur))
            cur = []
            if len(out) == count:
                return out
    sys.exit(f"embed_bench: Genesis has fewer than {count} passages of {words} words")


def loadavg() -> float:
    return round(os.getloadavg()[0], 2)


def run_metrale(binary: Path, model: Path, texts_file: Path, threads: int, compute: str,
                rounds: int) -> dict:
    cmd = [str(binary), "embed", "--model", str(model), "--input-file", str(texts_file), "--json",
           "--threads", str(threads), "--compute", compute, "--rounds", str(rounds)]
    load = loadavg()
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"embed_bench: {' '.join(cmd)} failed:\n{r.stderr}")
    j = json.loads(r.stdout)
    t = j["timing"]
    return {"engine": "metrale", "config": f"--compute {compute}", "command": cmd,
            "loadavg": load, "rounds_s": t["rounds_s"], "median_s": t["median_s"],
            "tokens": t["tokens"], "embeddings": [d["embedding"] for d in j["data"]]}


class StPeer:
    def __init__(self, model: Path, threads: int, dtype: str, batch: int):
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        self.dtype = dtype
        self.batch = batch
        self.st = SentenceTransformer(str(model), device="cpu",
                                      model_kwargs={"dtype": getattr(torch, dtype)})
        got = next(self.st.parameters()).dtype
        if got != getattr(torch, dtype):
            sys.exit(f"embed_bench: sentence-transformers loaded {got}, asked for {dtype}")

    def run(self, texts: list[str], rounds: int) -> dict:
        enc = lambda: self.st.encode(texts, batch_size=self.batch, convert_to_numpy=True)  # noqa: E731
        load = loadavg()
        out = enc()  # warm-up, and the embeddings compared
        seconds = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            enc()
            seconds.append(time.perf_counter() - t0)
        return {"engine": "sentence-transformers", "config": f"dtype {self.dtype}", "loadavg": load,
                "rounds_s": seconds, "median_s": statistics.median(seconds),
                "embeddings": out.astype("float32").tolist()}


def min_cosine(a: list[list[float]], b: list[list[float]]) -> float:
    import numpy as np

    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    cos = (x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
    return float(cos.min())


def git_commit() -> str:
    r = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                       text=True)
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return r.stdout.strip() + ("-dirty" if dirty else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=str(REPO / "build" / "release" / "src" / "metrale"))
    ap.add_argument("--model-dir", default=str(REPO / "build" / "bench" / "qwen3-embedding-0.6b-random"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--texts", type=int, default=32)
    ap.add_argument("--words", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--metrale-compute", default="f32,bf16")
    ap.add_argument("--st-dtype", default="float32,bfloat16")
    ap.add_argument("--st-batch", type=int, default=32)
    ap.add_argument("--min-cosine", type=float, default=0.99)
    ap.add_argument("--out", default=str(REPO / "build" / "bench" / "embed"))
    a = ap.parse_args()
    if min(a.threads, a.texts, a.words, a.rounds, a.passes, a.st_batch) < 1:
        sys.exit("embed_bench: --threads, --texts, --words, --rounds, --passes and --st-batch "
                 "must be >= 1")
    computes = [c for c in a.metrale_compute.split(",") if c]
    dtypes = [d for d in a.st_dtype.split(",") if d]
    if "float32" not in dtypes:
        sys.exit("embed_bench: --st-dtype must include float32 (the agreement reference)")
    try:
        import sentence_transformers
        import torch
        import transformers
    except ImportError as e:
        sys.exit(f"embed_bench: {e.name} is missing: pip install the torch, transformers and "
                 "sentence-transformers lines of tools/bench/requirements.txt")
    binary, model, out = Path(a.bin), Path(a.model_dir), Path(a.out)
    if not binary.exists():
        sys.exit(f"embed_bench: {binary} is missing: cmake --preset release && "
                 "cmake --build --preset release --target metrale")
    out.mkdir(parents=True, exist_ok=True)
    make_checkpoint(model)
    texts = kjv_passages(a.texts, a.words)
    texts_file = out / "texts.txt"
    texts_file.write_text("\n".join(texts) + "\n")

    peers = {d: StPeer(model, a.threads, d, a.st_batch) for d in dtypes}
    rows: list[dict] = []
    for p in range(a.passes):
        for c in computes:
            log(f"pass {p + 1}: metrale --compute {c}")
            rows.append(dict(run_metrale(binary, model, texts_file, a.threads, c, a.rounds), passno=p))
        for d in dtypes:
            log(f"pass {p + 1}: sentence-transformers {d}")
            rows.append(dict(peers[d].run(texts, a.rounds), passno=p))

    ref = next(r for r in rows if r["engine"] == "sentence-transformers" and r["config"] == "dtype float32")
    tokens = next(r["tokens"] for r in rows if r["engine"] == "metrale")
    summary = {}
    for r in rows:
        key = f"{r['engine']} {r['config']}"
        s = summary.setdefault(key, {"medians_s": [], "loadavg": [], "min_cosine_vs_st_f32": None})
        s["medians_s"].append(r["median_s"])
        s["loadavg"].append(r["loadavg"])
        s["min_cosine_vs_st_f32"] = min_cosine(r["embeddings"], ref["embeddings"])
    for key, s in summary.items():
        s["best_median_s"] = min(s["medians_s"])
        s["sequences_per_s"] = a.texts / s["best_median_s"]
        s["tokens_per_s"] = tokens / s["best_median_s"]
    results = {
        "flags": vars(a), "argv": sys.argv, "tokens": tokens, "texts": texts,
        "versions": {"metrale": git_commit(), "torch": torch.__version__,
                     "transformers": transformers.__version__,
                     "sentence-transformers": sentence_transformers.__version__},
        "machine": {"nproc": os.cpu_count(), "loadavg_end": os.getloadavg()},
        "summary": summary,
        "rows": [{k: v for k, v in r.items() if k != "embeddings"} for r in rows],
    }
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    st_best = {k: v["sequences_per_s"] for k, v in summary.items() if k.startswith("sentence")}
    lines = [f"{a.texts} texts, {tokens} tokens (metrale's count, <|endoftext|> included), "
             f"{a.threads} threads; best of {a.passes} passes' medians of {a.rounds} rounds",
             "", "| engine | sequences/s | tokens/s | vs ST f32 | vs ST bf16 | min cosine vs ST f32 | "
             "load per pass |", "|---|---|---|---|---|---|---|"]
    for key, s in summary.items():
        rel = [f"{s['sequences_per_s'] / st_best[k]:.2f}x" if k in st_best else "-"
               for k in ("sentence-transformers dtype float32", "sentence-transformers dtype bfloat16")]
        lines.append(f"| {key} | {s['sequences_per_s']:.2f} | {s['tokens_per_s']:.0f} | {rel[0]} | "
                     f"{rel[1]} | {s['min_cosine_vs_st_f32']:.5f} | "
                     f"{', '.join(str(x) for x in s['loadavg'])} |")
    table = "\n".join(lines)
    (out / "table.md").write_text(table + "\n")
    print(table)
    worst = min(s["min_cosine_vs_st_f32"] for s in summary.values())
    if worst < a.min_cosine:
        sys.exit(f"embed_bench: an engine's embeddings disagree with sentence-transformers f32 "
                 f"(min cosine {worst:.5f} < --min-cosine {a.min_cosine})")


if __name__ == "__main__":
    main()
