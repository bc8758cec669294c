#!/usr/bin/env bash
# Builds the release tool and serves models/demo as an OpenAI-compatible API on
# http://127.0.0.1:8080/v1 (the demo ships no chat template, so a real one from the tests is
# given). Extra arguments go to `metrale serve` (e.g. --port 9000 --api-key sk-local).
# Ctrl-C stops it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/bootstrap.sh
cmake --preset release >/dev/null
cmake --build --preset release --target metrale
exec ./build/release/src/metrale serve --model models/demo \
  --chat-template tests/data/chat_templates/Qwen3-Coder.jinja "$@"
