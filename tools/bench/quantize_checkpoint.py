#!/usr/bin/env python3
"""A bf16 bench checkpoint quantized by the real producer, llm-compressor, exactly as it saves
it (compressed-tensors), cached beside the other bench artifacts.

    python3 tools/bench/quantize_checkpoint.py --model /tmp/metrale-bench/checkpoints/qwen3-0.6b \
        --scheme w4a16 [--cache-dir /tmp/metrale-bench] [--no-install]

Run it with any Python: it makes (once) the virtual environment <cache>/venv-llmc from the full
lock tools/bench/requirements-llmc.txt (llmcompressor==0.14.0.1, compressed-tensors==0.19.0,
torch 2.14.0, transformers 5.17.0) through prereqs.ensure_venv, printing each command (with
--no-install it names them and stops), then runs itself again inside it. Prints the quantized
directory on stdout.

Schemes (SCHEMES): weight-only, data-free — QuantizationModifier(targets="Linear",
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

Cache: <cache>/quantized/<checkpoint>-<checkpoint key>-<scheme>-llmc<version>-<recipe hash>/,
so a different source checkpoint (size or mtime of its weights), scheme, recipe or producer
version makes a new directory; metrale_quantized.json in it records the recipe, the producer's
and its dependencies' versions, the resolved quantization_config and the time it took. Only a
complete directory carries the final name. OMP_NUM_THREADS defaults to 1 (a shared machine).
"""

import argparse
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

REQUIREMENTS = HERE / "requirements-llmc.txt"
MARKER = "metrale_quantized.json"
PRODUCER = "llmcompressor"

# scheme -> what QuantizationModifier gets besides targets / ignore (JSON, hashed into the
# cache key), the weight bit width (pairs it with llama.cpp's format of that width), and words.
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
}


def log(msg: str) -> None:
    print(f"[quantize] {msg}", file=sys.stderr, flush=True)


def pinned_versions() -> dict[str, str]:
    """PyPI name (lower case) -> version, from the lock file."""
    out = {}
    for line in REQUIREMENTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            out[name.strip().lower()] = version.strip()
    return out


def recipe(scheme: str) -> dict:
    """The QuantizationModifier arguments of a scheme."""
    return {"targets": "Linear", "ignore": SCHEMES[scheme].get("ignore", IGNORE),
            **SCHEMES[scheme]["modifier"]}


def recipe_hash(scheme: str) -> str:
    return hashlib.sha256(json.dumps(recipe(scheme), sort_keys=True).encode()).hexdigest()[:8]


def venv_dir(cache: Path) -> Path:
    return cache / "venv-llmc"


def out_dir(cache: Path, model_dir: Path, scheme: str) -> Path:
    version = pinned_versions()[PRODUCER]
    return cache / "quantized" / (f"{model_dir.name}-{llama_cpp_peer.checkpoint_key(model_dir)}-"
                                  f"{scheme}-llmc{version}-{recipe_hash(scheme)}")


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
    python = prereqs.ensure_venv(venv_dir(cache), REQUIREMENTS, install=install)
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


def produce(model_dir: Path, scheme: str, out: Path) -> None:
    """Inside the venv: oneshot (no dataset) + save_pretrained(save_compressed=True)."""
    from importlib import metadata
    import torch
    from transformers import AutoModelForCausalLM
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    start = time.monotonic()
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    args = recipe(scheme)
    log(f"oneshot QuantizationModifier({json.dumps(args)}) on {model_dir}")
    oneshot(model=model, recipe=QuantizationModifier(**args))
    model.save_pretrained(tmp, save_compressed=True)
    # Tokenizer and the other small files save_pretrained does not write.
    for f in model_dir.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and f.name not in (
                "config.json", "model.safetensors.index.json") and not (tmp / f.name).exists():
            shutil.copy(f, tmp / f.name)
    config = json.loads((tmp / "config.json").read_text())
    versions = {p: metadata.version(p) for p in (
        "llmcompressor", "compressed-tensors", "torch", "transformers", "accelerate")}
    (tmp / MARKER).write_text(json.dumps({
        "source": str(model_dir), "source_key": llama_cpp_peer.checkpoint_key(model_dir),
        "scheme": scheme, "description": SCHEMES[scheme]["description"],
        "bits": SCHEMES[scheme]["bits"], "producer": PRODUCER,
        "producer_call": "oneshot(model, recipe=QuantizationModifier(**recipe)) without "
                         "calibration data; model.save_pretrained(out, save_compressed=True)",
        "recipe": args, "versions": versions, "python": sys.version.split()[0],
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "quantization_config": config.get("quantization_config"),
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
