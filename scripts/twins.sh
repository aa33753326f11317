#!/usr/bin/env bash
# The reason for the hybrid (issue 50; docs/longctx.md, "Twins"): three models of ~4.1M parameters
# that differ only in their token mixers, trained from scratch on the same stages and tokens
# (configs/train-twins.json: 256 tokens, pass keys alone, then pass keys with multi-key and
# niah_multikey_2), then measured alike:
#   hybrid    configs/longctx-small.json, 3 KDA layers to 1 NoPE latent-attention layer;
#   all-mla   the same with every layer NoPE latent attention;
#   kda-only  the same with every layer KDA.
# For each: training tokens/s (the median step of each stage, from metrics.jsonl), accuracy by
# length 256 -> 2K (8x the trained length) on the held-out haystack with its intervals, prefill
# tokens/s at 8K and 64K, decode tokens/s at depths 8K and 64K, and the state a sequence holds at
# 8K and 64K (hyla plan). Writes runs/twins/{summary.json,summary.md,accuracy.svg}.
# Resumable: a finished step is skipped (training continues from its checkpoint). About 20 minutes
# a model on a 2-core box; run it alone, since its speeds are figures.
#   bash scripts/twins.sh [BUILD_DIR]       SAMPLES (default 20) per cell
set -euo pipefail
build=${1:-build}
hyla="$build/hyla"
out=runs/twins
samples=${SAMPLES:-20}
names=(hybrid all-mla kda-only)
mkdir -p data "$out"
bash scripts/prepare-kjv.sh "$build"
[[ -f data/devil.txt ]] || "$hyla" data fetch devil --out data/devil.txt

cp configs/longctx-small.json "$out/hybrid.json"
jq '.layer_types |= map("mla")' configs/longctx-small.json > "$out/all-mla.json"
jq '.layer_types |= map("kda")' configs/longctx-small.json > "$out/kda-only.json"

for name in "${names[@]}"; do
  run="$out/$name"
  if [[ ! -f "$run/model/config.json" ]]; then
    from=(--overwrite)
    [[ -d "$run/checkpoints" ]] && from=(--resume)
    echo "twins: training $name" >&2
    "$hyla" train --config "$out/$name.json" --train configs/train-twins.json --data data/kjv --out "$run" "${from[@]}"
  fi
  if [[ ! -f "$out/$name-eval.json" ]]; then
    "$hyla" eval longctx -m "$run/model" --seed 1 --train-text data/kjv.txt --haystack data/devil.txt \
      --tasks passkey,niah_multikey,niah_multikey_2 --lengths 256,512,1K,2K --depths 0,0.5,1 \
      --samples "$samples" --out "$out/$name-eval.json" --report "$out/$name-eval.html"
  fi
  if [[ ! -f "$out/$name-speed.json" ]]; then
    echo "twins: $name prefill at 8K and 64K, decode at depths 8K and 64K" >&2
    { "$hyla" bench -m "$run/model" -p 8192,65536 -n 16 -r 2 --json
      "$hyla" bench -m "$run/model" -p 1 -n 128 -d 8192,65536 -r 5 --json | jq 'map(select(.test | startswith("tg")))'
    } | jq -s 'add' > "$out/$name-speed.tmp" && mv "$out/$name-speed.tmp" "$out/$name-speed.json"
  fi
done

# One summary: each model's figures, then a markdown table and the accuracy plot.
for name in "${names[@]}"; do
  jq -n --arg name "$name" \
    --slurpfile metrics <(jq -c 'select(.tokens_per_s)' "$out/$name/metrics.jsonl") \
    --slurpfile eval "$out/$name-eval.json" --slurpfile speed "$out/$name-speed.json" \
    --argjson state8k "$("$hyla" plan --config "$out/$name/model" --context 8192 --json | jq .sequence_state_bytes)" \
    --argjson state64k "$("$hyla" plan --config "$out/$name/model" --context 65536 --json | jq .sequence_state_bytes)" '
    def median: sort | .[length / 2 | floor];
    {model: $name, parameters: $speed[0][0].params, state_bytes_8k: $state8k, state_bytes_64k: $state64k,
     train_tokens_per_s: ($metrics | group_by(.stage) | map({stage: .[0].stage, median: (map(.tokens_per_s) | median)})),
     accuracy: ($eval[0].cells | group_by([.task, .length]) | map({task: .[0].task, length: .[0].length,
                 correct: (map(.correct) | add), samples: (map(.samples) | add),
                 worst_depth: (map(.accuracy) | min)})),
     no_context: ($eval[0].controls.no_context | map({task, accuracy})),
     speed: ($speed[0] | map({test, tokens_per_s, roofline_fraction}))}'
