#!/usr/bin/env bash
# Fetches xgrammar's C++ core (the grammar engine of src/grammar, docs/dependencies.md) from its
# PyPI sdist, pinned by version and sha256, into build/third_party/xgrammar-<version> (git-ignored;
# nothing fetched is committed). Quick (no network) when that folder is already there. CMake builds
# the sources it finds there; without them metrale builds without structured outputs (the server
# answers constrained requests with a 400 saying so, and the grammar tests skip naming why).
# Exits non-zero, saying why, when the sdist cannot be had or its checksum differs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
version=0.2.9
sha256=87b466bca2475e29bb0323abc62c6c33cbcbcff47e5fb800a3e2099ac9620b90
url="https://files.pythonhosted.org/packages/3a/2f/5bf8e8fa6619cff534932f79b0abc81a417d354bc5093252c1a6081d0a93/xgrammar-${version}.tar.gz"
dest=build/third_party
dir="$dest/xgrammar-$version"
if [[ -f "$dir/.metrale-verified-2" ]]; then
  exit 0
fi
mkdir -p "$dest"
tarball="$dest/xgrammar-$version.tar.gz"
if [[ ! -f "$tarball" ]] || ! echo "$sha256  $tarball" | sha256sum -c --status; then
  rm -f "$tarball"
  if ! curl -sSfL --retry 3 -o "$tarball.part" "$url"; then
    rm -f "$tarball.part"
    echo "metrale: could not download $url (structured outputs will be unavailable)" >&2
    exit 1
  fi
  mv "$tarball.part" "$tarball"
fi
if ! echo "$sha256  $tarball" | sha256sum -c --status; then
  echo "metrale: $tarball: sha256 differs from the pinned $sha256" >&2
  rm -f "$tarball"
  exit 1
fi
rm -rf "$dir"
tar -xzf "$tarball" -C "$dest"
# One fix on top (docs/dependencies.md): 0.2.9's JSON strings with minLength / maxLength let raw
# control bytes (U+0000-U+001F) in, which no JSON parser accepts.
python3 - "$dir/cpp/json_schema_converter.cc" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
old = """builder_.AddCharacterClass({{'"', '"'}, {'\\\\', '\\\\'}, {'\\r', '\\r'}, {'\\n', '\\n'}}, true);
      int32_t body = Repeat("""
new = """builder_.AddCharacterClass({{0, 0x1f}, {'"', '"'}, {'\\\\', '\\\\'}}, true);
      int32_t body = Repeat("""
if s.count(old) != 1:
    sys.exit("metrale: xgrammar's bounded-string rule is not where fetch-xgrammar.sh expects it")
open(p, "w").write(s.replace(old, new))
PY
# And a second (found by fuzz/grammar_compile_fuzz.cc): xgrammar writes a codepoint up to U+00FF
# that needs escaping as \xNN in the EBNF it generates (from a regex, a schema), but its EBNF lexer
# reads \x followed by every hex digit there is, so a hex digit right after it (the regex
# [\u00e9a]: EBNF [\xe9a]) became part of the escape: a wrong codepoint (U+0E9A), or past 8
# digits a signed int overflow. Written as \u00NN (exactly four digits) it reads back as written.
python3 - "$dir/cpp/support/encoding.h" <<'PY'
import sys
p = sys.argv[1]
s = open(p).read()
old = """  char prefix = codepoint <= 0xFF ? 'x' : codepoint <= 0xFFFF ? 'u' : 'U';
  int width = codepoint <= 0xFF ? 2 : codepoint <= 0xFFFF ? 4 : 8;"""
new = """  char prefix = codepoint <= 0xFFFF ? 'u' : 'U';
  int width = codepoint <= 0xFFFF ? 4 : 8;"""
if s.count(old) != 1:
    sys.exit("metrale: xgrammar's EscapeString is not where fetch-xgrammar.sh expects it")
open(p, "w").write(s.replace(old, new))
PY
rm -f "$dir/.metrale-verified-1"
touch "$dir/.metrale-verified-2"
