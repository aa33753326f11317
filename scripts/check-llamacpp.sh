#!/usr/bin/env bash
# hyla's Kimi K3, Kimi Linear and Ling 3.0 against llama.cpp's kimi-k3, kimi-linear and bailingmoe3
# graphs, logit for logit (issues 48, 66): tiny models with random weights written by hyla as GGUF (`hyla convert`), run
# by hyla (on its model directory and on the GGUF) and by llama.cpp (on the same GGUF); the same
# with llama-quantize's MXFP4 experts and with hyla's bf16 and Q8_0 files; a deliberate error that
# must fail; a model `hyla train` produced, exported and run by llama.cpp; the files people
# download: every llama-quantize type and split sets (scripts/check-llamacpp-quants.sh); and the
# vision tower with its mmproj files (scripts/check-llamacpp-vision.sh).
#
#   bash scripts/check-llamacpp.sh BUILD LLAMA_CPP [WORK]
#
# BUILD holds hyla. LLAMA_CPP is a llama.cpp source tree built for the CPU with libllama and
# llama-quantize, e.g. the release node-llama-cpp 3.22.1 ships (as scripts/bench-llamacpp.sh):
#   npm pack node-llama-cpp@3.22.1 && tar xzf node-llama-cpp-3.22.1.tgz &&
#   git clone package/llama/gitRelease.bundle llama.cpp && cd llama.cpp &&
#   cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
#     -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF &&
#   cmake --build build -j2 --target llama llama-quantize llama-tokenize mtmd llama-mtmd-cli
# Needs g++ and python3 with numpy (Debian python3-numpy; python3-torch and python3-tqdm for the rows
# that run llama.cpp's own converter). Prints one line per comparison and
# exits non-zero when a comparison that must pass fails (or the deliberate error passes).
#
# The bounds, and why:
# - f32: both sides compute in f32 on the same f32 weights, in different orders (llama.cpp's
#   chunked delta rule uses 16-token chunks and its own exp/cumsum order; hyla its own kernels).
#   Rounding differences of ~1e-7 relative per operation grow through 8 layers to ~1e-6 (median)
#   and ~1e-4 (max) in logits of order 1: measured 9e-7 and 8e-5. The bounds keep 10x of headroom:
#   top-1 >= 99%, median <= 1e-5, max <= 1e-3. (A routing flip, two experts' scores within rounding
#   of each other, would move a row by far more and fail the max: none happens in these models.)
#   The models use rms_norm_eps = 1e-6 because llama.cpp adds rms_norm_eps inside the q/k L2 norm
#   where SPEC adds 1e-6 (docs/kimi-llamacpp.md); the row "eps 1e-5" shows that difference alone.
#   The MLA latent norms (q_a, kv_a) add 1e-6 on both sides in every row but that one: llama.cpp
#   takes layer_norm_rms_epsilon, hyla mla.norm_eps, which is rms_norm_eps in hyla's configs and
#   1e-6 for a HF checkpoint (SPEC §4); in the eps row both use 1e-5.
# - bf16, Q8_0, MXFP4: both engines round differently around the stored weights. hyla multiplies bf16
#   and MXFP4 weights exactly in f32 and runs Q8_0 as its int8 (activations rounded to 8-bit blocks
#   of its own); llama.cpp rounds activations to bf16, or to its 8-bit blocks for Q8_0 and MXFP4.
#   Those roundings move the logits by about what rounding the weights moved them, so the median
#   |Δ| between the engines must stay within 2x the median |Δ| the file causes in hyla (hyla's f32
#   directory -> hyla on the file).
set -euo pipefail
work=${3:-$(mktemp -d)}
source "$(dirname "$0")/llamacpp-common.sh" "$1" "$2" "$work"

