#!/usr/bin/env bash
# Training across processes on this box (issue 17): 1 process × T threads against N processes × 1
# thread under mpirun (data parallel with all-reduce, with ZeRO-1, and expert parallel over all N),
# the same model, data and batch, rounds interleaved. Per run: median tokens/s over the steps after the first few, and from metrics.jsonl
# the step split into compute, communication (the communication thread's busy time) and wait (the
# compute thread blocked on it), the expert all-to-all's time and its share of the step, with the
# bytes per step by kind against docs/distributed.md's formula (4·P all-reduce; 4·P reduce-scatter
# + 4·P/N all-gather).
#
#   bash scripts/bench-dist.sh BUILD [rounds=2] [steps=16] [config=demo]
set -euo pipefail
build=$(cd "$1" && pwd) rounds=${2:-2} steps=${3:-16} config=${4:-demo}
repo=$(cd "$(dirname "$0")/.." && pwd)
work=${WORK:-$(mktemp -d)}
mkdir -p "$work"
cores=$(nproc)
hyla="$build/hyla"
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $cores cores; work in $work" >&2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  # shared memory single-copy (CMA) stays on: it works here

data="$work/kjv"
if [[ ! -f "$data/meta.json" ]]; then
  "$hyla" data fetch kjv --out "$work/kjv.txt" >/dev/null
  "$hyla" tokenizer train --input "$work/kjv.txt" --vocab-size 4096 --out "$work/tok.json" >/dev/null
  "$hyla" data prepare --tokenizer "$work/tok.json" --input "$work/kjv.txt" --out "$data" >/dev/null
fi
# One stage of 8192-token steps at T=256, no evaluation or checkpoints: the steps alone.
layout() {  # name zero_stage expert_parallel
  cat > "$work/train-$1.json" <<JSON
{"precision": "bf16", "schedule": {"warmup_steps": 4},
 "curriculum": [{"seq_len": 256, "tokens": $((steps * 8192)), "batch_tokens": 8192}],
 "eval": {"every": 0}, "checkpoint": {"every": 0}, "log_every": 1000,
 "distributed": {"zero_stage": $2, "expert_parallel": $3}}
JSON
}
layout dp 0 1
layout zero1 1 1
layout ep 0 "$cores"

run() {  # name processes threads layout
  local out="$work/run-$1"
  rm -rf "$out"
  local command=("$hyla" train --config "$repo/configs/$config.json" --train "$work/train-$4.json" --data "$data"
                 --out "$out" --quiet -t "$3")
  if [[ $2 -gt 1 ]]; then
    mpirun --oversubscribe --bind-to none -np "$2" "${command[@]}" >/dev/null
  else
    "${command[@]}" >/dev/null
  fi
  python3 - "$out/metrics.jsonl" "$1" "$2" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()][3:]
tps = statistics.median(r["tokens_per_s"] for r in rows)
step = statistics.median(r["step_ms"] for r in rows)
line = {"run": sys.argv[2], "processes": int(sys.argv[3]), "tokens_per_s": round(tps, 1), "step_ms": round(step, 1)}
if "comm" in rows[0]:
    c = [r["comm"] for r in rows]
    wait = statistics.median(x["wait_ms"] for x in c)
    line.update(comm_ms=round(statistics.median(x["comm_ms"] for x in c), 1), wait_ms=round(wait, 1),
                compute_ms=round(step - wait, 1),
                all_to_all_ms=round(statistics.median(x["all_to_all_ms"] for x in c), 1),
                all_to_all_share=round(statistics.median(x["all_to_all_ms"] / r["step_ms"] for x, r in zip(c, rows)), 3),
                **{k: c[0][k] for k in ("all_reduce_bytes", "expert_all_reduce_bytes", "reduce_scatter_bytes",
                                        "all_gather_bytes", "all_to_all_bytes", "other_bytes")})
print(json.dumps(line))
PY
}

params=$("$hyla" init --config "$repo/configs/$config.json" --out "$work/init" --weight-dtype f32 2>&1 >/dev/null; \
         python3 -c "import json,struct,sys; f=open('$work/init/model.safetensors','rb'); n=struct.unpack('<Q',f.read(8))[0]; \
h=json.loads(f.read(n)); print(sum((v['data_offsets'][1]-v['data_offsets'][0])//4 for k,v in h.items() if k!='__metadata__'))")
echo "config $config: P = $params parameters; formula per step: all-reduce $((4 * params)) B; ZeRO-1 reduce-scatter $((4 * params)) B, all-gather ~$((4 * params / cores)) B" >&2
for round in $(seq "$rounds"); do
  echo "round $round" >&2
  run "1x$cores" 1 "$cores" dp
  run "${cores}x1" "$cores" 1 dp
  run "${cores}x1-zero1" "$cores" 1 zero1
  run "${cores}x1-ep$cores" "$cores" 1 ep
done
