#!/usr/bin/env bash
# Interleaved before/after timings of two builds, for changes that must not cost speed: the
# training step (`hyla bench train`), prefill and decode (`hyla bench --model`), and the MLA and MoE
# layer benchmarks, on an otherwise idle machine. Round r runs both builds, A first in odd rounds
# and B first in even ones (A B B A ...), so a drift of the machine's speed over the script falls
# on both alike. Each test's B/A ratio is taken within each round (the pair ran minutes apart);
# the table gives the medians per build, the geometric mean of the per-round ratios and its 95%
# interval (t over the rounds' log ratios; > 1: B is faster, for rates).
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
  if ((r % 2)); then order="A B"; else order="B A"; fi
  for tag in $order; do
    if [[ $tag == A ]]; then build=$a; else build=$b; fi
    run "$build" "$tag" | jq -c --argjson round "$r" '. + {round: $round}' >>"$work/rows"
  done
done
echo "| test | A (median) | B (median) | B/A per round: geometric mean [95% interval] | rounds |"
echo "|---|---:|---:|---:|---:|"
# t quantiles (0.975) for 1..10 degrees of freedom; more rounds use 10's (slightly wide).
jq -rs '
  def median: sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  def t975: [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228][([. , 10] | min) - 1];
  def r3: . * 1000 | round / 1000;
  group_by(.test)[] | . as $rows | (map(select(.tag == "A").value) | median) as $a |
  (map(select(.tag == "B").value) | median) as $b |
  [group_by(.round)[] | select(length == 2) | (map(select(.tag == "B"))[0].value / map(select(.tag == "A"))[0].value | log)] as $logs |
  ($logs | length) as $n | ($logs | add / $n) as $mean |
  (if $n > 1 then (($logs | map(. - $mean | . * .) | add) / ($n - 1) | sqrt) * (($n - 1) | t975) / ($n | sqrt) else 0 end) as $half |
  "| \($rows[0].test) | \($a * 100 | round / 100) | \($b * 100 | round / 100) | \($mean | exp | r3) [\($mean - $half | exp | r3), \($mean + $half | exp | r3)] | \($n) |"
' "$work/rows"
