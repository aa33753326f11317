#!/usr/bin/env bash
# Issue 51: a Kimi-Linear-48B-A3B-shaped checkpoint larger than this machine's memory, served from
# disk (docs/offload.md, BENCHMARKS.md). Resumable: each step skips what its output already holds,
# so a run cut short goes on where it stopped (delete WORK/uniform, WORK/skewed to measure again).
#   bash scripts/real-size.sh [BUILD_DIR] [WORK_DIR] [LLAMA_CPP_DIR]
# 1. the GGUF (`hyla init ... --experts mxfp4`, ~29 GB, written a tensor at a time; ~20 min on 2
#    cores), after checking the free disk;
# 2. the disk's read rate, cold page cache (`echo 3 > /proc/sys/vm/drop_caches`, root only: said
#    when it did not work), with dd;
# 3. for each routing, uniform (the random router's own, as hyla init wrote it; not uniform in
#    fact, step 6 measures it) and skewed (scripts/gguf-router-bias.py writes Zipf-like router
#    biases, SKEW_BETA, into the file; both programs add them before the top-k), ROUNDS
#    interleaved rounds of hyla bench with
#    an EXPERT_MEMORY cache and prefetch on, then llama.cpp's llama-bench on the same file without
#    repacking (its CPU backend otherwise repacks the MXFP4 experts into anonymous memory, which
#    does not fit; llama-cli's documented --no-repack, which llama-bench lacks, so
#    scripts/llama-bench-no-repack.patch adds it as LLAMA_BENCH_NO_REPACK=1: the script applies it
#    to LLAMA_CPP_DIR and rebuilds llama-bench); each command after a cold page cache, its peak RSS
#    from /usr/bin/time;
# 4. llama-bench with its defaults once (the OOM killer ends it: reported so);
# 5. for each routing, hyla's decode against its cache size, SWEEP (percentages of the experts);
# 6. for each routing, how skewed it is: the share of 512 tokens' routings (4096 a layer) that the
#    most-routed 20% of each layer's experts take (hyla bench -p 512, expert_top20_share; 20% if
#    uniform);
# 7. the same model as a safetensors directory (`hyla init --out DIR --experts mxfp4`, 4 GB
#    shards, ~20 min, after checking the free disk; with the KJV tokenizer so that text goes in
#    and out), `hyla generate`, one `hyla serve` completion and hyla bench on it, then the
#    directory deleted (the GGUF is kept for reruns unless CLEAN=1, which deletes it at the end);
# 8. the router biases back to zero (the file as hyla init wrote it), a table of the means with
#    95% intervals, and one JSON line: file_bytes, ram_bytes, hyla_tg, llama_tg, hyla_peak_rss,
#    llama_peak_rss (uniform routing: decode means over the rounds, RSS their maxima), then the
#    same four for the skewed routing.
# 9. with LLAMA_CPP_DIR, scripts/real-size-quant.sh: the file requantised by llama-quantize to Q2_K
#    (resident) and to an IQ1_S/Q2_K mix split into shards (offloaded), hyla against llama.cpp on
#    each; its JSON fields (hyla_tg_q2k, llama_tg_q2k, hyla_tg_iq1, llama_tg_iq1, ...) join the line.
# Needs jq and python3. Tests: pp16 and tg32 (TG tokens), 2 threads, as llama-bench's -p/-n.
# About 35 minutes once the file exists.
set -euo pipefail
build=${1:-build}
work=${2:-runs/real-size}
llama=${3:-}
hyla="$build/hyla"
memory=${EXPERT_MEMORY:-9G}
sweep=${SWEEP:-10% 20% 30% 40% 50% 60%}
beta=${SKEW_BETA:-0.04}
rounds=${ROUNDS:-3}
tg=${TG:-32}
config=tests/data/kimi-linear-48b-a3b.json
gguf="$work/kl48-mxfp4.gguf"
mkdir -p "$work"
ram=$(awk '/MemTotal/ {printf "%.0f", $2 * 1024}' /proc/meminfo)

source "$(dirname "$0")/bench-stats.sh"
routing_bias() { python3 scripts/gguf-router-bias.py "$gguf" "$([[ $1 == skewed ]] && echo "$beta" || echo 0)" >&2; }

