#!/usr/bin/env bash
# A fuzz campaign over every libFuzzer target (fuzz/, the `fuzz` preset: clang, libFuzzer,
# ASan + UBSan halting at the first report, -O1). Not in CI; docs/reliability.md has the last
# campaign's command and figures. Run it at low priority beside other work:
#
#   nice -n 19 scripts/fuzz.sh                                   # every target
#   FUZZ_SECONDS=90 nice -n 19 scripts/fuzz.sh tokenizer_fuzz tool_calls_fuzz
#
# The corpus: each target fuzzes $FUZZ_OUT/corpus/<target> (FUZZ_OUT: build/fuzz-out), into which
# its committed seeds (fuzz/README.md) are copied at every run; libFuzzer adds the inputs that
# find new coverage, and the folder is kept, so running the script again continues the campaign.
# $FUZZ_OUT/<target>.count holds the campaign's total executions and seconds for that target;
# FUZZ_FRESH=1 starts it again (the named targets' corpora and counts are dropped).
#
#   FUZZ_RUNS     the campaign's goal per target, in executions (default 1000000): a run ends when
#                 the target's campaign total reaches it, and a target already there is skipped
#   FUZZ_SECONDS  the wall-clock budget of one target in one run (default 600), whichever of the
#                 two comes first
#   FUZZ_JOBS     libFuzzer processes per target (default 2, the two cores of the machine it was
#                 sized for): -jobs=N -workers=N, sharing the corpus (each reloads what the others
#                 add), each given an equal share of the executions left and the whole time budget
#   FUZZ_UNIT_TIMEOUT  seconds one input may run before it is a finding (default 60; the first
#                 input also pays a target's one-time load)
#
# Executions are counted from each worker's log, $FUZZ_OUT/logs/<target>/fuzz-<i>.log: libFuzzer
# prints stat::number_of_executed_units once per process when it exits (-print_final_stats=1,
# also after a crash, timeout, leak or OOM), so a run's count is the sum over its workers (a
# worker killed before printing it counts its last "#N" status line instead).
# Prints one line per target: this run's executions, seconds and executions/s, the campaign's
# total executions and seconds, whether that total reached 1e6, and the findings: crash / leak /
# timeout / oom artifacts under $FUZZ_OUT/artifacts/ (a UBSan report is a crash artifact; an
# input slower than 10 s is kept as slow-unit-* and counted, not a finding; a target's artifacts
# are cleared when it starts a run). Each line is also appended to
# $FUZZ_OUT/runs.tsv with the date. Exit status 1 when any target found something.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
seconds="${FUZZ_SECONDS:-600}"
goal="${FUZZ_RUNS:-1000000}"
jobs="${FUZZ_JOBS:-2}"
out="${FUZZ_OUT:-$root/build/fuzz-out}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
all=(safetensors_header_fuzz model_config_fuzz tokenizer_fuzz tokenizer_json_fuzz
     processor_config_fuzz quant_config_fuzz quant_tensors_fuzz peft_adapter_fuzz
     chat_template_fuzz openai_request_fuzz grammar_compile_fuzz tool_calls_fuzz vision_decode_fuzz)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")

# A UBSan report is a finding: stop at it (libFuzzer then keeps the input as a crash artifact).
# The preset also builds with -fno-sanitize-recover=undefined, so this holds for a binary run by
# hand too.
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}"
# The targets find their fixtures here (fuzz/fuzz_source.h), whatever the working directory.
export METRALE_SOURCE_DIR="$root"

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz -j"${FUZZ_BUILD_JOBS:-2}" --target "${targets[@]}"

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
    safetensors_header_fuzz) echo "$root/tests/data/safetensors/header_fuzz.dict" ;;
    model_config_fuzz | tokenizer_json_fuzz | processor_config_fuzz | quant_config_fuzz | \
      chat_template_fuzz | openai_request_fuzz | grammar_compile_fuzz | tool_calls_fuzz)
      echo "$root/fuzz/${1%_fuzz}.dict" ;;
  esac
}

