#!/usr/bin/env python3
"""Vision tower speed: images/s of metrale's tower beside transformers' on the same checkpoint,
the same images, the same threads and the same dtype.

    python3 bench/compare/vision_tower.py [--threads 2,1] [--rounds 3] [--image-rounds 1] \
        [--sizes 448x448,1280x720] [--metrale-args='--compute bf16'] [--out out/vision-tower]

The checkpoint: Qwen3VLForConditionalGeneration (transformers' own class, its own random
initialisation: N(0, 0.02) matrices, unit norms, zero biases) with the vision tower of
Qwen/Qwen3-VL-2B-Instruct exactly as its config.json ships it (depth 24, width 1024, 16 heads,
MLP 4096 gelu_pytorch_tanh, patch 16, merge 2, 2304 learned positions, deepstack mergers after
blocks 5, 11, 17, out_hidden_size 2048) and its language model cut to 3 of its 28 layers (the
fewest that take the 3 deepstack features; only the tower is timed), written in bf16 with
save_pretrained beside the published preprocessor_config.json; cached under --cache-dir.
The images: tests/data/vision/images/photo_chelsea.jpg resized (PIL bicubic) to each --sizes
entry, written as PNG beside it.

Per thread count, --rounds interleaved rounds (the starting engine alternates):
  metrale       a fresh `metrale bench --model CKPT --image A --image B ... --image-warmup W
                --image-rounds N --threads T --json` (+ --metrale-args; default --compute bf16):
                each image preprocessed once, W untimed then N timed tower passes.
  transformers  in this process, torch.set_num_threads(T) and one inter-op thread, the model
                loaded once in bf16 (dtype=torch.bfloat16, SDPA attention): each image run
                through the checkpoint's own image processor (AutoImageProcessor) once, then
                N timed passes of model.model.visual(pixel_values.bf16, grid_thw) under
                inference_mode (what get_image_features runs: merger and deepstack mergers
                included); W untimed passes per image once per thread count.
Reported: the median ms per image over all timed passes (and the fastest pass, the least
disturbed on a loaded machine), images/s = 1000 / the median, and the speed-up (transformers
ms / metrale ms) of the medians and of the fastest passes.
`uptime`'s load averages are recorded before and after every engine run.

Same computation: once (on the --check-images entries: the first by default, as transformers'
f32 tower is slow), metrale's pixel_values and tower output (`bench --vision-out`) are
read back; transformers' tower runs on those same pixels in bf16 and in f32 (the same bf16
weights upcast), its output laid out as metrale's (the merger's rows, then each deepstack
merger's), and metrale is compared with both, transformers bf16 with f32: max abs diff, max
abs diff / max |reference| and the relative RMS error. metrale's pixels are compared with the
processor's too (the published file names Qwen2VLImageProcessorFast; without torchvision
transformers runs its PIL backend, metrale its torchvision-style resize, so pixels of a
resized image differ by the two kernels' rounding).

llama.cpp's mtmd (--mtmd): llama-mtmd-cli of the pinned llama.cpp (tools/bench/llama_cpp_peer.py:
llama-cpp-python's sdist, its vendored llama.cpp, built once into --llama-cache), with the
tower converted by the pinned convert_hf_to_gguf.py --mmproj (--mtmd-outtype, default bf16:
the checkpoint's own dtype, so the weights are the same bits; norms and biases come out f32)
and a text GGUF of the checkpoint's language model (the tool needs one; never timed; see
llama_cpp_peer.mtmd_text_checkpoint for why it has a 4th layer). Each round, per image, a fresh
process encodes the image W + N times (one prompt, a media marker per copy with text between, so
each copy is its own mtmd_batch_encode); the "mtmd batch encoding done in N ms" lines after the
first W are the timed passes (ms resolution; mtmd_batch_encode: the tower, merger and deepstack
mergers on the preprocessed image, as metrale's passes). -t and -tb are the thread count. Its
clip preprocessing resizes on its own (bicubic, rounding each side to the nearest multiple of
32): the merged tokens and resized size it logs (-v) are recorded, and where its patch count
differs from metrale's, the table gives ms per patch beside ms per image.
--no-transformers leaves transformers out (and the agreement check with it).

Outputs under --out: results.json (the command, every flag, versions of torch, transformers,
metrale's commit, lscpu, loads, every sample) and table.md (the command above the table).
"""
import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from run import git_state, lscpu_summary  # noqa: E402
sys.path.insert(0, str(REPO / "tools/bench"))
import llama_cpp_peer  # noqa: E402

