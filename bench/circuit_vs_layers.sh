#!/usr/bin/env bash
# Decode batch 1, the layer loop vs the circuit executor (fusion policy none and default), interleaved (docs/performance.md: "The
# circuit executor"). Usage: bench/circuit_vs_layers.sh CHECKPOINT_DIR [METRALE_BIN] [ROUNDS]
# Prints one line per run: round, threads, executor, fusion, the 1-minute load average at its start, and
# `metrale bench --json`'s object.
set -euo pipefail
ckpt="${1:?usage: bench/circuit_vs_layers.sh CHECKPOINT_DIR [METRALE_BIN] [ROUNDS]}"
bin="${2:-build/release/src/metrale}"
rounds="${3:-3}"
for round in $(seq 1 "$rounds"); do
  for t in 1 2; do
    for run in layers:none circuit:none circuit:default; do
      ex="${run%%:*}" fusion="${run##*:}"
      load=$(cut -d' ' -f1 /proc/loadavg)
      out=$("$bin" bench -m "$ckpt" -t "$t" --executor "$ex" --fusion "$fusion" --prefill 16 \
        --batch 1 --decode-tokens 32 --reps 3 --no-bandwidth --json 2>/dev/null)
      echo "round=$round threads=$t executor=$ex fusion=$fusion load=$load $out"
    done
  done
done