# flags_of TARGET: libFuzzer flags of its own. -entropic=0 where it paid (docs/reliability.md):
# clang 14's libFuzzer keeps the entropic schedule's feature frequencies with a linear search of
# the 100 rarest features for every feature an input covers (later libFuzzers use a bitmap),
# which for these targets, each input covering thousands of features, took more time than the
# target (grammar_compile_fuzz: 54% of the samples). Executions in one process's first 6-10 s
# with it and without, at equal coverage: grammar_compile 2 759 / 7 806, chat_template 2 860 /
# 7 624, openai_request 7 572 / 18 016, tokenizer_json 3 787 / 7 551, model_config 4 932 /
# 7 541, quant_tensors 15 690 / 22 022, peft_adapter 9 030 / 13 994 (vision_decode: no gain).
# The schedule only weighs which corpus input is mutated next; what each input checks is the same.
# vision_decode_fuzz: -max_len=16384 (from 2026-12-06 09:45 UTC on; before, libFuzzer's default,
# the largest seed, 105 KB). Most of a large image's time is decoding its pixel rows, not
# parsing; 23 of the corpus's 1 581 inputs were larger, and libFuzzer reads only their first
# 16 KiB (a truncated image: the decoders' error paths). docs/reliability.md has the rates.
flags_of() {
  case "$1" in
    grammar_compile_fuzz | peft_adapter_fuzz | quant_tensors_fuzz | chat_template_fuzz | \
      openai_request_fuzz | tokenizer_json_fuzz | model_config_fuzz) echo "-entropic=0" ;;
    vision_decode_fuzz) echo "-max_len=16384" ;;
  esac
}

# count_of LOGDIR: the executions of every worker whose log is in LOGDIR, summed.
count_of() {
  local total=0 n log
  for log in "$1"/fuzz-*.log; do
    [ -f "$log" ] || continue
    n=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{print $2}' | tail -1 || true)
    [ -n "$n" ] || n=$(grep -o '^#[0-9]*' "$log" | tr -d '#' | tail -1 || true)
    total=$((total + ${n:-0}))
  done
  echo "$total"
}

found=0
mkdir -p "$out/corpus" "$out/logs" "$out/artifacts"
printf '%-24s %10s %6s %7s %12s %8s %5s  %s\n' target executions secs "exec/s" campaign_execs \
  camp_sec "1e6?" findings
for t in "${targets[@]}"; do
  corpus="$out/corpus/$t"
  logs="$out/logs/$t"
  count_file="$out/$t.count"
  if [ "${FUZZ_FRESH:-0}" = 1 ]; then
    rm -rf "$corpus" "$count_file"
  fi
  mkdir -p "$corpus"
  seeds "$t" "$corpus"
  read -r before before_s 2>/dev/null <"$count_file" || { before=0; before_s=0; }
  left=$((goal - before))
  execs=0
  elapsed=0
  findings=""
  rc=0
  if [ "$left" -gt 0 ]; then
    dict="$(dict_of "$t")"
    read -r -a extra <<<"$(flags_of "$t")"
    rm -rf "$logs"
    mkdir -p "$logs"
    rm -f "$out/artifacts/$t"-*
    per_job=$(((left + jobs - 1) / jobs))
    start=$(date +%s)
    set +e
    # -jobs writes each worker's log to fuzz-<i>.log in the working directory.
    (cd "$logs" && "$root/build/fuzz/fuzz/$t" -jobs="$jobs" -workers="$jobs" ${dict:+-dict=$dict} \
      ${extra[@]+"${extra[@]}"} -runs="$per_job" -max_total_time="$seconds" -timeout="${FUZZ_UNIT_TIMEOUT:-60}" \
      -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$out/artifacts/$t-" \
      "$corpus" >"$logs/driver.log" 2>&1)
    rc=$?
    set -e
    # The scratch folders of the targets that parse files (fuzz/fuzz_source.h), one per process.
    rm -rf /dev/shm/metrale-fuzz-"$t".* 2>/dev/null || true
    elapsed=$(($(date +%s) - start))
    execs=$(count_of "$logs")
    findings=$( (ls "$out/artifacts/$t"-{crash,leak,timeout,oom}-* 2>/dev/null || true) |
      xargs -r -n1 basename | tr '\n' ' ')
    if [ "$rc" -ne 0 ] || [ -n "$findings" ]; then
      found=1
      findings="rc=$rc ${findings:-}(see $logs)"
    fi
    # libFuzzer keeps an input slower than 10 s wall-clock as slow-unit-*: not a failure (on a
    # loaded machine it is mostly waiting for a core), listed so it can be timed alone.
    slow=$( (ls "$out/artifacts/$t"-slow-unit-* 2>/dev/null || true) | wc -l)
    [ "$slow" -eq 0 ] || findings="${findings:-none} ($slow slow-unit input(s) kept)"
    echo "$((before + execs)) $((before_s + elapsed))" >"$count_file"
  fi
  total=$((before + execs))
  total_s=$((before_s + elapsed))
  rate=0
  [ "$elapsed" -gt 0 ] && rate=$((execs / elapsed))
  reached=no
  [ "$total" -ge 1000000 ] && reached=yes
  line=$(printf '%-24s %10s %6s %7s %12s %8s %5s  %s' "$t" "$execs" "$elapsed" "$rate" "$total" \
    "$total_s" "$reached" "${findings:-none}")
  echo "$line"
  printf '%s\t%s\n' "$(date -u +%FT%TZ)" "$line" >>"$out/runs.tsv"
done
exit "$found"
