#!/bin/bash
# Issue 23's runs owed on two GPUs, in one device call (kind nvidia-h200-x2): the two-GPU
# tests, then expert-, context- and tensor-parallel figures beside one GPU. Build here (no Go
# there) into a folder .git/info/exclude ignores, and carry it:
#   mkdir -p .bin/me && CGO_ENABLED=0 go build -o .bin/me/loom ./cmd/loom
#   CGO_ENABLED=0 go test -c -o .bin/me/cuda.test ./backend/cuda   (likewise engine, dist/nccl)
# then run there: bash tools/gpu2_runs.sh (BIN=.bin/me by default; logs go to $OUT or /tmp;
# PART=tests runs only the tests, PART=figures only the figures).
set -u
export NCCL_NVLS_ENABLE=0 LOOM_REQUIRE_GPU=1
B=$(cd "${BIN:-.bin/me}" && pwd); L=$B/loom; O=${OUT:-/tmp}; PART=${PART:-all}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
sumt() { echo "== $1: $(grep -cE '^\s*--- PASS' $O/$1.log) pass; $(grep -E '^(ok|FAIL|PASS)$|panic:' $O/$1.log | tr '\n' ' ')"; grep -E '^\s*--- FAIL' $O/$1.log | head -20; }
if [ "$PART" != figures ]; then
  (cd dist/nccl && timeout 200 $B/nccl.test -test.v > $O/nccl.log 2>&1)
  (cd backend/cuda && timeout 300 $B/cuda.test -test.v -test.run 'TwoGPUs|Peer|TP2|AllReduce|Collective' > $O/cuda.log 2>&1)
  (cd engine && timeout 400 $B/engine.test -test.v -test.run 'TP2|BF16LogitError|OverlappedSteps|MultiProc|ContextParallel|MoESharded' > $O/engine.log 2>&1)
  for t in nccl cuda engine; do sumt $t; done
fi
[ "$PART" = tests ] && exit 0
g() { grep -E "output tokens/s|time per output|time to first|engine:"; }
# MoE: a 24-layer Qwen3-30B-A3B copy (the whole one is 61 GB), one GPU, ep=2 both strategies, tp=2.
Q=/dev/shm/q3moe; [ -f $Q/config.json ] || $L synth qwen3-30b-a3b --layers 24 --out $Q >/dev/null 2>&1
for m in "" "--mesh ep=2" "--mesh ep=2 --set transforms.sharding_executor.ep_strategy=all_to_all" "--mesh tp=2"; do
  # Loading the 28 GB copy takes about a minute (57 GB took two in session 10).
  echo "== qwen3-30b-a3b (24 layers) $m batch 1"; timeout 240 $L bench --model $Q --device cuda --log-level warn $m --warmup 1 --num-requests 3 --concurrency 1 2>&1 | g
  echo "== qwen3-30b-a3b (24 layers) $m 64 concurrent"; timeout 300 $L bench --model $Q --device cuda --log-level warn $m --warmup 64 --num-requests 128 --concurrency 64 2>&1 | g
done
rm -rf $Q
# Context and tensor parallelism: Llama-3.1-8B.
M=/dev/shm/l8b; [ -f $M/config.json ] || $L synth llama-3.1-8b --out $M >/dev/null 2>&1
for n in 32000 100000; do
  for m in "" "--mesh cp=2" "--mesh cp=2 --set transforms.rewrite_cp_attention.cp_strategy=all_to_all"; do
    echo "== llama-3.1-8b TTFT $n $m"; timeout 200 $L bench --model $M --device cuda --log-level warn $m --input-len $n --output-len 32 --warmup 1 --num-requests 2 --concurrency 1 2>&1 | g
  done
done
for ws in 1 2; do
  echo "== llama-3.1-8b tp=$ws batch 1"; timeout 60 $L bench --model $M --device cuda --log-level warn --world-size $ws --warmup 1 --num-requests 3 --concurrency 1 2>&1 | g
  echo "== llama-3.1-8b tp=$ws 64 concurrent"; timeout 90 $L bench --model $M --device cuda --log-level warn --world-size $ws --warmup 64 --num-requests 192 --concurrency 64 2>&1 | g
done
port=8100
echo "== llama-3.1-8b tp=2, loom launch --nproc 2"
$L launch --nproc 2 -- $L serve --model $M --device cuda --world-size 2 --port $port --log-level info > $O/mp.log 2>&1 &
pid=$!
for i in $(seq 120); do curl -sf localhost:$port/health >/dev/null 2>&1 && break; sleep 1; done
H="$L bench --url http://127.0.0.1:$port --tokenizer $M --log-level warn"
timeout 60 $H --warmup 1 --num-requests 3 --concurrency 1 2>&1 | g
timeout 90 $H --warmup 64 --num-requests 192 --concurrency 64 2>&1 | g
kill $pid; wait $pid 2>/dev/null; grep -iE "error|panic" $O/mp.log | head -4
