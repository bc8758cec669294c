#!/usr/bin/env python3
"""llama.cpp as a benchmark peer, obtained from PyPI only and built once into a cache.

    python3 tools/bench/llama_cpp_peer.py --model HF_DIR --threads 2 [--outtype bf16] [--json]

* Source: `pip download llama-cpp-python==VERSION --no-binary :all: --no-deps`, pinned below
  (VERSION, the sdist's sha256 and the llama.cpp commit it vendors; the sdist carries
  llama.cpp with its convert_hf_to_gguf.py and the llama-bench / llama-batched-bench sources).
  To move the pin: change the three constants together (the commit is the sdist CHANGELOG's
  "update llama.cpp to ggml-org/llama.cpp@..." line of that version; ensure_source checks it).
* Build: Release, -DGGML_NATIVE=ON, CPU only, static, into <cache>/llama.cpp-VERSION-build.
  llama-server (bench/compare/serve_bench.py) is built on demand in the same directory
  (ensure_server_tool: SERVER_CMAKE_FLAGS, no web UI, nothing downloaded).
* Weights: the HF checkpoint converted by the vendored converter to GGUF bf16, cached per
  checkpoint + format + llama-cpp-python version (converter options per architecture: see
  converter_options; a Qwen3-Next checkpoint without an MTP head needs --no-mtp). Quantized
  formats (FORMATS: q4_0, q8_0 and variants) are that bf16 GGUF run through the pinned
  build's llama-quantize, with its default per-tensor choices or the options FORMATS names
  (--pure, --token-embedding-type ...); gguf_summary() reads back the type of every tensor.
  q8_0-convert is the converter's own --outtype q8_0 (what --outtype q8_0 meant before).
* Timing: llama-bench for prefill (pp128, pp512) and one-sequence decode (tg64), with the
  weights in anonymous memory (`-lm none`, this version's spelling of the older `-mmp 0`;
  with mmap decode was 2-4x slower on our VMs); llama-batched-bench for decode at batch 4 and
  16 (`-npl`), also with `-lm none`, each sequence decoding after a 16-token prompt of its own
  (as `metrale bench` does; llama-bench's tg64 starts from an empty cache). Each call does one repetition (plus llama-bench's own
  warm-up) so the caller can interleave repetitions with the other engines.
* Depth (--depth N, for bench/compare/run.py --depth): every timed decode step follows N
  tokens of context. Batch 1: llama-bench's own `-d N` (`-p 0 -n T -d N`: the N-token prompt
  is processed before the clock starts, then T tokens are timed; the tg warm-up runs on the
  empty cache first), in a second llama-bench call, because llama-bench crosses -d with every
  test and the prefill figures stay from an empty cache (`-p P -n 0`), as `metrale bench
  --depth` times them. Wider batches: llama-batched-bench with an N-token prompt per sequence
  (`-npp N` instead of 16). Without --depth: the calls as before (tg from an empty cache,
  batched after 16 tokens).
* KV cache type (--kv-type, default f16, llama.cpp's own default): `-ctk T -ctv T` on every
  llama-bench / llama-batched-bench call; the JSON says which ("kv_type", and llama-bench's
  own type_k / type_v) and kv_cache_per_token sizes the cache in it. tools/bench/
  llama_lora_bench.cpp and llama_greedy.cpp keep llama.cpp's default f16.
* LoRA (--lora ADAPTER_DIR, for bench/compare/run.py --lora-mix): the PEFT adapter converted
  by the vendored convert_lora_to_gguf.py (--base <the HF checkpoint> --outtype bf16), cached
  like the model's GGUF; decode with and without it timed in one process by
  tools/bench/llama_lora_bench.cpp (built like llama_greedy.cpp against the pinned build's
  libraries), because the pinned llama-batched-bench accepts --lora but never applies it (it
  creates its context without common_init_from_params; it even accepts a path that does not
  exist) and llama-bench has no LoRA option. That tool repeats llama-batched-bench's timed
  decode at each batch width; one adapter for all rows is llama.cpp's only mode.

* Vision (bench/compare/vision_tower.py --mtmd): llama-mtmd-cli, built on demand in the same
  directory (ensure_mtmd_tool), with the checkpoint's tower converted by the vendored
  converter's --mmproj (ensure_mmproj_gguf) and a text GGUF of its language model
  (mtmd_text_checkpoint: the tool needs one; it is never timed); mtmd_command / run_mtmd time
  the image encodes from the tool's own log line.

Prints (with --json) the same object as `metrale bench --json`:
{"prefill": {"128": tps, ...}, "decode": {"1": tps, ...}, ..., "kv_type": "f16",
 "depth": N or null, "commands": [every llama.cpp command line it ran]}.
Nothing from the sdist is copied into the repository.
"""

import argparse
import hashlib
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

DEFAULT_CACHE = Path("/tmp/metrale-bench")
PACKAGE = "llama-cpp-python"
# The pin: the sdist version, its sha256, and the llama.cpp commit it vendors.
VERSION = "0.3.36"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
LLAMA_CPP_COMMIT = "0c1e57098"  # ggml-org/llama.cpp, per the sdist's CHANGELOG for VERSION
TOOLS = ("llama-bench", "llama-batched-bench")
QUANTIZE_TOOL = "llama-quantize"  # built on demand beside TOOLS (ensure_quantize_tool)
SERVER_TOOL = "llama-server"  # built on demand beside TOOLS (ensure_server_tool)

# llama.cpp weight formats: name -> how the GGUF is made. "convert": the converter's --outtype;
# "quantize": llama-quantize's type, from the bf16 GGUF, with "args" before the file names.
# Tied embeddings (qwen3-0.6b, llama-3.2-1b): the one token_embd.weight is also the output
# head. llama-quantize's default rules (src/llama-quant.cpp, llama_tensor_get_type_impl) give
# a tied token_embd the *output* tensor's type: Q6_K under Q4_0 (any type but Q8_0 is raised
# to Q6_K), Q8_0 under Q8_0; --pure skips those rules (token_embd Q4_0 too);
# --token-embedding-type / --output-tensor-type set them outright. Norms (1-D) stay F32.
FORMATS = {
    "bf16": {"convert": "bf16", "bits": 16},
    "q8_0-convert": {"convert": "q8_0", "bits": 8},
    "q8_0": {"quantize": "Q8_0", "args": [], "bits": 8},
    "q4_0": {"quantize": "Q4_0", "args": [], "bits": 4},
    "q4_0-pure": {"quantize": "Q4_0", "args": ["--pure"], "bits": 4},
    # the embedding / output head kept bf16, as in the llm-compressor checkpoints (ignore
    # lm_head): both engines then read the same head bytes
    "q4_0-bf16head": {"quantize": "Q4_0", "bits": 4, "args": [
        "--token-embedding-type", "bf16", "--output-tensor-type", "bf16"]},
    "q8_0-bf16head": {"quantize": "Q8_0", "bits": 8, "args": [
        "--token-embedding-type", "bf16", "--output-tensor-type", "bf16"]},
}
CMAKE_FLAGS = ["-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=ON",
               "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
               "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF"]
