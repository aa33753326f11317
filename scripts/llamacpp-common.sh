# Shared by scripts/check-llamacpp.sh and scripts/check-llamacpp-quants.sh (sourced, not run):
# the llama.cpp logits tool, the token ids, the logits of both engines, the comparison and its
# bounds (check-llamacpp.sh's header says why), and a tiny model with random values.
#   source scripts/llamacpp-common.sh BUILD LLAMA_CPP WORK
build=$(cd "$1" && pwd) llama=$(cd "$2" && pwd) work=$3
mkdir -p "$work"
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
hyla="$build/hyla"
python=${PYTHON:-python3}
quantize="$llama/build/bin/llama-quantize"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; llama.cpp $(git -C "$llama" rev-parse --short HEAD 2>/dev/null || echo '?'); work in $work" >&2

logits_bin="$work/llamacpp-logits"
if [[ ! -x "$logits_bin" || "$repo/scripts/llamacpp-logits.cpp" -nt "$logits_bin" ]]; then
  g++ -O2 -std=c++17 -I"$llama/include" -I"$llama/ggml/include" "$repo/scripts/llamacpp-logits.cpp" \
    "$llama/build/src/libllama.a" "$llama/build/ggml/src/libggml.a" "$llama/build/ggml/src/libggml-cpu.a" \
    "$llama/build/ggml/src/libggml-base.a" -fopenmp -lpthread -ldl -o "$logits_bin"
fi

tokens=$("$python" -c "import random; random.seed(48); print(','.join(str(random.randrange(512)) for _ in range(128)))")
hyla_logits() { "$hyla" logits -m "$1" --tokens "[$tokens]" --out "$2" >/dev/null; }
llama_logits() { "$logits_bin" "$1" "$tokens" "$2" 1 2>"$2.log" || { tail -5 "$2.log" >&2; return 1; }; }

