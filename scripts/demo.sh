#!/usr/bin/env bash
# The main demo. Until training lands: initialise the small model of SPEC §1 and inspect it.
set -euo pipefail
build=${1:-build}
out=runs/demo
mkdir -p "$out"
"$build/hyla" init --config configs/small.json --out "$out/model-init" --seed 1
"$build/hyla" inspect "$out/model-init"