PHOTO = REPO / "tests/data/vision/images/photo_chelsea.jpg"
MARKER = "metrale_vision_tower_checkpoint.json"

# Qwen/Qwen3-VL-2B-Instruct config.json, vision_config as published.
VISION_CONFIG = {
    "deepstack_visual_indexes": [5, 11, 17],
    "depth": 24,
    "hidden_act": "gelu_pytorch_tanh",
    "hidden_size": 1024,
    "in_channels": 3,
    "initializer_range": 0.02,
    "intermediate_size": 4096,
    "num_heads": 16,
    "num_position_embeddings": 2304,
    "out_hidden_size": 2048,
    "patch_size": 16,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
}
# Its text_config with 3 of the 28 layers.
TEXT_CONFIG = {
    "attention_bias": False,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "initializer_range": 0.02,
    "intermediate_size": 6144,
    "max_position_embeddings": 262144,
    "num_attention_heads": 16,
    "num_hidden_layers": 3,
    "num_key_value_heads": 8,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 5000000,
                        "mrope_section": [24, 20, 20], "mrope_interleaved": True},
    "tie_word_embeddings": True,
    "vocab_size": 151936,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
MEDIA_IDS = {"image_token_id": 151655, "video_token_id": 151656,
             "vision_start_token_id": 151652, "vision_end_token_id": 151653}
# Its preprocessor_config.json as published.
PREPROCESSOR = {
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "processor_class": "Qwen3VLProcessor",
    "image_processor_type": "Qwen2VLImageProcessorFast",
}
SEED = 24


def log(msg: str) -> None:
    print(f"[vision_tower {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def ensure_checkpoint(cache: Path) -> Path:
    out = cache / "qwen3-vl-2b-tower"
    want = {"vision_config": VISION_CONFIG, "text_config": TEXT_CONFIG, "media": MEDIA_IDS,
            "preprocessor": PREPROCESSOR, "seed": SEED}
    marker = out / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == want:
        return out
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration
    log(f"making {out} (transformers' Qwen3VLForConditionalGeneration, bf16)")
    torch.manual_seed(SEED)
    config = Qwen3VLConfig(text_config=TEXT_CONFIG, vision_config=VISION_CONFIG,
                           tie_word_embeddings=True, **MEDIA_IDS)
    model = Qwen3VLForConditionalGeneration(config).to(torch.bfloat16).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2) + "\n")
    marker.write_text(json.dumps(want))
    return out


def ensure_images(cache: Path, sizes: list[tuple[int, int]]) -> list[Path]:
    from PIL import Image
    paths = []
    for w, h in sizes:
        p = cache / f"photo_chelsea_{w}x{h}.png"
        if not p.is_file():
            Image.open(PHOTO).convert("RGB").resize((w, h), Image.BICUBIC).save(p)
        paths.append(p)
    return paths


def size_list(text: str) -> list[tuple[int, int]]:
    out = []
    for item in text.split(","):
        w, _, h = item.partition("x")
        if not (w.isdigit() and h.isdigit() and int(w) > 0 and int(h) > 0):
            raise argparse.ArgumentTypeError(f"--sizes: '{item}' is not WIDTHxHEIGHT")
        out.append((int(w), int(h)))
    return out


def int_list(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of integers")
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"'{text}': every value must be >= 1")
    return vals


