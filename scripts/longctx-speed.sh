#!/usr/bin/env bash
# Prefill tokens/s against prompt length for the long-context hybrid (configs/longctx.json: 3 KDA
# layers to 1 NoPE latent-attention layer) and its all-latent-attention twin (the same shape, every
# layer latent attention), on one plot: KDA layers cost the same per token at any length, latent
# attention's per-token cost grows with the length. Then decode at depth, and the time to first
# token of a second turn over a long prompt, cold and from prompt-state snapshots.
#
#   bash scripts/longctx-speed.sh [BUILD] [LENGTHS] [DEPTH]
#
# Speed does not depend on what the weights learnt, so the models are freshly initialised. Writes
# runs/longctx-speed/{speed.json,prefill.svg}. Needs data/kjv-tokenizer.json (scripts/demo.sh's
# first steps) and jq. Lengths 1K to 64K with depth 64K took 33 minutes on a 2-core box; a
# length's cost grows with its square in the latent-attention layers.
set -euo pipefail
build=${1:-build}
lengths=${2:-1024,2048,4096,8192,16384,32768}
depth=${3:-32768}
hyla="$build/hyla"
out=runs/longctx-speed
mkdir -p "$out"
[[ -f data/kjv-tokenizer.json ]] || { echo "longctx-speed: data/kjv-tokenizer.json is missing; run bash scripts/prepare-kjv.sh" >&2; exit 1; }

jq '.layer_types |= map("mla")' configs/longctx.json > "$out/all-mla.json"
rows=()
for name in hybrid all-mla; do
  config=configs/longctx.json
  [[ $name == all-mla ]] && config="$out/all-mla.json"
  "$hyla" init --config "$config" --out "$out/$name" --seed 1 --tokenizer data/kjv-tokenizer.json >/dev/null
  echo "longctx-speed: $name prefill at $lengths, decode at depth $depth" >&2
  "$hyla" bench -m "$out/$name" -p "$lengths" -n 16 -r 1 --json \
    | jq --arg name "$name" 'map(. + {model: $name})' > "$out/$name-prefill.json"
  "$hyla" bench -m "$out/$name" -p 1 -n 16 -d "$depth" -r 2 --json \
    | jq --arg name "$name" 'map(select(.test | startswith("tg"))) | map(. + {model: $name})' > "$out/$name-decode.json"
  rows+=("$out/$name-prefill.json" "$out/$name-decode.json")
done
echo "longctx-speed: second turn over a $depth-token prompt, cold and from snapshots" >&2
"$hyla" bench -m "$out/hybrid" -p 64 -n 1 -r 2 --ttft-prefix "$depth" --json \
  | jq 'map(select(.test | startswith("ttft"))) | map(. + {model: "hybrid"})' > "$out/ttft.json"
jq -s 'add' "${rows[@]}" "$out/ttft.json" > "$out/speed.json"

# The plot: prefill tokens/s against length, both axes logarithmic.
jq -r '.[] | select(.test | test("^pp[0-9]+$")) | "\(.model) \(.test | ltrimstr("pp")) \(.tokens_per_s)"' "$out/speed.json" |
awk -v W=640 -v H=400 '
  function lx(v) { return 70 + (log(v) - log(xmin)) / (log(xmax) - log(xmin)) * (W - 100) }
  function ly(v) { return H - 50 - (log(v) - log(ymin)) / (log(ymax) - log(ymin)) * (H - 80) }
  { model[NR] = $1; len[NR] = $2; tps[NR] = $3
    if (xmin == "" || $2 < xmin) xmin = $2; if ($2 > xmax) xmax = $2
    if (ymin == "" || $3 < ymin) ymin = $3; if ($3 > ymax) ymax = $3 }
  END {
    ymin /= 1.5; ymax *= 1.5; if (xmax == xmin) xmax = xmin * 2
    printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H
    printf "<text x=\"%d\" y=\"20\" text-anchor=\"middle\">prefill tokens/s against prompt length (log-log)</text>\n", W / 2
    printf "<line x1=\"70\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#000\"/><line x1=\"70\" y1=\"30\" x2=\"70\" y2=\"%d\" stroke=\"#000\"/>\n", H - 50, W - 30, H - 50, H - 50
    for (x = xmin; x <= xmax * 1.01; x *= 2)
      printf "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%dK</text>\n", lx(x), H - 32, x / 1024
    for (y = 10; y <= ymax; y *= 10) if (y >= ymin)
      printf "<text x=\"64\" y=\"%.1f\" text-anchor=\"end\">%d</text><line x1=\"70\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", ly(y) + 4, y, ly(y), W - 30, ly(y)
    printf "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">prompt tokens</text>\n", W / 2, H - 10
    color["hybrid"] = "#1f77b4"; color["all-mla"] = "#d62728"
    n = split("hybrid all-mla", names, " ")
    for (k = 1; k <= n; ++k) {
      m = names[k]; path = ""
      for (i = 1; i <= NR; ++i) if (model[i] == m) {
        path = path sprintf("%s%.1f,%.1f", path == "" ? "M" : " L", lx(len[i]), ly(tps[i]))
        printf "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"><title>%s %d: %.0f tokens/s</title></circle>\n", lx(len[i]), ly(tps[i]), color[m], m, len[i], tps[i]
      }
      printf "<path d=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\"/>\n", path, color[m]
      printf "<text x=\"%d\" y=\"%d\" fill=\"%s\">%s</text>\n", W - 160, 40 + 16 * k, color[m], m == "hybrid" ? "hybrid (3 KDA : 1 MLA)" : "all MLA"
    }
    print "</svg>"
  }' > "$out/prefill.svg"

jq -r '.[] | "\(.model)\t\(.test)\t\(if .tokens_per_s then "\(.tokens_per_s | floor) tokens/s" + (if .roofline_fraction then ", \(.roofline_fraction * 100 | floor)% of the cache-aware bound" else "" end) else "\(.seconds * 1000 | floor) ms" + (if .snapshots then " (\(.snapshots) snapshots, \(.snapshot_bytes / 1048576 | floor) MiB)" else "" end) end)"' "$out/speed.json"
echo "longctx-speed: wrote $out/speed.json and $out/prefill.svg" >&2
