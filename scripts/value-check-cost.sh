#!/usr/bin/env bash
# What checking a model's values costs at load (issue 65): `hyla inspect` reports the seconds its
# value checks took over every tensor (model/weight_values.h: the pass every loading command makes,
# with the decoding to f32 of the tensors a model keeps in f32, which loading does anyway), set
# against reading the same file with cat, both with the file in the page cache.
#
#   bash scripts/value-check-cost.sh BUILD MODEL.gguf [MORE.gguf ...]
#
# One line per file: its bytes, cat's read in s and GB/s, the check in s and GB/s, and their ratio.
set -euo pipefail
build=$(cd "$1" && pwd)
shift
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
for model in "$@"; do
  bytes=$(stat -c %s "$model")
  cat "$model" >/dev/null  # into the page cache
  start=$(date +%s.%N)
  cat "$model" >/dev/null
  read_s=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
  check_s=$("$build/hyla" inspect "$model" | sed -n 's/.*values read and checked in \([0-9.]*\) s.*/\1/p')
  awk -v f="$(basename "$model")" -v b="$bytes" -v r="$read_s" -v c="$check_s" 'BEGIN {
    printf "%s: %.1f GB; cat %.2f s (%.1f GB/s); value check %.2f s (%.1f GB/s); check/read %.2f\n",
           f, b / 1e9, r, b / 1e9 / r, c, b / 1e9 / c, c / r }'
done
