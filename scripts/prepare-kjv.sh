#!/usr/bin/env bash
# The scripts' training text: the King James Bible (data/kjv.txt, from the Debian package), a
# 4096-token byte-level BPE trained on it (data/kjv-tokenizer.json) and its token shards
# (data/kjv). Each step is skipped when its output is already there.
#   bash scripts/prepare-kjv.sh [BUILD_DIR]
set -euo pipefail
hyla="${1:-build}/hyla"
mkdir -p data
[[ -f data/kjv.txt ]] || "$hyla" data fetch kjv --out data/kjv.txt
[[ -f data/kjv-tokenizer.json ]] || "$hyla" tokenizer train --input data/kjv.txt --vocab-size 4096 --out data/kjv-tokenizer.json
[[ -f data/kjv/meta.json ]] || "$hyla" data prepare --tokenizer data/kjv-tokenizer.json --input data/kjv.txt --out data/kjv
