#!/usr/bin/env python3
"""A bf16 bench checkpoint quantized by a real producer, exactly as it saves it, cached beside
the other bench artifacts: llm-compressor (compressed-tensors) or NVIDIA ModelOpt (its unified
HF export, quant_method "modelopt").

    python3 tools/bench/quantize_checkpoint.py --model /tmp/metrale-bench/checkpoints/qwen3-0.6b \
        --scheme w4a16 [--cache-dir /tmp/metrale-bench] [--no-install]

Run it with any Python: it makes (once) the scheme's producer's virtual environment through
prereqs.ensure_venv, printing each command (with --no-install it names them and stops), then
runs itself again inside it. Prints the quantized directory on stdout. PRODUCERS:
  llmcompressor    <cache>/venv-llmc from the full lock tools/bench/requirements-llmc.txt
                   (llmcompressor==0.14.0.1, compressed-tensors==0.19.0, torch 2.14.0,
                   transformers 5.17.0)
  nvidia-modelopt  <cache>/venv-modelopt from the full lock tools/bench/requirements-modelopt.txt
                   (nvidia-modelopt==0.47.0, torch 2.15.0, transformers 5.14.1). A venv made
                   by hand that holds the lock is accepted (prereqs.venv_ready); one linked in
                   (e.g. to /work/venv-modelopt) is never cleared and remade: if it stops
                   holding the lock the run stops instead.

llm-compressor schemes: weight-only, data-free — QuantizationModifier(targets="Linear",
ignore=["lm_head"]) applied by `oneshot(model=..., recipe=...)` with no dataset, then
`save_pretrained(out, save_compressed=True)`:
  w4a16  int4, group 128, symmetric (the W4A16 preset): pack-quantized weight_packed (int32,
         8 values each), weight_scale (bf16, one per 128 inputs), weight_shape
  w8a16  int8 per output channel, symmetric (spelled out: compressed-tensors >= 0.18 maps the
         W8A16 preset to int8 group 128)
  fp8    the FP8_DYNAMIC preset: float8_e4m3fn weights with one scale per output channel
         (activations quantized per token at run time by engines that do; metrale and this
         bench read the weights)
  nvfp4  the NVFP4A16 preset: e2m1 packed two per byte, float8_e4m3 scales per 16 inputs,
         one f32 weight_global_scale per tensor
  fp8-block  the FP8_BLOCK preset: float8_e4m3fn weights, one scale per 128 x 128 block
         (the DeepSeek-V3 / Qwen3-FP8 granularity, in compressed-tensors' layout)
The lm_head stays bf16 (the tied embedding of qwen3-0.6b / llama-3.2-1b with it): that is how
llm-compressor's recipes ship. llama.cpp's llama-quantize instead gives a tied token_embd Q6_K
under Q4_0 (see llama_cpp_peer.FORMATS; its q4_0-bf16head / q8_0-bf16head formats keep it bf16
so both engines read the same head bytes).

ModelOpt schemes: `mtq.quantize(model, <preset>, forward_loop)` (the preset's "max"
calibration) then `export_hf_checkpoint(model, export_dir=out)`, the preset unchanged (its
defaults leave lm_head, routers and the like unquantized). The calibration set is fixed:
CALIBRATION, 4 sequences of 64 token ids drawn uniformly from [0, vocab_size) by
torch.Generator().manual_seed(0), one forward each. Weight scales are the weights' own amax, so
the weights do not depend on it; the activations' input_scale does.
  modelopt-fp8    FP8_DEFAULT_CFG (quant_algo FP8): float8_e4m3fn weight, one f32 weight_scale
                  and one f32 input_scale (static per-tensor activations) per linear
  modelopt-nvfp4  NVFP4_DEFAULT_CFG (quant_algo NVFP4, group_size 16): weight uint8 (e2m1
                  packed two per byte), float8_e4m3 weight_scale per 16 inputs, f32
                  weight_scale_2 per tensor, f32 input_scale. The default (W4A4) preset, not
                  W4A16_NVFP4_CFG: the weight tensors are the same (weight calibration is
                  data-free either way), but the weight-only preset exports quant_algo
                  "W4A16_NVFP4", which is not what NVIDIA publishes (nvidia/*-FP4 are NVFP4) and
                  which metrale's config reader does not take (FP8, FP8_PER_CHANNEL_PER_TOKEN,
                  FP8_PB_WO, NVFP4). metrale reads the input_scale and does not use it.

Cache: <cache>/quantized/<checkpoint>-<checkpoint key>-<scheme>-<producer tag><version>-
<recipe hash>/ (tag llmc or modelopt; the recipe is the QuantizationModifier arguments or the
ModelOpt preset name with CALIBRATION), so a different source checkpoint (size or mtime of its
weights), scheme, recipe or producer version makes a new directory; metrale_quantized.json in
it records the recipe, the producer's and its dependencies' versions, the resolved
quantization_config (ModelOpt: also the preset as applied and hf_quant_config.json) and the
time it took. Only a complete directory carries the final name. OMP_NUM_THREADS defaults to 1
(a shared machine).
"""

