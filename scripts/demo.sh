#!/usr/bin/env bash
# The README's first command: install what is missing, build the release tool, and run the
# main job on the checkpoint that ships in the repository (models/demo).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/bootstrap.sh
cmake --preset release >/dev/null
cmake --build --preset release --target metrale
exec ./build/release/src/metrale inspect models/demo "$@"
