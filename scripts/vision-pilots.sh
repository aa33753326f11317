#!/usr/bin/env bash
# What holds Fashion-MNIST near 89% (docs/vision.md, "Why Fashion-MNIST stops near 89%"): 1,000-step
# pilots trained on KJV plus Fashion-MNIST only (configs/train-vision.json with tokens 1,024,000
# and no images.weights, seed 1), one after the other, each changing one thing against the
# recipe's model: finer patches, a wider model, augmented training images, three times the steps
# (with and without augmentation).
# Each is evaluated on all 10,000 test images (with the shuffled-patch and blank controls) and on
# the first 5,000 training images, so the table shows whether a variant under- or overfits.
#   bash scripts/vision-pilots.sh [BUILD_DIR]
# Needs jq. About two hours on two Zen 5 cores. Runs in runs/vision-pilots/.
set -euo pipefail
build=${1:-build}
hyla="$build/hyla"
out=runs/vision-pilots
mkdir -p data "$out"
bash scripts/prepare-kjv.sh "$build"
[[ -f data/fmnist/meta.json ]] || "$hyla" data prepare-images --dataset fashion-mnist --out data/fmnist

train1000=$(jq -c '.curriculum[0].tokens = 1024000 | del(.images.weights)' configs/train-vision.json)
echo "$train1000" > "$out/train-1000.json"
echo "$train1000" | jq -c '.curriculum[0].tokens = 3072000' > "$out/train-3000.json"
echo "$train1000" | jq -c '.images.augment = [{"flip": 0.5, "shift": 2}]' > "$out/train-1000-augmented.json"
jq -c '.images.augment = [{"flip": 0.5, "shift": 2}]' "$out/train-3000.json" > "$out/train-3000-augmented.json"
cp configs/vision.json "$out/vision.json"
jq '.vision.patch_size = 4 | .vision.max_grid = 14' configs/vision.json > "$out/vision-patch4.json"
jq '.hidden_size = 192 | .kda.head_dim = 48 | .mla.qk_nope_head_dim = 48 | .mla.v_head_dim = 48
    | .moe.moe_intermediate_size = 192 | .moe.intermediate_size = 576' configs/vision.json > "$out/vision-wide.json"

# name, model config, TRAIN.json
pilots=(
  "recipe vision.json train-1000.json"
  "patch4 vision-patch4.json train-1000.json"
  "wide192 vision-wide.json train-1000.json"
  "augmented vision.json train-1000-augmented.json"
  "steps3000 vision.json train-3000.json"
  "augmented3000 vision.json train-3000-augmented.json"
)
for pilot in "${pilots[@]}"; do
  read -r name model train <<< "$pilot"
  start=$(date +%s)
  "$hyla" train --config "$out/$model" --train "$out/$train" --data data/kjv --images data/fmnist \
    --out "$out/$name" --overwrite --quiet
  echo $(( $(date +%s) - start )) > "$out/$name.seconds"
  "$hyla" eval images --model "$out/$name/model" --images data/fmnist --split test --text-data data/kjv \
    --out "$out/$name-test.json" --report "$out/$name-test.html"
  "$hyla" eval images --model "$out/$name/model" --images data/fmnist --split train --limit 5000 --controls none \
    --out "$out/$name-train.json"
done

pct() { jq -r "$1 * 1000 | round / 10" "$2"; }
echo
echo "| pilot | test | 95% interval | train (first 5,000) | shuffled | blank | KJV val loss | training |"
echo "|---|---|---|---|---|---|---|---|"
for pilot in "${pilots[@]}"; do
  read -r name _ _ <<< "$pilot"
  t="$out/$name-test.json"
  echo "| $name | $(pct .runs.images.accuracy "$t")% | [$(pct '.runs.images.ci95[0]' "$t"), $(pct '.runs.images.ci95[1]' "$t")]" \
    "| $(pct .runs.images.accuracy "$out/$name-train.json")% | $(pct .runs.shuffled_patches.accuracy "$t")%" \
    "| $(pct .runs.blank.accuracy "$t")% | $(jq -r '.text.model_loss * 10000 | round / 10000' "$t") | $(cat "$out/$name.seconds") s |"
done
