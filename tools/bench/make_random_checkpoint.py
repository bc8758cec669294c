#!/usr/bin/env python3
"""Random-weight bf16 checkpoints with real models' shapes, for benchmarks only.

    python3 tools/bench/make_random_checkpoint.py --shape qwen3-0.6b [--cache-dir DIR]

Builds the model with transformers' own config/model classes and writes it with
save_pretrained, so the directory is exactly what an HF checkpoint of that architecture looks
like. Weights are N(0, 0.02) (norm weights 1): logits stay in a sane range, which matters
because a degenerate model (NaNs, saturated softmax) can take different kernel paths.

Nothing here is committed: the checkpoints are 1.2-2.5 GB. They go to
<cache-dir>/<shape>/ (default /tmp/metrale-bench/checkpoints) and are reused when the marker
file says they were made with the same shape and seed. Prints the directory on stdout.
"""

import argparse
import gzip
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
QWEN3_TOKENIZER = REPO / "tests/data/tokenizers/qwen3"
MARKER = "metrale_random_checkpoint.json"
DEFAULT_CACHE = Path("/tmp/metrale-bench/checkpoints")

# The published config.json of each model, minus weights-irrelevant bookkeeping.
SHAPES = {
    "qwen3-0.6b": {
        "class": "Qwen3",
        "config": dict(
            vocab_size=151936, hidden_size=1024, intermediate_size=3072,
            num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
            head_dim=128, hidden_act="silu", max_position_embeddings=40960,
            initializer_range=0.02, rms_norm_eps=1e-6, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
            attention_bias=False, use_sliding_window=False, sliding_window=None,
            max_window_layers=28, attention_dropout=0.0,
            bos_token_id=151643, eos_token_id=151645),
        "tokenizer": "qwen3",
    },
    "llama-3.2-1b": {
        "class": "Llama",
        "config": dict(
            vocab_size=128256, hidden_size=2048, intermediate_size=8192,
            num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
            head_dim=64, hidden_act="silu", max_position_embeddings=131072,
            initializer_range=0.02, rms_norm_eps=1e-5, tie_word_embeddings=True,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
                             "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                             "original_max_position_embeddings": 8192},
            attention_bias=False, mlp_bias=False, pretraining_tp=1, attention_dropout=0.0,
            bos_token_id=128000, eos_token_id=128001),
        "tokenizer": "llama3-like",
    },
}


def write_qwen3_tokenizer(out: Path) -> None:
    with gzip.open(QWEN3_TOKENIZER / "tokenizer.json.gz", "rb") as f:
        (out / "tokenizer.json").write_bytes(f.read())
    shutil.copy(QWEN3_TOKENIZER / "tokenizer_config.json", out / "tokenizer_config.json")


def write_llama3_like_tokenizer(out: Path, n_base: int = 128000, n_special: int = 256) -> None:
    """Llama 3's vocabulary layout (128000 BPE tokens + 256 specials = 128256) built from the
    committed Qwen3 tokenizer, since the Llama 3 tokenizer itself is not available offline.
    Only the layout matters for benchmarks (llama.cpp's GGUF needs a vocabulary of vocab_size
    entries); the benchmarks feed token ids, never text."""
    with gzip.open(QWEN3_TOKENIZER / "tokenizer.json.gz", "rt", encoding="utf-8") as f:
        tok = json.load(f)
    vocab = {t: i for t, i in tok["model"]["vocab"].items() if i < n_base}
    if len(vocab) != n_base:
        sys.exit(f"qwen3 tokenizer: expected >= {n_base} base tokens, found {len(vocab)}")

    def pair(m):
        return m.split(" ", 1) if isinstance(m, str) else m

    # A merge survives only if its inputs and its output are still in the vocabulary.
    tok["model"]["merges"] = [m for m in tok["model"]["merges"]
                              if all(p in vocab for p in pair(m)) and "".join(pair(m)) in vocab]
    tok["model"]["vocab"] = vocab
    names = ["<|begin_of_text|>", "<|end_of_text|>"] + [
        f"<|reserved_special_token_{i}|>" for i in range(n_special - 2)]
    tok["added_tokens"] = [
        {"id": n_base + i, "content": name, "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True} for i, name in enumerate(names)]
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": names[0], "eos_token": names[1], "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2))


def make(shape: str, out: Path, seed: int) -> None:
    import torch
    import transformers

    spec = SHAPES[shape]
    config_cls = getattr(transformers, spec["class"] + "Config")
    model_cls = getattr(transformers, spec["class"] + "ForCausalLM")
    config = config_cls(**spec["config"])
    config.dtype = torch.bfloat16
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.bfloat16)
    # Re-initialise explicitly so the distribution does not depend on transformers' defaults.
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:  # RMSNorm weights (these architectures have no biases)
                p.fill_(1.0)
            else:
                p.copy_(torch.empty(p.shape, dtype=torch.float32).normal_(0.0, 0.02, generator=gen))
    model.save_pretrained(out)
    if spec["tokenizer"] == "qwen3":
        write_qwen3_tokenizer(out)
    else:
        write_llama3_like_tokenizer(out)
    n_params = sum(p.numel() for p in model.parameters())
    (out / MARKER).write_text(json.dumps({"shape": shape, "seed": seed, "params": n_params,
                                          "transformers": transformers.__version__}, indent=2))


def ensure(shape: str, cache_dir: Path = DEFAULT_CACHE, seed: int = 0, force: bool = False) -> Path:
    """Returns the checkpoint directory, making it first when missing or stale."""
    if shape not in SHAPES:
        sys.exit(f"unknown --shape {shape!r}; expected one of {sorted(SHAPES)}")
    out = cache_dir / shape
    marker = out / MARKER
    if not force and marker.exists():
        m = json.loads(marker.read_text())
        if m.get("shape") == shape and m.get("seed") == seed:
            return out
    if out.exists():
        shutil.rmtree(out)
    tmp = cache_dir / (shape + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    make(shape, tmp, seed)
    tmp.rename(out)  # only a complete checkpoint ever carries the final name
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--shape", required=True, choices=sorted(SHAPES))
    ap.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="regenerate even if cached")
    args = ap.parse_args()
    print(ensure(args.shape, args.cache_dir, args.seed, args.force))


if __name__ == "__main__":
    main()