# What llama-server (bench/compare/serve_bench.py) adds to CMAKE_FLAGS, in the same build
# directory, when it is first asked for: the tools/server subdirectory, and no web UI. The
# pinned tree's UI assets come from `npm run build` (LLAMA_BUILD_UI) or a download from a
# Hugging Face bucket at build time (LLAMA_USE_PREBUILT_UI, on by default); with both off
# scripts/ui-assets.cmake embeds an empty asset table, the server answers its API and
# nothing is fetched. The bench tools' objects and the build stamp are unchanged by it (the
# option only adds subdirectories), so a tree whose llama_cpp_peer.py predates this finds
# its build as it left it.
SERVER_CMAKE_FLAGS = ["-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_UI=OFF",
                      "-DLLAMA_USE_PREBUILT_UI=OFF"]
# llama-lookup (bench/compare/spec_bench.py) is one of the pinned tree's examples; the server's
# flags are repeated so that reconfiguring for it keeps llama-server's target.
LOOKUP_TOOL = "llama-lookup"
LOOKUP_CMAKE_FLAGS = [*SERVER_CMAKE_FLAGS, "-DLLAMA_BUILD_EXAMPLES=ON"]


def log(msg: str) -> None:
    print(f"[llama.cpp] {msg}", file=sys.stderr, flush=True)


def sdist_path(cache: Path) -> Path:
    return cache / "dl" / f"llama_cpp_python-{VERSION}.tar.gz"


def build_dir(cache: Path) -> Path:
    return cache / f"llama.cpp-{VERSION}-build"


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def vendored_commit(root: Path) -> str | None:
    """The llama.cpp commit the sdist's CHANGELOG names for VERSION (the first
    "update llama.cpp to ggml-org/llama.cpp@<sha>" line of its section)."""
    text = (root / "CHANGELOG.md").read_text(encoding="utf-8")
    m = re.search(r"^## \[" + re.escape(VERSION) + r"\](.*?)(?=^## \[|\Z)", text, re.M | re.S)
    if not m:
        return None
    c = re.search(r"llama\.cpp@([0-9a-f]{7,40})", m.group(1))
    return c.group(1) if c else None


def ensure_source(cache: Path) -> Path:
    """Returns vendor/llama.cpp of the pinned llama-cpp-python sdist, downloading it once and
    checking its sha256 and vendored commit."""
    dl = cache / "dl"
    dl.mkdir(parents=True, exist_ok=True)
    sdist = sdist_path(cache)
    if not sdist.is_file():
        log(f"pip download {PACKAGE}=={VERSION} (sdist) -> {dl}")
        subprocess.run([sys.executable, "-m", "pip", "download", f"{PACKAGE}=={VERSION}",
                        "--no-binary", ":all:", "--no-deps", "-d", str(dl)], check=True,
                       stdout=sys.stderr)
        if not sdist.is_file():
            sys.exit(f"llama.cpp peer: pip download left no {sdist.name} in {dl}")
    root = dl / sdist.name[: -len(".tar.gz")]
    src = root / "vendor" / "llama.cpp"
    if not (src / "CMakeLists.txt").is_file():
        digest = sha256(sdist)
        if digest != SDIST_SHA256:
            sys.exit(f"llama.cpp peer: {sdist} has sha256 {digest}, the pin says {SDIST_SHA256}")
        log(f"extracting {sdist.name}")
        with tarfile.open(sdist) as tar:
            tar.extractall(dl, filter="data")
    if not (src / "convert_hf_to_gguf.py").is_file():
        sys.exit(f"llama.cpp peer: {src} lacks convert_hf_to_gguf.py; sdist layout changed?")
    commit = vendored_commit(root)
    if commit is None or not (commit.startswith(LLAMA_CPP_COMMIT) or
                              LLAMA_CPP_COMMIT.startswith(commit)):
        sys.exit(f"llama.cpp peer: {root}/CHANGELOG.md names llama.cpp@{commit} for {VERSION}, "
                 f"the pin says {LLAMA_CPP_COMMIT}")
    return src


def source_info(cache: Path) -> dict:
    """What results.json records about the llama.cpp peer's origin and build."""
    return {"package": f"{PACKAGE}=={VERSION}", "sdist_sha256": SDIST_SHA256,
            "llama_cpp_commit": LLAMA_CPP_COMMIT,
            "llama_cpp_repository": "ggml-org/llama.cpp",
            "build_dir": str(build_dir(cache)), "cmake_flags": CMAKE_FLAGS,
            "targets": list(TOOLS)}


def is_built(cache: Path) -> bool:
    bin_dir = build_dir(cache) / "bin"
    stamp = build_dir(cache) / "metrale-build-stamp.json"
    return all((bin_dir / t).is_file() for t in TOOLS) and stamp.is_file() and \
        json.loads(stamp.read_text()) == source_info(cache)


def ensure_build(cache: Path, src: Path) -> Path:
    """Builds llama-bench and llama-batched-bench once per pin; returns the bin directory."""
    build = build_dir(cache)
    bin_dir = build / "bin"
    if is_built(cache):
        return bin_dir
    log(f"building {', '.join(TOOLS)} in {build} (once; takes a while on 2 cores)")
    subprocess.run(["cmake", "-S", str(src), "-B", str(build), *CMAKE_FLAGS],
                   check=True, stdout=sys.stderr)
    subprocess.run(["cmake", "--build", str(build), "--target", *TOOLS, "-j2"],
                   check=True, stdout=sys.stderr)
    (build / "metrale-build-stamp.json").write_text(json.dumps(source_info(cache), indent=2))
    return bin_dir


GREEDY_SOURCE = Path(__file__).resolve().parent / "llama_greedy.cpp"
GREEDY_TOOL = "llama-greedy"
LORA_BENCH_SOURCE = Path(__file__).resolve().parent / "llama_lora_bench.cpp"
LORA_BENCH_TOOL = "llama-lora-bench"


