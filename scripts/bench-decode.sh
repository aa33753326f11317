#!/usr/bin/env bash
# Batch-1 decode against the cache-aware roofline, thread scaling, and decode beside a CPU-bound
# process (issue 21). One script, so that every ratio comes from one run on one machine:
#   1. `hyla bench --model` tg128 at depth 0 and 8192, 1 and 2 threads, bf16 and int8, on
#      configs/small.json and on configs/bench-dram.json (weights several times any L3);
#   2. the same small.json decode with one `yes > /dev/null` beside it: the default (adaptive)
#      thread count against --threads 1 and a forced --threads <cores>, and the default idle;
#   3. with BASE=DIR (a build of an earlier commit), the same idle and contended rows of BASE's
#      hyla, interleaved with this build's, for before/after ratios.
#
#   bash scripts/bench-decode.sh BUILD [rounds=3]      # BUILD holds hyla
set -euo pipefail
build=$1 rounds=${2:-3}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
cores=$(nproc)
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $cores cores; work in $work" >&2

model() {  # config name dtype -> model directory (made once)
  local config=$1 dir="$work/$1-bf16"
  [[ -f "$dir/model.safetensors" ]] || "$build/hyla" init --config "$repo/configs/$config.json" --out "$dir" \
    --weight-dtype bf16 >/dev/null
  if [[ $2 == int8 ]]; then
    [[ -f "$work/$config-int8/model.safetensors" ]] || "$build/hyla" quantize --model "$dir" --out "$work/$config-int8" >/dev/null
    dir="$work/$config-int8"
  fi
  echo "$dir"
}

rows() {  # tag hyla args... -> JSON rows tagged
  local tag=$1 hyla=$2
  shift 2
  "$hyla" bench "$@" --json 2>/dev/null | jq -c --arg tag "$tag" '.[] | select(.tokens_per_s != null) | . + {tag: $tag}'
}

beside_yes() {  # command... : runs it with one CPU-bound process beside it
  yes >/dev/null &
  local load=$!
  sleep 0.5  # the adaptive count samples the load every 0.25 s
  "$@" || { kill "$load"; return 1; }
  kill "$load"
  wait "$load" 2>/dev/null || true
}

out="$work/rows.jsonl"
: >"$out"
for config in small bench-dram; do
  for dtype in bf16 int8; do
    m=$(model "$config" "$dtype")
    echo "roofline: $config $dtype" >&2
    rows "roofline $config" "$build/hyla" --model "$m" -p 16 -n 128 -d 0,8192 -t 1,"$cores" -r "$rounds" >>"$out"
  done
done
binaries=("new:$build/hyla")
[[ -n ${BASE:-} ]] && binaries=("old:$BASE/hyla" "${binaries[@]}")
for dtype in bf16 int8; do
  m=$(model small "$dtype")
  for ((r = 1; r <= rounds; ++r)); do
    echo "contention: small $dtype round $r/$rounds" >&2
    for entry in "${binaries[@]}"; do
      name=${entry%%:*} hyla=${entry#*:}
      rows "$name idle default" "$hyla" --model "$m" -p 16 -n 128 -r 3 >>"$out"
      beside_yes rows "$name busy default" "$hyla" --model "$m" -p 16 -n 128 -r 3 >>"$out"
      beside_yes rows "$name busy forced" "$hyla" --model "$m" -p 16 -n 128 -r 3 -t "$cores" >>"$out"
      beside_yes rows "$name busy one" "$hyla" --model "$m" -p 16 -n 128 -r 3 -t 1 >>"$out"
    done
  done
done

echo "## Decode against the cache-aware roofline (median of $rounds repetitions' means)"
echo "| model | dtype | threads | test | t/s | roofline t/s | fraction | re-read MB at GB/s (tier) | routed MB at GB/s (tier) | DRAM GB/s |"
echo "|---|---|---:|---|---:|---:|---:|---|---|---:|"
jq -rs '
  def r1: . * 10 | round / 10;
  map(select(.tag | startswith("roofline")) | select(.test | startswith("tg")))[] |
  "| \(.tag | ltrimstr("roofline ")) | \(.dtype) | \(.threads) | \(.test) | \(.tokens_per_s | round) | \(.roofline_tokens_per_s | round) | \(.roofline_fraction * 100 | round)% | \(.reread_bytes / 1e6 | r1) at \(.reread_gbs | r1) (\(.reread_tier)) | \(.routed_bytes / 1e6 | r1) at \(.routed_gbs | r1) (\(.routed_tier)) | \(.dram_gbs | r1) |"
' "$out"
echo
echo "## Two threads over one (tg128, depth 0 and 8192)"
echo "| model | dtype | test | 1 thread t/s | $cores threads t/s | ratio |"
echo "|---|---|---|---:|---:|---:|"
jq -rs --argjson cores "$cores" '
  map(select(.tag | startswith("roofline")) | select(.test | startswith("tg"))) | group_by([.tag, .dtype, .test])[] |
  (map(select(.threads == 1))[0]) as $one | (map(select(.threads == $cores))[0]) as $many |
  "| \($one.tag | ltrimstr("roofline ")) | \($one.dtype) | \($one.test) | \($one.tokens_per_s | round) | \($many.tokens_per_s | round) | \($many.tokens_per_s / $one.tokens_per_s * 100 | round / 100) |"
' "$out"
echo
echo "## Beside one CPU-bound process (small.json tg128; medians over $rounds rounds)"
echo "| build | dtype | idle, default | busy, default | busy, --threads $cores | busy, --threads 1 | busy default / busy one |"
echo "|---|---|---:|---:|---:|---:|---:|"
jq -rs '
  def median: sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  map(select(.tag | startswith("roofline") | not) | select(.test == "tg128")) |
  map(. + {build: (.tag | split(" ")[0]), kind: (.tag | split(" ")[1:] | join(" "))}) | group_by([.build, .dtype])[] |
  . as $g | def m(k): ($g | map(select(.kind == k).tokens_per_s) | median);
  "| \($g[0].build) | \($g[0].dtype) | \(m("idle default") | round) | \(m("busy default") | round) | \(m("busy forced") | round) | \(m("busy one") | round) | \(m("busy default") / m("busy one") * 100 | round / 100) |"
' "$out"
