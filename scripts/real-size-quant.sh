#!/usr/bin/env bash
# Issue 64: scripts/real-size.sh's Kimi-Linear-48B-A3B-shaped model in the quantised forms people
# download, against llama.cpp on the same files. real-size.sh runs it and merges its JSON line;
# it also runs alone. Resumable: each step skips what its output already holds.
#   bash scripts/real-size-quant.sh BUILD_DIR WORK_DIR LLAMA_CPP_DIR
# Needs WORK_DIR/kl48-mxfp4.gguf (real-size.sh's step 1, which gives it the KJV vocabulary so that
# llama-imatrix can read text) and llama.cpp built: llama-quantize, llama-imatrix, llama-gguf-split,
# and llama-bench, which it patches (scripts/llama-bench-no-repack.patch) and rebuilds if needed.
# 1. Q2_K: llama-quantize --allow-requantize of the MXFP4 file, its Q2_K preset (~17 GB, ~20 min);
# 2. an importance matrix: llama-imatrix on the Q2_K file over KJV text (CHUNKS chunks of 256);
# 3. the IQ1_S/Q2_K mix: the routed experts' gate matrices IQ1_S, everything else as the Q2_K preset
#    has it (IQ1_S needs the matrix; quantising all routed matrices to IQ1_S would take ~100 min on
#    2 cores), split by llama-gguf-split into SHARD-sized shards, the unsplit file deleted;
# 4. ROUNDS interleaved rounds, each command after a cold page cache (root), its peak RSS from
#    /usr/bin/time, pp PP and tg TG at 2 threads as llama-bench's -p/-n:
#    - Q2_K resident: hyla bench against llama-bench with its defaults (on AVX-512 its CPU backend
#      repacks Q2_K into anonymous memory) and without repacking (the file's pages, as hyla);
#    - the mix, split: hyla bench with --expert-memory EXPERT_MEMORY and prefetch against
#      llama-bench without repacking (its mmap, the page cache as its expert cache) and with defaults;
#    (FILES_ONLY=1 stops before this step: the files can be made while the machine does other work)
# 5. a table of means with 95% intervals, and one JSON line: q2k_bytes, iq1_bytes, iq1_shards, then
#    hyla_tg_q2k, llama_tg_q2k (llama.cpp's better setting), hyla_pp_q2k, llama_pp_q2k,
#    hyla_tg_iq1, llama_tg_iq1, hyla_pp_iq1, llama_pp_iq1 (means over the rounds) and each side's
#    peak RSS (the maxima).
set -euo pipefail
build=${1:?BUILD_DIR}
work=${2:?WORK_DIR}
llama=${3:?LLAMA_CPP_DIR}
hyla="$build/hyla"
bin="$llama/build/bin"
rounds=${ROUNDS:-3}
pp=${PP:-64}
tg=${TG:-32}
memory=${EXPERT_MEMORY:-50%}
chunks=${CHUNKS:-16}
shard=${SHARD:-4G}
mxfp4="$work/kl48-mxfp4.gguf"
q2k="$work/kl48-q2_k.gguf"
mix="$work/kl48-iq1_s-q2_k"  # the shards' prefix: $mix-00001-of-0000N.gguf
[[ -f $mxfp4 ]] || { echo "real-size-quant: $mxfp4 is missing (scripts/real-size.sh writes it)" >&2; exit 1; }
if ! grep -q LLAMA_BENCH_NO_REPACK "$llama/tools/llama-bench/llama-bench.cpp"; then
  patch -d "$llama" -p1 < scripts/llama-bench-no-repack.patch >&2
fi
cmake --build "$llama/build" -j2 --target llama-bench >&2  # the patched llama-bench (nothing to do if built)

room() {  # GB: exits unless WORK has that much free
  local avail
  avail=$(df -B1 --output=avail "$work" | tail -1)
  (( avail > $1 * 1000 ** 3 )) || { echo "real-size-quant: $work has $((avail / 1000 ** 3)) GB free; the next file needs ~$1 GB" >&2; exit 1; }
}
source "$(dirname "$0")/bench-stats.sh"
timed() {  # LOG TIME COMMAND...: the command's output in LOG, its /usr/bin/time figures in TIME
  local log=$1 time=$2
  shift 2
  /usr/bin/time -v -o "$time" "$@" > "$log" 2>&1
}

