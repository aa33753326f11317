#!/usr/bin/env bash
# Image prefill, hyla against llama.cpp's llama-mtmd-cli on the same files (issue 69): a tower of
# Kimi-K2.5's size (MoonViT: 27 blocks of width 1152, 16 heads, MLP 4304, patch 14, 2x2 merge;
# random weights) as an f32 mmproj (kimik25, written by `hyla convert --mmproj-out`, which
# check-llamacpp-vision.sh shows llama.cpp reads as its own converter's), beside kimi-k3-tiny as an
# f32 text GGUF with the KJV vocabulary; one 448 x 448 image: 1024 patches, 256 tokens. At 1 and 2
# threads:
# - hyla: `hyla bench -m TEXT.gguf --mmproj MMPROJ.gguf --image IMG` (f32 and bf16 products): the
#   tower's patches/s (its share of each forward) and the image tokens/s of the whole forward;
# - llama.cpp: llama-mtmd-cli's own log line "mtmd batch encoding done in" (the tower), over 3 runs;
#   its image prefill is the image's tokens over that time, since this build logs no time for the
#   text model's share, which hyla's rows show is under 1% with this text model.
# The tower's FLOPs per image (products and attention) over its time, against the f32 or bf16 GEMM
# peak hyla bench measures beside its rows, is the fraction of the hardware limit.
#   bash scripts/bench-vision.sh BUILD LLAMA_CPP [WORK]       (about 10 minutes on 2 cores)
# LLAMA_CPP as scripts/check-llamacpp.sh says, with llama-mtmd-cli built. Needs python3 with numpy.
set -euo pipefail
work=${3:-$(mktemp -d)}
source "$(dirname "$0")/llamacpp-common.sh" "$1" "$2" "$work"

(cd "$repo" && bash scripts/prepare-kjv.sh "$build" >/dev/null)
m="$work/k25-tower"
if [[ ! -f "$work/mmproj.gguf" ]]; then
  k25_vision_config "$work/config.json" 1152 16 27 4304 64 64 erf
  "$hyla" init --config "$work/config.json" --out "$m" --seed 1 --force >/dev/null
  cp "$repo/data/kjv/tokenizer.json" "$m/"
  "$hyla" convert -m "$m" --out "$work/text.gguf" --type f32 --mmproj-out "$work/mmproj.gguf" --force >/dev/null
  rm -rf "$m"
fi
"$python" - "$work/image.png" <<'EOF'
import struct, sys, zlib
import numpy as np
rng = np.random.default_rng(1)
h = w = 448
raw = b''.join(b'\0' + row.tobytes() for row in rng.integers(0, 256, (h, w, 3)).astype(np.uint8))
chunk = lambda t, d: struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d))
open(sys.argv[1], 'wb').write(b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, 8, 2, 0, 0, 0)) +
                              chunk(b'IDAT', zlib.compress(raw)) + chunk(b'IEND', b''))
EOF

"$hyla" bench -m "$work/text.gguf" --mmproj "$work/mmproj.gguf" --image "$work/image.png" -p 16 -n 4 -t 1,2 \
  --dtype f32,bf16 -r 3 --json >"$work/hyla.json" 2>"$work/hyla.log"
for t in 1 2; do
  for run in 1 2 3; do
    "$llama/build/bin/llama-mtmd-cli" -m "$work/text.gguf" --mmproj "$work/mmproj.gguf" --image "$work/image.png" \
      -p "Describe the image." -n 1 -t "$t" --temp 0 --chat-template chatml >"$work/llama-$t-$run.log" 2>&1 ||
      { tail -5 "$work/llama-$t-$run.log" >&2; exit 1; }
  done
done

"$python" - "$work" <<'EOF'
import glob, json, re, sys
import numpy as np
work = sys.argv[1]
D, H, L, I, P, m, text = 1152, 16, 27, 4304, 14, 2, 64
patches, tokens = 1024, 256
# Multiply-adds x 2: patch embedding, per block qkv, wo, the MLP and the attention's two products
# over the image's patches, then the projector.
flops = 2 * patches * (3 * P * P * D + L * (3 * D * D + D * D + 2 * D * I + 2 * patches * D)) + \
        2 * tokens * ((m * m * D) ** 2 + m * m * D * text)
rows = json.load(open(f'{work}/hyla.json'))
peak = {}
for r in rows:
    peak[(r['dtype'], r['threads'])] = r['gemm_peak_gflops']
print(f"tower FLOPs per image: {flops / 1e9:.1f} G ({patches} patches, {tokens} tokens)")
print("| engine | products | threads | tower patches/s | tower GFLOP/s (fraction of GEMM peak) | image prefill tokens/s |")
print("|---|---|---:|---:|---:|---:|")
result = {}
for t in (1, 2):
    enc = [float(re.search(r'mtmd batch encoding done in (\d+) ms', open(path).read()).group(1)) / 1e3
           for path in sorted(glob.glob(f'{work}/llama-{t}-*.log'))]
    e, sd = np.mean(enc), np.std(enc, ddof=1) if len(enc) > 1 else 0.0
    result[('llama.cpp', 'f32', t)] = (patches / e, tokens / e)
    fp = peak.get(('f32', t))
    frac = f" ({flops / e / 1e9 / fp:.0%} of f32 {fp:.0f})" if fp else ""
    print(f"| llama.cpp llama-mtmd-cli | f32 (F32 mmproj) | {t} | {patches / e:.1f} ({len(enc)} runs, {e:.1f} ± {sd:.1f} s) | "
          f"{flops / e / 1e9:.1f}{frac} | {tokens / e:.1f} |")
for r in rows:
    if 'tower' not in r['test']:
        continue
    t, dtype = r['threads'], r['dtype']
    whole = next(x for x in rows if x['threads'] == t and x['dtype'] == dtype and 'prefill' in x['test'] and 'image' in x['test'])
    rate = r['tokens_per_s']
    result[('hyla', dtype, t)] = (rate, whole['tokens_per_s'])
    print(f"| hyla bench | {dtype} | {t} | {rate:.0f} ± {r['std']:.0f} | {rate * flops / patches / 1e9:.1f} "
          f"({rate * flops / patches / 1e9 / r['gemm_peak_gflops']:.0%} of {dtype} {r['gemm_peak_gflops']:.0f}) | "
          f"{whole['tokens_per_s']:.1f} ± {whole['std']:.1f} |")
for t in (1, 2):
    base = result[('llama.cpp', 'f32', t)]
    for dtype in ('f32', 'bf16'):
        h = result.get(('hyla', dtype, t))
        if h:
            print(f"{t} thread(s), hyla {dtype} / llama.cpp f32: tower {h[0] / base[0]:.2f}x, image prefill {h[1] / base[1]:.2f}x")
EOF
