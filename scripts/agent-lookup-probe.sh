#!/usr/bin/env bash
# Why recipe seed 2's SFT never learnt lookup (issue 70, docs/agent.md): from that SFT model
# (runs/agent/seed-2/sft, 1,500 steps of the calculator + lookup mix: calculator 64.5%, lookup 9.1%
# at test), 300 more SFT steps two ways, everything else equal (configs/train-agent-sft.json,
# seed 2, the same learning rate):
# - "lookup": demonstrations of lookup alone;
# - "mix" (the control): the recipe's own mix, calculator and lookup.
# If lookup rises under its own demonstrations and not under the mix, the model can learn it from
# where seed 2's SFT stopped, and what held it back is the mix's competition (calculator learnt
# first takes the updates), not capacity or the demonstrations. The three models are then
# evaluated on the dev split (100 tasks per environment x 4 trials, temperature 1, faults off).
#   bash scripts/agent-lookup-probe.sh [BUILD_DIR]        about 20 minutes alone (2-core AMD EPYC)
set -euo pipefail
hyla="${1:-build}/hyla"
from=runs/agent/seed-2/sft
out=runs/agent/probe-seed2
[[ -f "$from/config.json" ]] || { echo "needs $from: run scripts/agent.sh with recipe seed 2 first" >&2; exit 1; }
mkdir -p "$out"
for arm in lookup mix; do
  [[ -f "$out/$arm/model/config.json" ]] && continue
  envs='["calculator", "lookup"]'
  [[ $arm == lookup ]] && envs='["lookup"]'
  jq ".seed = 2 | .agent.environments = $envs | .curriculum[0].tokens = 300 * 256 | .checkpoint.every = 300" \
    configs/train-agent-sft.json >"$out/$arm.json"
  "$hyla" train --config configs/agent.json --train "$out/$arm.json" --data data/kjv --out "$out/$arm" \
    --init "$from" --overwrite
done
[[ -f "$out/eval-dev.json" ]] ||
  "$hyla" eval agent -m "$from" -m "$out/lookup/model" -m "$out/mix/model" --envs calculator,lookup --split dev \
    --tasks 100 --trials 4 --temperature 1 --faults 0 --max-steps 6 --seed 2 --out "$out/eval-dev.json" \
    --report "$out/eval-dev.html"
jq -r '.models[] | "\(.model): calculator \(.summary.calculator["pass@1"]) \(.summary.calculator["pass@1_interval"]), lookup \(.summary.lookup["pass@1"]) \(.summary.lookup["pass@1_interval"])"' \
  "$out/eval-dev.json"