# 1. The file.
if [[ ! -f $gguf ]]; then
  avail=$(df -B1 --output=avail "$work" | tail -1)
  (( avail > 35 * 1000 ** 3 )) || { echo "real-size: $work has $((avail / 1000 ** 3)) GB free; the file needs ~30 GB and headroom" >&2; exit 1; }
  echo "== writing $gguf (about 20 minutes)" >&2
  /usr/bin/time -v -o "$work/init.time" "$hyla" init --config "$config" --out "$gguf" --type bf16 --experts mxfp4 \
    --tokenizer data/kjv/tokenizer.json >&2
fi
file_bytes=$(stat -c %s "$gguf")
(( file_bytes > ram )) || echo "real-size: warning: the file ($file_bytes bytes) is not larger than RAM ($ram bytes)" >&2

# 2. The disk's read rate.
if [[ ! -f $work/disk.json ]]; then
  state=$(cold)
  start=$(date +%s.%N)
  dd if="$gguf" of=/dev/null bs=16M status=none
  seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {print b - a}')
  jq -n --argjson bytes "$file_bytes" --argjson s "$seconds" --arg cache "$state" \
    '{bytes: $bytes, seconds: $s, read_gbs: ($bytes / $s / 1e9), page_cache: $cache}' > "$work/disk.json"
fi
echo "disk: $(jq -c . "$work/disk.json")" >&2

# hyla bench into OUT.json (rows, peak RSS, memory), unless it is there.
hyla_bench() {  # OUT MEMORY
  local out=$1 mem=$2 status rows
  [[ -f $out.json ]] && return 0
  echo "== hyla bench, --expert-memory $mem ($(cold) page cache) -> $out" >&2
  set +e
  /usr/bin/time -v -o "$out.time" "$hyla" bench -m "$gguf" --expert-memory "$mem" --expert-prefetch on \
    -p 16 -n "$tg" -r 1 -t 2 --json > "$out.rows" 2> "$out.log"
  status=$?
  set -e
  rows=$(jq -c . "$out.rows" 2> /dev/null || echo '[]')
  jq -n --argjson rss "$(peak_rss "$out.time")" --arg mem "$mem" --argjson status "$status" --argjson rows "${rows:-[]}" \
    '{memory: $mem, exit_status: $status, peak_rss: $rss, rows: $rows}' > "$out.json"
}
# llama-bench into OUT.json (exit status, rows, peak RSS), unless it is there; SETTING defaults|no-repack.
llama_bench() {  # OUT SETTING
  local out=$1 setting=$2 status rows
  [[ -f $out.json ]] && return 0
  echo "== llama-bench, $setting ($(cold) page cache) -> $out" >&2
  set +e
  env $([[ $setting == no-repack ]] && echo LLAMA_BENCH_NO_REPACK=1) /usr/bin/time -v -o "$out.time" \
    "$llama/build/bin/llama-bench" -m "$gguf" -p 16 -n "$tg" -t 2 -r 1 -o json > "$out.rows" 2> "$out.log"
  status=$?
  set -e
  rows=$(jq -c . "$out.rows" 2> /dev/null || echo null)
  jq -n --arg setting "$setting" --argjson status "$status" --argjson rss "$(peak_rss "$out.time")" \
    --argjson rows "${rows:-null}" '{setting: $setting, exit_status: $status, peak_rss: $rss, rows: $rows}' > "$out.json"
}

if [[ -n $llama ]]; then
  if ! grep -q LLAMA_BENCH_NO_REPACK "$llama/tools/llama-bench/llama-bench.cpp"; then
    patch -d "$llama" -p1 < scripts/llama-bench-no-repack.patch >&2
  fi
  cmake --build "$llama/build" -j2 --target llama-bench >&2
fi

# 3. Interleaved rounds.
for routing in uniform skewed; do
  mkdir -p "$work/$routing"
  routing_bias "$routing"
  for ((r = 1; r <= rounds; ++r)); do
    hyla_bench "$work/$routing/hyla-r$r" "$memory"
    [[ -n $llama ]] && llama_bench "$work/$routing/llama-r$r" no-repack
  done
done

# 4. llama.cpp's defaults.
if [[ -n $llama ]]; then
  routing_bias uniform
  llama_bench "$work/uniform/llama-defaults" defaults
fi

# 5. The cache-size sweep.
for routing in uniform skewed; do
  routing_bias "$routing"
  for mem in $sweep; do hyla_bench "$work/$routing/sweep-${mem%\%}" "$mem"; done
done