def greedy_link_libraries(build: Path) -> list[str]:
    """The libraries llama-bench links (its LINK_LIBRARIES line in build.ninja, relative to the
    build directory), less the tools' and common's own archives: libllama, the ggml archives
    and the system libraries (OpenMP, pthread, dl, m) of exactly this configuration."""
    text = (build / "build.ninja").read_text()
    m = re.search(r"^build bin/llama-bench:.*?\n((?:  .*\n)+)", text, re.M)
    libs = m and re.search(r"^  LINK_LIBRARIES = (.*)$", m.group(1), re.M)
    if not libs:
        sys.exit(f"llama.cpp peer: no LINK_LIBRARIES for llama-bench in {build}/build.ninja")
    keep = [a for a in libs.group(1).split()
            if not a.startswith(("tools/", "common/", "vendor/"))]
    if "src/libllama.a" not in keep:
        sys.exit(f"llama.cpp peer: llama-bench does not link src/libllama.a ({keep}); "
                 "the build layout changed")
    return keep


def greedy_tool_path(cache: Path) -> Path:
    return build_dir(cache) / "bin" / GREEDY_TOOL


def lora_bench_tool_path(cache: Path) -> Path:
    return build_dir(cache) / "bin" / LORA_BENCH_TOOL


def ensure_greedy_tool(cache: Path, src: Path) -> Path:
    """tools/bench/llama_greedy.cpp compiled (-O2, the build's C++ compiler) against the
    pinned build's static libraries, which ensure_build makes as llama-bench's dependencies,
    into <build>/bin/llama-greedy; recompiled when the source or libllama.a is newer. Nothing
    is added to the cmake build, so llama-bench / llama-batched-bench and the build stamp
    stay as they are. The numerics are the library's: one program linking libllama.a."""
    return ensure_tool(cache, src, GREEDY_SOURCE, greedy_tool_path(cache))


def ensure_lora_bench_tool(cache: Path, src: Path) -> Path:
    """tools/bench/llama_lora_bench.cpp, built as ensure_greedy_tool builds llama-greedy."""
    return ensure_tool(cache, src, LORA_BENCH_SOURCE, lora_bench_tool_path(cache))


def ensure_tool(cache: Path, src: Path, source: Path, tool: Path) -> Path:
    """One C++ file of tools/bench compiled against the pinned build's static libraries into
    `tool` (see ensure_greedy_tool); recompiled when the source or libllama.a is newer."""
    ensure_build(cache, src)
    build = build_dir(cache)
    newest = max(source.stat().st_mtime, (build / "src" / "libllama.a").stat().st_mtime)
    if tool.is_file() and tool.stat().st_mtime >= newest:
        return tool
    cxx = "c++"
    cache_txt = (build / "CMakeCache.txt").read_text()
    m = re.search(r"^CMAKE_CXX_COMPILER:FILEPATH=(.+)$", cache_txt, re.M)
    if m and Path(m.group(1)).is_file():
        cxx = m.group(1)
    cmd = [cxx, "-std=c++17", "-O2", "-I", str(src / "include"), "-I", str(src / "ggml" / "include"),
           str(source), "-o", str(tool.with_suffix(".partial")),
           *greedy_link_libraries(build), "-pthread"]
    log(f"building {tool} ({' '.join(cmd)})")
    subprocess.run(cmd, cwd=build, check=True, stdout=sys.stderr)
    tool.with_suffix(".partial").rename(tool)
    return tool


def greedy_command(cache: Path, gguf: Path, ids: list[int], n: int, threads: int,
           load_mode: str = "mmap", lora: Path | None = None) -> list[str]:
    """The llama-greedy command line for this GGUF and prompt, with the LoRA adapter GGUF
    `lora` applied if given (run it with ensure_greedy_tool done first)."""
    return [str(greedy_tool_path(cache)), "-m", str(gguf), "--ids", ",".join(map(str, ids)),
            "-n", str(n), "-t", str(threads), "--load-mode", load_mode,
            *(["--lora", str(lora)] if lora else [])]


LORA_OUTTYPE = "bf16"  # the adapters are bf16, as metrale's slots under --lora-dtype bf16


def lora_gguf_path(cache: Path, model_dir: Path, adapter_dir: Path,
                   outtype: str = LORA_OUTTYPE) -> Path:
    """Where the GGUF of this PEFT adapter (for this base checkpoint) is cached: keyed by the
    checkpoint as gguf_path is, and by the adapter's path, size and mtime."""
    h = hashlib.sha256(str(adapter_dir.resolve()).encode())
    for f in sorted(adapter_dir.glob("adapter_*")):
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return cache / "gguf" / "lora" / (f"{model_dir.name}-{checkpoint_key(model_dir)}-"
                                      f"{adapter_dir.name}-{h.hexdigest()[:12]}-{outtype}-"
                                      f"lcp{VERSION}.gguf")


def lora_convert_command(src: Path, model_dir: Path, adapter_dir: Path, out: Path,
                         outtype: str = LORA_OUTTYPE) -> list[str]:
    """The vendored convert_lora_to_gguf.py on a PEFT adapter directory; --base gives it the
    checkpoint's config (no weights are read from it, nothing from the Hub)."""
    return [sys.executable, str(src / "convert_lora_to_gguf.py"), "--base", str(model_dir),
            "--outtype", outtype, "--outfile", str(out), str(adapter_dir)]


def ensure_lora_gguf(cache: Path, src: Path, model_dir: Path, adapter_dir: Path,
                     outtype: str = LORA_OUTTYPE) -> Path:
    """The adapter converted once (the converter's log kept beside it as .log)."""
    out = lora_gguf_path(cache, model_dir, adapter_dir, outtype)
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".gguf.partial")
    cmd = lora_convert_command(src, model_dir, adapter_dir, partial, outtype)
    log(f"converting adapter {adapter_dir} -> {out.name}: {' '.join(cmd)}")
    with open(str(out) + ".log", "w") as fh:
        subprocess.run(cmd, check=True, stdout=fh, stderr=subprocess.STDOUT)
    partial.rename(out)
    return out


def checkpoint_key(model_dir: Path) -> str:
    """Distinguishes checkpoints by path, size and mtime of their weight files."""
    h = hashlib.sha256(str(model_dir.resolve()).encode())
    for f in sorted(model_dir.glob("*.safetensors")):
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:12]


def gguf_path(cache: Path, model_dir: Path, fmt: str) -> Path:
    """Where the GGUF of this checkpoint, format (FORMATS) and llama.cpp version is cached:
    the converter's output <model>-<key>-<outtype>-lcp<VERSION>.gguf, a llama-quantize product
    of the bf16 one <that stem>.<format>.gguf."""
    spec = FORMATS[fmt]
    stem = f"{model_dir.name}-{checkpoint_key(model_dir)}"
    if "convert" in spec:
        return cache / "gguf" / f"{stem}-{spec['convert']}-lcp{VERSION}.gguf"
    return cache / "gguf" / f"{stem}-bf16-lcp{VERSION}.{fmt}.gguf"


