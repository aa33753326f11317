#!/usr/bin/env bash
# Agents end to end (docs/agent.md), base -> SFT -> RL -> evaluation:
# 1. scripts/base.sh: a base model that can copy (KJV + dense pass keys; ~15 min);
# 2. SFT from it (configs/train-agent-sft.json, 1,500 steps, ~14 min): expert demonstrations of
#    calculator and lookup, faults off, pass keys kept in the mix; scripts/sft-pick.sh then takes the
#    first checkpoint whose dev pass@1 at temperature 1 lies in [20%, 40%] with pass@8 >= pass@1 + 20;
# 3. GRPO from that checkpoint once per RL seed (configs/rl-agent.json; format_reward 0: pass or
#    fail only);
# 4. the fault-tolerant branch: SFT continued from the picked model on demonstrations with faults
#    in half of the calls (configs/train-agent-sft-faults.json, 600 steps: the expert retries a call
#    that timed out and rewords one that was rejected), then GRPO from it once per RL seed;
# 5. the picked SFT model and every RL model on the test split (100 tasks per environment x 8
#    trials at temperature 1) without faults (the headline) and with faults in 20% of calls
#    (recovery and retries), both with the branch's models beside them; the headline models on the
#    shifted split; then greedy on the test split (one trial).
# About 100 minutes alone with three seeds (2-core AMD EPYC), so it runs in resumable segments:
# every step saves its model or JSON and skips what is already done; after an interruption rerun
# it to continue.
# Saves runs/agent/sft (the picked checkpoint) and runs/agent/rl (the first seed's); reports in
# runs/agent/*.html.
#   bash scripts/agent.sh [BUILD_DIR]          RL_SEEDS="1 2 3" (the default) for the RL seeds
# Needs jq.
set -euo pipefail
build=${1:-build}
hyla="$build/hyla"
out=runs/agent
seeds=${RL_SEEDS:-1 2 3}
envs=calculator,lookup
mkdir -p data "$out"
start=$(date +%s)
bash scripts/base.sh "$build"
base_done=$(date +%s)

# SFT (TRAIN.json $2) from model $3 into $out/$1, resumed if interrupted.
sft() {
  local run="$out/$1" from=(--init "$3" --overwrite)
  [[ -f "$run/model/config.json" ]] && return
  [[ -d "$run/checkpoints" ]] && from=(--resume)  # the checkpoint holds the weights
  "$hyla" train --config configs/agent.json --train "$2" --data data/kjv --out "$run" "${from[@]}"
}

sft sft-run configs/train-agent-sft.json runs/base/model
if [[ ! -f "$out/sft/config.json" ]]; then
  picked=$(ENVS=$envs bash scripts/sft-pick.sh "$out/sft-run" "$build")
  rm -rf "$out/sft.tmp" && cp -r "$picked" "$out/sft.tmp" && mv "$out/sft.tmp" "$out/sft"
  echo "SFT: picked $picked"
fi
sft_done=$(date +%s)

# GRPO (configs/rl-agent.json with RL seed $2) from model $3 into $out/$1, resumed if interrupted.
grpo() {
  local run="$out/$1" resume=--overwrite
  [[ -f "$run/model/config.json" ]] && return
  jq ".seed = $2" configs/rl-agent.json > "$run.json"
  [[ -d "$run/checkpoints" ]] && resume=--resume
  "$hyla" rl --config "$run.json" -m "$3" --out "$run" $resume
}

models=(-m "$out/sft" --label sft)
for seed in $seeds; do
  grpo "rl-run-seed$seed" "$seed" "$out/sft"
  models+=(-m "$out/rl-run-seed$seed/model" --label "rl seed $seed")
done
first=${seeds%% *}
rm -rf "$out/rl"
cp -r "$out/rl-run-seed$first/model" "$out/rl"

sft sft-faults-run configs/train-agent-sft-faults.json "$out/sft"
branch=(-m "$out/sft-faults-run/model" --label "sft+faults")
for seed in $seeds; do
  grpo "rl-faults-run-seed$seed" "$seed" "$out/sft-faults-run/model"
  branch+=(-m "$out/rl-faults-run-seed$seed/model" --label "rl+faults seed $seed")
done
rl_done=$(date +%s)

# split, faults, temperature, trials: the headline at temperature 1, then faults, the shifted split, greedy
for eval in "test 0 1 8" "test 0.2 1 8" "shifted 0 1 8" "test 0 0 1"; do
  read -r split faults temperature trials <<<"$eval"
  name="eval-$split-faults$faults"
  [[ $temperature == 0 ]] && name+="-greedy"
  [[ -f "$out/$name.json" ]] && continue
  evaluated=("${models[@]}")
  [[ $split == test && $temperature != 0 ]] && evaluated+=("${branch[@]}")
  "$hyla" eval agent "${evaluated[@]}" --envs "$envs" --split "$split" --tasks 100 --trials "$trials" \
    --temperature "$temperature" --faults "$faults" --max-steps 6 --out "$out/$name.json" --report "$out/$name.html"
done
done=$(date +%s)
echo "times: base $(( (base_done - start) / 60 )) min, SFT $(( (sft_done - base_done) / 60 )) min," \
  "RL $(( (rl_done - sft_done) / 60 )) min, evaluation $(( (done - rl_done) / 60 )) min;" \
  "models in $out/sft and $out/rl, reports $out/eval-*.html"
