#!/usr/bin/env bash
# The expert-offload measurements of docs/offload.md: configs/small.json trained briefly on the KJV
# (configs/train-offload.json: 100 steps of 16 x 256) twice, with quantile balancing and with none,
# quantized to int8, then decoded from real text (the tail of the KJV) with every expert resident
# and with caches of 100%, 50%, 25% and 2x the active experts (8 of 128 per layer), LRU and
# frequency-aware, warm and cold page cache, with and without prefetch, on 2 compute threads and on
# 1 (which leaves the prefetch thread a core). Prints a markdown table; ratios are to the resident
# model at the same thread count, measured in the same script.
#   bash scripts/offload.sh [BUILD_DIR] [OUT_DIR]
# Needs data/kjv.txt (scripts/prepare-kjv.sh) and jq.
set -euo pipefail
build=${1:-build}
out=${2:-runs/offload}
hyla="$build/hyla"
[[ -f data/kjv.txt ]] || "$hyla" data fetch kjv --out data/kjv.txt
[[ -f data/kjv-tokenizer-8192.json ]] ||
  "$hyla" tokenizer train --input data/kjv.txt --vocab-size 8192 --out data/kjv-tokenizer-8192.json
[[ -f data/kjv-8192/meta.json ]] ||
  "$hyla" data prepare --tokenizer data/kjv-tokenizer-8192.json --input data/kjv.txt --out data/kjv-8192
mkdir -p "$out"
tail -c 30000 data/kjv.txt > "$out/text.txt"

for balancing in quantile none; do
  if [[ ! -f "$out/$balancing-int8/model.safetensors" ]]; then
    sed "s/\"balancing\": \"quantile\"/\"balancing\": \"$balancing\"/" configs/small.json > "$out/small-$balancing.json"
    rm -rf "${out:?}/$balancing"
    echo "== training small.json, balancing $balancing" >&2
    "$hyla" train --config "$out/small-$balancing.json" --train configs/train-offload.json --data data/kjv-8192 \
      --out "$out/$balancing" --quiet >&2
    "$hyla" quantize --model "$out/$balancing/model" --out "$out/$balancing-int8" >&2
  fi
done

# 2 x the active experts: 8 slots per MoE layer x 7 layers x 221,184 bytes per packed int8 expert.
two_x_active=$((8 * 7 * 221184))
results="$out/results.jsonl"
: > "$results"
run() {  # label, then extra bench flags
  local model=$1 label=$2; shift 2
  echo "== $model $label" >&2
  "$hyla" bench -m "$out/$model-int8" --text "$out/text.txt" -p 64 -n 128 -r 5 --json "$@" 2>/dev/null |
    jq -c --arg model "$model" --arg run "$label" '.[] | select(.test == "tg128") + {balancing: $model, run: $run}' \
      >> "$results"
}
for model in quantile none; do
  run "$model" "resident, 2 threads"
  for memory in 100% 50% 25% "$two_x_active"; do
    run "$model" "lru, warm, prefetch off" --expert-memory "$memory" --expert-cache lru --expert-prefetch off
    run "$model" "frequency, warm, prefetch off" --expert-memory "$memory" --expert-cache frequency --expert-prefetch off
    run "$model" "lru, cold, prefetch off" --expert-memory "$memory" --expert-prefetch off --cold-page-cache
    run "$model" "lru, warm, prefetch on" --expert-memory "$memory" --expert-prefetch on
  done
  # One compute thread leaves the I/O thread a core of its own.
  run "$model" "resident, 1 thread" -t 1
  run "$model" "lru, warm, prefetch off, 1 thread" -t 1 --expert-memory 25% --expert-prefetch off
  run "$model" "lru, warm, prefetch on, 1 thread" -t 1 --expert-memory 25% --expert-prefetch on
  run "$model" "resident, 2 threads, again"  # the baseline is the mean of both: the box drifts
done

echo "| balancing | experts resident | policy, page cache, prefetch | tg128 t/s | vs resident | hit rate | prefetch precision / recall | MB read / token | stall ms / token |"
echo "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
jq -rs '
  (map(select(.run | startswith("resident"))) | group_by("\(.balancing)/\(.threads)")
   | map({key: "\(.[0].balancing)/\(.[0].threads)", value: (map(.tokens_per_s) | add / length)}) | from_entries) as $base
  | .[]
  | ($base["\(.balancing)/\(.threads)"]) as $b
  | if (.run | startswith("resident")) then
      "| \(.balancing) | all (no offload) | \(.run) | \(.tokens_per_s | round) ± \(.std | round) | 1.00 | | | | |"
    else
      "| \(.balancing) | \(.expert_slots_per_layer) of 128 per layer (\(.expert_memory_bytes / 1048576 * 10 | round / 10) MiB) | \(.run) | \(.tokens_per_s | round) ± \(.std | round) | \(.tokens_per_s / $b * 100 | round / 100) | \(.expert_hit_rate * 1000 | round / 10)% | \(.prefetch_precision * 100 | round)% / \(.prefetch_recall * 100 | round)% | \(.expert_bytes_per_token / 1e4 | round / 100) | \(.expert_stall_ms_per_token * 1000 | round / 1000) |"
    end' "$results"
