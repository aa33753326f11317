#!/usr/bin/env bash
# Runs a command and reports its peak resident memory split as the kernel counts it: anonymous
# (what the process allocated) and file-backed (pages of memory-mapped files it touched, which the
# kernel can drop at any time), sampled every 50 ms from /proc/PID/status, plus VmHWM (the total
# peak). For `hyla convert`'s claim that memory stays bounded by one tensor (docs/kimi-llamacpp.md).
#
#   bash scripts/peak-memory.sh COMMAND [ARGS...]
set -euo pipefail
"$@" &
pid=$!
anon=0 file=0 hwm=0
while kill -0 "$pid" 2>/dev/null; do
  if status=$(cat "/proc/$pid/status" 2>/dev/null); then
    a=$(awk '/^RssAnon:/ {print $2}' <<<"$status") f=$(awk '/^RssFile:/ {print $2}' <<<"$status")
    h=$(awk '/^VmHWM:/ {print $2}' <<<"$status")
    ((${a:-0} > anon)) && anon=$a
    ((${f:-0} > file)) && file=$f
    ((${h:-0} > hwm)) && hwm=$h
  fi
  sleep 0.05
done
wait "$pid"
echo "peak memory: anonymous $((anon / 1024)) MiB, file-backed $((file / 1024)) MiB, VmHWM $((hwm / 1024)) MiB" >&2
