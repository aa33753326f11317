#!/usr/bin/env bash
# hyla's Kimi K3 and Kimi Linear against llama.cpp's kimi-k3 and kimi-linear graphs, logit for
# logit (issue 48): tiny models with random weights written by hyla as GGUF (`hyla convert`), run
# by hyla (on its model directory and on the GGUF) and by llama.cpp (on the same GGUF); the same
# with llama-quantize's MXFP4 experts and with hyla's bf16 and Q8_0 files; a deliberate error that
# must fail; a model `hyla train` produced, exported and run by llama.cpp; and the files people
# download: every llama-quantize type and split sets (scripts/check-llamacpp-quants.sh).
#
#   bash scripts/check-llamacpp.sh BUILD LLAMA_CPP [WORK]
#
# BUILD holds hyla. LLAMA_CPP is a llama.cpp source tree built for the CPU with libllama and
# llama-quantize, e.g. the release node-llama-cpp 3.22.1 ships (as scripts/bench-llamacpp.sh):
#   npm pack node-llama-cpp@3.22.1 && tar xzf node-llama-cpp-3.22.1.tgz &&
#   git clone package/llama/gitRelease.bundle llama.cpp && cd llama.cpp &&
#   cmake -B build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
#     -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF &&
#   cmake --build build -j2 --target llama llama-quantize llama-tokenize
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
for arch in kimi-k3 kimi-linear; do
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

# llama.cpp's own converter: a tiny checkpoint in the release's Hugging Face layout (config.json
# from tests/data shrunk to the tiny shape, tensors renamed and reshaped as the release stores them,
# f32), converted by convert_hf_to_gguf.py (its tensor mapping and transforms; a shim stands in for
# `transformers`, which Debian does not package, and writes no vocabulary), then run by hyla on the
# checkpoint directory, by hyla on llama.cpp's GGUF and by llama.cpp on it. Needs Debian's
# python3-torch and python3-tqdm; skipped with a note when they are missing.
if "$python" -c "import torch, tqdm" 2>/dev/null; then
  shim="$work/shim"
  mkdir -p "$shim/transformers"
  cat >"$shim/transformers/__init__.py" <<'EOF2'
# Stands in for Hugging Face transformers in llama.cpp's converter: the config falls back to
# config.json (the converter's own fallback) and no tokenizer is read.
class AutoConfig:
    @staticmethod
    def from_pretrained(*args, **kwargs):
        raise OSError("transformers shim: read config.json")
class AutoTokenizer:
    @staticmethod
    def from_pretrained(*args, **kwargs):
        raise OSError("transformers shim: no tokenizer")
EOF2
  cat >"$shim/convert.py" <<'EOF2'
# llama.cpp's convert_hf_to_gguf.py with set_vocab writing no vocabulary (tokenizer model "none",
# which llama.cpp loads as vocab_size dummy tokens): the tensor mapping is untouched. Debian 12's
# torch (1.13) lacks the newer dtypes the converter lists in a table; placeholders fill the table
# (no tensor of those types is read here).
import runpy, sys
import torch
for name in ("float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"):
    if not hasattr(torch, name):
        setattr(torch, name, type(name, (), {})())
llama = sys.argv.pop(1)
sys.path[:0] = [llama, llama + "/gguf-py"]
import conversion.base
def no_vocab(self):
    self.gguf_writer.add_tokenizer_model("none")
conversion.base.TextModel.set_vocab = no_vocab
import conversion.kimi_linear, conversion.kimi_k3
conversion.kimi_linear.KimiLinearModel.set_vocab = no_vocab
conversion.kimi_k3.KimiK3Model.set_vocab = no_vocab
sys.argv[0] = llama + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
EOF2
  # kimi-k3:mxfp4 is K3 as released: compressed-tensors MXFP4 experts. hyla keeps them MXFP4 (f32
  # activations in `hyla logits`); llama.cpp's converter repacks them into ggml MXFP4, which hyla
  # reads as they are and llama.cpp runs after llama-quantize dequantises them to F32 (its own MXFP4
  # path rounds activations to 8 bits): every comparison is then f32 on the same weights.
  for variant in kimi-k3 kimi-linear kimi-k3:mxfp4; do
    arch=${variant%%:*} mxfp4=
    [[ $variant == *:mxfp4 ]] && mxfp4=1
    m="$work/$arch" h="$work/$arch-hf${mxfp4:+-mxfp4}"
    rm -rf "$h" && mkdir -p "$h"
    "$python" - "$m" "$h" "$repo" "$arch" "$mxfp4" <<'EOF2'
