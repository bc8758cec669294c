#!/usr/bin/env python3
"""Random-weight bf16 checkpoints with real models' shapes, for benchmarks only.

    python3 tools/bench/make_random_checkpoint.py --shape qwen3-0.6b [--cache-dir DIR]
    python3 tools/bench/make_random_checkpoint.py --shape qwen3-30b-a3b [--layers 6]
    python3 tools/bench/make_random_checkpoint.py --shape qwen3-next-L2
    python3 tools/bench/make_random_checkpoint.py --shape deepseek-v2-lite-L4

Dense shapes (qwen3-0.6b, llama-3.2-1b) are built with transformers' own config/model classes
and written with save_pretrained, so the directory is exactly what an HF checkpoint of that
architecture looks like. Weights are N(0, 0.02) (norm weights 1): logits stay in a sane range,
which matters because a degenerate model (NaNs, saturated softmax) can take different kernel
paths.

The MoE shape qwen3-30b-a3b-L<N> is Qwen3-30B-A3B (hidden 2048, 128 experts, top-8, expert
intermediate 768, 32 heads / 4 KV heads, head_dim 128, untied lm_head) with only N of its 48
layers. It is streamed to disk tensor by tensor with numpy (no torch, never more than one
chunk in RAM) in the published layout: the published config.json, sharded
model-0000K-of-0000M.safetensors + model.safetensors.index.json, per-expert tensors
model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight and the router model.layers.N.mlp.gate.
Each tensor's values depend only on (seed, tensor name), not on chunking or sharding.
The default N=6 makes an 8.7 GB bf16 checkpoint (1.25 GB per layer + 1.24 GB of embedding and
lm_head), so the file in the page cache plus an engine's copy fit 23 GiB of RAM.

The hybrid shape qwen3-next-L<N> is Qwen3-Next-80B-A3B (Qwen3NextForCausalLM: hidden 2048,
512 experts, top-10, expert and shared-expert intermediate 512, untied lm_head; gated
full attention with 16 query / 2 KV heads of dim 256 and partial rotary 0.25 on every 4th
layer, gated-delta-net linear attention with 16 key / 32 value heads of dim 128 and a
4-tap causal conv on the others) with only N of its 48 layers, streamed the same way in the
same per-expert published layout (plus mlp.shared_expert.* and mlp.shared_expert_gate).
layer_types is written out: layer i is full attention when (i + 1) % 4 == 0, and when
N < 4 (no such layer) the last layer is made full attention so that both kinds are present;
N >= 2 for that reason. The published checkpoint's multi-token-prediction head (mtp.*, one
more full-attention MoE layer used only for speculative decoding) is left out. Weights are
initialised as Qwen3NextPreTrainedModel does, in bf16: matrices, conv taps and the router
N(0, 0.02); the zero-centred RMSNorm weights (output * (1 + w)) 0; the gated norm of the
linear attention 1; dt_bias 1; A_log = log U(0.01, 16). Each layer holds 3.22 GB of routed
experts, so N=2 (the default) makes a 7.83 GB checkpoint, the fewest layers with both kinds:
the safetensors and the GGUF in the page cache plus one engine's copy of the weights come to
3 x 7.8 = 23.5 GB of the machine's 24.7 GB (23 GiB), the largest that fits; N=3 (11 GB) would
not fit even two of them beside an engine.

The MLA shape deepseek-v2-lite-L<N> is DeepSeek-V2-Lite's published dimensions (hidden 2048,
16 heads, q_lora_rank null (a full-rank q_proj), kv_lora_rank 512, qk_rope_head_dim 64,
qk_nope_head_dim 128, v_head_dim 128; 64 routed experts top-6 with expert intermediate 1408,
2 shared experts, n_group 1 / topk_group 1, norm_topk_prob false, routed_scaling_factor 1.0;
first_k_dense_replace 1 with the dense layer's intermediate 10944; vocab 102400, untied
lm_head; rope_theta 10000 with the YaRN scaling V2-Lite ships: factor 40 over 4096 original
positions, beta_fast 32, beta_slow 1, mscale = mscale_all_dim = 0.707, so the rope's
frequencies are YaRN's and the softmax scale is multiplied by mscale^2 = 1.261^2; rope on
interleaved pairs as DeepSeek's own code does) with only N of its 27 layers: layer 0 dense,
the rest MoE. It is written as model_type deepseek_v3 (DeepseekV3ForCausalLM), the MLA model
metrale and transformers 5 run, so the router is V3's: sigmoid scores plus
e_score_correction_bias (zeros, as DeepseekV3 initialises it) for the choice, where V2-Lite's
own deepseek_v2 type has a softmax router; the per-token work (64 experts, 6 chosen) is the
same. llama.cpp's converter maps DeepseekV3ForCausalLM to its deepseek2 architecture (MLA with
the absorbed k_b / v_b tensors; scoring_func "sigmoid" in the config selects its sigmoid
gating). The tokenizer is DeepSeek's layout (100000 BPE tokens, then specials: bos, eos and
reserved ones up to the config's vocab_size 102400) re-cut from the committed Qwen3 one, as
for llama-3.2-1b. Per MoE layer 1.15 GB, the dense layer 0.16 GB, embedding + lm_head
0.84 GB: N=4 (the default) makes a 4.5 GB checkpoint.

Nothing here is committed: the checkpoints are 1.2-9 GB. They go to <cache-dir>/<shape>/
(default /tmp/metrale-bench/checkpoints) and are reused when the marker file says they were
made with the same shape and seed. Prints the directory on stdout.
"""

