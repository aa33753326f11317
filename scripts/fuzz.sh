#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan/UBSan) and runs each for a share of the time:
#   safetensors_header_fuzz  the safetensors header parser
#   json_document_fuzz       parse_json, the reader of request bodies and every JSON file
#   gguf_header_fuzz         the GGUF reader: header, metadata arrays, tensor ranges and types
# Inputs go up to 1 MiB (libFuzzer's default cap of 4 KB hid the 100k-deep nesting crash), and the
# seeds include documents nested far past the limit.
# Usage: scripts/fuzz.sh [seconds]   (default 600, split between the targets)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-600}
mkdir -p fuzz/bin fuzz/crashes
common=(src/hyla/io/json_fields.cpp src/hyla/io/file.cpp src/hyla/core/tensor.cpp src/hyla/core/dtype.cpp
        src/hyla/core/half.cpp src/hyla/core/memory.cpp)
build() {  # target extra-sources...
  local target=$1
  shift
  clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -Isrc "fuzz/$target.cpp" "$@" "${common[@]}" \
    -lfmt -o "fuzz/bin/$target"
}
build safetensors_header_fuzz src/hyla/io/safetensors.cpp
build json_document_fuzz
build gguf_header_fuzz src/hyla/io/gguf.cpp src/hyla/io/ggml_types.cpp src/hyla/io/ggml_iq_grids.cpp

deep() {  # prefix open close depth suffix
  printf '%s' "$1"
  printf "%${4}s" | tr ' ' "$2"
  printf "%${4}s" | tr ' ' "$3"
  printf '%s' "$5"
}
st=fuzz/corpus/safetensors_header_fuzz js=fuzz/corpus/json_document_fuzz gg=fuzz/corpus/gguf_header_fuzz
mkdir -p "$st" "$js" "$gg"
# safetensors: an 8-byte data size, then the header.
printf '\x10\x00\x00\x00\x00\x00\x00\x00{"a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}}' >"$st"/valid
printf '\x08\x00\x00\x00\x00\x00\x00\x00{"__metadata__":{"k":"v"},"b":{"dtype":"BF16","shape":[4],"data_offsets":[0,8]}}' \
  >"$st"/metadata
{ printf '\x10\x00\x00\x00\x00\x00\x00\x00'; deep '{"a":{"dtype":"F32","shape":' '[' ']' 100000 ',"data_offsets":[0,16]}}'; } \
  >"$st"/deep
# JSON documents: requests, and nesting at, just past and far past the limit.
printf '%s' '{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"x":{"type":"string"}}}}}],"max_tokens":4}' \
  >"$js"/chat
deep '{"prompt":[1,' '[' ']' 63 '],"max_tokens":2}' >"$js"/at-limit
deep '{"prompt":[1,' '[' ']' 100000 '],"max_tokens":2}' >"$js"/deep-arrays
deep '' '{"a":' '}' 100000 '' | sed 's/{"a":}/1}/' >"$js"/deep-objects

# GGUF: metadata of each kind, an F32 and a Q8_0 tensor, and an array count no file could hold.
python3 - "$gg" <<'PY'
import struct, sys
out = sys.argv[1]
def s(b): return struct.pack("<Q", len(b)) + b
def header(tensors, kvs): return b"GGUF" + struct.pack("<IQQ", 3, tensors, kvs)
meta = s(b"a.n") + struct.pack("<II", 4, 7) + s(b"a.s") + struct.pack("<IIQ", 9, 8, 2) + s(b"x") + s(b"yz")
open(f"{out}/metadata", "wb").write(header(0, 2) + meta)
head = header(2, 0)
for name, ne, typ, off in ((b"f", (32, 2), 0, 0), (b"q", (32, 1), 8, 256)):
    head += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne) + struct.pack("<IQ", typ, off)
head += bytes(-len(head) % 32)
open(f"{out}/tensors", "wb").write(head + bytes(256 + 34))
open(f"{out}/lying-count", "wb").write(header(0, 1) + s(b"a.b") + struct.pack("<IIQ", 9, 7, 1 << 60))
PY

each=$((seconds / 3))
for target in safetensors_header_fuzz json_document_fuzz gguf_header_fuzz; do
  echo "== $target ($each s)"
  "fuzz/bin/$target" "fuzz/corpus/$target" -max_len=1048576 -artifact_prefix=fuzz/crashes/ -max_total_time="$each" -print_final_stats=1
done
