#!/usr/bin/env bash
# The README's first command: install what is missing, build the release tool, and run the
# main job on the checkpoint that ships in the repository (models/demo, a tiny Qwen3 trained
# on the King James Bible): generate text from a prompt. Extra arguments go to `generate`
# (e.g. --prompt "In the beginning" -n 64 --temperature 0.8 --seed 3).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/bootstrap.sh
cmake --preset release >/dev/null
cmake --build --preset release --target metrale
bin=./build/release/src/metrale
"$bin" inspect models/demo | head -n 8
echo
if [[ $# -eq 0 ]]; then set -- --prompt "And God said" --max-tokens 48; fi
exec "$bin" generate --model models/demo "$@"
