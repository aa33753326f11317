#!/usr/bin/env bash
# The training studies of docs/studies.md: configs/nano.json (with the KJV tokenizer's 4096-token
# vocabulary) trained on the same tokens (configs/train-study.json: 800 steps of 16 × 256) with one
# setting changed at a time: MoE balancing (quantile, bias_sign, aux_loss, none), block attention
# residuals on/off, and the KDA gate (lower-bounded vs softplus). Prints the markdown tables.
#   bash scripts/studies.sh [BUILD_DIR] [OUT_DIR]
# Needs the demo's data (data/kjv, from `make demo` or scripts/prepare-kjv.sh) and jq.
set -euo pipefail
build=${1:-build}
out=${2:-runs/studies}
hyla="$build/hyla"
[[ -f data/kjv/meta.json ]] || { echo "studies: data/kjv is missing; run bash scripts/prepare-kjv.sh" >&2; exit 1; }
mkdir -p "$out"

base="$out/nano-4096.json"
sed 's/"vocab_size": 256/"vocab_size": 4096/' configs/nano.json > "$base"

variant() {  # name, then sed expressions applied to the base config
  local name=$1; shift
  local config="$out/$name.json"
  cp "$base" "$config"
  for expr in "$@"; do sed -i "$expr" "$config"; done
  if [[ ! -f "$out/$name/metrics.jsonl" ]] || ! grep -q '"step":800' "$out/$name/metrics.jsonl"; then
    rm -rf "${out:?}/$name"
    echo "== $name" >&2
    "$hyla" train --config "$config" --train configs/train-study.json --data data/kjv --out "$out/$name" --quiet >&2
  fi
}

# One row: final validation loss, the expert load (max/mean over experts, mean over MoE layers) and
# dead experts at the last step and averaged over the run, and the median tokens/s.
row() {
  local name=$1 label=$2
  jq -rs --arg title "$label" '
    def mean(f): (map(f) | add) / length;
    (map(select(.val_loss != null)) | last) as $eval
    | (last) as $last
    | (map(.tokens_per_s) | sort | .[length / 2 | floor]) as $tps
    | "| \($title) | \($eval.val_loss * 1000 | round / 1000) | \($last.moe | mean(.max_over_mean) * 100 | round / 100)"
      + " | \(map(.moe | mean(.max_over_mean)) | add / length * 100 | round / 100)"
      + " | \($last.moe | map(.dead) | add) | \($tps | round) |"' "$out/$name/metrics.jsonl"
}

variant quantile
variant bias_sign 's/"balancing": "quantile"/"balancing": "bias_sign"/'
variant aux_loss 's/"balancing": "quantile"/"balancing": "aux_loss"/' 's/"aux_loss_coef": 0.0/"aux_loss_coef": 0.01/'
variant none 's/"balancing": "quantile"/"balancing": "none"/'
variant no_attn_res '/"attn_res"/,/}/ s/"enabled": true/"enabled": false/'
variant softplus 's/"gate": "lower_bound"/"gate": "softplus"/'

header="| run | val loss | load max/mean (last) | load max/mean (run mean) | dead experts (last) | tokens/s |
| --- | ---: | ---: | ---: | ---: | ---: |"
echo "### MoE balancing"
echo "$header"
row quantile "quantile (default)"
row bias_sign "bias_sign"
row aux_loss "aux_loss (coef 0.01)"
row none "none"
echo
echo "### Block attention residuals"
echo "$header"
row quantile "AttnRes on (block 2)"
row no_attn_res "AttnRes off (pre-norm residual)"
echo
echo "### KDA gate"
echo "$header"
row quantile "lower-bounded (−5)"
row softplus "softplus"
