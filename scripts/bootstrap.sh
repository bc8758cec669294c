#!/usr/bin/env bash
# Installs the Debian 12 packages listed in scripts/debian-packages.txt that are missing, and
# fetches the pinned xgrammar sources (scripts/fetch-xgrammar.sh; structured outputs). Quick (no
# apt-get, no network) when everything is already there. Without xgrammar the build goes on
# without structured outputs, unless METRALE_REQUIRE_XGRAMMAR=1 (scripts/test.sh, hence CI).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if ! bash "$here/fetch-xgrammar.sh"; then
  if [[ "${METRALE_REQUIRE_XGRAMMAR:-0}" == 1 ]]; then
    echo "metrale: xgrammar is required here (METRALE_REQUIRE_XGRAMMAR=1)" >&2
    exit 1
  fi
  echo "metrale: building without structured outputs (no xgrammar)" >&2
fi
mapfile -t wanted < <(grep -vE '^\s*(#|$)' "$here/debian-packages.txt")
missing=()
for pkg in "${wanted[@]}"; do
  status="$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)"
  [[ "$status" == "install ok installed" ]] || missing+=("$pkg")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
echo "metrale: installing missing Debian packages: ${missing[*]}"
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  command -v sudo >/dev/null || { echo "metrale: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