# 1. Q2_K.
if [[ ! -f $q2k ]]; then
  room 20
  echo "== llama-quantize Q2_K -> $q2k (about 20 minutes)" >&2
  timed "$work/q2k-quantize.log" "$work/q2k-quantize.time" "$bin/llama-quantize" --allow-requantize "$mxfp4" "$q2k.tmp" Q2_K 2
  mv "$q2k.tmp" "$q2k"
fi

# 2. The importance matrix.
if [[ ! -f $work/kl48-imatrix.gguf ]]; then
  echo "== llama-imatrix on $q2k, $chunks chunks of KJV" >&2
  head -c 400000 data/kjv.txt > "$work/imatrix-text.txt"
  timed "$work/imatrix.log" "$work/imatrix.time" "$bin/llama-imatrix" -m "$q2k" -f "$work/imatrix-text.txt" \
    -o "$work/kl48-imatrix.tmp.gguf" -c 256 --chunks "$chunks" -t 2
  mv "$work/kl48-imatrix.tmp.gguf" "$work/kl48-imatrix.gguf"
fi

# 3. The mix, split.
if ! ls "$mix"-00001-of-*.gguf > /dev/null 2>&1; then
  room 34  # the file, then its shards beside it
  echo "== llama-quantize IQ1_S gate experts + Q2_K -> $mix.gguf (about 40 minutes), then split" >&2
  timed "$work/iq1-quantize.log" "$work/iq1-quantize.time" "$bin/llama-quantize" --allow-requantize \
    --imatrix "$work/kl48-imatrix.gguf" --tensor-type ffn_gate_exps=iq1_s "$mxfp4" "$mix.gguf" Q2_K 2
  rm -f "$mix".tmp-*
  "$bin/llama-gguf-split" --split --split-max-size "$shard" "$mix.gguf" "$mix.tmp" >&2
  for f in "$mix".tmp-*.gguf; do mv "$f" "${f/.tmp-/-}"; done
  rm "$mix.gguf"
fi
first=$(ls "$mix"-00001-of-*.gguf)
[[ ${FILES_ONLY:-0} == 1 ]] && { echo "real-size-quant: files written (FILES_ONLY=1: no benchmarks)" >&2; exit 0; }

# 4. Interleaved rounds.
hyla_bench() {  # OUT MODEL [OPTIONS...]
  local out=$1 model=$2 status rows
  shift 2
  [[ -f $out.json ]] && return 0
  echo "== hyla bench $* ($(cold) page cache) -> $out" >&2
  set +e
  /usr/bin/time -v -o "$out.time" "$hyla" bench -m "$model" "$@" -p "$pp" -n "$tg" -r 1 -t 2 --json > "$out.rows" 2> "$out.log"
  status=$?
  set -e
  rows=$(jq -c . "$out.rows" 2> /dev/null || echo '[]')
  jq -n --argjson rss "$(peak_rss "$out.time")" --argjson status "$status" --argjson rows "${rows:-[]}" \
    '{exit_status: $status, peak_rss: $rss, rows: $rows}' > "$out.json"
}
llama_bench() {  # OUT MODEL defaults|no-repack
  local out=$1 model=$2 setting=$3 status rows
  [[ -f $out.json ]] && return 0
  echo "== llama-bench, $setting ($(cold) page cache) -> $out" >&2
  set +e
  env $([[ $setting == no-repack ]] && echo LLAMA_BENCH_NO_REPACK=1) /usr/bin/time -v -o "$out.time" \
    "$bin/llama-bench" -m "$model" -p "$pp" -n "$tg" -t 2 -r 1 -o json > "$out.rows" 2> "$out.log"
  status=$?
  set -e
  rows=$(jq -c . "$out.rows" 2> /dev/null || echo null)
  jq -n --arg setting "$setting" --argjson status "$status" --argjson rss "$(peak_rss "$out.time")" \
    --argjson rows "${rows:-null}" '{setting: $setting, exit_status: $status, peak_rss: $rss, rows: $rows}' > "$out.json"
}
mkdir -p "$work/q2k" "$work/iq1"
for ((r = 1; r <= rounds; ++r)); do
  hyla_bench "$work/q2k/hyla-r$r" "$q2k"
  llama_bench "$work/q2k/llama-defaults-r$r" "$q2k" defaults
  llama_bench "$work/q2k/llama-no-repack-r$r" "$q2k" no-repack
  hyla_bench "$work/iq1/hyla-r$r" "$first" --expert-memory "$memory" --expert-prefetch on
  llama_bench "$work/iq1/llama-no-repack-r$r" "$first" no-repack
  llama_bench "$work/iq1/llama-defaults-r$r" "$first" defaults