import argparse
import gzip
import hashlib
import json
import re
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

# Qwen3-30B-A3B's published config.json; `ensure("qwen3-30b-a3b-L<N>")` keeps N of its 48
# layers (num_hidden_layers and max_window_layers = N). Streamed, not built with transformers.
QWEN3_MOE_BASE = "qwen3-30b-a3b"
QWEN3_MOE_DEFAULT_LAYERS = 6
QWEN3_MOE_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,
    "max_position_embeddings": 40960,
    "max_window_layers": 48,
    "mlp_only_layers": [],
    "model_type": "qwen3_moe",
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "num_attention_heads": 32,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "num_hidden_layers": 48,
    "num_key_value_heads": 4,
    "output_router_logits": False,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000.0,
    "router_aux_loss_coef": 0.001,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

# Qwen3-Next-80B-A3B's published config.json (Qwen/Qwen3-Next-80B-A3B-Instruct; the same as
# tests/data/configs/qwen3_next/config.json); `ensure("qwen3-next-L<N>")` keeps N of its 48
# layers and writes layer_types out (see qwen3_next_layer_types). Streamed like Qwen3-MoE.
QWEN3_NEXT_BASE = "qwen3-next"
QWEN3_NEXT_DEFAULT_LAYERS = 2
QWEN3_NEXT_CONFIG = {
    "architectures": ["Qwen3NextForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "decoder_sparse_step": 1,
    "eos_token_id": 151645,
    "full_attention_interval": 4,
    "head_dim": 256,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 5120,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
    "linear_value_head_dim": 128,
    "max_position_embeddings": 262144,
    "mlp_only_layers": [],
    "model_type": "qwen3_next",
    "moe_intermediate_size": 512,
    "norm_topk_prob": True,
    "num_attention_heads": 16,
    "num_experts": 512,
    "num_experts_per_tok": 10,
    "num_hidden_layers": 48,
    "num_key_value_heads": 2,
    "output_router_logits": False,
    "partial_rotary_factor": 0.25,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 10000000,
    "router_aux_loss_coef": 0.001,
    "shared_expert_intermediate_size": 512,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.57.0.dev0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}

# DeepSeek-V2-Lite's dimensions as a deepseek_v3 config (see the module docstring);
# `ensure("deepseek-v2-lite-L<N>")` keeps N of its 27 layers. Streamed like Qwen3-MoE.
DEEPSEEK_V2_LITE_BASE = "deepseek-v2-lite"
DEEPSEEK_V2_LITE_DEFAULT_LAYERS = 4
DEEPSEEK_V2_LITE_CONFIG = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 100000,
    "eos_token_id": 100001,
    "first_k_dense_replace": 1,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 10944,
    "kv_lora_rank": 512,
    "max_position_embeddings": 163840,
    "model_type": "deepseek_v3",
    "moe_intermediate_size": 1408,
    "moe_layer_freq": 1,
    "n_group": 1,
    "n_routed_experts": 64,
    "n_shared_experts": 2,
    "norm_topk_prob": False,
    "num_attention_heads": 16,
    "num_experts_per_tok": 6,
    "num_hidden_layers": 27,
    "num_key_value_heads": 16,
    "num_nextn_predict_layers": 0,
    "q_lora_rank": None,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "rms_norm_eps": 1e-06,
    "rope_interleave": True,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 0.707,
                     "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096,
                     "type": "yarn"},
    "rope_theta": 10000,
    "routed_scaling_factor": 1.0,
    "scoring_func": "sigmoid",
    "tie_word_embeddings": False,
    "topk_group": 1,
    "topk_method": "noaux_tc",
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "v_head_dim": 128,
    "vocab_size": 102400,
}

