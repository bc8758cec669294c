#!/usr/bin/env python3
"""Random PEFT LoRA adapters for a benchmark checkpoint (what `bench/compare/run.py --lora-mix`
serves; the tests use real PEFT output, tests/data/fixtures/lora).

    python3 tools/bench/make_lora_adapters.py --model DIR --out DIR --count 16 [--rank 16]

Writes <out>/lora-<i>/ for i in [0, count): adapter_config.json and adapter_model.safetensors
in the layout PEFT 0.21's save_pretrained writes (keys base_model.model.<module>.lora_A.weight
[r, in] / .lora_B.weight [out, r], bf16), with r = lora_alpha = --rank on every attention and
MLP projection (q, k, v, o, gate, up, down) of every layer. A is uniform in +-1/sqrt(in) (PEFT's
kaiming-uniform bound), B normal with std 0.02 / sqrt(r), so the adapters change the logits
without swamping the base model. Seeded per adapter: reruns give the same bytes.
"""

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

PROJ = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn",
        "o_proj": "self_attn", "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}


def shapes(cfg: dict) -> dict:
    """[out, in] of every adapted projection."""
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    return {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
            "gate_proj": (inter, h), "up_proj": (inter, h), "down_proj": (h, inter)}


def make(model: Path, out: Path, index: int, rank: int) -> Path:
    cfg = json.loads((model / "config.json").read_text())
    rng = np.random.default_rng(1000 + index)
    tensors = {}
    for layer in range(cfg["num_hidden_layers"]):
        for name, (o, i) in shapes(cfg).items():
            key = f"base_model.model.model.layers.{layer}.{PROJ[name]}.{name}"
            a = rng.uniform(-1, 1, size=(rank, i)).astype(np.float32) / np.sqrt(i)
            b = rng.standard_normal(size=(o, rank)).astype(np.float32) * 0.02 / np.sqrt(rank)
            tensors[key + ".lora_A.weight"] = torch.from_numpy(a).to(torch.bfloat16)
            tensors[key + ".lora_B.weight"] = torch.from_numpy(b).to(torch.bfloat16)
    d = out / f"lora-{index}"
    d.mkdir(parents=True, exist_ok=True)
    save_file(tensors, d / "adapter_model.safetensors")
    (d / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": rank,
        "lora_dropout": 0.0, "bias": "none", "use_rslora": False, "fan_in_fan_out": False,
        "target_modules": sorted(PROJ), "base_model_name_or_path": str(model),
        "inference_mode": True}, indent=2, sort_keys=True) + "\n")
    return d


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--count", type=int, default=16)
    ap.add_argument("--rank", type=int, default=16)
    a = ap.parse_args()
    for i in range(a.count):
        print(make(a.model, a.out, i, a.rank))


if __name__ == "__main__":
    main()