# compare NAME A B [f32 | identical | exact FLOOR_A FLOOR_B | quantized BASE_A BASE_B | rounded | error |
# exact-error FLOOR_A FLOOR_B | report]: one line; failures counted in $work/failed. identical: max 0.
# rounded: top-1 >= 99%, max <= 1e-2 (check-llamacpp-vision.sh: llama.cpp's fp16 roundings).
# exact: the same decoded weights in f32 on both sides (issue 64: top-1 >= 99%, median <= 1e-4; the
# max reported, a routing near-tie can move it). Top-1 counts the positions whose top-2 gap in B
# exceeds the max |dlogit| of the engines on the unquantised file (FLOOR_A against FLOOR_B): below
# that gap the engines' f32 orders alone may pick either token; the raw top-1 is printed too.
compare() {
  "$python" - "$@" <<'EOF' || echo "$1" >>"$work/failed"
import json, struct, sys
import numpy as np
def read(path):
    b = open(path, 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    e = json.loads(b[8:8 + n])['logits']
    s, t = e['data_offsets']
    return np.frombuffer(b[8 + n + s:8 + n + t], dtype=np.float32).reshape(e['shape']).astype(np.float64)
name, a, b, kind = sys.argv[1], read(sys.argv[2]), read(sys.argv[3]), sys.argv[4]
d = np.abs(a - b)
top1 = 100.0 * np.mean(a.argmax(1) == b.argmax(1))
line = f"{name} top-1 {top1:.1f}% max|dlogit| {d.max():.2g} median {np.median(d):.2g} (|logit| up to {np.abs(a).max():.2g})"
if kind in ('exact', 'exact-error'):
    floor = np.abs(read(sys.argv[5]) - read(sys.argv[6])).max()
    top2 = np.sort(b, axis=1)[:, -2:]
    decidable = top2[:, 1] - top2[:, 0] > floor
    top1 = 100.0 * np.mean((a.argmax(1) == b.argmax(1))[decidable])
    line += f"; top-1 {top1:.1f}% of the {decidable.sum()} positions whose top-2 gap exceeds the f32 floor {floor:.2g}"
if kind == 'f32':
    ok = top1 >= 99 and d.max() <= 1e-3 and np.median(d) <= 1e-5
elif kind == 'quantized':
    own = np.median(np.abs(read(sys.argv[5]) - read(sys.argv[6])))
    line += f"; the file's own rounding moves the median {own:.2g}"
    ok = np.median(d) <= 2 * own
elif kind == 'identical':
    ok = d.max() == 0
elif kind == 'exact':
    ok = top1 >= 99 and np.median(d) <= 1e-4
elif kind == 'rounded':
    ok = top1 >= 99 and d.max() <= 1e-2
    line += " (bound top-1 >= 99%, max <= 1e-2: llama.cpp's fp16 roundings carried through)"
elif kind == 'error':
    ok = not (top1 >= 99 and d.max() <= 1e-3 and np.median(d) <= 1e-5)
    line += " (a deliberate error: the f32 check must fail)"
elif kind == 'exact-error':
    ok = not (top1 >= 99 and np.median(d) <= 1e-4)
    line += " (a deliberate decoding error: the exact check must fail)"
else:
    ok = True
print(("ok    " if ok else "FAIL  ") + line)
sys.exit(0 if ok else 1)
EOF
}

# A tiny model with hyla's initial matrices and random values where an initial model is trivial
# (norms, AttnRes queries, the balancing bias; a vision tower's biases and learned grid), so every
# transform of the conversion is exercised; the MLA layers' q and kv_b are scaled by 4, the vision
# tower's wqkv by 8, so that attention is far from uniform (at the initial scale the scores are near
# 0 and the softmax scale, or which rotary axis is which, would hardly matter).
make_model() {  # config out seed [eps]
  local config=$1 out=$2 seed=$3 eps=${4:-1e-6}
  "$python" -c "import json,sys; c=json.load(open('$config')); c['rms_norm_eps']=$eps; json.dump(c,open('$work/config.json','w'))"
  "$hyla" init --config "$work/config.json" --out "$out" --seed "$seed" --force >/dev/null
  "$python" - "$out/model.safetensors" "$seed" "$out/config.json" <<'EOF'
import json, struct, sys
import numpy as np
path, rng = sys.argv[1], np.random.default_rng(int(sys.argv[2]))
types = json.load(open(sys.argv[3]))['layer_types']
mla_q = tuple(f'layers.{l}.self_attn.{p}.weight' for l, t in enumerate(types) if t == 'mla' for p in ('q_proj', 'q_b_proj', 'kv_b_proj'))
b = open(path, 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
header = json.loads(b[8:8 + n])
data = bytearray(b[8 + n:])
for name, e in header.items():
    if name == '__metadata__':
        continue
    s, t = e['data_offsets']
    x = np.frombuffer(data[s:t], dtype=np.float32).reshape(e['shape'])
    if name.startswith(('vision_tower.', 'mm_projector.')) and name.endswith('.bias'):
        x = 0.1 * rng.standard_normal(x.shape)
    elif name.endswith('pos_emb.weight'):
        x = 0.5 * rng.standard_normal(x.shape)
    elif name.endswith('.wqkv.weight'):
        x = 8 * x
    elif 'norm' in name:
        x = 1 + 0.2 * rng.standard_normal(x.shape)
    elif name.endswith('res_query') or name.endswith('correction_bias'):
        x = 0.3 * rng.standard_normal(x.shape)
    elif name.endswith(mla_q):
        x = 4 * x
    data[s:t] = x.astype(np.float32).tobytes()
open(path, 'wb').write(b[:8 + n] + bytes(data))
EOF
}


# A kimi-k3-tiny config with the KJV vocabulary and a MoonViT tower in K2.5's variant (the one
# llama.cpp's kimik25 graph runs): OUT WIDTH HEADS BLOCKS MLP GRID_H GRID_W PROJECTOR_GELU.
k25_vision_config() {
  "$python" - "$repo/configs/kimi-k3-tiny.json" "$@" <<'EOF'
import json, sys
base, out, width, heads, blocks, mlp, grid_h, grid_w, gelu = sys.argv[1:10]
c = json.load(open(base))
c['vocab_size'] = 4096
c['vision'] = {'enabled': True, 'tower': 'moonvit', 'patch_size': 14, 'channels': 3, 'moonvit': {
    'hidden_size': int(width), 'num_heads': int(heads), 'head_dim': int(width) // int(heads), 'num_layers': int(blocks),
    'intermediate_size': int(mlp), 'pos_emb_height': int(grid_h), 'pos_emb_width': int(grid_w),
    'pos_emb_resample': 'bicubic', 'norm': 'layernorm', 'norm_eps': 1e-5, 'bias': True, 'merge': 2,
    'projector': 'patchmerger', 'projector_eps': 1e-5, 'projector_gelu': gelu}}
json.dump(c, open(out, 'w'), indent=1)
EOF
}