# Streamed families: base name -> what canonical_shape / make_streamed need. Layer counts are
# chosen per run with -L<N> (or --layers); SHAPES lists each family's default.
STREAMED = {
    QWEN3_MOE_BASE: {
        "class": "Qwen3Moe", "real_layers": 48, "min_layers": 1,
        "default_layers": QWEN3_MOE_DEFAULT_LAYERS,
        "description": "Qwen3-30B-A3B (48 layers, 128 experts, top-8) with the first N layers",
    },
    QWEN3_NEXT_BASE: {
        "class": "Qwen3Next", "real_layers": 48, "min_layers": 2,
        "default_layers": QWEN3_NEXT_DEFAULT_LAYERS,
        "description": "Qwen3-Next-80B-A3B (48 layers, 512 experts, top-10 + shared expert; "
                       "gated-delta-net linear attention, full attention on every 4th layer) "
                       "with N layers: layer i is full attention when (i + 1) % 4 == 0, and "
                       "for N < 4 the last layer is full attention so both kinds are present "
                       "(N=2: linear, full); no MTP head",
    },
    DEEPSEEK_V2_LITE_BASE: {
        "class": "DeepseekV3", "real_layers": 27, "min_layers": 2,
        "default_layers": DEEPSEEK_V2_LITE_DEFAULT_LAYERS, "tokenizer": "deepseek-like",
        "description": "DeepSeek-V2-Lite's dimensions (MLA: 16 heads, q_lora_rank null, "
                       "kv_lora_rank 512, rope 64, nope 128, v 128; 64 routed experts top-6, "
                       "expert intermediate 1408, 2 shared; YaRN factor 40, mscale 0.707) as a "
                       "deepseek_v3 checkpoint (sigmoid router, zero correction bias) with N of "
                       "its 27 layers: layer 0 dense (intermediate 10944), the rest MoE",
    },
}
for _base, _fam in STREAMED.items():
    SHAPES[f"{_base}-L{_fam['default_layers']}"] = {
        "class": _fam["class"], "streamed": True, "tokenizer": _fam.get("tokenizer", "qwen3"),
        "description": _fam["description"]}
SHARD_BYTES = 4 * 10**9  # published checkpoints use ~4-5 GB shards


def streamed_family(shape: str) -> tuple[str, int | None] | None:
    """('qwen3-next', 2) for 'qwen3-next-L2', ('qwen3-next', None) for 'qwen3-next'; None when
    the name is not a streamed family's."""
    for base in STREAMED:
        m = re.fullmatch(re.escape(base) + r"(?:-L(\d+))?", shape)
        if m:
            return base, int(m.group(1)) if m.group(1) else None
    return None


def canonical_shape(shape: str, layers: int | None = None) -> str:
    """'qwen3-30b-a3b' (+ layers) or 'qwen3-30b-a3b-L<N>' -> 'qwen3-30b-a3b-L<N>', the same for
    'qwen3-next'; dense names pass through. Exits on an unknown name."""
    fam = streamed_family(shape)
    if fam:
        base, n = fam
        spec = STREAMED[base]
        if layers is not None and n is not None and layers != n:
            sys.exit(f"--shape {shape} and --layers {layers} disagree")
        n = n or layers or spec["default_layers"]
        lo, hi = spec["min_layers"], spec["real_layers"]
        if not lo <= n <= hi:
            why = {QWEN3_NEXT_BASE: " (2 is the fewest with both a linear-attention and a "
                                    "full-attention layer)",
                   DEEPSEEK_V2_LITE_BASE: " (2 is the fewest with both the dense layer and an "
                                          "MoE layer)"}.get(base, "")
            sys.exit(f"{base}: layers must be {lo}..{hi} (the real model has {hi}){why}, "
                     f"found {n}")
        return f"{base}-L{n}"
    if shape not in SHAPES:
        sys.exit(f"unknown shape {shape!r}; expected one of {sorted(SHAPES)} or "
                 + " or ".join(f"{b}-L<layers>" for b in STREAMED))
    if layers is not None:
        sys.exit(f"--layers applies to {', '.join(STREAMED)} only, not {shape}")
    return shape