import argparse
import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import llama_cpp_peer  # noqa: E402  (checkpoint_key, DEFAULT_CACHE; stdlib only)
import prereqs  # noqa: E402

MARKER = "metrale_quantized.json"

# producer (its PyPI name) -> its name in words, the cache tag before its version, its venv
# under the cache, the lock that makes it, and the packages whose versions a quantized
# directory records.
PRODUCERS = {
    "llmcompressor": {"label": "llm-compressor", "tag": "llmc", "venv": "venv-llmc",
                      "requirements": HERE / "requirements-llmc.txt",
                      "versions": ("llmcompressor", "compressed-tensors", "torch",
                                   "transformers", "accelerate")},
    "nvidia-modelopt": {"label": "ModelOpt", "tag": "modelopt", "venv": "venv-modelopt",
                        "requirements": HERE / "requirements-modelopt.txt",
                        "versions": ("nvidia-modelopt", "torch", "transformers", "accelerate",
                                     "safetensors")},
}

# scheme -> its producer (llmcompressor unless named), what it gets (llm-compressor: the
# QuantizationModifier arguments besides targets / ignore; ModelOpt: the mtq preset name), the
# weight bit width (pairs it with llama.cpp's format of that width), and words. The recipe is
# hashed into the cache key.
IGNORE = ["lm_head"]
SCHEMES = {
    "w4a16": {"bits": 4, "modifier": {"scheme": "W4A16"},
              "description": "int4 group 128 symmetric (llm-compressor W4A16)"},
    "w8a16": {"bits": 8, "modifier": {"config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True,
                    "dynamic": False}}}},
              "description": "int8 per-channel symmetric (llm-compressor, W8A16 channel)"},
    "fp8": {"bits": 8, "modifier": {"scheme": "FP8_DYNAMIC"},
            "description": "fp8 e4m3 per-channel weights (llm-compressor FP8_DYNAMIC)"},
    "nvfp4": {"bits": 4, "modifier": {"scheme": "NVFP4A16"},
              "description": "nvfp4 e2m1, e4m3 scale per 16 + f32 global (llm-compressor NVFP4A16)"},
    "fp8-block": {"bits": 8, "modifier": {"scheme": "FP8_BLOCK"},
                  "description": "fp8 e4m3, one scale per 128x128 block (llm-compressor FP8_BLOCK)"},
    # The same recipes with the lm_head quantized too (ignore nothing): llm-compressor unties a
    # tied head first, so the checkpoint keeps a bf16 embedding for lookups and a quantized
    # lm_head for the logits, as llama.cpp's Q4_0 (Q6_K head) and Q8_0 (Q8_0 head) do.
    "w4a16-head": {"bits": 4, "modifier": {"scheme": "W4A16"}, "ignore": [],
                   "description": "int4 group 128 symmetric, lm_head too (llm-compressor W4A16)"},
    "w8a16-head": {"bits": 8, "modifier": {"config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True,
                    "dynamic": False}}}}, "ignore": [],
                   "description": "int8 per-channel symmetric, lm_head too (llm-compressor)"},
    # NVIDIA ModelOpt's presets as shipped (lm_head left bf16 by their defaults).
    "modelopt-fp8": {"bits": 8, "producer": "nvidia-modelopt", "preset": "FP8_DEFAULT_CFG",
                     "description": "fp8 e4m3 per-tensor weights + static input scale "
                                    "(ModelOpt FP8_DEFAULT_CFG)"},
    "modelopt-nvfp4": {"bits": 4, "producer": "nvidia-modelopt", "preset": "NVFP4_DEFAULT_CFG",
                       "description": "nvfp4 e2m1, e4m3 scale per 16 + f32 weight_scale_2 "
                                      "(ModelOpt NVFP4_DEFAULT_CFG)"},
}
# ModelOpt's calibration forward passes: fixed random token ids (see the docstring).
CALIBRATION = {"sequences": 4, "tokens": 64, "seed": 0,
               "ids": "uniform over [0, vocab_size), torch.Generator().manual_seed(seed)"}