def has_mtp_tensors(model_dir: Path) -> bool:
    """Whether the checkpoint carries a multi-token-prediction head (mtp.* tensors)."""
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        names = json.loads(index.read_text()).get("weight_map", {})
    else:
        names = {}
        for f in model_dir.glob("*.safetensors"):
            with open(f, "rb") as fh:
                names.update(json.loads(fh.read(int.from_bytes(fh.read(8), "little"))))
    return any(n.startswith(("mtp.", "model.mtp.")) for n in names)


def converter_options(model_dir: Path) -> tuple[list[str], list[str]]:
    """(convert_gguf.py options, convert_hf_to_gguf.py options) this checkpoint needs:
    * Llama-architecture checkpoints here carry a re-cut tokenizer with an unknown
      pre-tokenizer hash (see convert_gguf.py): --pre-fallback llama-bpe; the
      deepseek-v2-lite-L<N> shape (model_type deepseek_v3) likewise: --pre-fallback
      deepseek-llm, DeepSeek-V2's pre-tokenizer. A fallback is used only when the hash is
      unknown, so a real checkpoint's tokenizer keeps its own.
    * Qwen3 checkpoints with a tokenizer of their own (models/demo: a BPE trained with
      Qwen2/Qwen3's split regex, whose hash the converter does not know): --pre-fallback
      qwen2, Qwen2/Qwen3's pre-tokenizer; the real Qwen3 tokenizer's hash is known and kept.
    * DeepSeek with q_lora_rank null and a layer count other than V2-Lite's 26 / 27: the
      pinned llama.cpp requires deepseek2.attention.q_lora_rank then, which the converter
      writes only when set: --q-lora-rank-zero (convert_gguf.py) writes it as 0.
    * Qwen3-Next without an MTP head (the random qwen3-next-L<N> shape leaves it out): the
      pinned converter assumes published Qwen3-Next checkpoints carry mtp.* tensors and fails
      an assertion (`assert self.opt_num_mtp_layers != 0`, conversion/qwen.py) unless told
      --no-mtp. The benchmarks never use MTP (llama-bench and llama-batched-bench decode
      without a draft), so leaving it out changes no timed work."""
    config = json.loads((model_dir / "config.json").read_text())
    wrapper, converter = [], []
    if config.get("model_type") == "llama":
        wrapper += ["--pre-fallback", "llama-bpe"]
    if config.get("model_type") == "qwen3":
        wrapper += ["--pre-fallback", "qwen2"]
    if config.get("model_type") == "deepseek_v3":
        wrapper += ["--pre-fallback", "deepseek-llm"]
        if config.get("q_lora_rank") is None and config.get("num_hidden_layers") not in (26, 27):
            wrapper += ["--q-lora-rank-zero"]
    if config.get("model_type") == "qwen3_next" and not has_mtp_tensors(model_dir):
        converter += ["--no-mtp"]
    return wrapper, converter


def quantize_command(cache: Path, model_dir: Path, fmt: str, threads: int = 1) -> list[str]:
    """The llama-quantize command making format `fmt` from the bf16 GGUF (into a .partial)."""
    spec = FORMATS[fmt]
    out = gguf_path(cache, model_dir, fmt)
    return [str(build_dir(cache) / "bin" / QUANTIZE_TOOL), *spec["args"],
            str(gguf_path(cache, model_dir, "bf16")), str(out) + ".partial", spec["quantize"],
            str(threads)]


def ensure_gguf(cache: Path, src: Path, model_dir: Path, fmt: str) -> Path:
    """The GGUF of this checkpoint in format `fmt` (FORMATS), made once: converted, or the bf16
    one converted first and then quantized (llama-quantize's log kept beside it as .log)."""
    spec = FORMATS[fmt]
    out = gguf_path(cache, model_dir, fmt)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.is_file():
        return out
    if "quantize" in spec:
        ensure_gguf(cache, src, model_dir, "bf16")
        ensure_quantize_tool(cache, src)
        cmd = quantize_command(cache, model_dir, fmt)
        log(f"quantizing -> {out.name}: {' '.join(cmd)}")
        with open(str(out) + ".log", "w") as fh:
            subprocess.run(cmd, check=True, stdout=fh, stderr=subprocess.STDOUT)
        Path(cmd[-3]).rename(out)
        return out
    partial = out.with_suffix(".gguf.partial")
    log(f"converting {model_dir} -> {out.name}")
    converter = Path(__file__).resolve().parent / "convert_gguf.py"
    wrapper_opts, converter_opts = converter_options(model_dir)
    subprocess.run([sys.executable, str(converter), "--llama-src", str(src), *wrapper_opts, "--",
                    str(model_dir), "--outtype", spec["convert"], "--outfile", str(partial),
                    *converter_opts], check=True, stdout=sys.stderr)
    partial.rename(out)
    return out


def build_extra_tool(cache: Path, src: Path, name: str) -> Path:
    """Tool `name` of the pinned build, built on first use in the same cmake configuration as
    TOOLS (the build stamp is left as it is)."""
    ensure_build(cache, src)
    tool = build_dir(cache) / "bin" / name
    if not tool.is_file():
        log(f"building {name} in {build_dir(cache)}")
        subprocess.run(["cmake", "--build", str(build_dir(cache)), "--target", name, "-j2"],
                       check=True, stdout=sys.stderr)
    return tool


def ensure_quantize_tool(cache: Path, src: Path) -> Path:
    """llama-quantize of the pinned build (same cmake configuration as TOOLS; the build
    stamp is left as it is)."""
    return build_extra_tool(cache, src, QUANTIZE_TOOL)


def server_tool_path(cache: Path) -> Path:
    return build_dir(cache) / "bin" / SERVER_TOOL


def server_info(cache: Path) -> dict:
    """What results.json records about the llama-server binary: source_info plus the cmake
    options it was configured with and its target."""
    return {**source_info(cache), "targets": [SERVER_TOOL],
            "cmake_flags": CMAKE_FLAGS + SERVER_CMAKE_FLAGS, "binary": str(server_tool_path(cache))}


def ensure_server_tool(cache: Path, src: Path) -> Path:
    """llama-server of the pinned build: the build directory of TOOLS reconfigured with
    SERVER_CMAKE_FLAGS, then its llama-server target (see build_reconfigured_tool)."""
    return build_reconfigured_tool(cache, src, SERVER_TOOL, SERVER_CMAKE_FLAGS)