rm -f "$work/failed"
for arch in kimi-k3 kimi-linear ling3; do
  m="$work/$arch"
  make_model "$repo/configs/$arch-tiny.json" "$m" 1
  "$hyla" convert -m "$m" --out "$m-f32.gguf" --type f32 >/dev/null
  hyla_logits "$m" "$m-dir.st"
  hyla_logits "$m-f32.gguf" "$m-gguf.st"
  llama_logits "$m-f32.gguf" "$m-llama.st"
  compare "$arch f32 hyla-dir->hyla-gguf" "$m-dir.st" "$m-gguf.st" f32
  compare "$arch f32 hyla->llama.cpp" "$m-dir.st" "$m-llama.st" f32

  # MXFP4 experts, the rest F32 (llama-quantize MXFP4_MOE with every other tensor kept F32), and the
  # same file dequantised by llama-quantize to F32: hyla reads MXFP4 exactly, so the f32 bound holds.
  # Then llama-quantize's own MXFP4_MOE mixture (experts MXFP4, other matrices Q8_0, which hyla runs
  # as int8 with block 32), both engines on the one file.
  keep_f32=(--output-tensor-type f32 --token-embedding-type f32)
  for pattern in attn ssm 'ffn_gate\.' 'ffn_up\.' 'ffn_down\.' shexp routed; do keep_f32+=(--tensor-type "$pattern=f32"); done
  "$quantize" "${keep_f32[@]}" "$m-f32.gguf" "$m-mxfp4.gguf" MXFP4_MOE >/dev/null 2>&1
  "$quantize" --allow-requantize "$m-mxfp4.gguf" "$m-mxfp4-f32.gguf" F32 >/dev/null 2>&1
  "$quantize" "$m-f32.gguf" "$m-mxfp4-moe.gguf" MXFP4_MOE >/dev/null 2>&1
  hyla_logits "$m-mxfp4.gguf" "$m-mxfp4-hyla.st"
  llama_logits "$m-mxfp4-f32.gguf" "$m-mxfp4-f32-llama.st"
  llama_logits "$m-mxfp4.gguf" "$m-mxfp4-llama.st"
  compare "$arch f32(mxfp4 experts dequantised) hyla->llama.cpp" "$m-mxfp4-hyla.st" "$m-mxfp4-f32-llama.st" f32
  compare "$arch mxfp4 experts hyla->llama.cpp" "$m-mxfp4-hyla.st" "$m-mxfp4-llama.st" quantized "$m-dir.st" "$m-mxfp4-hyla.st"
  hyla_logits "$m-mxfp4-moe.gguf" "$m-mxfp4-moe-hyla.st"
  llama_logits "$m-mxfp4-moe.gguf" "$m-mxfp4-moe-llama.st"
  compare "$arch mxfp4_moe hyla->llama.cpp" "$m-mxfp4-moe-hyla.st" "$m-mxfp4-moe-llama.st" quantized "$m-dir.st" "$m-mxfp4-moe-hyla.st"
  for type in bf16 q8_0; do
    "$hyla" convert -m "$m" --out "$m-$type.gguf" --type "$type" >/dev/null
    hyla_logits "$m-$type.gguf" "$m-$type-hyla.st"
    llama_logits "$m-$type.gguf" "$m-$type-llama.st"
    compare "$arch $type hyla->llama.cpp" "$m-$type-hyla.st" "$m-$type-llama.st" quantized "$m-dir.st" "$m-$type-hyla.st"
  done

  # SPEC's q/k L2-norm eps (1e-6) against llama.cpp's (rms_norm_eps): the configs' 1e-5, reported.
  make_model "$repo/configs/$arch-tiny.json" "$m-eps" 1 1e-5
  "$hyla" convert -m "$m-eps" --out "$m-eps.gguf" --type f32 >/dev/null
  hyla_logits "$m-eps" "$m-eps-dir.st"
  llama_logits "$m-eps.gguf" "$m-eps-llama.st"
  compare "$arch f32 rms_norm_eps 1e-5 hyla->llama.cpp (reported: L2-norm eps differs)" "$m-eps-dir.st" "$m-eps-llama.st" report
done

