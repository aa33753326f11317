#!/usr/bin/env bash
# hyla against llama.cpp's `kimi-k3` graph on the same GGUF files (issue 48): prefill (pp512) and
# decode (tg128), one and all threads, in interleaved rounds so that every ratio compares runs
# minutes apart. The model is configs/kimi-k3-small.json (Kimi K3's structure at configs/small.json's
# size: KDA with the low-rank decay gate, NoPE MLA with Dr = 64 and its output gate, latent MoE with
# SiTU and full-width shared experts, attention residuals), or with MODEL=ling3 configs/ling3-small.json
# (Ling 3.0's at the same size, llama.cpp's `bailingmoe3` graph: full-rank KDA gates, MLA with RoPE
# and per-head gates, 128 experts with clamped SwiGLU and a shared expert 256 wide), random weights
# (speed does not depend on them), written by `hyla convert` as:
#   bf16    every matrix bf16 (norms, convs, router F32)
#   q8_0    every matrix Q8_0 (hyla runs them as its int8 with block 32)
#   mxfp4   llama-quantize MXFP4_MOE of the bf16 file: routed experts MXFP4, other matrices Q8_0
#           (hyla keeps the experts MXFP4 and the rest as its int8; both engines round the experts'
#           activations to 8 bits per 32)
#   q2_k, q4_k_m, iq2_xxs, iq1_s   llama-quantize's presets of the bf16 file, with an importance
#           matrix that llama-imatrix computed on KJV text (the model carries data/kjv-tokenizer.json)
#   ud      the mixture shaped like the published UD files: routed experts IQ1_S (gate), IQ2_XXS (up),
#           Q2_K (down); attention and KDA Q4_K; shared experts and dense FFN Q6_K; embedding Q8_0
#   (hyla multiplies every K and IQ type straight from the file's blocks, kernels/ggml_gemm.h,
#   rounding activations to 8 bits per block as llama.cpp does)
#
#   bash scripts/bench-llamacpp.sh BUILD LLAMA_CPP [rounds=3]     (DTYPES="mxfp4 ud" for some files only;
#                                                                  MODEL=ling3 for Ling 3.0's structure)
#
# BUILD holds hyla; LLAMA_CPP is a llama.cpp source tree with build/bin/llama-bench and
# build/bin/llama-quantize built for the CPU (scripts/check-llamacpp.sh says how).
set -euo pipefail
build=$1 llama=$2 rounds=${3:-3}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
cores=$(nproc)
model=${MODEL:-kimi-k3}
files="$work/${model#kimi-}"  # the files' prefix: k3 (as before) or ling3
graph=$([[ $model == ling3 ]] && echo bailingmoe3 || echo "$model")
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $cores cores; work in $work" >&2

[[ -f "$files/model.safetensors" ]] ||
  "$build/hyla" init --config "$repo/configs/$model-small.json" --out "$files" --force >/dev/null
[[ -f "$files/tokenizer.json" ]] || cp "$repo/data/kjv-tokenizer.json" "$files/tokenizer.json"
[[ -f "$files-bf16.gguf" ]] || "$build/hyla" convert -m "$files" --out "$files-bf16.gguf" --type bf16 >/dev/null
[[ -f "$files-q8_0.gguf" ]] || "$build/hyla" convert -m "$files" --out "$files-q8_0.gguf" --type q8_0 >/dev/null
[[ -f "$files-mxfp4.gguf" ]] ||
  "$llama/build/bin/llama-quantize" "$files-bf16.gguf" "$files-mxfp4.gguf" MXFP4_MOE >/dev/null 2>&1
if [[ ! -f "$files-imatrix.gguf" ]]; then
  head -c 100000 "$repo/data/kjv.txt" >"$work/imatrix-text.txt"
  "$llama/build/bin/llama-imatrix" -m "$files-bf16.gguf" -f "$work/imatrix-text.txt" -o "$files-imatrix.gguf" \
    -c 256 --chunks 20 -t "$cores" >"$work/imatrix.log" 2>&1