def ensure_lookup_tool(cache: Path, src: Path) -> Path:
    """llama-lookup (bench/compare/spec_bench.py: llama.cpp's prompt-lookup decoding, the
    pinned examples/lookup/lookup.cpp unchanged): the build directory reconfigured with
    LOOKUP_CMAKE_FLAGS, then its target (see build_reconfigured_tool)."""
    return build_reconfigured_tool(cache, src, LOOKUP_TOOL, LOOKUP_CMAKE_FLAGS)


def build_reconfigured_tool(cache: Path, src: Path, name: str, flags: list[str]) -> Path:
    """Tool `name` of the pinned build, once: the build directory of TOOLS reconfigured with
    CMAKE_FLAGS + `flags` (later -D options win; cmake's cache keeps what an earlier tool
    turned on), then its target alone (libllama, ggml and common are shared with the bench
    tools, so only the tool's own sources compile). The build stamp is left as it is, as for
    llama-quantize."""
    ensure_build(cache, src)
    tool = build_dir(cache) / "bin" / name
    if tool.is_file():
        return tool
    build = build_dir(cache)
    log(f"building {name} in {build} (once; minutes on 2 cores)")
    subprocess.run(["cmake", "-S", str(src), "-B", str(build), *CMAKE_FLAGS, *flags],
                   check=True, stdout=sys.stderr)
    subprocess.run(["cmake", "--build", str(build), "--target", name, "-j2"],
                   check=True, stdout=sys.stderr)
    return tool


# llama-mtmd-cli (bench/compare/vision_tower.py --mtmd): the vision tower of a Qwen3-VL
# checkpoint, converted by the pinned converter with --mmproj, beside a text GGUF of the same
# checkpoint (the tool needs one to run; its layers are never timed).
MTMD_TOOL = "llama-mtmd-cli"  # built on demand beside TOOLS (ensure_mtmd_tool)
# The line the pinned tools/mtmd/mtmd-cli.cpp logs after each media batch's encode
# (mtmd_batch_encode: preprocessed pixels through the tower, merger and deepstack mergers):
MTMD_ENCODE_RE = re.compile(r"mtmd batch encoding done in (\d+) ms")
# With -v, mtmd.cpp's debug lines give the batch's merged tokens and the resized image:
MTMD_TOKENS_RE = re.compile(r"encoding batch with (\d+) entries and total (\d+) tokens")
MTMD_IMAGE_RE = re.compile(r"copying image \d+/\d+ to input buffer \(nx=(\d+), ny=(\d+)\)")


def ensure_mtmd_tool(cache: Path, src: Path) -> Path:
    """llama-mtmd-cli of the pinned build (tools/mtmd is configured by CMAKE_FLAGS already: the
    pinned tools/CMakeLists.txt adds it unconditionally); libmtmd, libllama and ggml are
    shared with the other tools. The build stamp is left as it is, as for llama-quantize."""
    return build_extra_tool(cache, src, MTMD_TOOL)


def mmproj_command(src: Path, model_dir: Path, out: Path, outtype: str = "bf16") -> list[str]:
    """The pinned converter's --mmproj conversion (the vision tower and its mergers only)."""
    return [sys.executable, str(src / "convert_hf_to_gguf.py"), str(model_dir), "--mmproj",
            "--outtype", outtype, "--outfile", str(out)]


def ensure_mmproj_gguf(cache: Path, src: Path, model_dir: Path,
                       outtype: str = "bf16") -> tuple[Path, list[str]]:
    """The checkpoint's vision tower as the pinned converter's mmproj GGUF, made once;
    returns it and the conversion command."""
    out = cache / "gguf" / f"mmproj-{model_dir.name}-{checkpoint_key(model_dir)}-{outtype}-lcp{VERSION}.gguf"
    partial = out.with_suffix(".gguf.partial")
    cmd = mmproj_command(src, model_dir, partial, outtype)
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        log(f"converting the tower: {' '.join(cmd)}")
        subprocess.run(cmd, check=True, stdout=sys.stderr)
        partial.rename(out)
    return out, cmd


def mtmd_text_checkpoint(cache: Path, model_dir: Path) -> Path:
    """The checkpoint's language model alone, for the text GGUF llama-mtmd-cli loads beside
    the mmproj: its text tensors, the committed Qwen3 tokenizer (tests/data/tokenizers/qwen3,
    as make_random_checkpoint writes it: Qwen3-VL's vocabulary and media tokens; the tower
    checkpoint ships none), and at least one layer more than
    deepstack features. The pinned src/models/qwen3vl.cpp adds deepstack feature i after layer
    i, on the last layer after it has kept only the output rows (ggml_get_rows on
    inp_out_ids), so a model of no more layers than features fails GGML_ASSERT(
    ggml_can_repeat(b, a)) in its warm-up decode; the missing layers are copies of the last.
    Only the tower is timed, so this changes no timed work."""
    import torch  # noqa: F401  (safetensors' torch API)
    from safetensors import safe_open
    from safetensors.torch import save_file
    config = json.loads((model_dir / "config.json").read_text())
    text = config["text_config"]
    n_ds = len(config.get("vision_config", {}).get("deepstack_visual_indexes", []))
    have = text["num_hidden_layers"]
    want = max(have, n_ds + 1)
    out = cache / "checkpoints" / f"{model_dir.name}-{checkpoint_key(model_dir)}-mtmd-text-L{want}"
    if (out / "model.safetensors").is_file():
        return out
    log(f"writing {out} (the language model, {have} -> {want} layers, for llama-mtmd-cli)")
    out.mkdir(parents=True, exist_ok=True)
    text["num_hidden_layers"] = want
    (out / "config.json").write_text(json.dumps(config, indent=2))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import make_random_checkpoint  # noqa: E402  (beside this file)
    make_random_checkpoint.write_qwen3_tokenizer(out)
    tensors = {}
    last = f"model.language_model.layers.{have - 1}."
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(f), "pt") as fh:
            for k in fh.keys():
                if k.startswith("model.visual."):
                    continue
                tensors[k] = fh.get_tensor(k)
                if k.startswith(last):
                    for extra in range(have, want):
                        tensors[k.replace(last, f"model.language_model.layers.{extra}.")] = \
                            tensors[k].clone()
    save_file(tensors, str(out / "model.safetensors.partial"), metadata={"format": "pt"})
    (out / "model.safetensors.partial").rename(out / "model.safetensors")
    return out