import json, struct, sys
import numpy as np
src, dst, repo, arch, mxfp4 = sys.argv[1:6]
k3 = arch == 'kimi-k3'
# The released config.json, shrunk to the tiny config's shape.
hf = json.load(open(f"{repo}/tests/data/{'kimi-k3-hf-config.json' if k3 else 'kimi-linear-48b-a3b-hf-config.json'}"))
tiny = json.load(open(f'{src}/config.json'))
t = hf['text_config'] if k3 else hf
t.update(vocab_size=tiny['vocab_size'], hidden_size=tiny['hidden_size'], intermediate_size=tiny['moe']['intermediate_size'],
         num_hidden_layers=tiny['num_hidden_layers'], num_attention_heads=tiny['mla']['num_heads'],
         num_key_value_heads=tiny['mla']['num_heads'], kv_lora_rank=tiny['mla']['kv_lora_rank'],
         qk_nope_head_dim=tiny['mla']['qk_nope_head_dim'], qk_rope_head_dim=tiny['mla']['qk_rope_head_dim'],
         v_head_dim=tiny['mla']['v_head_dim'], moe_intermediate_size=tiny['moe']['moe_intermediate_size'],
         num_experts=tiny['moe']['num_experts'], num_experts_per_token=tiny['moe']['num_experts_per_tok'],
         num_shared_experts=tiny['moe']['num_shared_experts'], first_k_dense_replace=tiny['moe']['first_k_dense_replace'],
         routed_scaling_factor=tiny['moe']['routed_scaling_factor'], rms_norm_eps=tiny['rms_norm_eps'],
         max_position_embeddings=tiny['max_position_embeddings'])
if k3:
    t.update(q_lora_rank=tiny['mla']['q_lora_rank'] or None, routed_expert_hidden_size=tiny['moe']['latent_dim'],
             attn_res_block_size=tiny['attn_res']['block_size'], activation_situ_beta=tiny['moe']['situ_beta'],
             activation_situ_linear_beta=tiny['moe']['situ_linear_beta'])
full = [l + 1 for l, x in enumerate(tiny['layer_types']) if x == 'mla']
t['linear_attn_config'].update(full_attn_layers=full, kda_layers=[l + 1 for l in range(tiny['num_hidden_layers']) if l + 1 not in full],
                               num_heads=tiny['kda']['num_heads'], head_dim=tiny['kda']['head_dim'])
if mxfp4:  # the release's routed experts: compressed-tensors MXFP4
    hf['quantization_config'] = {'quant_method': 'compressed-tensors', 'format': 'mxfp4-pack-quantized'}
