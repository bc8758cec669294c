#!/usr/bin/env bash
# Tokenizer encode MB/s and vision preprocessing images/s, metrale beside the HF peers
# (tokenizers; transformers' Qwen2-VL image processor), in one run on the same inputs and
# machine, one thread each. Needs the Python packages of tools/ (tokenizers, transformers,
# torch, torchvision, pillow).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
cmake --preset release >/dev/null
cmake --build --preset release --target tokenizer_bench vision_bench >/dev/null
echo "== tokenizer encode: metrale (bench/tokenizer_bench.cc) =="
./build/release/bench/tokenizer_bench --benchmark_counters_tabular=true
echo "== tokenizer encode: HF tokenizers, 1 thread (tools/bench/tokenizer_peer.py) =="
RAYON_NUM_THREADS=1 python3 tools/bench/tokenizer_peer.py
echo "== Qwen2-VL image preprocessing: metrale (bench/vision_bench.cc) =="
./build/release/bench/vision_bench --benchmark_counters_tabular=true
echo "== Qwen2-VL image preprocessing: transformers, 1 thread (tools/bench/vision_peer.py) =="
python3 tools/bench/vision_peer.py