# 6. The routing's skew.
for routing in uniform skewed; do
  routing_bias "$routing"
  out="$work/$routing/skew.json"
  [[ -f $out ]] && continue
  echo "== hyla bench -p 512, $routing routing -> $out" >&2
  "$hyla" bench -m "$gguf" --expert-memory "$memory" -p 512 -n 1 -r 1 -t 2 --json > "$out.tmp" && mv "$out.tmp" "$out"
done
routing_bias uniform

# 7. The safetensors directory: generate, serve, bench.
st="$work/kl48-st"
if [[ ! -f $work/safetensors.json ]]; then
  if [[ ! -f $st/config.json ]]; then
    avail=$(df -B1 --output=avail "$work" | tail -1)
    (( avail > 35 * 1000 ** 3 )) || { echo "real-size: $work has $((avail / 1000 ** 3)) GB free; the directory needs ~30 GB and headroom" >&2; exit 1; }
    echo "== writing $st (about 20 minutes)" >&2
    /usr/bin/time -v -o "$work/init-st.time" "$hyla" init --config "$config" --out "$st" --weight-dtype bf16 \
      --experts mxfp4 --tokenizer data/kjv/tokenizer.json >&2
  fi
  echo "== hyla generate on $st ($(cold) page cache)" >&2
  /usr/bin/time -v -o "$work/generate-st.time" "$hyla" generate -m "$st" --dtype bf16 --expert-memory "$memory" \
    --expert-prefetch on -p "In the beginning God created the heaven and the earth." -n "$tg" --temperature 0 --ignore-eos \
    > "$work/generate-st.out" 2>&1
  echo "== hyla serve on $st, one completion ($(cold) page cache)" >&2
  port=${PORT:-18151}
  /usr/bin/time -v -o "$work/serve-st.time" "$hyla" serve -m "$st" --dtype bf16 --expert-memory "$memory" \
    --expert-prefetch on --port "$port" -c 512 --max-sequences 1 > "$work/serve-st.log" 2>&1 &
  server=$!
  until curl -sf "localhost:$port/health" > /dev/null; do
    kill -0 "$server" 2> /dev/null || { echo "real-size: hyla serve exited: $(tail -3 "$work/serve-st.log")" >&2; exit 1; }
    sleep 2
  done
  start=$(date +%s.%N)
  curl -sf "localhost:$port/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"prompt\": \"In the beginning God created the heaven and the earth.\", \"max_tokens\": $tg, \"temperature\": 0, \"ignore_eos\": true}" \
    > "$work/serve-st.json"
  serve_s=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {print b - a}')
  pkill -TERM -P "$server"  # hyla, not /usr/bin/time, which then writes the server's figures
  wait "$server" || true
  hyla_bench "$work/st-bench" "$memory"
  gen_tps=$(grep -o 'generated [0-9]* tokens: [0-9.]* tokens/s' "$work/generate-st.out" | awk '{print $4}')
  jq -n --argjson bytes "$(du -sb "$st" | cut -f1)" --argjson shards "$(ls "$st"/*.safetensors | wc -l)" \
    --argjson gen "${gen_tps:-null}" --argjson gen_rss "$(peak_rss "$work/generate-st.time")" \
    --argjson serve_s "$serve_s" --argjson serve_tokens "$(jq '.usage.completion_tokens' "$work/serve-st.json")" \
    --argjson serve_rss "$(peak_rss "$work/serve-st.time")" --arg text "$(jq -r '.choices[0].text' "$work/serve-st.json")" \
    --argjson bench "$(jq -c . "$work/st-bench.json")" \
    '{dir_bytes: $bytes, shards: $shards, generate_tokens_per_s: $gen, generate_peak_rss: $gen_rss,
      serve_seconds: $serve_s, serve_completion_tokens: $serve_tokens, serve_peak_rss: $serve_rss, serve_text: $text,
      bench: $bench}' > "$work/safetensors.json"
  rm -rf "$st"
fi
echo "safetensors: $(jq -c 'del(.bench)' "$work/safetensors.json")" >&2

