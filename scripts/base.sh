#!/usr/bin/env bash
# A base model that can copy (issue 49; docs/agent.md): configs/agent.json trained on KJV text with
# dense pass-key samples mixed into every step (configs/train-base.json: 15 pass-key rows per text
# row at 256 tokens, constant lr 2e-3 after warmup), the regime in which these small models learn
# to find a key's earlier occurrence and repeat what follows it. Then it measures what it claims:
# pass-key accuracy at 256 tokens over every depth (100 samples per depth), and fails unless it
# reaches 90%. The model goes to runs/base/model; the other recipes start from it with --init.
# Resumable: rerun it after an interruption and training continues from the last checkpoint.
# SEED (default 1) seeds the initial weights and the data order; OUT (default runs/base) is where
# the run and the model go (scripts/agent.sh gives each recipe seed its own).
#   bash scripts/base.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
hyla="$build/hyla"
out=${OUT:-runs/base}
seed=${SEED:-1}
mkdir -p "$out"
bash scripts/prepare-kjv.sh "$build"
jq ".seed = $seed" configs/train-base.json > "$out/train-base.json"

start=$(date +%s)
resume=--overwrite
[[ -d "$out/run/checkpoints" ]] && resume=--resume
[[ -f "$out/run/model/config.json" ]] && resume=done
if [[ $resume != done ]]; then
  "$hyla" train --config configs/agent.json --train "$out/train-base.json" --data data/kjv --out "$out/run" $resume
fi
trained=$(date +%s)

"$hyla" eval longctx -m "$out/run/model" --tasks passkey --lengths 256 --samples 100 --train-text data/kjv.txt \
  --out "$out/passkey-256.json" --report "$out/passkey-256.html"
cells='[.cells[] | select(.task == "passkey" and .length == 256)]'
accuracy=$(jq "$cells | (map(.correct) | add) / (map(.samples) | add)" "$out/passkey-256.json")
worst=$(jq "$cells | map(.accuracy) | min" "$out/passkey-256.json")
done=$(date +%s)
echo "base: training $(( (trained - start) / 60 )) min, evaluation $(( (done - trained) / 60 )) min;" \
  "pass keys at 256 tokens: $accuracy pooled over 5 depths of 100 samples, $worst at the worst depth"
awk -v a="$accuracy" 'BEGIN { exit !(a >= 0.9) }' || { echo "below 90%: no copying yet (train longer)" >&2; exit 1; }
rm -rf "$out/model"
cp -r "$out/run/model" "$out/model"
echo "model in $out/model"