def shape_spec(shape: str) -> dict:
    """SHAPES entry of a canonical shape name (any <streamed family>-L<N>)."""
    fam = streamed_family(shape)
    if fam:
        spec = STREAMED[fam[0]]
        return {"class": spec["class"], "streamed": True,
                "tokenizer": spec.get("tokenizer", "qwen3"), "description": spec["description"]}
    return SHAPES[shape]


def qwen3_moe_config(layers: int) -> dict:
    config = dict(QWEN3_MOE_CONFIG)
    config["num_hidden_layers"] = layers
    config["max_window_layers"] = layers
    return config



def expert_tensors(p, e, f, h):
    """The per-expert tensors of one MoE layer (prefix p), as published checkpoints name them."""
    out = []
    for j in range(e):
        q = f"{p}mlp.experts.{j}."
        out += [(q + "gate_proj.weight", (f, h), "normal"),
                (q + "up_proj.weight", (f, h), "normal"),
                (q + "down_proj.weight", (h, f), "normal")]
    return out

def qwen3_moe_tensors(config: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, init) of every tensor of a Qwen3-MoE checkpoint, in the published names;
    init is "normal" (N(0, 0.02)) or "ones" (RMSNorm weights)."""
    h, v = config["hidden_size"], config["vocab_size"]
    d, nq, nkv = config["head_dim"], config["num_attention_heads"], config["num_key_value_heads"]
    e, f = config["num_experts"], config["moe_intermediate_size"]
    out = [("model.embed_tokens.weight", (v, h), "normal")]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out += [
            (p + "input_layernorm.weight", (h,), "ones"),
            (p + "self_attn.q_proj.weight", (nq * d, h), "normal"),
            (p + "self_attn.k_proj.weight", (nkv * d, h), "normal"),
            (p + "self_attn.v_proj.weight", (nkv * d, h), "normal"),
            (p + "self_attn.o_proj.weight", (h, nq * d), "normal"),
            (p + "self_attn.q_norm.weight", (d,), "ones"),
            (p + "self_attn.k_norm.weight", (d,), "ones"),
            (p + "post_attention_layernorm.weight", (h,), "ones"),
            (p + "mlp.gate.weight", (e, h), "normal"),  # router
        ]
        out += expert_tensors(p, e, f, h)
    out += [("model.norm.weight", (h,), "ones"), ("lm_head.weight", (v, h), "normal")]
    return out


def qwen3_next_layer_types(layers: int) -> list[str]:
    """Qwen3NextConfig's default pattern (full attention when (i + 1) % 4 == 0) for the first
    `layers` layers; with fewer than 4 layers (no full-attention layer) the last one is full
    attention, so both kinds are present."""
    interval = QWEN3_NEXT_CONFIG["full_attention_interval"]
    types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention"
             for i in range(layers)]
    if "full_attention" not in types:
        types[-1] = "full_attention"
    return types


def qwen3_next_config(layers: int) -> dict:
    config = dict(QWEN3_NEXT_CONFIG)
    config["num_hidden_layers"] = layers
    config["layer_types"] = qwen3_next_layer_types(layers)
    return config


def qwen3_next_tensors(config: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, init) of every tensor of a Qwen3-Next checkpoint in the published names
    (per-expert routed experts; no mtp.* head). init: "normal" N(0, 0.02), "zeros" (the
    zero-centred Qwen3NextRMSNorm), "ones" (the gated norm, dt_bias), "a_log"."""
    h, v = config["hidden_size"], config["vocab_size"]
    d, nq, nkv = config["head_dim"], config["num_attention_heads"], config["num_key_value_heads"]
    e, f = config["num_experts"], config["moe_intermediate_size"]
    fs = config["shared_expert_intermediate_size"]
    nk, nv = config["linear_num_key_heads"], config["linear_num_value_heads"]
    dk, dv = config["linear_key_head_dim"], config["linear_value_head_dim"]
    key_dim, value_dim = nk * dk, nv * dv
    conv_dim = 2 * key_dim + value_dim
    out = [("model.embed_tokens.weight", (v, h), "normal")]
    for i, kind in enumerate(config["layer_types"]):
        p = f"model.layers.{i}."
        out.append((p + "input_layernorm.weight", (h,), "zeros"))
        if kind == "full_attention":
            out += [
                (p + "self_attn.q_proj.weight", (2 * nq * d, h), "normal"),  # query | gate
                (p + "self_attn.k_proj.weight", (nkv * d, h), "normal"),
                (p + "self_attn.v_proj.weight", (nkv * d, h), "normal"),
                (p + "self_attn.o_proj.weight", (h, nq * d), "normal"),
                (p + "self_attn.q_norm.weight", (d,), "zeros"),
                (p + "self_attn.k_norm.weight", (d,), "zeros"),
            ]
        else:
            q = p + "linear_attn."
            out += [
                (q + "in_proj_qkvz.weight", (2 * key_dim + 2 * value_dim, h), "normal"),
                (q + "in_proj_ba.weight", (2 * nv, h), "normal"),
                (q + "conv1d.weight", (conv_dim, 1, config["linear_conv_kernel_dim"]), "normal"),
                (q + "dt_bias", (nv,), "ones"),
                (q + "A_log", (nv,), "a_log"),
                (q + "norm.weight", (dv,), "ones"),
                (q + "out_proj.weight", (h, value_dim), "normal"),
            ]
        out += [
            (p + "post_attention_layernorm.weight", (h,), "zeros"),
            (p + "mlp.gate.weight", (e, h), "normal"),  # router
        ]
        out += expert_tensors(p, e, f, h)
        out += [(p + "mlp.shared_expert.gate_proj.weight", (fs, h), "normal"),
                (p + "mlp.shared_expert.up_proj.weight", (fs, h), "normal"),
                (p + "mlp.shared_expert.down_proj.weight", (h, fs), "normal"),
                (p + "mlp.shared_expert_gate.weight", (1, h), "normal")]
    out += [("model.norm.weight", (h,), "zeros"), ("lm_head.weight", (v, h), "normal")]
    return out


