#!/usr/bin/env bash
# Interleaved before/after timings of two builds, for changes that must not cost speed: the
# training step (`hyla bench train`), prefill and decode (`hyla bench --model`), and the MLA and MoE
# layer benchmarks. Rounds alternate A, B, A, B... in one script on an otherwise idle machine; the
# table gives each test's median per build and the ratio B/A (> 1: B is faster, for rates).
#
#   bash scripts/bench-ab.sh BUILD_A BUILD_B [rounds=2]    # each holds hyla, bench_mla, bench_moe
set -euo pipefail
a=$1 b=$2 rounds=${3:-2}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# configs/small.json, freshly initialised, with a BPE trained on the spec: the weights' values do
# not change the timings.
"$b/hyla" tokenizer train --input "$repo/docs/SPEC.md" --vocab-size 1024 --out "$work/tok.json" >/dev/null 2>&1
"$b/hyla" init --config "$repo/configs/small.json" --out "$work/small" --weight-dtype bf16 --tokenizer "$work/tok.json" >/dev/null

run() {  # build round
  local build=$1 tag=$2
  "$build/hyla" bench train --config "$repo/configs/small.json" --shapes 8x512 --dtype bf16 --steps 3 --json 2>/dev/null |
    jq -c --arg tag "$tag" '.[] | {tag: $tag, test: ("train " + .shape), value: .tokens_per_s}'
  "$build/hyla" bench --model "$work/small" -p 512 -n 128 -t 2 -b 1,4 -r 3 --json 2>/dev/null |
    jq -c --arg tag "$tag" '.[] | select(.test != null and .tokens_per_s != null) |
      {tag: $tag, test: ("model " + .test), value: .tokens_per_s}'
  for bench in bench_mla bench_moe; do
    "$build/$bench" --benchmark_filter='decode_layer/seqs(1|16)/depth8192|train_8x512_bf16/fwd\+bwd|bf16/moe_4096' \
      --benchmark_out="$work/$bench.json" --benchmark_out_format=json >/dev/null 2>&1
    jq -c --arg tag "$tag" --arg b "$bench" '.benchmarks[] |
      {tag: $tag, test: ($b + " " + .name + " (runs/s)"),
       value: (1 / (.real_time * ({"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1}[.time_unit])))}' "$work/$bench.json"
  done
}

for ((r = 1; r <= rounds; ++r)); do
  echo "round $r/$rounds" >&2
  run "$a" A >>"$work/rows"
  run "$b" B >>"$work/rows"
done
echo "| test | A (median) | B (median) | B/A |"
echo "|---|---:|---:|---:|"
jq -rs '
  def median: sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  group_by(.test)[] | . as $rows | (map(select(.tag == "A").value) | median) as $a |
  (map(select(.tag == "B").value) | median) as $b |
  "| \($rows[0].test) | \($a * 100 | round / 100) | \($b * 100 | round / 100) | \($b / $a * 1000 | round / 1000) |"
' "$work/rows"