hf.pop('vision_config', None)  # text only, as llama.cpp's K3 converter reads it
json.dump(hf, open(f'{dst}/config.json', 'w'), indent=1)
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
def pack_mxfp4(w):  # the OCP recipe: scale 2^(floor(log2 max) - 2) per 32, nearest E2M1 code
    rows, cols = w.shape
    blocks = w.reshape(rows, cols // 32, 32).astype(np.float64)
    amax = np.abs(blocks).max(axis=2)
    e = np.clip(np.where(amax > 0, np.floor(np.log2(np.maximum(amax, 1e-38))) - 2, 0) + 127, 1, 254)
    v = blocks / np.exp2(e - 127)[:, :, None]
    code = np.abs(np.abs(v)[..., None] - E2M1).argmin(axis=3) | np.where(v < 0, 8, 0)
    code = code.reshape(rows, cols).astype(np.uint8)
    return (code[:, 0::2] | (code[:, 1::2] << 4)).astype(np.uint8), e.astype(np.uint8)
# The tensors under the release's names and shapes.
b = open(f'{src}/model.safetensors', 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
header = json.loads(b[8:8 + n])
renames = [('.mlp.gate.', '.block_sparse_moe.gate.'), ('.mlp.shared_experts.', '.block_sparse_moe.shared_experts.'),
           ('.mlp.lat_down.', '.block_sparse_moe.routed_expert_down_proj.'),
           ('.mlp.lat_up.', '.block_sparse_moe.routed_expert_up_proj.'),
           ('.mlp.lat_norm.', '.block_sparse_moe.routed_expert_norm.'),
           ('.attn_res_query', '.self_attention_res_proj.weight'), ('.attn_res_norm.', '.self_attention_res_norm.'),
           ('.mlp_res_query', '.mlp_res_proj.weight'), ('model.out_res_query', 'model.output_attn_res_proj.weight'),
           ('model.out_res_norm.', 'model.output_attn_res_norm.')]
out = {}
for name, e in header.items():
    if name == '__metadata__':
        continue
    s, e2 = e['data_offsets']
    x = np.frombuffer(b[8 + n + s:8 + n + e2], dtype=np.float32).reshape(e['shape'])
    hname = name
    for a, c in renames:
        hname = hname.replace(a, c)
    if '.mlp.experts.' in hname:
        hname = hname.replace('.mlp.experts.', '.block_sparse_moe.experts.')
        hname = hname.replace('.gate_proj.', '.w1.').replace('.down_proj.', '.w2.').replace('.up_proj.', '.w3.')
        if mxfp4:
            codes, scales = pack_mxfp4(x)
            out[('language_model.' if k3 else '') + hname + '_packed'] = codes
            out[('language_model.' if k3 else '') + hname + '_scale'] = scales
            continue
    if hname.endswith('A_log'):
        x = x.reshape(-1) if k3 else x.reshape(1, 1, -1, 1)
    if hname.endswith('conv1d.weight'):
        x = x.reshape(x.shape[0], x.shape[2])
    if hname.endswith('res_proj.weight'):
        x = x.reshape(1, -1)
    out[('language_model.' if k3 else '') + hname] = np.ascontiguousarray(x)
h, offset = {}, 0
for name, x in out.items():
    h[name] = {'dtype': 'U8' if x.dtype == np.uint8 else 'F32', 'shape': list(x.shape), 'data_offsets': [offset, offset + x.nbytes]}
    offset += x.nbytes
text = json.dumps(h).encode()
text += b' ' * ((8 - len(text) % 8) % 8)
with open(f'{dst}/model.safetensors', 'wb') as f:
    f.write(struct.pack('<Q', len(text)) + text)
    for x in out.values():
        f.write(x.tobytes())
EOF2
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

# The reverse direction: a K3-shaped model that `hyla train` produced (200 steps on the KJV), exported.
t="$work/trained"
if [[ ! -f "$t/model/config.json" ]]; then
  (cd "$repo" && bash scripts/prepare-kjv.sh "$build" >/dev/null)
  "$python" -c "import json; c=json.load(open('$repo/configs/kimi-k3-tiny.json')); c['vocab_size']=4096; c['rms_norm_eps']=1e-6; json.dump(c,open('$work/trained-config.json','w'))"
  "$python" -c "import json; json.dump({'seed': 1, 'optimizer': {'lr': 0.003}, 'schedule': {'warmup_steps': 20},
    'curriculum': [{'seq_len': 256, 'tokens': 200 * 4096, 'batch_tokens': 4096}], 'eval': {'every': 100, 'batches': 2},
    'checkpoint': {'every': 100, 'keep': 1}}, open('$work/trained-train.json', 'w'))"
  "$hyla" train --config "$work/trained-config.json" --train "$work/trained-train.json" --data "$repo/data/kjv" \
    --out "$t" >"$work/trained.log" 2>&1
fi
"$hyla" convert -m "$t/model" --out "$t.gguf" --type f32 >/dev/null
tokens=$("$python" -c "import random; random.seed(49); print(','.join(str(random.randrange(4096)) for _ in range(128)))")
hyla_logits "$t/model" "$t-hyla.st"
llama_logits "$t.gguf" "$t-llama.st"
compare "kimi-k3 f32 hyla-trained->llama.cpp" "$t-hyla.st" "$t-llama.st" f32

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

if [[ -f "$work/failed" ]]; then
  echo "failed: $(paste -sd, "$work/failed")" >&2
  exit 1
fi
echo "all comparisons passed"
