#!/usr/bin/env bash
# Long context end to end (docs/longctx.md): prepares the King James Bible (4096-token BPE), trains
# the small hybrid (configs/longctx-small.json: 3 KDA layers and one NoPE latent-attention layer)
# on the seeds' context ladder divided by 32 (configs/train-longctx.json: 256 -> 2K -> 8K -> 32K,
# KJV text plus the suite's retrieval and synthesis generators, many short samples first), saves
# runs/longctx/model, then runs `hyla eval longctx` over the training range and beyond it, with the
# no-context control and the contamination check. Report in runs/longctx/report.html.
#   bash scripts/longctx.sh [BUILD_DIR]
# Environment: LENGTHS (default 1K,2K,4K,8K,16K,32K,64K,128K,256K), TASKS (default: every task),
# DEPTHS (default 0,0.25,0.5,0.75,1), SAMPLES (default 0: the suite's 100 per cell up to 8K, 25 up
# to 128K, 5 beyond), SKIP_TRAIN=1 to evaluate runs/longctx/model again.
# Training took 67 minutes on two cores (AMD EPYC Zen 3); the full default evaluation takes hours (a
# 32K cell of 20 samples ~2 minutes with 8 sequences at once).
set -euo pipefail
build=${1:-build}
hyla="$build/hyla"
out=runs/longctx
mkdir -p data "$out"
bash scripts/prepare-kjv.sh "$build"

start=$(date +%s)
if [[ -z "${SKIP_TRAIN:-}" ]]; then
  "$hyla" train --config configs/longctx-small.json --train configs/train-longctx.json --data data/kjv \
    --out "$out/train" --overwrite
  rm -rf "$out/model"
  cp -r "$out/train/model" "$out/model"
fi
trained=$(date +%s)

tasks=()
[[ -n "${TASKS:-}" ]] && tasks=(--tasks "$TASKS")
"$hyla" eval longctx --model "$out/model" "${tasks[@]}" --lengths "${LENGTHS:-1K,2K,4K,8K,16K,32K,64K,128K,256K}" \
  --depths "${DEPTHS:-0,0.25,0.5,0.75,1}" --samples "${SAMPLES:-0}" --seed 1 --train-text data/kjv.txt \
  --out "$out/eval.json" --report "$out/report.html"
done=$(date +%s)
echo "times: training $(( (trained - start) / 60 )) min, evaluation $(( (done - trained) / 60 )) min;" \
  "model in $out/model, report in $out/report.html"
