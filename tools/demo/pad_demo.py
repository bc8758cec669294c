#!/usr/bin/env python3
"""Makes a memory-bound copy of models/demo_mtp (or models/demo): the same trained target (and
MTP drafter), computing exactly the same function, with weights that no longer fit the CPU's
caches.

Why: models/demo_mtp (3.3 MB) sits in L2/L3, so a k-row verify step costs about k decode steps
and speculation cannot pay off on it (docs/performance.md). Speculation's premise is a target
whose decode step streams its weights from DRAM, so that verifying K + 1 rows costs about one
step. Training a target that large takes hours of CPU; this script instead pads the trained
pair with weights that contribute exactly nothing:

- every FFN (the four target layers' and the MTP layer's, where there is one) grows from 384 to 384 * --ffn-multiple
  intermediate rows: the new gate/up rows are copies of the trained ones (realistic values), the
  new down_proj columns are zero, so each extra product adds +0.0 to an f32 sum;
- --identity-layers decoder layers are added after the four trained ones: each is a copy of a
  trained layer (its norms, MLA projections, FFN) with o_proj and down_proj zeroed, so attention
  and FFN both add +0.0 to the residual stream, which leaves it unchanged;
- the MTP layer moves to index num_hidden_layers (its own weights unchanged but for the FFN
  padding), first_k_dense_replace past it (every layer dense, as in the original).

models/demo (Qwen3-shaped, no MTP layer) pads the same way, for the n-gram comparison with
llama.cpp's lookup decoding (its GGUF converts; llama.cpp has no MTP drafting to compare).

The target's hidden states, logits and the drafter's drafts are those of models/demo_mtp up to
the order of f32 summation (the kernels block a longer K differently), so acceptance is the
trained pair's, and the cost per step is a 36-layer, 181 MB target's with a one-layer drafter
(1/36 of the target's FFN bytes; DeepSeek-V3 ships 1/61). It is a benchmark device, not a model:
nothing in it was trained beyond models/demo_mtp, and the docs say so wherever it is measured.

    python3 tools/demo/pad_demo.py --out build/bench-cache/demo_mtp_padded \\
        --ffn-multiple 16 --identity-layers 32

Deterministic (no randomness); the output is not committed (181 MB).
"""

import argparse
import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

kSource = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models",
                       "demo_mtp")


def pad_ffn(tensors, prefix, multiple):
    """Grows one dense FFN by `multiple`: gate/up rows repeated, down_proj columns zero-padded."""
    gate = tensors[prefix + "mlp.gate_proj.weight"]
    up = tensors[prefix + "mlp.up_proj.weight"]
    down = tensors[prefix + "mlp.down_proj.weight"]
    rows = gate.shape[0]
    tensors[prefix + "mlp.gate_proj.weight"] = gate.repeat(multiple, 1).contiguous()
    tensors[prefix + "mlp.up_proj.weight"] = up.repeat(multiple, 1).contiguous()
    padded = torch.zeros(down.shape[0], rows * multiple, dtype=down.dtype)
    padded[:, :rows] = down
    tensors[prefix + "mlp.down_proj.weight"] = padded


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", default=kSource, help="the trained pair (models/demo_mtp)")
    ap.add_argument("--out", required=True, help="directory to write the padded checkpoint to")
    ap.add_argument("--ffn-multiple", type=int, default=16,
                    help="each FFN's intermediate size becomes this many times the trained one")
    ap.add_argument("--identity-layers", type=int, default=32,
                    help="decoder layers added after the trained ones (each adds exactly 0)")
    args = ap.parse_args()
    if args.ffn_multiple < 1 or args.identity_layers < 0:
        ap.error("--ffn-multiple must be >= 1 and --identity-layers >= 0")

    with open(os.path.join(args.source, "config.json")) as f:
        config = json.load(f)
    model_type = config.get("model_type")
    trained = config["num_hidden_layers"]
    mtp_layers = config.get("num_nextn_predict_layers", 0)
    if model_type == "deepseek_v3":
        if config["first_k_dense_replace"] <= trained + mtp_layers - 1:
            raise SystemExit(f"{args.source}: expected every layer dense (first_k_dense_replace "
                             f"> {trained + mtp_layers - 1}), found "
                             f"{config['first_k_dense_replace']}")
    elif model_type != "qwen3" or mtp_layers != 0:
        raise SystemExit(f"{args.source}: expected models/demo_mtp (deepseek_v3) or models/demo "
                         f"(qwen3), found model_type {model_type!r}")
    if any(t != "full_attention" for t in config.get("layer_types", ["full_attention"])):
        raise SystemExit(f"{args.source}: expected full attention in every layer")
    source = load_file(os.path.join(args.source, "model.safetensors"))
    layers = trained + args.identity_layers

    out = {}
    for name, tensor in source.items():
        for m in range(mtp_layers):  # the MTP layers move past the new ones
            head = f"model.layers.{trained + m}."
            if name.startswith(head):
                name = f"model.layers.{layers + m}." + name[len(head):]
        out[name] = tensor
    for i in range(args.identity_layers):
        copy_of = i % trained  # a trained layer's weights, so the values are realistic
        for name, tensor in source.items():
            head = f"model.layers.{copy_of}."
            if not name.startswith(head):
                continue
            rest = name[len(head):]
            value = tensor.clone()
            if rest in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
                value.zero_()  # attention and FFN add exactly +0.0 to the residual
            out[f"model.layers.{trained + i}.{rest}"] = value
    for layer in range(layers + mtp_layers):
        pad_ffn(out, f"model.layers.{layer}.", args.ffn_multiple)

    config["num_hidden_layers"] = layers
    config["intermediate_size"] = config["intermediate_size"] * args.ffn_multiple
    if model_type == "deepseek_v3":
        config["first_k_dense_replace"] = layers + mtp_layers
    if "layer_types" in config:
        config["layer_types"] = ["full_attention"] * layers
    os.makedirs(args.out, exist_ok=True)
    save_file(dict(sorted(out.items())), os.path.join(args.out, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")
    for name in ("generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(args.source, name), os.path.join(args.out, name))
    total = sum(t.numel() * t.element_size() for t in out.values())
    print(f"{args.out}: {layers} decoder layers + {mtp_layers} MTP layer(s), intermediate "
          f"{config['intermediate_size']}, {len(out)} tensors, {total / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