def log(msg: str) -> None:
    print(f"[quantize] {msg}", file=sys.stderr, flush=True)


def producer(scheme: str) -> str:
    return SCHEMES[scheme].get("producer", "llmcompressor")


def pinned_versions(requirements: Path) -> dict[str, str]:
    """PyPI name (lower case) -> version, from a lock file."""
    out = {}
    for line in requirements.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[name.strip().lower()] = version.strip()
    return out


def recipe(scheme: str) -> dict:
    """What the producer is given: llm-compressor's QuantizationModifier arguments, or the
    ModelOpt preset's name and the calibration set."""
    spec = SCHEMES[scheme]
    if producer(scheme) == "nvidia-modelopt":
        return {"preset": spec["preset"], "calibration": CALIBRATION}
    return {"targets": "Linear", "ignore": spec.get("ignore", IGNORE), **spec["modifier"]}


def recipe_hash(scheme: str) -> str:
    return hashlib.sha256(json.dumps(recipe(scheme), sort_keys=True).encode()).hexdigest()[:8]


def venv_dir(cache: Path, name: str) -> Path:
    """The venv of producer `name`."""
    return cache / PRODUCERS[name]["venv"]


def ensure_venv(cache: Path, name: str, install: bool = True) -> Path:
    """Producer `name`'s venv (prereqs.ensure_venv), or a stop where it is a link to a venv
    made elsewhere that does not hold the lock: remaking it (venv --clear) would empty the
    venv it points to. Returns its python."""
    venv, requirements = venv_dir(cache, name), PRODUCERS[name]["requirements"]
    if venv.is_symlink() and not prereqs.venv_ready(venv, requirements):
        sys.exit(f"quantize_checkpoint: {venv} links to {venv.resolve()}, which does not hold "
                 f"{requirements}; not remaking a linked venv. Remove the link (then the venv "
                 f"is made from the lock) or install the lock into it.")
    return prereqs.ensure_venv(venv, requirements, install=install)


def out_dir(cache: Path, model_dir: Path, scheme: str) -> Path:
    spec = PRODUCERS[producer(scheme)]
    version = pinned_versions(spec["requirements"])[producer(scheme)]
    return cache / "quantized" / (f"{model_dir.name}-{llama_cpp_peer.checkpoint_key(model_dir)}-"
                                  f"{scheme}-{spec['tag']}{version}-{recipe_hash(scheme)}")


def is_ready(cache: Path, model_dir: Path, scheme: str) -> bool:
    return (out_dir(cache, model_dir, scheme) / MARKER).is_file()


def info(path: Path) -> dict:
    """The marker of a quantized directory (recipe, producer versions, ...)."""
    return json.loads((path / MARKER).read_text())


def ensure(model_dir: Path, scheme: str, cache: Path = llama_cpp_peer.DEFAULT_CACHE,
           install: bool = True) -> Path:
    """The quantized directory, made first (venv, then the producer in it) when missing."""
    out = out_dir(cache, model_dir, scheme)
    if (out / MARKER).is_file():
        return out
    python = ensure_venv(cache, producer(scheme), install=install)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    cmd = [str(python), str(Path(__file__).resolve()), "--in-venv", "--model", str(model_dir),
           "--scheme", scheme, "--out", str(out)]
    log(f"$ OMP_NUM_THREADS={env['OMP_NUM_THREADS']} {' '.join(cmd)}")
    subprocess.run(cmd, check=True, env=env, stdout=sys.stderr)
    if not (out / MARKER).is_file():
        sys.exit(f"quantize_checkpoint: {out} has no {MARKER} after the producer ran")
    return out


# --- inside the producer's venv ------------------------------------------------------------

