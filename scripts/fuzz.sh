#!/usr/bin/env bash
# Builds the safetensors header fuzzer with clang + libFuzzer + ASan/UBSan and runs it.
# Usage: scripts/fuzz.sh [seconds]   (default 600)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
mkdir -p fuzz/bin fuzz/corpus fuzz/crashes
src=(src/hyla/io/safetensors.cpp src/hyla/io/file.cpp src/hyla/core/tensor.cpp src/hyla/core/dtype.cpp
     src/hyla/core/half.cpp src/hyla/core/memory.cpp)
clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -Isrc fuzz/safetensors_header_fuzz.cpp "${src[@]}" \
  -lfmt -o fuzz/bin/safetensors_header_fuzz
# Seed corpus: valid and near-valid headers.
printf '\x10\x00\x00\x00\x00\x00\x00\x00{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}' > fuzz/corpus/seed1
printf '\x08\x00\x00\x00\x00\x00\x00\x00{"__metadata__":{"k":"v"},"b":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]}}' > fuzz/corpus/seed2
fuzz/bin/safetensors_header_fuzz fuzz/corpus -artifact_prefix=fuzz/crashes/ -max_total_time="$seconds" -print_final_stats=1