def deepseek_v2_lite_config(layers: int) -> dict:
    config = dict(DEEPSEEK_V2_LITE_CONFIG)
    config["num_hidden_layers"] = layers
    return config


def deepseek_v3_tensors(config: dict) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, init) of every tensor of a DeepSeek-V3-type checkpoint without q_lora
    (q_proj full rank) in the published names: MLA attention, a dense MLP for the first
    first_k_dense_replace layers, then the router (+ e_score_correction_bias, "zeros"), the
    per-expert routed experts and the shared experts (one MLP of n_shared_experts x the
    expert intermediate)."""
    assert config["q_lora_rank"] is None
    h, v, n = config["hidden_size"], config["vocab_size"], config["num_attention_heads"]
    r, rope = config["kv_lora_rank"], config["qk_rope_head_dim"]
    nope, vd = config["qk_nope_head_dim"], config["v_head_dim"]
    e, f = config["n_routed_experts"], config["moe_intermediate_size"]
    fs = config["n_shared_experts"] * f
    out = [("model.embed_tokens.weight", (v, h), "normal")]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        out += [
            (p + "input_layernorm.weight", (h,), "ones"),
            (a + "q_proj.weight", (n * (nope + rope), h), "normal"),
            (a + "kv_a_proj_with_mqa.weight", (r + rope, h), "normal"),
            (a + "kv_a_layernorm.weight", (r,), "ones"),
            (a + "kv_b_proj.weight", (n * (nope + vd), r), "normal"),
            (a + "o_proj.weight", (h, n * vd), "normal"),
            (p + "post_attention_layernorm.weight", (h,), "ones"),
        ]
        if i < config["first_k_dense_replace"]:
            fd = config["intermediate_size"]
            out += [(p + "mlp.gate_proj.weight", (fd, h), "normal"),
                    (p + "mlp.up_proj.weight", (fd, h), "normal"),
                    (p + "mlp.down_proj.weight", (h, fd), "normal")]
            continue
        out += [(p + "mlp.gate.weight", (e, h), "normal"),  # router
                (p + "mlp.gate.e_score_correction_bias", (e,), "zeros")]
        out += expert_tensors(p, e, f, h)
        out += [(p + "mlp.shared_experts.gate_proj.weight", (fs, h), "normal"),
                (p + "mlp.shared_experts.up_proj.weight", (fs, h), "normal"),
                (p + "mlp.shared_experts.down_proj.weight", (h, fs), "normal")]
    out += [("model.norm.weight", (h,), "ones"), ("lm_head.weight", (v, h), "normal")]
    return out


def write_bf16_values(fh, name: str, numel: int, init: str, seed: int,
                      chunk: int = 1 << 24) -> None:
    """Writes numel bf16 values of `init` to fh, `chunk` at a time. The stream is seeded by
    (seed, name) alone, so the values do not depend on the chunk size or the shard layout."""
    import numpy as np

    if init == "ones":
        np.full(numel, 0x3F80, dtype="<u2").tofile(fh)  # bf16 1.0
        return
    if init == "zeros":
        np.zeros(numel, dtype="<u2").tofile(fh)
        return
    name_key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    rng = np.random.Generator(np.random.PCG64([seed, name_key]))
    left = numel
    while left:
        n = min(chunk, left)
        if init == "a_log":  # Qwen3NextPreTrainedModel: A_log = log(U(0.01, 16))
            x = np.log(rng.uniform(0.01, 16.0, n)).astype(np.float32)
        elif init == "normal":
            x = rng.standard_normal(n, dtype=np.float32)
            x *= np.float32(0.02)
        else:
            raise ValueError(f"{name}: unknown init {init!r}")
        u = x.view(np.uint32)
        u += np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))  # round to nearest even
        (u >> np.uint32(16)).astype("<u2").tofile(fh)
        left -= n


def write_streamed_safetensors(out: Path, tensors: list[tuple[str, tuple[int, ...], str]],
                               seed: int, shard_bytes: int = SHARD_BYTES) -> int:
    """Writes bf16 `tensors` as HF-style shards + model.safetensors.index.json, one chunk in
    memory at a time; returns the total tensor bytes."""
    shards: list[list[tuple[str, tuple[int, ...], str]]] = [[]]
    size = 0
    for t in tensors:
        nbytes = 2 * _numel(t[1])
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += nbytes
    weight_map, total = {}, 0
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        header, offset = {"__metadata__": {"format": "pt"}}, 0
        for name, shape, _ in shard:
            nbytes = 2 * _numel(shape)
            header[name] = {"dtype": "BF16", "shape": list(shape),
                            "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
            weight_map[name] = fname
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)  # the data section starts 8-byte aligned
        with open(out / fname, "wb") as fh:
            fh.write(len(blob).to_bytes(8, "little"))
            fh.write(blob)
            for name, shape, init in shard:
                write_bf16_values(fh, name, _numel(shape), init, seed)
        total += offset
        print(f"make_random_checkpoint: wrote {fname} ({offset / 1e9:.2f} GB)", file=sys.stderr,
              flush=True)
    (out / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    return total


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def make_streamed(shape: str, out: Path, seed: int) -> None:
    base, layers = streamed_family(shape)
    if base == QWEN3_NEXT_BASE:
        config = qwen3_next_config(layers)
        tensors = qwen3_next_tensors(config)
    elif base == DEEPSEEK_V2_LITE_BASE:
        config = deepseek_v2_lite_config(layers)
        tensors = deepseek_v3_tensors(config)
    else:
        config = qwen3_moe_config(layers)
        tensors = qwen3_moe_tensors(config)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    total = write_streamed_safetensors(out, tensors, seed)
    if STREAMED[base].get("tokenizer") == "deepseek-like":
        write_deepseek_like_tokenizer(out)
    else:
        write_qwen3_tokenizer(out)
    import numpy as np
    (out / MARKER).write_text(json.dumps({
        "shape": shape, "seed": seed, "params": total // 2, "bytes": total,
        "writer": "streamed numpy (make_random_checkpoint.write_streamed_safetensors)",
        "numpy": np.__version__}, indent=2))


def write_qwen3_tokenizer(out: Path) -> None:
    with gzip.open(QWEN3_TOKENIZER / "tokenizer.json.gz", "rb") as f:
        (out / "tokenizer.json").write_bytes(f.read())
    shutil.copy(QWEN3_TOKENIZER / "tokenizer_config.json", out / "tokenizer_config.json")


def write_llama3_like_tokenizer(out: Path, n_base: int = 128000, n_special: int = 256) -> None:
    """Llama 3's vocabulary layout (128000 BPE tokens + 256 specials = 128256) built from the
    committed Qwen3 tokenizer, since the Llama 3 tokenizer itself is not available offline.
    Only the layout matters for benchmarks (llama.cpp's GGUF needs a vocabulary of vocab_size
    entries); the benchmarks feed token ids, never text."""
    names = ["<|begin_of_text|>", "<|end_of_text|>"] + [
        f"<|reserved_special_token_{i}|>" for i in range(n_special - 2)]
    write_recut_tokenizer(out, n_base, names, model_max_length=131072)


def write_deepseek_like_tokenizer(out: Path, n_base: int = 100000, n_special: int = 2400) -> None:
    """DeepSeek-V2's vocabulary layout (100000 BPE tokens, then specials from id 100000, bos
    <｜begin▁of▁sentence｜> and eos <｜end▁of▁sentence｜> first) re-cut from the committed Qwen3
    tokenizer, as write_llama3_like_tokenizer does for Llama 3. DeepSeek-V2 ships 15 specials
    and pads the embedding to vocab_size 102400; here reserved specials fill the padding too, so
    every id a random-weight model may pick (greedy over all 102400 logits) is a token that
    `metrale generate --ids` accepts back."""
    names = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"] + [
        f"<|reserved_special_token_{i}|>" for i in range(n_special - 2)]
    write_recut_tokenizer(out, n_base, names, model_max_length=16384)


def write_recut_tokenizer(out: Path, n_base: int, names: list[str],
                          model_max_length: int) -> None:
    """The committed Qwen3 tokenizer cut to its first n_base tokens (and the merges that stay
    within them), then `names` as special tokens from id n_base; bos / eos are names[0:2]."""
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
    tok["added_tokens"] = [
        {"id": n_base + i, "content": name, "single_word": False, "lstrip": False,
         "rstrip": False, "normalized": False, "special": True} for i, name in enumerate(names)]
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": names[0], "eos_token": names[1], "model_max_length": model_max_length,
        "tokenizer_class": "PreTrainedTokenizerFast"}, indent=2))


def make(shape: str, out: Path, seed: int) -> None:
    spec = shape_spec(shape)
    if spec.get("streamed"):
        make_streamed(shape, out, seed)
        return
    import torch
    import transformers

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


def is_ready(shape: str, cache_dir: Path = DEFAULT_CACHE, seed: int = 0) -> bool:
    """Whether ensure() would reuse a cached checkpoint (so making one needs nothing)."""
    marker = cache_dir / canonical_shape(shape) / MARKER
    if not marker.exists():
        return False
    m = json.loads(marker.read_text())
    return m.get("shape") == canonical_shape(shape) and m.get("seed") == seed


def python_needs(shape: str) -> list[str]:
    """Python modules making this shape's checkpoint imports."""
    return ["numpy"] if shape_spec(canonical_shape(shape)).get("streamed") else [
        "torch", "transformers"]


def ensure(shape: str, cache_dir: Path = DEFAULT_CACHE, seed: int = 0, force: bool = False) -> Path:
    """Returns the checkpoint directory, making it first when missing or stale."""
    shape = canonical_shape(shape)
    out = cache_dir / shape
    if not force and is_ready(shape, cache_dir, seed):
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
    ap.add_argument("--shape", required=True,
                    help=f"one of {sorted(SHAPES)}, or " +
                         ", ".join(f"{b}[-L<layers>]" for b in STREAMED))
    ap.add_argument("--layers", type=int, default=None,
                    help=f"{', '.join(STREAMED)} only: decoder layers to keep (default " +
                         ", ".join(f"{f['default_layers']} for {b}" for b, f in STREAMED.items())
                         + "; the real models have " +
                         ", ".join(f"{f['real_layers']}" for f in STREAMED.values()) + ")")
    ap.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--force", action="store_true", help="regenerate even if cached")
    args = ap.parse_args()
    print(ensure(canonical_shape(args.shape, args.layers), args.cache_dir, args.seed, args.force))


if __name__ == "__main__":
    main()
