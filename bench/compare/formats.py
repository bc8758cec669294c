"""Weight formats of bench/compare/run.py: which checkpoint or GGUF each row of the table runs,
how it is made, the weight bytes one decode step of it reads, and which llama.cpp row it is
compared with.

A row is one engine on one format. metrale (--formats): bf16 (the random-weight checkpoint)
or a scheme of tools/bench/quantize_checkpoint.py (w4a16, w8a16, fp8, nvfp4, ...: that
checkpoint quantized by llm-compressor; modelopt-fp8, modelopt-nvfp4: by NVIDIA ModelOpt;
loaded as the producer wrote it). llama.cpp (--llama-formats): a
format of tools/bench/llama_cpp_peer.FORMATS (bf16 converted; q4_0, q8_0 and variants made by
the pinned llama-quantize from the bf16 GGUF). hf: bf16 only. Row ids: the engine for bf16
("metrale", "llama.cpp", "hf" — as before formats existed), else "<engine> <format>".
Each metrale / hf row is compared with every --llama-formats row of the same weight bit width
(4: w4a16, nvfp4, modelopt-nvfp4 -> q4_0*; 8: w8a16, fp8, modelopt-fp8 -> q8_0*; 16: bf16),
else with the first llama.cpp
row; the first of them is its peer (greedy check, the peer's bytes in the notes).
"""

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path

import llama_cpp_peer
import make_random_checkpoint
import quantize_checkpoint

METRALE_FORMATS = ("bf16", *quantize_checkpoint.SCHEMES)
LLAMA_FORMATS = tuple(llama_cpp_peer.FORMATS)


@dataclass
class Row:
    engine: str                  # metrale | llama.cpp | hf
    format: str                  # bf16 | w4a16 ... | q4_0 ...
    bits: int
    peer: str | None = None      # id of the llama.cpp row its ratios divide by
    peers: list[str] = field(default_factory=list)  # every llama.cpp row of its bit width
    model_dir: Path | None = None  # what metrale / hf load; llama.cpp: the bf16 source
    gguf: Path | None = None
    producer: dict = field(default_factory=dict)
    weight_bytes: dict | None = None  # {"per_step": {B: bytes}, ...}
    error: str | None = None     # preparation failed: the row is reported, not run

    @property
    def id(self) -> str:
        return self.engine if self.format == "bf16" else f"{self.engine} {self.format}"

    def record(self) -> dict:
        """What results.json keeps (config.rows)."""
        return {"id": self.id, "engine": self.engine, "format": self.format, "bits": self.bits,
                "peer": self.peer, "peers": self.peers, "model_dir": str(self.model_dir) if self.model_dir else None,
                "gguf": str(self.gguf) if self.gguf else None, "producer": self.producer,
                "weight_bytes": self.weight_bytes, "error": self.error}


def format_list(text: str, allowed: tuple[str, ...], option: str) -> list[str]:
    out = [f for f in text.split(",") if f]
    bad = [f for f in out if f not in allowed]
    if bad or not out:
        raise SystemExit(f"{option}: unknown {bad}; expected a comma-separated subset of "
                         f"{list(allowed)}")
    return list(dict.fromkeys(out))


def metrale_bits(fmt: str) -> int:
    return 16 if fmt == "bf16" else quantize_checkpoint.SCHEMES[fmt]["bits"]


def plan_rows(engines: list[str], metrale_formats: list[str], llama_formats: list[str]) -> list[Row]:
    """The rows in table order (metrale, llama.cpp, hf; formats as listed), peers assigned."""
    rows = []
    if "metrale" in engines:
        rows += [Row("metrale", f, metrale_bits(f)) for f in metrale_formats]
    if "llama.cpp" in engines:
        rows += [Row("llama.cpp", f, llama_cpp_peer.FORMATS[f]["bits"]) for f in llama_formats]
    if "hf" in engines:
        rows.append(Row("hf", "bf16", 16))
    peers = [r for r in rows if r.engine == "llama.cpp"]
    for r in rows:
        if r.engine != "llama.cpp" and peers:
            r.peers = [p.id for p in peers if p.bits == r.bits] or [peers[0].id]
            r.peer = r.peers[0]
    return rows


def quantizers(rows: list[Row]) -> list[str]:
    """The producers (quantize_checkpoint.PRODUCERS) of the metrale rows' schemes."""
    return list(dict.fromkeys(quantize_checkpoint.producer(r.format) for r in rows
                              if r.engine == "metrale" and r.format != "bf16"))


def quantized_missing(rows: list[Row], cache: Path, model_dir: Path) -> list[str]:
    """The producers that must run (so their venvs are needed) for metrale rows whose
    quantized checkpoint is not cached; [] when none."""
    return quantizers([r for r in rows if r.engine == "metrale" and r.format != "bf16" and
                       not quantize_checkpoint.is_ready(cache, model_dir, r.format)])