# A deliberate error: MLA's softmax scale 1/sqrt(Dn) instead of 1/sqrt(Dn + Dr), written into the
# GGUF as q_b scaled by sqrt((Dn + Dr) / Dn). The f32 comparison must fail.
m="$work/kimi-k3"
rm -rf "$m-wrong" && cp -r "$m" "$m-wrong"
"$python" - "$m-wrong/model.safetensors" "$m-wrong/config.json" <<'EOF'
import json, struct, sys
import numpy as np
path, config = sys.argv[1], json.load(open(sys.argv[2]))
scale = ((config['mla']['qk_nope_head_dim'] + config['mla']['qk_rope_head_dim']) / config['mla']['qk_nope_head_dim']) ** 0.5
b = open(path, 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
header = json.loads(b[8:8 + n])
data = bytearray(b[8 + n:])
for name, e in header.items():
    if name.endswith('q_b_proj.weight'):
        s, t = e['data_offsets']
        data[s:t] = (np.frombuffer(data[s:t], dtype=np.float32) * scale).astype(np.float32).tobytes()
open(path, 'wb').write(b[:8 + n] + bytes(data))
EOF
"$hyla" convert -m "$m-wrong" --out "$m-wrong.gguf" --type f32 >/dev/null
llama_logits "$m-wrong.gguf" "$m-wrong-llama.st"
compare "kimi-k3 f32 hyla->llama.cpp, MLA scale 1/sqrt(Dn)" "$m-dir.st" "$m-wrong-llama.st" error

# Ling 3.0's deliberate error: q_pe and k_pe rotated as halves where llama.cpp (and SPEC §4) rotate
# adjacent pairs, written into the GGUF as the rope rows of q (q_b) and of k_pe (kv_a) permuted
# pairs -> halves. The f32 comparison must fail.
m="$work/ling3"
rm -rf "$m-wrong" && cp -r "$m" "$m-wrong"
"$python" - "$m-wrong/model.safetensors" "$m-wrong/config.json" <<'EOF'
import json, struct, sys
import numpy as np
path, config = sys.argv[1], json.load(open(sys.argv[2]))
m = config['mla']
Dn, Dr, H, R = m['qk_nope_head_dim'], m['qk_rope_head_dim'], m['num_heads'], m['kv_lora_rank']
halves = np.array(list(range(0, Dr, 2)) + list(range(1, Dr, 2)))
b = open(path, 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
header = json.loads(b[8:8 + n])
data = bytearray(b[8 + n:])
for name, e in header.items():
    if name == '__metadata__' or not name.endswith(('q_b_proj.weight', 'kv_a_proj_with_mqa.weight')):
        continue
    s, t = e['data_offsets']
    w = np.frombuffer(data[s:t], dtype=np.float32).reshape(e['shape']).copy()
    if name.endswith('q_b_proj.weight'):
        for h in range(H):
            first = h * (Dn + Dr) + Dn
            w[first:first + Dr] = w[first + halves]
    else:
        w[R:R + Dr] = w[R + halves]
    data[s:t] = w.tobytes()
open(path, 'wb').write(b[:8 + n] + bytes(data))
EOF
"$hyla" convert -m "$m-wrong" --out "$m-wrong.gguf" --type f32 >/dev/null
llama_logits "$m-wrong.gguf" "$m-wrong-llama.st"
compare "ling3 f32 hyla->llama.cpp, q_pe and k_pe rotated as halves" "$m-dir.st" "$m-wrong-llama.st" error

# llama.cpp's own converter: a tiny checkpoint in the release's Hugging Face layout (config.json
# from tests/data shrunk to the tiny shape, tensors renamed and reshaped as the release stores them,
# f32; scripts/hf-checkpoint.py), converted by convert_hf_to_gguf.py (its tensor mapping and
# transforms; scripts/llamacpp-converter stands in for `transformers`, which Debian does not
# package, and writes no vocabulary), then run by hyla on the
# checkpoint directory, by hyla on llama.cpp's GGUF and by llama.cpp on it. Needs Debian's
# python3-torch and python3-tqdm; skipped with a note when they are missing.
if "$python" -c "import torch, tqdm" 2>/dev/null; then
  shim="$repo/scripts/llamacpp-converter"
  # kimi-k3:mxfp4 is K3 as released: compressed-tensors MXFP4 experts. hyla keeps them MXFP4 (f32
  # activations in `hyla logits`); llama.cpp's converter repacks them into ggml MXFP4, which hyla
  # reads as they are and llama.cpp runs after llama-quantize dequantises them to F32 (its own MXFP4
  # path rounds activations to 8 bits): every comparison is then f32 on the same weights.
  for variant in kimi-k3 kimi-linear ling3 kimi-k3:mxfp4; do
    arch=${variant%%:*} mxfp4=
    [[ $variant == *:mxfp4 ]] && mxfp4=1
    m="$work/$arch" h="$work/$arch-hf${mxfp4:+-mxfp4}"
    rm -rf "$h" && mkdir -p "$h"
    "$python" "$repo/scripts/hf-checkpoint.py" "$m" "$h" "$repo" "$arch" "$mxfp4"
    PYTHONPATH="$shim" "$python" "$shim/convert.py" "$llama" "$h" --outtype f32 --outfile "$h.gguf" >"$h.log" 2>&1 ||
      { tail -20 "$h.log" >&2; echo "$arch convert_hf_to_gguf" >>"$work/failed"; continue; }
    hyla_logits "$h" "$h-hyla.st"
    hyla_logits "$h.gguf" "$h-gguf-hyla.st"
    if [[ -n $mxfp4 ]]; then
      "$quantize" --allow-requantize "$h.gguf" "$h-f32.gguf" F32 >/dev/null 2>&1
      llama_logits "$h-f32.gguf" "$h-llama.st"
      compare "$arch mxfp4 compressed-tensors hf->llama.cpp's converter->hyla" "$h-hyla.st" "$h-gguf-hyla.st" f32
      compare "$arch mxfp4 compressed-tensors hf->llama.cpp's converter->llama.cpp (F32 dequantised)" "$h-hyla.st" "$h-llama.st" f32
      continue
    fi
    llama_logits "$h.gguf" "$h-llama.st"
    compare "$arch f32 hyla-hf->hyla-dir" "$m-dir.st" "$h-hyla.st" f32
    compare "$arch f32 hf->llama.cpp's converter->hyla" "$h-hyla.st" "$h-gguf-hyla.st" f32
    compare "$arch f32 hf->llama.cpp's converter->llama.cpp" "$h-hyla.st" "$h-llama.st" f32
  done
else
  echo "skipped: llama.cpp's own converter (needs apt-get install python3-torch python3-tqdm)"
fi

# The reverse direction: a K3-shaped and a Ling-3.0-shaped model that `hyla train` produced (200
# steps on the KJV each), exported.
(cd "$repo" && bash scripts/prepare-kjv.sh "$build" >/dev/null)
"$python" -c "import json; json.dump({'seed': 1, 'optimizer': {'lr': 0.003}, 'schedule': {'warmup_steps': 20},
  'curriculum': [{'seq_len': 256, 'tokens': 200 * 4096, 'batch_tokens': 4096}], 'eval': {'every': 100, 'batches': 2},
  'checkpoint': {'every': 100, 'keep': 1}}, open('$work/trained-train.json', 'w'))"