fi
dtypes=${DTYPES:-bf16 q8_0 mxfp4 q2_k q4_k_m iq2_xxs iq1_s ud}
quantise() {  # name preset [llama-quantize options]
  [[ " $dtypes " == *" $1 "* ]] || return 0
  [[ -f "$files-$1.gguf" ]] ||
    "$llama/build/bin/llama-quantize" --imatrix "$files-imatrix.gguf" "${@:3}" "$files-bf16.gguf" \
      "$files-$1.gguf" "$2" >"$files-$1.log" 2>&1
}
quantise q2_k Q2_K
quantise q4_k_m Q4_K_M
quantise iq2_xxs IQ2_XXS
quantise iq1_s IQ1_S
quantise ud IQ1_S --tensor-type 'ffn_gate_exps=iq1_s' --tensor-type 'ffn_up_exps=iq2_xxs' \
  --tensor-type 'ffn_down_exps=q2_k' --tensor-type 'attn=q4_k' --tensor-type 'ssm=q4_k' --tensor-type 'shexp=q6_k' \
  --tensor-type 'ffn_gate\.=q6_k' --tensor-type 'ffn_up\.=q6_k' --tensor-type 'ffn_down\.=q6_k' \
  --tensor-type 'routed=q4_k' --token-embedding-type q8_0 --output-tensor-type q6_k

# Rows as {engine, dtype, test, threads, tokens_per_s, round}; tests named as llama-bench names them.
hyla_rows() {  # round dtype gguf
  "$build/hyla" bench --model "$3" -p 512 -n 128 -r 3 -t 1,"$cores" --json 2>/dev/null |
    jq -c --arg dtype "$2" --argjson round "$1" '.[] | select(.tokens_per_s != null) |
      {engine: "hyla", dtype: $dtype, test, threads, tokens_per_s, roofline_fraction, round: $round}'
}
llama_rows() {  # round dtype gguf
  "$llama/build/bin/llama-bench" -m "$3" -p 512 -n 128 -r 3 -t 1,"$cores" -o jsonl 2>/dev/null |
    jq -c --arg dtype "$2" --argjson round "$1" '
      {engine: "llama.cpp", dtype: $dtype, test: (if .n_prompt > 0 then "pp\(.n_prompt)" else "tg\(.n_gen)" end),
       threads: .n_threads, tokens_per_s: .avg_ts, round: $round}'
}

out="$work/rows.jsonl"
: >"$out"
for ((r = 1; r <= rounds; ++r)); do
  for dtype in $dtypes; do
    echo "round $r/$rounds: $dtype" >&2
    hyla_rows "$r" "$dtype" "$files-$dtype.gguf" >>"$out"
    llama_rows "$r" "$dtype" "$files-$dtype.gguf" >>"$out"
  done
done

echo "## hyla ÷ llama.cpp, $graph graph, configs/$model-small.json, the same GGUF ($rounds interleaved rounds; medians)"
echo "| test | file | threads | hyla t/s | hyla % of its decode bound | llama.cpp t/s | hyla ÷ llama.cpp (median of rounds) |"
echo "|---|---|---:|---:|---:|---:|---:|"
jq -rs '
  def median: sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  group_by([.test, .dtype, .threads])[] | . as $g |
  ($g | map(select(.engine == "hyla")) | map({key: (.round | tostring), value: .tokens_per_s}) | from_entries) as $h |
  ($g | map(select(.engine == "llama.cpp")) | map({key: (.round | tostring), value: .tokens_per_s}) | from_entries) as $l |
  ($g | map(select(.engine == "hyla" and .roofline_fraction != null).roofline_fraction)) as $f |
  "| \($g[0].test) | \($g[0].dtype) | \($g[0].threads) | \($h | [.[]] | median | round) | \(if ($f | length) > 0 then "\($f | median * 100 | round)%" else "" end) | \($l | [.[]] | median | round) | \([$h | keys[] | select($l[.] != null) | $h[.] / $l[.]] | median * 100 | round / 100) |"
' "$out"