done

# 5. The figures.
hyla_rate() { jq --arg t "$1" '[.rows[] | select(.test == $t) | .tokens_per_s][0] // null' "$2"; }
llama_rate() {  # pp|tg FILE
  if [[ $1 == pp ]]; then jq --argjson n "$pp" '[(.rows // [])[] | select(.n_prompt == $n and .n_gen == 0) | .avg_ts][0] // null' "$2"
  else jq --argjson n "$tg" '[(.rows // [])[] | select(.n_gen == $n) | .avg_ts][0] // null' "$2"; fi
}
series() {  # FILE_GLOB pp|tg hyla|llama -> one rate per line
  for f in $1; do [[ -f $f ]] && { [[ $3 == hyla ]] && hyla_rate "$2$([[ $2 == pp ]] && echo "$pp" || echo "$tg")" "$f" || llama_rate "$2" "$f"; }; done | grep -v null || true
}
{
  echo "| file | engine, setting | pp$pp t/s | tg$tg t/s | peak RSS | exit |"
  echo "| --- | --- | ---: | ---: | ---: | --- |"
  for file in q2k iq1; do
    for who in hyla llama-defaults llama-no-repack; do
      engine=${who%%-*}
      glob="$work/$file/$who-r*.json"
      rss=$(for f in $glob; do jq .peak_rss "$f"; done | max)
      exits=$(for f in $glob; do jq .exit_status "$f"; done | sort -u | tr '\n' ' ')
      echo "| $file | $who | $(series "$glob" pp "$engine" | stats) | $(series "$glob" tg "$engine" | stats) | $(awk -v b="$rss" 'BEGIN {printf "%.2f GB", b / 1e9}') | $exits|"
    done
  done
} >&2
best_llama() {  # FILE pp|tg: the better of llama.cpp's two settings, by mean
  local a b
  a=$(series "$work/$1/llama-defaults-r*.json" "$2" llama | mean)
  b=$(series "$work/$1/llama-no-repack-r*.json" "$2" llama | mean)
  awk -v a="$a" -v b="$b" 'BEGIN {if (a == "null") print b; else if (b == "null") print a; else print (a > b ? a : b)}'
}
fields() {  # FILE SUFFIX
  local file=$1 s=$2 hr lr
  hr=$(for f in "$work/$file"/hyla-r*.json; do jq .peak_rss "$f"; done | max)
  lr=$(for f in "$work/$file"/llama-*-r*.json; do jq 'select(.exit_status == 0) | .peak_rss' "$f"; done | max)
  echo "\"hyla_tg_$s\":$(series "$work/$file/hyla-r*.json" tg hyla | mean),\"llama_tg_$s\":$(best_llama "$file" tg)," \
       "\"hyla_pp_$s\":$(series "$work/$file/hyla-r*.json" pp hyla | mean),\"llama_pp_$s\":$(best_llama "$file" pp)," \
       "\"hyla_peak_rss_$s\":$hr,\"llama_peak_rss_$s\":$lr"
}
echo "{\"q2k_bytes\":$(stat -c %s "$q2k"),\"iq1_bytes\":$(stat -c %s "$mix"-*-of-*.gguf | awk '{s += $1} END {printf "%.0f", s}'),\"iq1_shards\":$(ls "$mix"-*-of-*.gguf | wc -l),$(fields q2k q2k),$(fields iq1 iq1)}" | tr -d ' '