def llama_needs(rows: list[Row], cache: Path, model_dir: Path) -> tuple[bool, bool]:
    """(a GGUF must be converted, llama-quantize must be built) for the llama.cpp rows."""
    convert = quantize = False
    for r in rows:
        if r.engine != "llama.cpp":
            continue
        spec = llama_cpp_peer.FORMATS[r.format]
        if not llama_cpp_peer.gguf_path(cache, model_dir, r.format).is_file():
            src_fmt = "bf16" if "quantize" in spec else r.format
            convert |= not llama_cpp_peer.gguf_path(cache, model_dir, src_fmt).is_file()
            quantize |= "quantize" in spec and not (
                llama_cpp_peer.build_dir(cache) / "bin" / llama_cpp_peer.QUANTIZE_TOOL).is_file()
    return convert, quantize


def prepare(rows: list[Row], cache: Path, model_dir: Path, lsrc: Path | None,
            batches: list[int], install: bool, log) -> None:
    """Makes each row's checkpoint or GGUF (cached) and fills in its producer and weight bytes;
    a row whose preparation fails keeps the error and is reported as failed, not run."""
    bf16_bytes = checkpoint_weight_bytes(model_dir, batches)
    marker = model_dir / make_random_checkpoint.MARKER
    source = {"checkpoint": str(model_dir),
              "random_checkpoint": json.loads(marker.read_text()) if marker.is_file() else None}
    for r in rows:
        try:
            if r.engine == "llama.cpp":
                r.model_dir = model_dir
                r.gguf = llama_cpp_peer.ensure_gguf(cache, lsrc, model_dir, r.format)
                summary = llama_cpp_peer.gguf_summary(r.gguf)
                spec = llama_cpp_peer.FORMATS[r.format]
                r.producer = {
                    "source": source,
                    "tool": (f"llama-quantize {spec['quantize']} of the bf16 GGUF"
                             if "quantize" in spec else
                             f"convert_hf_to_gguf.py --outtype {spec['convert']}"),
                    "command": (llama_cpp_peer.quantize_command(cache, model_dir, r.format)
                                if "quantize" in spec else None),
                    "llama_cpp": llama_cpp_peer.source_info(cache),
                    "gguf_summary": summary,
                    "tensor_types": {k: "/".join(v["types"]) for k, v in summary["kinds"].items()},
                }
                r.weight_bytes = gguf_step_bytes(summary, bf16_bytes)
            elif r.format == "bf16":
                r.model_dir = model_dir
                r.producer = {"source": source, "tool": "tools/bench/make_random_checkpoint.py"
                              if source["random_checkpoint"] else "(given with --model)"}
                r.weight_bytes = bf16_bytes
            else:
                r.model_dir = quantize_checkpoint.ensure(model_dir, r.format, cache, install)
                r.producer = {"source": source, **quantize_checkpoint.info(r.model_dir)}
                r.weight_bytes = checkpoint_weight_bytes(r.model_dir, batches)
        except (Exception, SystemExit) as e:  # noqa: BLE001 — one format must not sink the run
            r.error = f"preparing {r.id} failed: {type(e).__name__}: {e}"
            log(r.error)


# --- bytes one decode step reads --------------------------------------------------------------

# Where each non-expert tensor's bytes go in weight_bytes["components"] (first match wins).
WEIGHT_COMPONENTS = (
    ("lm_head", ("lm_head.", "embed_tokens.weight")),  # the latter only when tied
    ("router", (".mlp.gate.weight",)),
    ("shared_expert", (".mlp.shared_expert.", ".mlp.shared_expert_gate.")),
    ("attention", (".self_attn.",)),
    ("linear_attention", (".linear_attn.",)),
    ("norms", ("norm.weight",)),
)
# Tensors a quantized checkpoint stores per module that no decode step reads: compressed-
# tensors' weight_shape (the unpacked shape, int64 x 2; metadata the loader uses once), and
# static activation scales (ModelOpt's input_scale, compressed-tensors' input_global_scale /
# input_zero_point: metrale reads them at load and computes with unquantized activations).
UNREAD_SUFFIXES = {"metadata": (".weight_shape",),
                   "activation_scales": (".input_scale", ".input_global_scale",
                                         ".input_zero_point")}


def weight_component(name: str) -> str:
    for comp, keys in WEIGHT_COMPONENTS:
        if any(k in name for k in keys):
            return comp
    return "other"  # dense MLPs of dense models


def tensor_kind(name: str, dtype: str) -> str:
    """'weight_packed I32', 'weight_scale BF16', 'weight F8_E4M3', ...: the by_kind key."""
    suffix = name.rsplit(".", 1)[-1]
    if suffix == "weight" and ("embed_tokens" in name or "lm_head" in name):
        suffix = "embedding/lm_head"
    elif suffix == "weight" and "norm" in name.rsplit(".", 2)[-2:][0]:
        suffix = "norm"
    return f"{suffix} {dtype}"


