"""The random-weight Qwen3 of the structured-outputs tests and bench/compare/grammar_peer.py: its
unconstrained output is noise over the real Qwen3 vocabulary, so only a grammar makes it valid,
and every step's mask spans 151,936 ids (the worst case for a mask's cost per token)."""
import gzip
import json
import os
import shutil
import struct

from metrale_server import ROOT


def random_qwen3(path, randbytes=os.urandom, vocab=151936, bos=151643, eos=151645,
                 qwen_tokenizer=True):
    """A one-layer Qwen3 with random bf16 weights and the real Qwen3 tokenizer (151,936 ids),
    written into the directory `path`, or (qwen_tokenizer=False) no tokenizer: the caller writes
    one of `vocab` ids. randbytes(n) gives the weights' random bytes (seeded:
    random.Random(seed).randbytes, as bench/compare/grammar_peer.py does)."""
    hidden, inter, heads, kv, hd = 16, 32, 2, 1, 8
    config = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": vocab,
        "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": 1,
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
        "hidden_act": "silu", "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "tie_word_embeddings": True, "attention_bias": False,
        "bos_token_id": bos, "eos_token_id": eos, "dtype": "bfloat16",
    }
    shapes = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden]}
    p = "model.layers.0."
    shapes.update({p + "input_layernorm.weight": [hidden],
                   p + "post_attention_layernorm.weight": [hidden],
                   p + "mlp.gate_proj.weight": [inter, hidden],
                   p + "mlp.up_proj.weight": [inter, hidden],
                   p + "mlp.down_proj.weight": [hidden, inter],
                   p + "self_attn.q_proj.weight": [heads * hd, hidden],
                   p + "self_attn.k_proj.weight": [kv * hd, hidden],
                   p + "self_attn.v_proj.weight": [kv * hd, hidden],
                   p + "self_attn.o_proj.weight": [hidden, heads * hd],
                   p + "self_attn.q_norm.weight": [hd], p + "self_attn.k_norm.weight": [hd]})
    # bf16 values of magnitude ~0.5..1 with random signs and mantissas (norms: 1.0).
    sign = bytes(range(256)).translate(bytes((0x3F | (b & 0x80)) for b in range(256)))
    header, blobs, offset = {}, [], 0
    for name in sorted(shapes):
        n = 1
        for d in shapes[name]:
            n *= d
        data = bytearray(2 * n)
        if name.endswith("norm.weight"):
            data[0::2] = b"\x80" * n
            data[1::2] = b"\x3f" * n
        else:
            data[0::2] = randbytes(n)
            data[1::2] = randbytes(n).translate(sign)
        header[name] = {"dtype": "BF16", "shape": shapes[name],
                        "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(bytes(data))
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for b in blobs:
            f.write(b)
    (path / "config.json").write_text(json.dumps(config))
    if not qwen_tokenizer:
        return
    tok = ROOT / "tests" / "data" / "tokenizers" / "qwen3"
    with gzip.open(tok / "tokenizer.json.gz", "rb") as src:
        (path / "tokenizer.json").write_bytes(src.read())
    shutil.copy(tok / "tokenizer_config.json", path / "tokenizer_config.json")