def quantize_llmc(model_dir: Path, scheme: str, tmp: Path) -> dict:
    """oneshot (no dataset) + save_pretrained(save_compressed=True). Returns marker fields."""
    import torch
    from transformers import AutoModelForCausalLM
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    args = recipe(scheme)
    log(f"oneshot QuantizationModifier({json.dumps(args)}) on {model_dir}")
    oneshot(model=model, recipe=QuantizationModifier(**args))
    model.save_pretrained(tmp, save_compressed=True)
    return {"producer_call": "oneshot(model, recipe=QuantizationModifier(**recipe)) without "
                             "calibration data; model.save_pretrained(out, save_compressed=True)"}


def quantize_modelopt(model_dir: Path, scheme: str, tmp: Path) -> dict:
    """mtq.quantize(preset, CALIBRATION forwards) + export_hf_checkpoint. Returns marker
    fields: the preset as applied and the hf_quant_config.json the export wrote."""
    import torch
    from transformers import AutoModelForCausalLM
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    preset = SCHEMES[scheme]["preset"]
    cfg = copy.deepcopy(getattr(mtq, preset))
    vocab = model.config.get_text_config().vocab_size
    ids = torch.randint(0, vocab, (CALIBRATION["sequences"], CALIBRATION["tokens"]),
                        generator=torch.Generator().manual_seed(CALIBRATION["seed"]),
                        dtype=torch.int64)

    def forward_loop(m):
        with torch.no_grad():
            for row in ids:
                m(row[None])

    log(f"mtq.quantize({preset}) with {len(ids)} x {ids.shape[1]} random-token calibration "
        f"forwards, then export_hf_checkpoint, on {model_dir}")
    mtq.quantize(model, cfg, forward_loop)
    export_hf_checkpoint(model, export_dir=tmp)
    hf_quant = tmp / "hf_quant_config.json"
    return {"producer_call": f"mtq.quantize(model, copy.deepcopy(mtq.{preset}), forward_loop "
                             f"over the calibration ids); export_hf_checkpoint(model, "
                             f"export_dir=out)",
            "preset_config": json.loads(json.dumps(cfg, default=str)),
            "hf_quant_config": json.loads(hf_quant.read_text()) if hf_quant.is_file() else None}


QUANTIZERS = {"llmcompressor": quantize_llmc, "nvidia-modelopt": quantize_modelopt}


def produce(model_dir: Path, scheme: str, out: Path) -> None:
    """Inside the venv: the scheme's producer writes out.partial, then the tokenizer and the
    marker are added and it is renamed to out."""
    from importlib import metadata
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    start = time.monotonic()
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    name = producer(scheme)
    fields = QUANTIZERS[name](model_dir, scheme, tmp)
    call = fields.pop("producer_call")
    # Tokenizer and the other small files the producer does not write.
    for f in model_dir.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name not in (
                "config.json", "model.safetensors.index.json") and not (tmp / f.name).exists():
            shutil.copy(f, tmp / f.name)
    config = json.loads((tmp / "config.json").read_text())
    versions = {p: metadata.version(p) for p in PRODUCERS[name]["versions"]}
    (tmp / MARKER).write_text(json.dumps({
        "source": str(model_dir), "source_key": llama_cpp_peer.checkpoint_key(model_dir),
        "scheme": scheme, "description": SCHEMES[scheme]["description"],
        "bits": SCHEMES[scheme]["bits"], "producer": name, "producer_call": call,
        "recipe": recipe(scheme), "versions": versions, "python": sys.version.split()[0],
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "quantization_config": config.get("quantization_config"), **fields,
        "seconds": round(time.monotonic() - start, 1)}, indent=2))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="bf16 HF checkpoint directory")
    ap.add_argument("--scheme", choices=list(SCHEMES), required=True)
    ap.add_argument("--cache-dir", type=Path, default=llama_cpp_peer.DEFAULT_CACHE)
    ap.add_argument("--no-install", action="store_true",
                    help="do not make the venv: name the commands and stop")
    ap.add_argument("--in-venv", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    model_dir = args.model.resolve()
    if args.in_venv:
        produce(model_dir, args.scheme, args.out)
        return
    print(ensure(model_dir, args.scheme, args.cache_dir, install=not args.no_install))


if __name__ == "__main__":
    main()