done | jq -s '.' > "$out/summary.json"

jq -r '
  def pct: . * 100 | round | tostring + "%";
  def wilson($k; $n): ($k / $n) as $p | 1.959964 as $z | ($z * $z / $n) as $z2 |
    [(($p + $z2 / 2 - $z * (($p * (1 - $p) / $n + $z2 / 4 / $n) | sqrt)) / (1 + $z2)),
     (($p + $z2 / 2 + $z * (($p * (1 - $p) / $n + $z2 / 4 / $n) | sqrt)) / (1 + $z2))];
  (.[0].accuracy | map(.length) | unique) as $lengths |
  "| model | task | " + ($lengths | map(tostring) | join(" | ")) + " |",
  "|---|---|" + ($lengths | map("---:") | join("|")) + "|",
  (.[] | . as $m | ($m.accuracy | map(.task) | unique[]) as $task |
    "| \($m.model) | \($task) | " + ([$m.accuracy[] | select(.task == $task)] | sort_by(.length) |
      map(wilson(.correct; .samples) as $ci | "\(.correct / .samples | pct) [\($ci[0] | pct)–\($ci[1] | pct)], worst \(.worst_depth | pct)") | join(" | ")) + " |"),
  "",
  "| model | parameters | train tokens/s (stage 1 / 2) | prefill 8K | prefill 64K | decode at 8K | decode at 64K | state at 8K | state at 64K |",
  "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
  (.[] | "| \(.model) | \(.parameters) | \(.train_tokens_per_s | map(.median | round | tostring) | join(" / ")) | " +
    ([.speed[] | select(.test == "pp8192" or .test == "pp65536") | .tokens_per_s | round | tostring] | join(" | ")) + " | " +
    ([.speed[] | select(.test | test("^tg128 @ d")) | "\(.tokens_per_s | round)" +
      (if .roofline_fraction then " (\(.roofline_fraction | pct) of its bound)" else "" end)] | join(" | ")) + " | " +
    "\(.state_bytes_8k / 1024 | round) KiB | \(.state_bytes_64k / 1024 | round) KiB |")
' "$out/summary.json" > "$out/summary.md"

# Accuracy against length (log2 axis), one line per model and task, pass key solid, multi-key dashed.
jq -r '.[] | .model as $m | .accuracy[] | "\($m) \(.task) \(.length) \(.correct / .samples)"' "$out/summary.json" |
awk -v W=640 -v H=380 '
  function lx(v) { return 70 + (log(v) - log(256)) / (log(2048) - log(256)) * (W - 250) }
  function ly(v) { return H - 50 - v * (H - 90) }
  { key = $1 " " $2; if (!(key in seen)) { seen[key] = 1; keys[++n] = key }
    pts[key] = pts[key] sprintf("%s%.1f,%.1f", pts[key] == "" ? "M" : " L", lx($3), ly($4)) }
  END {
    printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H
    printf "<text x=\"%d\" y=\"20\" text-anchor=\"middle\">accuracy against length, trained at 256 (held-out haystack)</text>\n", (W - 180) / 2 + 35
    printf "<line x1=\"70\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#000\"/><line x1=\"70\" y1=\"40\" x2=\"70\" y2=\"%d\" stroke=\"#000\"/>\n", H - 50, W - 180, H - 50, H - 50
    for (x = 256; x <= 2048; x *= 2) printf "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", lx(x), H - 32, x
    for (y = 0; y <= 1.001; y += 0.25)
      printf "<text x=\"64\" y=\"%.1f\" text-anchor=\"end\">%d%%</text><line x1=\"70\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", ly(y) + 4, y * 100, ly(y), W - 180, ly(y)
    printf "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">tokens</text>\n", (W - 180) / 2 + 35, H - 10
    color["hybrid"] = "#1f77b4"; color["all-mla"] = "#d62728"; color["kda-only"] = "#2ca02c"
    for (i = 1; i <= n; ++i) {
      split(keys[i], part, " ")
      dash = part[2] == "passkey" ? "" : (part[2] == "niah_multikey" ? " stroke-dasharray=\"6 3\"" : " stroke-dasharray=\"2 3\"")
      printf "<path d=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"%s/>\n", pts[keys[i]], color[part[1]], dash
      printf "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"%s/><text x=\"%d\" y=\"%d\">%s %s</text>\n", W - 170, 46 + 16 * i, W - 145, 46 + 16 * i, color[part[1]], dash, W - 140, 50 + 16 * i, part[1], part[2]
    }
    print "</svg>"
  }' > "$out/accuracy.svg"
cat "$out/summary.md"
echo "twins: wrote $out/summary.json, summary.md and accuracy.svg" >&2