def mtmd_command(tool: Path, text_gguf: Path, mmproj: Path, image: Path, copies: int,
                 threads: int) -> list[str]:
    """One llama-mtmd-cli process encoding `image` `copies` times: one prompt with a media
    marker per copy, text between them (consecutive media chunks would be encoded as one
    batch; text splits them, so each copy is its own mtmd_batch_encode and its own log line),
    one generated token, -t / -tb both `threads` (mtmd's own n_threads is -t), -v for the
    batch's token count and resized image, a context holding every copy's tokens."""
    prompt = " ".join(f"<__media__> {i}" for i in range(copies))
    return [str(tool), "-m", str(text_gguf), "--mmproj", str(mmproj),
            "--image", ",".join([str(image)] * copies), "-p", prompt, "-n", "1", "--temp", "0",
            "-t", str(threads), "-tb", str(threads), "-c", str(1024 * (4 * copies + 1)), "-v"]


def run_mtmd(cmd: list[str]) -> dict:
    """Runs mtmd_command's process; the encode ms of every copy in order, the merged tokens
    and the image size the tower saw."""
    res = subprocess.run(cmd, capture_output=True, text=True)
    log_text = res.stdout + res.stderr
    ms = [int(x) for x in MTMD_ENCODE_RE.findall(log_text)]
    if res.returncode != 0 or not ms:
        sys.exit(f"llama.cpp peer: {' '.join(cmd)} failed ({res.returncode}):\n{log_text[-3000:]}")
    tokens = {int(t) for _, t in MTMD_TOKENS_RE.findall(log_text)}
    sizes = {(int(x), int(y)) for x, y in MTMD_IMAGE_RE.findall(log_text)}
    return {"encode_ms": ms, "tokens": sorted(tokens), "image_nx_ny": sorted(sizes)}


def ensure_mtmd(cache: Path, model_dir: Path, outtype: str = "bf16") -> dict:
    """Everything llama-mtmd-cli needs for this checkpoint (built / converted once): the tool,
    the mmproj GGUF (and its conversion command), the text GGUF (ensure_gguf's bf16 of
    mtmd_text_checkpoint) and source_info."""
    src = ensure_source(cache)
    tool = ensure_mtmd_tool(cache, src)
    mmproj, cmd = ensure_mmproj_gguf(cache, src, model_dir, outtype)
    text_dir = mtmd_text_checkpoint(cache, model_dir)
    text_gguf = ensure_gguf(cache, src, text_dir, "bf16")
    return {"tool": tool, "mmproj": mmproj, "mmproj_command": cmd, "mmproj_outtype": outtype,
            "text_checkpoint": text_dir, "text_gguf": text_gguf, "source": source_info(cache)}


# GGML type ids -> (name, block elements, block bytes), for the types these GGUFs hold
# (ggml/include/ggml.h enum ggml_type; ggml/src/ggml.c type_traits).
GGML_TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
              6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34),
              9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
              12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
              15: ("Q8_K", 256, 292), 24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4),
              27: ("I64", 1, 8), 28: ("F64", 1, 8), 30: ("BF16", 1, 2)}


