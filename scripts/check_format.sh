#!/usr/bin/env bash
# Fails when a tracked C++ file is not clang-formatted (the repo's .clang-format). Run by
# scripts/test.sh, so CI checks it; `bash scripts/check_format.sh --fix` formats in place.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fmt="$(command -v clang-format-14 || command -v clang-format || true)"
[[ -n "$fmt" ]] || { echo "metrale: clang-format not found (Debian package clang-format)" >&2; exit 1; }
mapfile -t files < <(git ls-files 'src/*.cc' 'src/*.h' 'tests/*.cc' 'tests/*.h' 'fuzz/*.cc' 'fuzz/*.h' \
  'bench/*.cc' 'bench/*.h')
if [[ "${1:-}" == "--fix" ]]; then
  "$fmt" -i --style=file "${files[@]}"
  exit 0
fi
if ! "$fmt" --dry-run --Werror --style=file "${files[@]}"; then
  echo "metrale: the files above are not clang-formatted; run: bash scripts/check_format.sh --fix" >&2
  exit 1
fi
echo "clang-format: ${#files[@]} files clean"
