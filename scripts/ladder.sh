#!/usr/bin/env bash
# The long-context ladder from the base model (issue 50; docs/longctx.md, "The ladder from the base"):
# runs/base/model (scripts/base.sh: KJV text and dense pass keys, copying learnt at 256 tokens) is
# trained on configs/train-ladder.json, 256 -> 512 -> 2K -> 8K, with every stage's tasks weighted
# (multi-key, variable tracking, QA1 and MQAR twice) and the answers carrying half of each
# micro-batch's loss; the model config is the base's with the position limit raised to 1M
# (configs/longctx-base.json), which no weight depends on. Then the evaluations, each one table of
# docs/longctx.md:
#   heldout     every trained task, 256-8K, 5 depths, on the held-out haystack (The Devil's
#               Dictionary), RULER's templates;
#   paraphrase  the same facts in other words (--paraphrase), held-out haystack, 512/2K/8K;
#   extrapolate pass key and the single needle in noise at 16K/32K/64K (8x the last stage), depths
#               0.5 and 1;
#   far         the same two tasks at 256K (SAMPLES_FAR, default 2, per depth; about 50 minutes
#               on 2 cores: ~720 prompt tokens/s);
#   million     only with MILLION=1: the pass key at 1M, depths 1 then 0.5, one sample each, each its
#               own segment (million-depth1.json, million-depth0.5.json): the latent attention's
#               cost per token grows with the length, so a 1M read takes about 70 minutes here.
# Each with the no-context control and the contamination check against the training text.
# Resumable: training continues from its last checkpoint, and an evaluation whose JSON exists is
# skipped (delete it to rerun). SAMPLES (default 20) sets samples per cell up to 8K, SAMPLES_LONG
# (default 10) beyond.
#   bash scripts/ladder.sh [BUILD_DIR]
set -euo pipefail
build=${1:-build}
hyla="$build/hyla"
out=runs/ladder
samples=${SAMPLES:-20}
samples_long=${SAMPLES_LONG:-10}
mkdir -p data "$out"
bash scripts/prepare-kjv.sh "$build"
[[ -f data/devil.txt ]] || "$hyla" data fetch devil --out data/devil.txt
[[ -f runs/base/model/config.json ]] || bash scripts/base.sh "$build"

start=$(date +%s)
if [[ ! -f "$out/run/model/config.json" ]]; then
  from=(--init runs/base/model --overwrite)
  [[ -d "$out/run/checkpoints" ]] && from=(--resume)  # the checkpoint holds the weights
  "$hyla" train --config configs/longctx-base.json --train configs/train-ladder.json --data data/kjv \
    --out "$out/run" "${from[@]}"
fi
trained=$(date +%s)

evaluate() {  # name, then eval longctx's options
  local name=$1
  shift
  [[ -f "$out/$name.json" ]] && return
  "$hyla" eval longctx -m "$out/run/model" --seed 1 --train-text data/kjv.txt --haystack data/devil.txt \
    --out "$out/$name.json" --report "$out/$name.html" "$@"
}
evaluate heldout --samples "$samples" --lengths 256,512,1K,2K,4K,8K --depths 0,0.25,0.5,0.75,1 \
  --tasks passkey,niah_single_noise,niah_single_essay,niah_multikey,niah_multikey_2,niah_multivalue,vt_1x4,qa1,qa2,mqar
evaluate paraphrase --paraphrase --samples "$samples" --lengths 512,2K,8K --depths 0,0.5,1 \
  --tasks passkey,niah_single_essay,niah_multikey,vt_1x4,qa1,mqar
evaluate extrapolate --samples "$samples_long" --lengths 16K,32K,64K --depths 0.5,1 --tasks passkey,niah_single_noise
evaluate far --samples "${SAMPLES_FAR:-2}" --lengths 256K --depths 0.5,1 --tasks passkey,niah_single_noise
if [[ ${MILLION:-0} == 1 ]]; then
  for depth in 1 0.5; do  # one segment each: the needle by the question first, the middle second
    evaluate "million-depth$depth" --samples 1 --lengths 1M --depths "$depth" --tasks passkey
  done
fi
done=$(date +%s)
echo "times: training $(( (trained - start) / 60 )) min, evaluation $(( (done - trained) / 60 )) min;" \
  "model in $out/run/model, reports in $out/*.html"
