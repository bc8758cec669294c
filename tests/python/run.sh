#!/usr/bin/env bash
# ctest's runner for one Python test file: uses the venv scripts/test.sh makes (build/venv, or
# $METRALE_VENV); exits 77 (ctest: skipped) when there is none, saying how to make it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${METRALE_VENV:-$root/build/venv}"
if ! "$venv/bin/python" -c "import openai" 2>/dev/null; then
  echo "skipped: no Python venv with the openai client at $venv (scripts/test.sh makes it:" \
    "python3 -m venv $venv && $venv/bin/pip install -r tests/python/requirements.txt)"
  exit 77
fi
exec "$venv/bin/python" "$@"
