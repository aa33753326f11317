#!/usr/bin/env bash
# hyla against llama.cpp's `kimi-linear` graph at the shape of configs/small.json (issue 21):
# prefill (pp512), decode (tg128) and decode at depth 8192 (tg64 @ d8192), one and all threads,
# bf16 and int8 (hyla's int8 against llama.cpp's Q8_0), in interleaved rounds so that every ratio
# compares runs minutes apart. Both models have random weights: speed does not depend on them.
#
#   bash scripts/bench-llamacpp.sh BUILD LLAMA_CPP [rounds=3]
#
# BUILD holds hyla; LLAMA_CPP is a llama.cpp source tree with build/bin/llama-bench and
# build/bin/llama-quantize built (CPU backend) and its gguf-py, which with numpy (Debian
# python3-numpy) writes the GGUF (scripts/kimi-linear-gguf.py: what llama.cpp's converter would
# emit for a Kimi-Linear config of this shape). BENCHMARKS.md says what cannot be matched.
set -euo pipefail
build=$1 llama=$2 rounds=${3:-3}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-$(mktemp -d)}
python=${PYTHON:-python3}
mkdir -p "$work"
cores=$(nproc)
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $cores cores; work in $work" >&2

[[ -f "$work/kimi-bf16.gguf" ]] ||
  PYTHONPATH="$llama/gguf-py" "$python" "$repo/scripts/kimi-linear-gguf.py" "$work/kimi-bf16.gguf" >&2
[[ -f "$work/kimi-q8_0.gguf" ]] ||
  "$llama/build/bin/llama-quantize" "$work/kimi-bf16.gguf" "$work/kimi-q8_0.gguf" Q8_0 >/dev/null 2>&1
[[ -f "$work/small-bf16/model.safetensors" ]] ||
  "$build/hyla" init --config "$repo/configs/small.json" --out "$work/small-bf16" --weight-dtype bf16 >/dev/null
[[ -f "$work/small-int8/model.safetensors" ]] ||
  "$build/hyla" quantize --model "$work/small-bf16" --out "$work/small-int8" >/dev/null

# Rows as {engine, dtype, test, threads, tokens_per_s, round}; tests named as llama-bench names them.
hyla_rows() {  # round dtype model hyla-bench-args...
  local round=$1 dtype=$2 model=$3
  shift 3
  "$build/hyla" bench --model "$model" "$@" -t 1,"$cores" --json 2>/dev/null |
    jq -c --arg dtype "$dtype" --argjson round "$round" '.[] | select(.tokens_per_s != null) |
      {engine: "hyla", dtype: $dtype, test, threads, tokens_per_s, roofline_fraction, round: $round}'
}
llama_rows() {  # round dtype gguf llama-bench-args...
  local round=$1 dtype=$2 gguf=$3
  shift 3
  "$llama/build/bin/llama-bench" -m "$gguf" "$@" -t 1,"$cores" -o jsonl 2>/dev/null |
    jq -c --arg dtype "$dtype" --argjson round "$round" '
      {engine: "llama.cpp", dtype: $dtype,
       test: (if .n_prompt > 0 then "pp\(.n_prompt)" else "tg\(.n_gen)" end
              + (if .n_depth > 0 then " @ d\(.n_depth)" else "" end)),
       threads: .n_threads, tokens_per_s: .avg_ts, round: $round}'
}

out="$work/rows.jsonl"
: >"$out"
for ((r = 1; r <= rounds; ++r)); do
  for dtype in bf16 int8; do
    echo "round $r/$rounds: $dtype" >&2
    gguf="$work/kimi-$([[ $dtype == int8 ]] && echo q8_0 || echo bf16).gguf"
    hyla_rows "$r" "$dtype" "$work/small-$dtype" -p 512 -n 128 -r 3 >>"$out"
    llama_rows "$r" "$dtype" "$gguf" -p 512 -n 128 -r 3 >>"$out"
    hyla_rows "$r" "$dtype" "$work/small-$dtype" -p 1 -n 64 -d 8192 -r 2 | jq -c 'select(.test | startswith("tg"))' >>"$out"
    llama_rows "$r" "$dtype" "$gguf" -p 0 -n 64 -d 8192 -r 2 >>"$out"
  done
done

echo "## hyla ÷ llama.cpp kimi-linear, configs/small.json shape ($rounds interleaved rounds; medians)"
echo "| test | dtype (llama.cpp) | threads | hyla t/s | hyla % of its decode bound | llama.cpp t/s | hyla ÷ llama.cpp (median of rounds) |"
echo "|---|---|---:|---:|---:|---:|---:|"
jq -rs '
  def median: sort | if length % 2 == 1 then .[length / 2 | floor] else (.[length / 2 - 1] + .[length / 2]) / 2 end;
  group_by([.test, .dtype, .threads])[] | . as $g |
  ($g | map(select(.engine == "hyla")) | map({key: (.round | tostring), value: .tokens_per_s}) | from_entries) as $h |
  ($g | map(select(.engine == "llama.cpp")) | map({key: (.round | tostring), value: .tokens_per_s}) | from_entries) as $l |
  ($g | map(select(.engine == "hyla" and .roofline_fraction != null).roofline_fraction)) as $f |
  "| \($g[0].test) | \($g[0].dtype)\(if $g[0].dtype == "int8" then " (Q8_0)" else "" end) | \($g[0].threads) | \($h | [.[]] | median | round) | \(if ($f | length) > 0 then "\($f | median * 100 | round)%" else "" end) | \($l | [.[]] | median | round) | \([$h | keys[] | select($l[.] != null) | $h[.] / $l[.]] | median * 100 | round / 100) |"
' "$out"
