#!/bin/bash
# Issue 17's single-GPU runs in one device call (kind nvidia-h200): the moe kernel tests over
# path and tiling, the per-launch timings, then Qwen3-30B-A3B at all 48 layers, batch 1 and 64
# concurrent, with the default experts' kernels and with the tensor-core GEMV (mmv). Build
# here (no Go there) into a folder .git/info/exclude ignores, and carry it:
#   mkdir -p .bin/me && CGO_ENABLED=0 go build -o .bin/me/loom ./cmd/loom
#   CGO_ENABLED=0 go test -c -o .bin/me/cuda.test ./backend/cuda
# then run there: bash tools/gpu_moe_runs.sh (BIN=.bin/me by default). The 57 GB checkpoint is
# written to the RAM-backed /dev/shm (the disk holds 64 GB) in about 90 s, and each loom bench
# loads it in about 25 s: the whole call takes about 5 minutes.
set -u
export NCCL_NVLS_ENABLE=0 LOOM_REQUIRE_GPU=1
B=$(cd "${BIN:-.bin/me}" && pwd); L=$B/loom
T0=$(date +%s); el() { echo "[t=$(($(date +%s) - T0))s]"; }
(cd backend/cuda && $B/cuda.test -test.v -test.run 'TestMoEMatchesCPU|TestMoEFusedDecodeBits|TestMoEGraphReplay|TestQKVNormRoPE' 2>&1 |
  grep -E '^(--- |ok|FAIL|PASS)|panic:' | head -40)
(cd backend/cuda && LOOM_CUDA_TIMINGS=1 $B/cuda.test -test.v -test.run TestMoETimings 2>&1 | grep -E 'T=|--- ' | sed 's/^ *moe_test.go:[0-9]*: //')
el
g() { grep -E "output tokens/s|time per output|model loaded|engine:"; }
Q=/dev/shm/q3; [ -f $Q/config.json ] || $L synth qwen3-30b-a3b --out $Q >/dev/null 2>&1
el
F="--device cuda --max-batch 64 --max-tokens-per-step 2048 --input-len 128 --output-len 128"
echo "== batch 1"; $L bench --model $Q $F --warmup 1 --num-requests 3 --concurrency 1 2>&1 | g; el
for path in "" mmv; do
  echo "== 64 concurrent, LOOM_CUDA_MOE_PATH=$path"
  LOOM_CUDA_MOE_PATH=$path $L bench --model $Q $F --warmup 64 --num-requests 128 --concurrency 64 2>&1 | g; el
done
