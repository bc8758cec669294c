#!/usr/bin/env bash
# Makes build/router-venv with the router pinned in tests/python/router-requirements.txt
# (vllm-router, version and sha256 fixed, no dependencies); reinstalls only when that file
# changes. Prints the venv's python. Exits non-zero, saying why, where the wheel cannot be had
# (no network, not x86_64 Linux): the router test then skips and scripts/cluster.sh stops.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
venv="${METRALE_ROUTER_VENV:-build/router-venv}"
req=tests/python/router-requirements.txt
if ! cmp -s "$req" "$venv/requirements.txt" 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv"
  if ! "$venv/bin/pip" install --quiet --disable-pip-version-check --no-deps --require-hashes \
    -r "$req" >&2; then
    rm -rf "$venv"
    echo "metrale: could not install the router from $req (see above)" >&2
    exit 1
  fi
  cp "$req" "$venv/requirements.txt"
fi
echo "$venv/bin/python"
