#!/usr/bin/env bash
# Issue 51: a Kimi-Linear-48B-A3B-shaped checkpoint larger than this machine's memory, served from
# disk (docs/offload.md, BENCHMARKS.md). Resumable: each step skips what its output already holds,
# so a run cut short goes on where it stopped (rm WORK/*.json to measure again).
#   bash scripts/real-size.sh [BUILD_DIR] [WORK_DIR] [LLAMA_CPP_DIR]
# 1. the GGUF (`hyla init ... --experts mxfp4`, ~29 GB, written a tensor at a time; ~20 min on 2
#    cores), after checking the free disk;
# 2. the disk's read rate, cold page cache (`echo 3 > /proc/sys/vm/drop_caches`, root only: said
#    when it did not work), with dd;
# 3. hyla bench on it for each EXPERT_MEMORY size (default 4G), prefetch on, cold page cache, peak
#    RSS from /usr/bin/time;
# 4. llama.cpp's llama-bench on the same file, the same tests: its defaults (its CPU backend repacks
#    the MXFP4 experts into anonymous memory, which does not fit: the OOM killer ends it, reported
#    so), then without the repacking (llama-cli's documented --no-repack; llama-bench lacks the flag,
#    so scripts/llama-bench-no-repack.patch adds it as LLAMA_BENCH_NO_REPACK=1: the script applies it
#    to LLAMA_CPP_DIR and rebuilds llama-bench);
# 5. one JSON line: file_bytes, ram_bytes, hyla_tg, llama_tg, hyla_peak_rss, llama_peak_rss.
# Needs jq. Decode figures are tg16 after a 16-token prompt, 2 threads.
set -euo pipefail
build=${1:-build}
work=${2:-runs/real-size}
llama=${3:-}
hyla="$build/hyla"
memories=${EXPERT_MEMORY:-4G}
config=tests/data/kimi-linear-48b-a3b.json
gguf="$work/kl48-mxfp4.gguf"
mkdir -p "$work"
ram=$(awk '/MemTotal/ {printf "%.0f", $2 * 1024}' /proc/meminfo)

cold() {  # drops the page cache; says when it cannot
  sync
  if { echo 3 > /proc/sys/vm/drop_caches; } 2> /dev/null; then echo cold; else echo "warm (drop_caches needs root)"; fi
}
peak_rss() { awk -F': ' '/Maximum resident set size/ {printf "%.0f", $2 * 1024}' "$1"; }

# 1. The file.
if [[ ! -f $gguf ]]; then
  avail=$(df -B1 --output=avail "$work" | tail -1)
  (( avail > 35 * 1000 ** 3 )) || { echo "real-size: $work has $((avail / 1000 ** 3)) GB free; the file needs ~30 GB and headroom" >&2; exit 1; }
  echo "== writing $gguf (about 20 minutes)" >&2
  /usr/bin/time -v -o "$work/init.time" "$hyla" init --config "$config" --out "$gguf" --type bf16 --experts mxfp4 >&2
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

# 3. hyla.
for mem in $memories; do
  out="$work/hyla-$mem.json"
  [[ -f $out ]] && continue
  echo "== hyla bench, --expert-memory $mem ($(cold) page cache)" >&2
  /usr/bin/time -v -o "$work/hyla-$mem.time" "$hyla" bench -m "$gguf" --expert-memory "$mem" --expert-prefetch on \
    -p 16 -n 16 -r 1 -t 2 --json > "$work/hyla-$mem.rows"
  jq --argjson rss "$(peak_rss "$work/hyla-$mem.time")" --arg mem "$mem" \
    '{memory: $mem, peak_rss: $rss, rows: .}' "$work/hyla-$mem.rows" > "$out"
done

# 4. llama.cpp.
if [[ -n $llama ]]; then
  if ! grep -q LLAMA_BENCH_NO_REPACK "$llama/tools/llama-bench/llama-bench.cpp"; then
    patch -d "$llama" -p1 < scripts/llama-bench-no-repack.patch >&2
  fi
  cmake --build "$llama/build" -j2 --target llama-bench >&2
  for setting in defaults no-repack; do
    out="$work/llama-$setting.json"
    [[ -f $out ]] && continue
    echo "== llama-bench, $setting ($(cold) page cache)" >&2
    set +e
    env $([[ $setting == no-repack ]] && echo LLAMA_BENCH_NO_REPACK=1) /usr/bin/time -v -o "$work/llama-$setting.time" \
      "$llama/build/bin/llama-bench" -m "$gguf" -p 16 -n 16 -t 2 -r 1 -o json > "$work/llama-$setting.rows" 2> "$work/llama-$setting.log"
    status=$?
    set -e
    rows=$(jq -c . "$work/llama-$setting.rows" 2> /dev/null || echo null)
    jq -n --arg setting "$setting" --argjson status "$status" --argjson rss "$(peak_rss "$work/llama-$setting.time")" \
      --argjson rows "${rows:-null}" '{setting: $setting, exit_status: $status, peak_rss: $rss, rows: $rows}' > "$out"
  done
fi

# 5. The line.
first=$(echo "$memories" | awk '{print $1}')
hyla_tg=$(jq '[.rows[] | select(.test == "tg16") | .tokens_per_s][0]' "$work/hyla-$first.json")
hyla_rss=$(jq '.peak_rss' "$work/hyla-$first.json")
llama_tg=null llama_rss=null
if [[ -f $work/llama-no-repack.json ]]; then
  llama_tg=$(jq '[(.rows // [])[] | select(.n_gen == 16) | .avg_ts][0]' "$work/llama-no-repack.json")
  llama_rss=$(jq '.peak_rss' "$work/llama-no-repack.json")
fi
jq -cn --argjson f "$file_bytes" --argjson r "$ram" --argjson ht "$hyla_tg" --argjson lt "$llama_tg" \
  --argjson hr "$hyla_rss" --argjson lr "$llama_rss" \
  '{file_bytes: $f, ram_bytes: $r, hyla_tg: $ht, llama_tg: $lt, hyla_peak_rss: $hr, llama_peak_rss: $lr}'