def checkpoint_weight_bytes(model_dir: Path, batches: list[int]) -> dict:
    """Bytes of weights one decode step reads, per batch width: every tensor (quantized ones as
    stored: packed values, scales, zero points, g_idx, global scales — each is read once per
    step by the layer using it), except that an untied input embedding is only gathered (a few
    rows), not streamed, that a multi-token-prediction head (mtp.*) is not run by a plain
    decode step, that compressed-tensors' weight_shape is metadata and static activation scales
    (input_scale, ...) are not used by a weight-only decode step, and that a mixture-of-
    experts layer reads only the experts its rows were routed to. With E experts, k per token
    and uniform routing (what random weights give), a batch of B rows touches an expected
    1 - (1 - k/E)^B of each layer's experts: exactly k/E at batch 1. Shared experts
    (Qwen3-Next's mlp.shared_expert.*), routers, attention and linear-attention projections,
    norms and the lm_head are read whole every step. A tied embedding is streamed as the
    lm_head and counted once.
    Returns {"total": all tensor bytes, "dense": non-expert bytes read, "experts": expert
    bytes, "per_step": {B: bytes}, "moe": {...} or None, "components": dense bytes by kind
    (lm_head, router, shared_expert, attention, linear_attention, norms, other) plus
    "experts_b1" (routed-expert bytes one token reads), "by_kind": bytes read by tensor
    suffix and dtype ("weight_packed I32", "weight_scale BF16", "embedding/lm_head BF16",
    ModelOpt's "weight U8" / "weight_scale F8_E4M3" / "weight_scale_2 F32", ...), "unread":
    {embed_tokens, mtp, metadata, activation_scales: bytes}}."""
    config = json.loads((model_dir / "config.json").read_text())
    config = config.get("text_config", config)
    tied = config.get("tie_word_embeddings", False)
    total = dense = experts = 0
    components: dict[str, int] = {}
    by_kind: dict[str, int] = {}
    unread = {"embed_tokens": 0, "mtp": 0, **{k: 0 for k in UNREAD_SUFFIXES}}
    for f in sorted(model_dir.glob("*.safetensors")):
        with open(f, "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(n))
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            size = meta["data_offsets"][1] - meta["data_offsets"][0]
            total += size
            if name.startswith(("mtp.", "model.mtp.")):
                unread["mtp"] += size
                continue
            if name.endswith("embed_tokens.weight") and not tied:
                unread["embed_tokens"] += size
                continue
            skip = next((k for k, s in UNREAD_SUFFIXES.items() if name.endswith(s)), None)
            if skip:
                unread[skip] += size
                continue
            kind = tensor_kind(name, meta["dtype"])
            by_kind[kind] = by_kind.get(kind, 0) + size
            if ".mlp.experts." in name:  # routed experts (a shared expert is .shared_expert.)
                experts += size
            else:
                dense += size
                comp = weight_component(name)
                components[comp] = components.get(comp, 0) + size
    n_experts = config.get("num_experts") or config.get("n_routed_experts")
    top_k = config.get("num_experts_per_tok")
    moe = None
    if experts and n_experts and top_k:
        moe = {"experts": n_experts, "top_k": top_k}
        frac = {b: 1 - (1 - top_k / n_experts) ** b for b in batches}
        components["experts_b1"] = round(experts * top_k / n_experts)
    else:
        frac = {b: 1.0 for b in batches}
    return {"total": total, "dense": dense, "experts": experts, "moe": moe,
            "components": components, "by_kind": by_kind, "unread": unread,
            "per_step": {str(b): round(dense + experts * frac[b]) for b in batches}}


def gguf_step_bytes(summary: dict, checkpoint: dict) -> dict:
    """A GGUF's bytes per decode step and width: its tensors (llama_cpp_peer.gguf_summary
    already leaves an untied token_embd out); routed experts (*_exps tensors) scaled by the
    fraction the checkpoint's routing reads at each width."""
    experts = sum(k["bytes"] for name, k in summary["kinds"].items() if "_exps." in name)
    dense = summary["per_step"] - experts
    per_step = {}
    for b, v in checkpoint["per_step"].items():
        frac = ((v - checkpoint["dense"]) / checkpoint["experts"]) if checkpoint["experts"] else 1
        per_step[b] = round(dense + experts * frac)
    return {"total": summary["tensor_bytes"], "dense": dense, "experts": experts,
            "moe": checkpoint["moe"], "by_kind": summary["bytes_by_type"], "per_step": per_step}


def quantizer_note(metrale: Row, llama: Row) -> str:
    """How the two rows' weights were made, for the greedy check's line."""
    if metrale.format == "bf16" and llama.format == "bf16":
        return "same bf16 weights"
    name = metrale.producer.get("producer", "llmcompressor")
    m = ("bf16 checkpoint" if metrale.format == "bf16" else
         f"{quantize_checkpoint.PRODUCERS[name]['label']} "
         f"{metrale.producer.get('versions', {}).get(name, '?')} {metrale.format}")
    return f"different quantizers: metrale {m}, llama.cpp {llama.format}"
