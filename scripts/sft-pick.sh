#!/usr/bin/env bash
# The SFT checkpoint rule of issue 49, fixed before running: the first checkpoint (in step order)
# whose dev pass@1 at temperature 1 lies in [0.20, 0.40] and whose pass@8 is at least pass@1 +
# 0.20. The first bound leaves RL something to learn; the second says the right answer is often
# among 8 samples, so RL has something to amplify. Each checkpoint is evaluated on the dev split
# (25 tasks per environment x 8 trials, faults off, SFT's environments) until one qualifies. Its
# model directory is printed last; RUN/pick.jsonl keeps every checkpoint's figures. Exits 1 when
# none qualifies.
#   bash scripts/sft-pick.sh RUN_DIR [BUILD_DIR]       ENVS=calculator,lookup by default
set -euo pipefail
run=$1
hyla="${2:-build}/hyla"
envs=${ENVS:-calculator,lookup}
: > "$run/pick.jsonl"
for checkpoint in "$run"/checkpoints/step-*; do
  "$hyla" eval agent -m "$checkpoint/model" --envs "$envs" --split dev --tasks 25 --trials 8 --temperature 1 \
    --faults 0 --max-steps 6 --out "$run/pick-eval.json" >/dev/null 2>&1
  row=$(jq -c --arg c "$checkpoint" '.models[0].summary["all"] | {checkpoint: $c, pass1: .["pass@1"], pass8: .["pass@k"]["8"]}' \
    "$run/pick-eval.json")
  echo "$row" >>"$run/pick.jsonl"
  echo "$row" >&2
  if jq -e '.pass1 >= 0.2 and .pass1 <= 0.4 and .pass8 >= .pass1 + 0.2' <<<"$row" >/dev/null; then
    echo "$checkpoint/model"
    exit 0
  fi
done
echo "no checkpoint of $run meets the rule (dev pass@1 in [0.2, 0.4], pass@8 >= pass@1 + 0.2)" >&2
exit 1
