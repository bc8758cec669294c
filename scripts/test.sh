#!/usr/bin/env bash
# The README's second command: install what is missing, check the C++ formatting, build
# everything with warnings as errors, and run the whole test suite (heavy-labelled tests excluded; run them with
# `ctest --preset release -L heavy`).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/bootstrap.sh
bash scripts/check_format.sh
jobs="${METRALE_JOBS:-$(nproc)}"
cmake --preset ci
cmake --build --preset ci -j "$jobs"
ctest --preset ci -j "$jobs"
