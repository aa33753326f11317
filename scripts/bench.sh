#!/usr/bin/env bash
# Runs every benchmark program one after another (never two at once: the figures would be worthless).
set -euo pipefail
build=${1:-build}
lscpu | grep -E "Model name|^CPU\(s\)"
for b in "$build"/bench_*; do
  echo "== $b"
  "$b"
done