class HfTower:
    """transformers' Qwen3-VL vision tower on the checkpoint, in bf16 (and f32 for the check)."""

    def __init__(self, ckpt: Path, images: list[Path]):
        import torch
        from PIL import Image
        from transformers import AutoImageProcessor, Qwen3VLForConditionalGeneration
        self.torch = torch
        model = Qwen3VLForConditionalGeneration.from_pretrained(ckpt, dtype=torch.bfloat16)
        self.visual = model.model.visual.eval()
        self.attn = self.visual.config._attn_implementation
        del model
        proc = AutoImageProcessor.from_pretrained(ckpt)
        self.processor = type(proc).__name__
        self.inputs = []
        for p in images:
            out = proc(images=[Image.open(p).convert("RGB")], return_tensors="pt")
            self.inputs.append((out["pixel_values"], out["image_grid_thw"]))

    def run(self, i: int, dtype=None):
        torch = self.torch
        pv, grid = self.inputs[i]
        with torch.inference_mode():
            res = self.visual(pv.to(dtype or torch.bfloat16), grid_thw=grid)
        return res

    def time(self, i: int) -> float:
        t0 = time.perf_counter()
        self.run(i)
        return (time.perf_counter() - t0) * 1e3

    def features(self, res):
        """[tokens, 2048 * (1 + deepstack)] f32: the merger's rows, then each deepstack's."""
        torch = self.torch
        parts = [res.pooler_output] + list(res.deepstack_features or [])
        return torch.cat([p.float() for p in parts], dim=1)


def diff(a, b) -> dict:
    """a against the reference b."""
    d = (a - b).abs()
    ref = b.abs().max().item()
    return {"max_abs": d.max().item(), "max_abs_over_max_ref": d.max().item() / ref,
            "rel_rms": ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()).item()}


def agreement(hf: HfTower, vision_out: Path, images: list[Path], which: list[int]) -> list[dict]:
    """metrale's tower output against transformers' towers run on metrale's own pixel_values
    (so preprocessing differences stay out of it; they are reported beside it)."""
    import copy
    import torch
    from safetensors.torch import load_file
    got = load_file(str(vision_out))
    f32 = copy.deepcopy(hf.visual).float()
    rows = []
    for i in which:
        path = images[i]
        m_pv, m_out = got[f"pixel_values.{i}"], got[f"vision.{i}"]
        pv, grid = hf.inputs[i]
        log(f"agreement {path.name}: transformers' tower in bf16 and in f32 on metrale's pixels")
        with torch.inference_mode():
            hf_bf16 = hf.features(hf.visual(m_pv.to(torch.bfloat16), grid_thw=grid))
            hf_f32 = hf.features(f32(m_pv, grid_thw=grid))
        rows.append({
            "image": path.name, "grid_thw": grid[0].tolist(),
            "pixels_metrale_vs_processor": diff(m_pv, pv.float()) if m_pv.shape == pv.shape else
            {"shapes": [list(m_pv.shape), list(pv.shape)]},
            "metrale_vs_transformers_bf16": diff(m_out, hf_bf16),
            "metrale_vs_transformers_f32": diff(m_out, hf_f32),
            "transformers_bf16_vs_f32": diff(hf_bf16, hf_f32),
        })
        log("  " + "; ".join(f"{k}: " + ", ".join(f"{n} {x:.3g}" for n, x in v.items())
                             for k, v in rows[-1].items() if isinstance(v, dict)))
    return rows


def run_metrale(cmd: list[str]) -> dict:
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"vision_tower: {shlex.join(cmd)} failed ({r.returncode}):\n{r.stderr[-4000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def mtmd_rows(args, images, samples, metrale_report, results) -> list[dict]:
    """metrale beside llama-mtmd-cli, per thread count and image: ms per image, and ms per
    patch where the two preprocessings give different patch counts."""
    rows = []
    for t in args.threads:
        for i, p in enumerate(images):
            img = metrale_report["images"][i]
            rep = next(x["report"][i] for x in results["runs"]
                       if x["engine"] == "mtmd" and x["threads"] == t)
            merge = 2  # spatial_merge_size of the tower (VISION_CONFIG): tokens x 4 = patches
            m_patches, l_patches = img["patches"], rep["tokens"][0] * merge * merge
            m, l = statistics.median(samples[("metrale", t, i)]), statistics.median(samples[("mtmd", t, i)])
            m_min, l_min = min(samples[("metrale", t, i)]), min(samples[("mtmd", t, i)])
            rows.append({"image": f"{args.sizes[i][0]}x{args.sizes[i][1]}", "threads": t,
                         "metrale_grid_thw": img["grid_thw"], "metrale_patches": m_patches,
                         "metrale_resized": [img["resized_width"], img["resized_height"]],
                         "mtmd_patches": l_patches, "mtmd_tokens": rep["tokens"][0],
                         "mtmd_resized": rep["image_nx_ny"][0], "metrale_ms": m, "mtmd_ms": l,
                         "metrale_min_ms": m_min, "mtmd_min_ms": l_min, "ratio": l / m,
                         "ratio_of_min": l_min / m_min,
                         "ratio_per_patch": (l / l_patches) / (m / m_patches),
                         "samples": [len(samples[("metrale", t, i)]), len(samples[("mtmd", t, i)])]})
    return rows


