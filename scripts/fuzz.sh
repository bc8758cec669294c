#!/usr/bin/env bash
# Runs every libFuzzer target (fuzz/, the `fuzz` preset: clang, ASan + UBSan) until it has done
# FUZZ_RUNS executions (default 1e6) or spent FUZZ_SECONDS (default 600) on it, whichever comes
# first, each from its committed seeds (copied into a scratch corpus) and dictionary, and prints
# one line per target: executions, seconds, whether 1e6 was reached, findings (crash / leak /
# timeout / oom artifacts, kept under $FUZZ_OUT, default build/fuzz-out). An input running past
# FUZZ_UNIT_TIMEOUT (default 60 s) is a finding; the first input also pays a target's one-time
# load (tokenizer_fuzz's Qwen3 tokenizer under ASan). Exit status 1 when any target found
# something. Not in CI (docs/reliability.md has the last run's figures).
#
#   scripts/fuzz.sh                        # every target
#   FUZZ_SECONDS=90 scripts/fuzz.sh tokenizer_fuzz tool_calls_fuzz
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
seconds="${FUZZ_SECONDS:-600}"
runs="${FUZZ_RUNS:-1000000}"
out="${FUZZ_OUT:-$root/build/fuzz-out}"
all=(safetensors_header_fuzz model_config_fuzz tokenizer_fuzz tokenizer_json_fuzz
     processor_config_fuzz quant_config_fuzz quant_tensors_fuzz peft_adapter_fuzz
     chat_template_fuzz openai_request_fuzz grammar_compile_fuzz tool_calls_fuzz vision_decode_fuzz)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")

# A UBSan report is a finding: stop at it (libFuzzer then keeps the input as a crash artifact)
# instead of printing it and going on.
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j"${FUZZ_BUILD_JOBS:-2}" --target "${targets[@]}"
mkdir -p "$out"

# seeds TARGET DIR: copies the target's committed seeds into DIR (the fuzz/README.md table).
seeds() {
  local t="$1" dir="$2" f
  case "$t" in
    safetensors_header_fuzz) cp tests/data/safetensors/interop.safetensors "$dir/" ;;
    model_config_fuzz)
      for f in tests/data/configs/*/config.json tests/data/fixtures/*/config.json; do
        cp "$f" "$dir/$(basename "$(dirname "$f")").json"
      done ;;
    tokenizer_fuzz) ;;
    processor_config_fuzz) cp tests/data/vision/reference/configs/*.json "$dir/" ;;
    quant_config_fuzz)
      for f in tests/data/fixtures/quant_*/config.json; do
        python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["quantization_config"]))' \
          "$f" >"$dir/$(basename "$(dirname "$f")").json"
      done ;;
    vision_decode_fuzz)
      find tests/data/vision/images -type f -size -256k -exec cp {} "$dir/" \; ;;
    *) cp -r "fuzz/corpus/$t/." "$dir/" ;;
  esac
}

dict_of() {
  case "$1" in
    safetensors_header_fuzz) echo tests/data/safetensors/header_fuzz.dict ;;
    model_config_fuzz | tokenizer_json_fuzz | processor_config_fuzz | quant_config_fuzz | \
      chat_template_fuzz | openai_request_fuzz | grammar_compile_fuzz | tool_calls_fuzz)
      echo "fuzz/${1%_fuzz}.dict" ;;
  esac
}

found=0
printf '%-24s %12s %8s %8s  %s\n' target executions seconds "1e6?" findings
for t in "${targets[@]}"; do
  corpus="$(mktemp -d)"
  seeds "$t" "$corpus"
  dict="$(dict_of "$t")"
  log="$out/$t.log"
  rm -f "$out/$t"-crash-* "$out/$t"-leak-* "$out/$t"-timeout-* "$out/$t"-oom-*
  start=$(date +%s)
  set +e
  "build/fuzz/fuzz/$t" ${dict:+-dict=$dict} -runs="$runs" -max_total_time="$seconds" \
    -timeout="${FUZZ_UNIT_TIMEOUT:-60}" -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$out/$t-" \
    "$corpus" >"$log" 2>&1
  rc=$?
  set -e
  elapsed=$(($(date +%s) - start))
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{print $2}' | tail -1 ||
    true)
  [ -n "$execs" ] || execs=$(grep -o '^#[0-9]*' "$log" | tr -d '#' | tail -1 || true)
  [ -n "$execs" ] || execs=0
  findings=$( (ls "$out/$t"-* 2>/dev/null || true) | (grep -v '\.log$' || true) |
    xargs -r -n1 basename | tr '\n' ' ')
  if [ "$rc" -ne 0 ] || [ -n "$findings" ]; then
    found=1
    findings="rc=$rc ${findings:-}(see $log)"
  fi
  reached=no
  [ "$execs" -ge 1000000 ] && reached=yes
  printf '%-24s %12s %8s %8s  %s\n' "$t" "$execs" "$elapsed" "$reached" "${findings:-none}"
  rm -rf "$corpus"
done
exit "$found"
