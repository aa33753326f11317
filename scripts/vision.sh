#!/usr/bin/env bash
# Images end to end (docs/vision.md): prepares the King James Bible (4096-token BPE), Fashion-MNIST
# and the rendered-document set, trains configs/vision.json on text and image-text records mixed in
# every step (configs/train-vision.json) and its text-only twin on exactly the same text (the same
# TRAIN.json without images), then evaluates: Fashion-MNIST over all 10,000 test images, the
# documents (test split and the held-out font), each with shuffled-patch and blank-image controls,
# and the KJV validation loss of both models. Saves the model to runs/vision/model and the
# reports to runs/vision/{fmnist,documents,documents-heldout-font}.html.
#   bash scripts/vision.sh [BUILD_DIR]
# Needs jq. About 40 minutes on two Zen 5 cores, 75-95 on the earlier
# Intel box (docs/vision.md has the measured run).
set -euo pipefail
build=${1:-build}
hyla="$build/hyla"
out=runs/vision
mkdir -p data "$out"
bash scripts/prepare-kjv.sh "$build"
[[ -f data/fmnist/meta.json ]] || "$hyla" data prepare-images --dataset fashion-mnist --out data/fmnist
# An earlier recipe rendered 10,000 training documents: a set of another size is rendered again
# (the val and test splits do not depend on it).
train_documents=50000
if ! jq -e ".splits.train.records == $train_documents" data/documents/meta.json > /dev/null 2>&1; then
  "$hyla" data prepare-documents --out data/documents --width 56 --height 56 \
    --train "$train_documents" --heldout-font /usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf
fi

start=$(date +%s)
"$hyla" train --config configs/vision.json --train configs/train-vision.json --data data/kjv \
  --images data/fmnist --images data/documents --out "$out/train" --overwrite
trained=$(date +%s)
jq 'del(.images)' configs/train-vision.json > "$out/train-text-twin.json"
"$hyla" train --config configs/vision.json --train "$out/train-text-twin.json" --data data/kjv --out "$out/text-twin" \
  --overwrite --quiet
twinned=$(date +%s)
rm -rf "$out/model"
cp -r "$out/train/model" "$out/model"

"$hyla" eval images --model "$out/model" --images data/fmnist --split test --text-data data/kjv \
  --twin "$out/text-twin/model" --out "$out/fmnist.json" --report "$out/fmnist.html"
for split in test test-heldout-font; do
  "$hyla" eval images --model "$out/model" --images data/documents --split "$split" \
    --out "$out/documents-$split.json" --report "$out/documents-$split.html"
done
done=$(date +%s)
echo "times: vision training $(( (trained - start) / 60 )) min, text twin $(( (twinned - trained) / 60 )) min," \
  "evaluation $(( (done - twinned) / 60 )) min; model in $out/model, reports in $out/*.html"