tokens=$("$python" -c "import random; random.seed(49); print(','.join(str(random.randrange(4096)) for _ in range(128)))")
for arch in kimi-k3 ling3; do
  t="$work/trained"
  [[ $arch == ling3 ]] && t="$work/trained-ling3"
  if [[ ! -f "$t/model/config.json" ]]; then
    "$python" -c "import json; c=json.load(open('$repo/configs/$arch-tiny.json')); c['vocab_size']=4096; c['rms_norm_eps']=1e-6; json.dump(c,open('$t-config.json','w'))"
    "$hyla" train --config "$t-config.json" --train "$work/trained-train.json" --data "$repo/data/kjv" \
      --out "$t" >"$t.log" 2>&1
  fi
  "$hyla" convert -m "$t/model" --out "$t.gguf" --type f32 >/dev/null
  hyla_logits "$t/model" "$t-hyla.st"
  llama_logits "$t.gguf" "$t-llama.st"
  compare "$arch f32 hyla-trained->llama.cpp" "$t-hyla.st" "$t-llama.st" f32
done
t="$work/trained"  # the K3 model's

# The trained model's vocabulary travels in the GGUF (tokenizer.ggml.*, pre "qwen2"): llama.cpp's
# tokenizer must give hyla's ids.
printf 'And God said, Let there be light: and there was light.\n\n  In the beginning 1234567 世界 🚀 "quoted" it'"'"'s\t\tend' >"$work/text.txt"
"$hyla" tokenizer encode --tokenizer "$t/model/tokenizer.json" --input "$work/text.txt" --out "$work/ids.json" >/dev/null
hyla_ids=$("$python" -c "import json; print(','.join(map(str, json.load(open('$work/ids.json')))))")
llama_ids=$("$llama/build/bin/llama-tokenize" -m "$t.gguf" -f "$work/text.txt" --ids --no-bos --log-disable 2>/dev/null |
  tail -1 | tr -d '[] ')
if [[ "$hyla_ids" == "$llama_ids" ]]; then
  echo "ok    kimi-k3 vocabulary hyla->llama.cpp tokenize: the same $(tr ',' '\n' <<<"$hyla_ids" | wc -l) ids"
else
  echo "FAIL  kimi-k3 vocabulary hyla->llama.cpp tokenize: hyla [$hyla_ids], llama.cpp [$llama_ids]"
  echo "vocabulary" >>"$work/failed"
fi

# Every llama-quantize type, a UD-shaped mixture and split sets (issue 64).
bash "$repo/scripts/check-llamacpp-quants.sh" "$build" "$llama" "$work/quants" || echo "quantised files" >>"$work/failed"

# The vision tower against llama.cpp's kimik25 graph, and mmproj files both ways (issue 69).
bash "$repo/scripts/check-llamacpp-vision.sh" "$build" "$llama" "$work/vision" || echo "vision" >>"$work/failed"

if [[ -f "$work/failed" ]]; then
  echo "failed: $(paste -sd, "$work/failed")" >&2
  exit 1
fi
echo "all comparisons passed"
