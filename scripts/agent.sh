#!/usr/bin/env bash
# Agents end to end (docs/agent.md): prepares the King James Bible (4096-token BPE), trains
# configs/agent.json on KJV text with expert demonstrations of the four tool environments mixed into
# every step (configs/train-agent-sft.json: loss on the assistant's turns, faults in a fifth of the
# calls), runs GRPO from that model once per RL seed (configs/rl-agent.json), then evaluates the SFT
# model and every RL model on the held-out test split: 25 tasks per environment, 16 trials each.
# Saves runs/agent/sft and runs/agent/rl (the first seed's), reports in runs/agent/*.html.
#   bash scripts/agent.sh [BUILD_DIR]          RL_SEEDS="1 2 3" for three RL seeds (default: 1)
# Needs jq.
set -euo pipefail
build=${1:-build}
hyla="$build/hyla"
out=runs/agent
seeds=${RL_SEEDS:-1}
mkdir -p data "$out"
bash scripts/prepare-kjv.sh "$build"

start=$(date +%s)
"$hyla" train --config configs/agent.json --train configs/train-agent-sft.json --data data/kjv --out "$out/sft-run" --overwrite
rm -rf "$out/sft"
cp -r "$out/sft-run/model" "$out/sft"
sft_done=$(date +%s)

models=(-m "$out/sft" --label sft)
for seed in $seeds; do
  jq ".seed = $seed" configs/rl-agent.json > "$out/rl-seed$seed.json"
  "$hyla" rl --config "$out/rl-seed$seed.json" -m "$out/sft" --out "$out/rl-run-seed$seed" --overwrite
  models+=(-m "$out/rl-run-seed$seed/model" --label "rl seed $seed")
done
first=${seeds%% *}
rm -rf "$out/rl"
cp -r "$out/rl-run-seed$first/model" "$out/rl"
rl_done=$(date +%s)

"$hyla" eval agent "${models[@]}" --split test --tasks 25 --trials 16 --faults 0.2 \
  --out "$out/eval-test.json" --report "$out/eval-test.html"
done=$(date +%s)
echo "times: SFT $(( (sft_done - start) / 60 )) min, RL $(( (rl_done - sft_done) / 60 )) min," \
  "evaluation $(( (done - rl_done) / 60 )) min; models in $out/sft and $out/rl, report $out/eval-test.html"
