#!/usr/bin/env bash
# Regenerates tests/data/ggml_quant_vectors.txt from a llama.cpp source tree: builds ggml's base
# library with fused multiply-adds off (-ffp-contract=off: ggml's reference decoders as their C
# source rounds them, which is what hyla's decoders match) and runs scripts/ggml-quant-vectors.c.
#
#   bash scripts/ggml-quant-vectors.sh LLAMA_CPP      (e.g. the tree scripts/check-llamacpp.sh names)
set -euo pipefail
llama=$(cd "$1" && pwd)
repo=$(cd "$(dirname "$0")/.." && pwd)
build="$llama/build-reference"
cmake -S "$llama" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DCMAKE_C_FLAGS=-ffp-contract=off \
  -DCMAKE_CXX_FLAGS=-ffp-contract=off -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target ggml-base >/dev/null
gcc -O2 -ffp-contract=off -I"$llama/ggml/include" "$repo/scripts/ggml-quant-vectors.c" "$build/ggml/src/libggml-base.a" \
  -lm -lpthread -fopenmp -lstdc++ -o "$build/ggml-quant-vectors"
mkdir -p "$repo/tests/data"
"$build/ggml-quant-vectors" >"$repo/tests/data/ggml_quant_vectors.txt.tmp"
mv "$repo/tests/data/ggml_quant_vectors.txt.tmp" "$repo/tests/data/ggml_quant_vectors.txt"
echo "wrote tests/data/ggml_quant_vectors.txt ($(grep -c '^type' "$repo/tests/data/ggml_quant_vectors.txt") types; llama.cpp $(git -C "$llama" rev-parse --short HEAD 2>/dev/null || echo '?'))"