# 8. The figures.
hyla_tg() { jq --arg t "tg$tg" '[.rows[] | select(.test == $t) | .tokens_per_s][0]' "$1"; }
llama_tg() { jq --argjson n "$tg" '[(.rows // [])[] | select(.n_gen == $n) | .avg_ts][0] // null' "$1"; }
disk_gb() { awk -F': ' '/File system inputs/ {printf "%.1f", $2 * 512 / 1e9}' "$1"; }  # bytes read from disk by a command
{
  echo "| routing | hyla tg$tg t/s | llama.cpp tg$tg t/s | hyla peak RSS | llama.cpp peak RSS | hyla hit rate | disk GB read a command, hyla / llama.cpp | top 20% routed (pp512) |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  for routing in uniform skewed; do
    h=$(for f in "$work/$routing"/hyla-r*.json; do hyla_tg "$f"; done | grep -v null | stats)
    l=$(for f in "$work/$routing"/llama-r*.json; do [[ -f $f ]] && llama_tg "$f"; done | grep -v null | stats)
    hr=$(for f in "$work/$routing"/hyla-r*.json; do jq .peak_rss "$f"; done | max)
    lr=$(for f in "$work/$routing"/llama-r*.json; do [[ -f $f ]] && jq .peak_rss "$f"; done | max)
    hit=$(for f in "$work/$routing"/hyla-r*.json; do jq --arg t "tg$tg" '.rows[] | select(.test == $t) | .expert_hit_rate' "$f"; done | mean)
    top=$(jq '.[] | select(.test == "pp512") | .expert_top20_share' "$work/$routing/skew.json" 2> /dev/null || echo -)
    hd=$(for f in "$work/$routing"/hyla-r*.time; do disk_gb "$f"; echo; done | mean)
    ld=$(for f in "$work/$routing"/llama-r*.time; do [[ -f $f ]] && { disk_gb "$f"; echo; }; done | mean)
    gb() { awk -v b="$1" 'BEGIN {printf (b == "" ? "-" : "%.2f GB"), b / 1e9}'; }
    pct() { awk -v x="$1" 'BEGIN {printf (x == "-" || x == "null" ? "-" : "%.1f%%"), 100 * x}'; }
    echo "| $routing | $h | $l | $(gb "$hr") | $(gb "$lr") | $(pct "$hit") | $hd / $ld | $(pct "$top") |"
  done
  echo
  echo "| routing | cache | slots per layer | tg$tg t/s | hit rate | MB read per token | stall ms per token | peak RSS |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  for routing in uniform skewed; do
    for mem in $sweep; do
      f="$work/$routing/sweep-${mem%\%}.json"
      [[ -f $f ]] || continue
      [[ $(jq .exit_status "$f") == 0 ]] || { echo "| $routing | $mem | | exit $(jq .exit_status "$f") | | | | |"; continue; }
      jq -r --arg t "tg$tg" --arg r "$routing" '.peak_rss as $rss | .memory as $m | .rows[] | select(.test == $t) |
        "| \($r) | \($m) | \(.expert_slots_per_layer) | \(.tokens_per_s * 1000 | round / 1000) | \(.expert_hit_rate * 1000 | round / 10)% | \(.expert_bytes_per_token / 1e6 | round) | \(.expert_stall_ms_per_token | round) | \($rss / 1e9 * 100 | round / 100) GB |"' "$f"
    done
  done
} >&2
line() {  # ROUTING -> hyla_tg llama_tg hyla_peak_rss llama_peak_rss as JSON fields
  local routing=$1 suffix=$2
  local ht lt hr lr
  ht=$(for f in "$work/$routing"/hyla-r*.json; do hyla_tg "$f"; done | grep -v null | mean)
  lt=$(for f in "$work/$routing"/llama-r*.json; do [[ -f $f ]] && llama_tg "$f"; done | grep -v null | mean)
  hr=$(for f in "$work/$routing"/hyla-r*.json; do jq .peak_rss "$f"; done | max)
  lr=$(for f in "$work/$routing"/llama-r*.json; do [[ -f $f ]] && jq .peak_rss "$f"; done | max)
  echo "\"hyla_tg$suffix\":$ht,\"llama_tg$suffix\":${lt:-null},\"hyla_peak_rss$suffix\":$hr,\"llama_peak_rss$suffix\":${lr:-null}"
}
file_bytes=$(stat -c %s "$gguf")
summary="{\"file_bytes\":$file_bytes,\"ram_bytes\":$ram,$(line uniform ""),$(line skewed _skewed)}"

# 9. The quantised files (Q2_K resident, an IQ1_S/Q2_K mix split and offloaded) against llama.cpp.
if [[ -n $llama ]]; then
  summary=$(jq -c -n --argjson a "$summary" --argjson b "$(bash scripts/real-size-quant.sh "$build" "$work" "$llama" | tail -1)" '$a + $b')
fi
[[ ${CLEAN:-0} == 1 ]] && rm -f "$gguf" && echo "real-size: deleted $gguf" >&2
echo "$summary"