def gguf_tensors(path: Path) -> tuple[list[dict], dict]:
    """([{"name", "shape", "type", "bytes"}], {metadata key: scalar value}) of a GGUF (v2/v3),
    read from its header alone (arrays in the metadata are skipped, not returned)."""
    import struct
    with open(path, "rb") as f:
        def rd(fmt):
            return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]

        def rd_str():
            return f.read(rd("Q")).decode("utf-8", "replace")
        scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q",
                  11: "q", 12: "d"}

        def rd_value(t):
            if t in scalar:
                return rd(scalar[t])
            if t == 8:
                return rd_str()
            if t == 9:
                et, n = rd("I"), rd("Q")
                for _ in range(n):
                    rd_value(et)
                return None
            raise ValueError(f"{path}: unknown GGUF value type {t}")
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version, n_tensors, n_kv = rd("I"), rd("Q"), rd("Q")
        meta = {"gguf_version": version}
        for _ in range(n_kv):
            key = rd_str()
            value = rd_value(rd("I"))
            if value is not None:
                meta[key] = value
        tensors = []
        for _ in range(n_tensors):
            name = rd_str()
            dims = [rd("Q") for _ in range(rd("I"))]
            ttype, _offset = rd("I"), rd("Q")
            numel = 1
            for d in dims:
                numel *= d
            tname, blk, bb = GGML_TYPES.get(ttype, (f"type{ttype}", None, None))
            tensors.append({"name": name, "shape": dims, "type": tname,
                            "bytes": numel // blk * bb if blk else None})
    return tensors, meta


def gguf_summary(path: Path) -> dict:
    """What results.json records of a GGUF: the tensor type of each kind of tensor (names
    with the layer number taken out: blk.N.attn_q.weight -> attn_q.weight), the bytes of
    each type, and the bytes one decode step reads (every tensor, except token_embd when an
    output.weight exists: an untied embedding is only gathered)."""
    tensors, meta = gguf_tensors(path)
    kinds: dict[str, dict] = {}
    by_type: dict[str, int] = {}
    names = {t["name"] for t in tensors}
    tied = "output.weight" not in names
    step = 0
    for t in tensors:
        kind = re.sub(r"^blk\.\d+\.", "", t["name"])
        k = kinds.setdefault(kind, {"types": {}, "count": 0, "bytes": 0})
        k["types"][t["type"]] = k["types"].get(t["type"], 0) + 1
        k["count"] += 1
        k["bytes"] += t["bytes"] or 0
        by_type[t["type"]] = by_type.get(t["type"], 0) + (t["bytes"] or 0)
        if not (t["name"] == "token_embd.weight" and not tied):
            step += t["bytes"] or 0
    return {"file": str(path), "file_bytes": path.stat().st_size,
            "file_type": meta.get("general.file_type"), "tied_embeddings": tied,
            "tensor_bytes": sum(t["bytes"] or 0 for t in tensors), "bytes_by_type": by_type,
            "per_step": step, "kinds": kinds}


# Bytes of llama.cpp's default KV cache types (llama-bench / llama-batched-bench / the greedy
# tool leave -ctk / -ctv at f16).
KV_CACHE_TYPE = ("f16", 2)
# The -ctk / -ctv values --kv-type offers (a subset of common/arg.cpp's kv_cache_types) ->
# (bytes per block, values per block), from GGML_TYPES. q8_0 / q4_0 V needs flash attention,
# which llama-bench and llama-batched-bench leave on "auto".
KV_TYPES = {"f32": (4, 1), "f16": (2, 1), "bf16": (2, 1), "q8_0": (34, 32), "q4_0": (18, 32)}


def kv_cache_per_token(path: Path, kv_type: str = KV_CACHE_TYPE[0]) -> dict | None:
    """The KV cache llama.cpp allocates per token for this GGUF, from its metadata as
    llama_kv_cache sizes it (src/llama-kv-cache.cpp): per layer K of key_length x head_count_kv
    and V of value_length x head_count_kv values, in kv_type (KV_TYPES; default llama.cpp's
    f16); a model with MLA lengths
    (<arch>.attention.key_length_mla, deepseek2) is converted as MQA over the latent (one kv
    head, key_length = kv_lora_rank + rope dim) and keeps K only, no V cache. None for an
    architecture whose layers do not all keep K/V (hybrids) or whose lengths are per-layer
    arrays."""
    _, meta = gguf_tensors(path)
    arch = meta.get("general.architecture")
    if arch is None or arch in ("qwen3next", "qwen35", "qwen35moe"):
        return None
    n_layer = meta.get(f"{arch}.block_count")
    n_head = meta.get(f"{arch}.attention.head_count")
    n_kv = meta.get(f"{arch}.attention.head_count_kv", n_head)
    embd = meta.get(f"{arch}.embedding_length")
    k_len = meta.get(f"{arch}.attention.key_length", embd // n_head if embd and n_head else None)
    v_len = meta.get(f"{arch}.attention.value_length", k_len)
    if not all(isinstance(v, int) for v in (n_layer, n_kv, k_len, v_len)):
        return None
    mla = f"{arch}.attention.key_length_mla" in meta
    k, v = k_len * n_kv, 0 if mla else v_len * n_kv
    name, (block_bytes, block) = kv_type, KV_TYPES[kv_type]
    return {"bytes": n_layer * ((k + block - 1) // block + (v + block - 1) // block) * block_bytes,
            "layers": n_layer, "k_values": k, "v_values": v,
            "dtype": name, "mla_latent": mla,
            "layout": (f"MLA latent: K {k} values (kv_lora_rank + rope) x {n_layer} layers, "
                       f"no V, {name}" if mla else
                       f"K {k} + V {v} values x {n_layer} layers, {name}")}


def kv_type_args(kv_type: str | None) -> list[str]:
    """-ctk / -ctv for llama-bench and llama-batched-bench ([] for None: llama.cpp's default,
    the calls as they were before --kv-type)."""
    return [] if kv_type is None else ["-ctk", kv_type, "-ctv", kv_type]


def llama_bench_command(bin_dir: Path, gguf: Path, threads: int, prefill: list[int],
                        decode_tokens: int, depth: int = 0,
                        kv_type: str | None = None) -> list[str]:
    """One llama-bench call, one repetition: prompts `prefill` (-p, 0 = none) and a decode of
    decode_tokens (-n, 0 = none), after `depth` tokens of context when > 0 (-d)."""
    return [str(bin_dir / "llama-bench"), "-m", str(gguf), "-t", str(threads),
            "-p", ",".join(map(str, prefill)) or "0", "-n", str(decode_tokens),
            *(["-d", str(depth)] if depth else []), *kv_type_args(kv_type), "-lm", "none",
            "-r", "1", "-o", "json"]


def run_llama_bench(bin_dir: Path, gguf: Path, threads: int, prefill: list[int],
                    decode_tokens: int, depth: int = 0, kv_type: str | None = None,
                    commands: list | None = None) -> dict:
    """llama-bench's prefill (depth 0, from an empty cache) and batch-1 decode figures. With
    depth > 0, two calls: the prefill tests alone (-n 0), then the decode alone at that depth
    (-p 0 -n T -d depth), since -d applies to every test of a call. Each row's n_depth,
    type_k and type_v as llama-bench reports them go to "llama_bench_rows"."""
    calls = ([llama_bench_command(bin_dir, gguf, threads, prefill, decode_tokens, 0, kv_type)]
             if not depth else
             [llama_bench_command(bin_dir, gguf, threads, prefill, 0, 0, kv_type),
              llama_bench_command(bin_dir, gguf, threads, [], decode_tokens, depth, kv_type)])
    rows = []
    for cmd in calls:
        log(" ".join(cmd))
        if commands is not None:
            commands.append(cmd)
        res = subprocess.run(cmd, check=True, capture_output=True, text=True)
        rows += json.loads(res.stdout)
    out = {"prefill": {}, "decode": {}}
    for row in rows:
        if row["n_prompt"] > 0 and row["n_gen"] == 0 and not row.get("n_depth"):
            out["prefill"][str(row["n_prompt"])] = row["avg_ts"]
        elif row["n_gen"] > 0 and row["n_prompt"] == 0 and row.get("n_depth", 0) == depth:
            out["decode"]["1"] = row["avg_ts"]
    missing = [f"pp{n}" for n in prefill if str(n) not in out["prefill"]] + \
        ([] if "1" in out["decode"] or not decode_tokens else
         [f"tg{decode_tokens}" + (f" @ d{depth}" if depth else "")])
    if missing:
        sys.exit(f"llama-bench: no result for {missing}; rows were:\n{json.dumps(rows)}")
    out["llama_bench_rows"] = [{k: row.get(k) for k in ("n_prompt", "n_gen", "n_depth",
                                                         "type_k", "type_v", "flash_attn",
                                                         "avg_ts")} for row in rows]
    out["build"] = {"commit": rows[0].get("build_commit"), "number": rows[0].get("build_number"),
                    "cpu": rows[0].get("cpu_info")} if rows else {}
    return out


def run_batched_bench(bin_dir: Path, gguf: Path, threads: int, batches: list[int],
                      decode_tokens: int, prompt: int, kv_type: str | None = None,
                      commands: list | None = None) -> dict:
    """Aggregate decode tokens/s (S_TG) per batch width, each sequence after a `prompt`-token
    prefill of its own."""
    ctx = max(batches) * (prompt + decode_tokens) + 64
    cmd = [str(bin_dir / "llama-batched-bench"), "-m", str(gguf), "-t", str(threads),
           "-tb", str(threads), "-c", str(ctx), "-b", "2048", "-ub", "512",
           "-npp", str(prompt), "-ntg", str(decode_tokens),
           "-npl", ",".join(map(str, batches)), *kv_type_args(kv_type), "-lm", "none",
           "--output-format", "jsonl"]
    log(" ".join(cmd))
    if commands is not None:
        commands.append(cmd)
    res = subprocess.run(cmd, check=True, capture_output=True, text=True)
    out = {}
    for line in res.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            row = json.loads(line)
            out[str(row["pl"])] = row["speed_tg"]
    missing = [b for b in batches if str(b) not in out]
    if missing:
        sys.exit(f"llama-batched-bench: no result for batch {missing}; stdout was:\n{res.stdout}")
    return out


def lora_bench_command(cache: Path, gguf: Path, lora: Path, threads: int, batches: list[int],
                       decode_tokens: int, prompt: int) -> list[str]:
    """llama-lora-bench: decode at each batch width without and with the adapter, with the
    weights in anonymous memory as -lm none."""
    return [str(lora_bench_tool_path(cache)), "-m", str(gguf), "--lora", str(lora), "-t",
            str(threads), "-npl", ",".join(map(str, batches)), "-npp", str(prompt), "-ntg",
            str(decode_tokens), "--load-mode", "none"]


def run_lora_bench(cache: Path, gguf: Path, lora: Path, threads: int, batches: list[int],
                   decode_tokens: int, prompt: int) -> dict:
    cmd = lora_bench_command(cache, gguf, lora, threads, batches, decode_tokens, prompt)
    log(" ".join(cmd))
    res = subprocess.run(cmd, check=True, capture_output=True, text=True)
    line = next((ln for ln in reversed(res.stdout.splitlines()) if ln.startswith("{")), None)
    if line is None:
        sys.exit(f"llama-lora-bench: no JSON on stdout:\n{res.stdout}\n{res.stderr[-2000:]}")
    return {"command": cmd, **json.loads(line)}


def bench(model_dir: Path, threads: int, prefill: list[int], batches: list[int],
          decode_tokens: int, outtype: str = "bf16", cache: Path = DEFAULT_CACHE,
          batched_prompt: int = 16, lora: Path | None = None, depth: int | None = None,
          kv_type: str | None = None) -> dict:
    """depth: tokens of context before the timed decode steps (None: llama-bench's tg from an
    empty cache, the batched widths after batched_prompt tokens, as before); kv_type: -ctk /
    -ctv (None: not passed, llama.cpp's default f16)."""
    if lora and kv_type not in (None, KV_CACHE_TYPE[0]):
        sys.exit(f"llama.cpp peer: --lora times with tools/bench/llama_lora_bench.cpp, which "
                 f"keeps llama.cpp's default {KV_CACHE_TYPE[0]} KV cache; --kv-type {kv_type} "
                 "is not supported with it")
    src = ensure_source(cache)
    bin_dir = ensure_build(cache, src)
    gguf = ensure_gguf(cache, src, model_dir, outtype)
    commands: list[list[str]] = []
    prompt = depth if depth else batched_prompt
    out = run_llama_bench(bin_dir, gguf, threads, prefill, decode_tokens, depth or 0, kv_type,
                          commands)
    wider = [b for b in batches if b != 1]
    if wider:
        out["decode"].update(run_batched_bench(bin_dir, gguf, threads, wider, decode_tokens,
                                               prompt, kv_type, commands))
    if lora:
        # The adapter's GGUF and tool are made by the caller (run.py prepares them before the
        # timed rounds); made here too when this script runs alone.
        lora_gguf = ensure_lora_gguf(cache, src, model_dir, lora)
        ensure_lora_bench_tool(cache, src)
        res = run_lora_bench(cache, gguf, lora_gguf, threads, batches, decode_tokens,
                             prompt)
        # decode_lora as `metrale bench --json` has it ({"1": {B: tps}}); decode_lora_base:
        # the same tool's base-model figures in the same process (the ratio's denominator).
        out["decode_lora"] = res["decode_lora"]
        out["decode_lora_base"] = res["decode"]
        out["lora"] = {"adapter": str(lora), "gguf": str(lora_gguf), "command": res["command"]}
    out["weight_bytes"] = gguf_summary(gguf)["per_step"]
    kv = kv_cache_per_token(gguf, kv_type or KV_CACHE_TYPE[0])
    if kv:
        out["kv_bytes_per_token"] = kv["bytes"]
        out["kv_cache"] = kv
    out["kv_type"] = kv_type or KV_CACHE_TYPE[0]
    out["depth"] = depth
    out["commands"] = commands + ([out["lora"]["command"]] if lora else [])
    out["format"] = outtype
    out["gguf"] = str(gguf)
    out["llama_cpp_python"] = VERSION
    out["llama_cpp_commit"] = LLAMA_CPP_COMMIT
    return out


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, found {text!r}")
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, found {text!r}")
    return values


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, found {text!r}")
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, found {text!r}")
    return v


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="HF checkpoint directory")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prefill", type=int_list, default=[128, 512])
    ap.add_argument("--batch", type=int_list, default=[1, 4, 16])
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--depth", type=positive_int, default=None,
                    help="tokens of context before the timed decode steps: llama-bench -d N "
                         "(batch 1), llama-batched-bench -npp N (wider); prefill stays from "
                         "an empty cache (default: tg from an empty cache, the batched widths "
                         "after 16 tokens)")
    ap.add_argument("--kv-type", choices=list(KV_TYPES), default=None,
                    help="KV cache type, -ctk / -ctv on every llama-bench / llama-batched-bench "
                         f"call (default: not passed, llama.cpp's {KV_CACHE_TYPE[0]})")
    ap.add_argument("--outtype", choices=list(FORMATS), default="bf16",
                    help="weight format (FORMATS): bf16, or llama-quantize's q4_0 / q8_0 "
                         "(and variants) of the bf16 GGUF; q8_0-convert: the converter's q8_0")
    ap.add_argument("--summary", action="store_true",
                    help="with --prepare-only: print the GGUF's per-tensor summary as JSON")
    ap.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--lora", type=Path, default=None,
                    help="a PEFT LoRA adapter directory: also time decode at every --batch "
                         "width without and with it (converted by convert_lora_to_gguf.py, "
                         "bf16; timed by tools/bench/llama_lora_bench.cpp)")
    ap.add_argument("--prepare-only", action="store_true",
                    help="download, build and convert, then exit")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.prepare_only:
        src = ensure_source(args.cache_dir)
        ensure_build(args.cache_dir, src)
        gguf = ensure_gguf(args.cache_dir, src, args.model, args.outtype)
        if args.lora:
            ensure_lora_gguf(args.cache_dir, src, args.model, args.lora)
            ensure_lora_bench_tool(args.cache_dir, src)
        print(json.dumps(gguf_summary(gguf), indent=2) if args.summary else gguf)
        return
    out = bench(args.model, args.threads, args.prefill, args.batch, args.decode_tokens,
                args.outtype, args.cache_dir, lora=args.lora, depth=args.depth,
                kv_type=args.kv_type)
    print(json.dumps(out) if args.json else json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
