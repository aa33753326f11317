#!/usr/bin/env bash
# The main demo: the King James Bible, a 4096-token byte-level BPE, and a small hybrid model
# (configs/demo.json: KDA + latent attention, 32 experts, AttnRes) trained through the context
# curriculum 256 → 1024 → 4096 (configs/train-demo.json), with samples along the way, the HTML
# report, and a generated passage at the end. Training takes about 35 minutes on two quiet cores
# (README: the machine, and the figure on a busy one); its log prints an ETA.
set -euo pipefail
build=${1:-build}
hyla="$build/hyla"
mkdir -p data runs
bash scripts/prepare-kjv.sh "$build"
rm -rf runs/demo
"$hyla" train --config configs/demo.json --train configs/train-demo.json --data data/kjv --out runs/demo
"$hyla" report runs/demo
echo
echo "== a passage from the trained model (runs/demo/model):"
"$hyla" generate --model runs/demo/model --prompt "And it came to pass" -n 160 --temperature 0.7 --top-p 0.95 --seed 7
echo
echo "Report: runs/demo/report.html"