def mtmd_table(results, args, images, samples, metrale_report) -> list[str]:
    rows = results["table_mtmd"]
    mt = results["mtmd"]
    lines = ["", f"llama.cpp {mt['source']['llama_cpp_commit']} ({mt['source']['package']}), "
                 f"llama-mtmd-cli, mmproj --outtype {mt['mmproj_outtype']}", "",
             "| image | metrale patches (resized) | mtmd patches (resized) | threads | "
             "metrale ms/image (min) | mtmd ms/image (min) | speed-up (of the mins) | "
             "speed-up per patch |", "|---|---|---|---|---|---|---|---|"]
    for x in rows:
        lines.append(
            f"| {x['image']} | {x['metrale_patches']} ({x['metrale_resized'][0]}x"
            f"{x['metrale_resized'][1]}) | {x['mtmd_patches']} ({x['mtmd_resized'][0]}x"
            f"{x['mtmd_resized'][1]}) | {x['threads']} | {x['metrale_ms']:.0f} "
            f"({x['metrale_min_ms']:.0f}) | {x['mtmd_ms']:.0f} ({x['mtmd_min_ms']:.0f}) | "
            f"{x['ratio']:.2f}x ({x['ratio_of_min']:.2f}x) | {x['ratio_per_patch']:.2f}x |")
    lines.append("\nspeed-up = mtmd ms / metrale ms (medians); per patch: each engine's median "
                 "ms / its own patch count.")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--threads", type=int_list, default=[2])
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds per thread count")
    ap.add_argument("--image-rounds", type=int, default=1, help="timed passes per image per round")
    ap.add_argument("--warmup", type=int, default=1, help="untimed passes per image (see above)")
    ap.add_argument("--sizes", type=size_list, default=size_list("448x448,1280x720"))
    ap.add_argument("--metrale-bin", type=Path, default=REPO / "build/release/src/metrale")
    ap.add_argument("--metrale-args", default="--compute bf16")
    ap.add_argument("--cache-dir", type=Path, default=REPO / "build/bench-vision")
    ap.add_argument("--out", type=Path, default=REPO / "out/vision-tower")
    ap.add_argument("--no-check", action="store_true", help="skip the output agreement check")
    ap.add_argument("--mtmd", action="store_true",
                    help="also time llama.cpp's llama-mtmd-cli (the pinned llama.cpp; see above)")
    ap.add_argument("--mtmd-outtype", choices=["bf16", "f16", "f32"], default="bf16",
                    help="the mmproj converter's --outtype (default bf16, the checkpoint's)")
    ap.add_argument("--llama-cache", type=Path, default=llama_cpp_peer.DEFAULT_CACHE,
                    help="llama_cpp_peer.py's cache: sdist, build, GGUFs")
    ap.add_argument("--no-transformers", action="store_true",
                    help="leave transformers out (implies --no-check)")
    ap.add_argument("--check-images", type=int_list, default=[1],
                    help="1-based --sizes entries the agreement check runs on (default: the first)")
    args = ap.parse_args()
    if args.no_transformers:
        args.no_check = True
    if args.rounds < 1 or args.image_rounds < 1 or args.warmup < 0:
        ap.error("--rounds and --image-rounds must be >= 1, --warmup >= 0")
    if not args.metrale_bin.is_file():
        ap.error(f"{args.metrale_bin} not found: cmake --preset release && "
                 "cmake --build --preset release --target metrale")

    import torch
    import transformers
    torch.set_num_interop_threads(1)
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    ckpt = ensure_checkpoint(args.cache_dir / "checkpoints")
    images = ensure_images(args.cache_dir, args.sizes)
    hf = None if args.no_transformers else HfTower(ckpt, images)
    mtmd = llama_cpp_peer.ensure_mtmd(args.llama_cache, ckpt, args.mtmd_outtype) if args.mtmd \
        else None
    engines = ["metrale"] + ([] if hf is None else ["transformers"]) + ([] if mtmd is None else
                                                                       ["mtmd"])
    command = shlex.join([sys.executable and "python3", *sys.argv])

    def metrale_cmd(threads: int, vision_out: Path | None = None) -> list[str]:
        cmd = [str(args.metrale_bin), "bench", "--model", str(ckpt)]
        for p in images:
            cmd += ["--image", str(p)]
        cmd += ["--image-warmup", str(args.warmup), "--image-rounds", str(args.image_rounds),
                "--threads", str(threads), "--json", *shlex.split(args.metrale_args)]
        if vision_out is not None:
            cmd += ["--vision-out", str(vision_out)]
        return cmd

    results = {
        "command": command, "argv": sys.argv,
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "checkpoint": {"dir": str(ckpt), "vision_config": VISION_CONFIG,
                       "text_config": TEXT_CONFIG, "preprocessor": PREPROCESSOR,
                       "source": "Qwen/Qwen3-VL-2B-Instruct config.json (vision_config as "
                                 "published, text_config with 3 of 28 layers)",
                       "dtype": "bfloat16"},
        "images": [str(p) for p in images],
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "python": platform.python_version(), "metrale": git_state(),
                     "cpu_capability": torch.backends.cpu.get_cpu_capability()},
        "transformers": None if hf is None else {
            "attn_implementation": hf.attn, "image_processor": hf.processor, "dtype": "bfloat16"},
        "mtmd": None if mtmd is None else {
            **{k: (str(v) if isinstance(v, Path) else v) for k, v in mtmd.items()},
            "encode_log_line": llama_cpp_peer.MTMD_ENCODE_RE.pattern},
        "engines": engines,
        "machine": lscpu_summary(), "loadavg_start": loadavg(), "runs": [],
    }
    samples = {}  # (engine, threads, image index) -> [ms]
    vision_out = args.out / "metrale_vision_out.safetensors"
    for t in args.threads:
        torch.set_num_threads(t)
        if hf is not None:
            log(f"{t} thread(s): transformers warm-up")
            for i in range(len(images)):
                for _ in range(args.warmup):
                    hf.run(i)
        for r in range(args.rounds):
            # the starting engine rotates (with two engines: alternates, as before)
            order = engines[r % len(engines):] + engines[:r % len(engines)]
            for engine in order:
                before = loadavg()
                t0 = time.time()
                if engine == "metrale":
                    want_out = not args.no_check and r == 0 and t == max(args.threads)
                    cmd = metrale_cmd(t, vision_out if want_out else None)
                    res = run_metrale(cmd)
                    ms = [img["pass_ms"] for img in res["images"]]
                    extra = {"cmd": cmd, "report": res}
                elif engine == "mtmd":
                    cmds, reports, ms = [], [], []
                    for p in images:
                        cmd = llama_cpp_peer.mtmd_command(
                            mtmd["tool"], mtmd["text_gguf"], mtmd["mmproj"], p,
                            args.warmup + args.image_rounds, t)
                        res = llama_cpp_peer.run_mtmd(cmd)
                        if len(res["encode_ms"]) != args.warmup + args.image_rounds:
                            sys.exit(f"vision_tower: {shlex.join(cmd)}: expected "
                                     f"{args.warmup + args.image_rounds} encodes, got {res}")
                        cmds.append(cmd)
                        reports.append(res)
                        ms.append([float(x) for x in res["encode_ms"][args.warmup:]])
                    extra = {"cmd": cmds, "report": reports}
                else:
                    ms = [[hf.time(i) for _ in range(args.image_rounds)] for i in range(len(images))]
                    extra = {}
                run = {"engine": engine, "threads": t, "round": r, "ms": ms, "loadavg_before": before,
                       "loadavg_after": loadavg(), "wall_s": round(time.time() - t0, 2), **extra}
                results["runs"].append(run)
                for i, v in enumerate(ms):
                    samples.setdefault((engine, t, i), []).extend(v)
                log(f"{t}T round {r} {engine}: " + ", ".join(
                    f"{images[i].stem}: {statistics.median(v):.0f} ms" for i, v in enumerate(ms)) +
                    f" (load {before[0]} -> {run['loadavg_after'][0]})")
    results["loadavg_end"] = loadavg()
    if not args.no_check:
        results["agreement"] = agreement(hf, vision_out, images,
                                         [i - 1 for i in args.check_images if i <= len(images)])
    metrale_report = next(x["report"] for x in results["runs"] if x["engine"] == "metrale")

    rows = []
    for t in (args.threads if hf is not None else []):
        for i, p in enumerate(images):
            m = statistics.median(samples[("metrale", t, i)])
            h = statistics.median(samples[("transformers", t, i)])
            img = metrale_report["images"][i]
            m_min = min(samples[("metrale", t, i)])
            h_min = min(samples[("transformers", t, i)])
            rows.append({"image": f"{args.sizes[i][0]}x{args.sizes[i][1]}", "threads": t,
                         "grid_thw": img["grid_thw"], "patches": img["patches"],
                         "tokens": img["tokens"], "metrale_ms": m, "transformers_ms": h,
                         "metrale_images_per_s": 1000 / m, "transformers_images_per_s": 1000 / h,
                         "ratio": h / m, "metrale_min_ms": m_min, "transformers_min_ms": h_min,
                         "ratio_of_min": h_min / m_min,
                         "samples": len(samples[("metrale", t, i)])})
    results["table"] = rows
    if mtmd is not None:
        results["table_mtmd"] = mtmd_rows(args, images, samples, metrale_report, results)
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")

    loads = [x["loadavg_before"][0] for x in results["runs"]] + [x["loadavg_after"][0] for x in results["runs"]]
    lines = [f"`{command}`", "",
             f"metrale {results['versions']['metrale']['commit'][:10]} (`{args.metrale_args}`), "
             f"torch {torch.__version__} / transformers {transformers.__version__} (bf16, "
             f"{hf.attn if hf else None}); load average (1 min) {min(loads):.1f}-{max(loads):.1f} during the runs", "",
             "| image | patches (grid) | threads | metrale ms/image (min) | metrale images/s | "
             "transformers ms/image (min) | transformers images/s | speed-up (of the mins) |",
             "|---|---|---|---|---|---|---|---|"]
    for x in rows:
        g = "x".join(str(v) for v in x["grid_thw"])
        lines.append(f"| {x['image']} | {x['patches']} ({g}) | {x['threads']} | {x['metrale_ms']:.0f} "
                     f"({x['metrale_min_ms']:.0f}) | {x['metrale_images_per_s']:.3f} | "
                     f"{x['transformers_ms']:.0f} ({x['transformers_min_ms']:.0f}) | "
                     f"{x['transformers_images_per_s']:.3f} | {x['ratio']:.2f}x ({x['ratio_of_min']:.2f}x) |")
    lines.append(f"\nms/image: the median over {rows[0]['samples'] if rows else 0} timed passes per engine "
                 "(min in brackets); images/s = 1000 / median; speed-up = transformers ms / metrale ms.")
    for a in results.get("agreement", []):
        d = a["metrale_vs_transformers_f32"]
        e = a["transformers_bf16_vs_f32"]
        lines.append(f"\n{a['image']}: against transformers' f32 tower, metrale rel RMS {d['rel_rms']:.2e} "
                     f"(max abs {d['max_abs']:.3g}), transformers bf16 rel RMS {e['rel_rms']:.2e} "
                     f"(max abs {e['max_abs']:.3g}); metrale vs transformers bf16 rel RMS "
                     f"{a['metrale_vs_transformers_bf16']['rel_rms']:.2e}; pixels max abs diff "
                     f"{a['pixels_metrale_vs_processor']['max_abs']:.3g}")
    if hf is None:
        lines = lines[:2] + [f"metrale {results['versions']['metrale']['commit'][:10]} "
                             f"(`{args.metrale_args}`); load average (1 min) {min(loads):.1f}-"
                             f"{max(loads):.1f} during the runs"]
    if mtmd is not None:
        lines += mtmd_table(results, args, images, samples, metrale_report)
    table = "\n".join(lines) + "\n"
    (args.out / "table.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
