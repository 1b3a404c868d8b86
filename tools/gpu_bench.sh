#!/bin/bash
# The GPU figures of docs/PERFORMANCE.md, in one session on the GPU host (2 GPUs for tp=2):
# every GPU test (the four test binaries at once), the kernel timings, then the end-to-end
# figures. Build here (no Go there), into a folder .git/info/exclude ignores, and carry it:
#   mkdir -p .bin/me && make build && cp loom tools/hf_llama_decode.py .bin/me/
#   CGO_ENABLED=0 go test -c -o .bin/me/cuda.test ./backend/cuda   (likewise engine, dist/nccl, cubind)
# then run there: bash tools/gpu_bench.sh  (BIN=.bin/me by default; logs go to $OUT or /tmp;
# HF=1 adds the Hugging Face eager baseline, about a minute; PART=tests runs only the tests
# and kernel timings, PART=figures only the end-to-end figures, so that each fits in one
# device call).
set -u
export NCCL_NVLS_ENABLE=0 LOOM_REQUIRE_GPU=1
B=$(cd "${BIN:-.bin/me}" && pwd); L=$B/loom; M=/dev/shm/l8b; O=${OUT:-/tmp}
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
PART=${PART:-all}
if [ "$PART" != tests ]; then
  ( [ -f $M/config.json ] || $L synth llama-3.1-8b --out $M >/dev/null 2>&1; echo synth done ) &
  S=$!
fi
sumt() { echo "== $1: $(grep -cE '^\s*--- PASS' $O/$1.log) pass; $(grep -E '^(ok|FAIL|PASS)$|panic:' $O/$1.log | tr '\n' ' ')"; grep -E '^\s*--- FAIL' $O/$1.log | head -20; }
if [ "$PART" != figures ]; then
P=""
(cd cubind && timeout 200 $B/cubind.test -test.v > $O/cubind.log 2>&1) & P="$P $!"
(cd dist/nccl && timeout 200 $B/nccl.test -test.v > $O/nccl.log 2>&1) & P="$P $!"
(cd backend/cuda && timeout 240 $B/cuda.test -test.v -test.skip GemmTune > $O/cuda.log 2>&1) & P="$P $!"
(cd engine && timeout 240 $B/engine.test -test.v -test.run 'CUDA|Device|MultiProc' > $O/engine.log 2>&1) & P="$P $!"
wait $P
for t in cubind nccl cuda engine; do sumt $t; done
(cd backend/cuda && LOOM_CUDA_TIMINGS=1 timeout 60 $B/cuda.test -test.v -test.run 'PeerLatency|GemvTimings|LinearFusedTimings|PagedDecodeTimings' > $O/timings.log 2>&1)
grep -A10 "one-shot all-reduce, 2" $O/timings.log; grep -A5 "all_reduce_add_rmsnorm bf16" $O/timings.log | head -6
grep "linear + packed op" $O/timings.log
fi
[ "$PART" = tests ] && exit 0
wait $S
BB="$L bench --model $M --device cuda --log-level warn --max-batch 64 --max-tokens-per-step 2048"
g() { grep -E "output tokens/s|time per output|time to first|engine:"; }
# Each batch-1 figure also with the steps not launched ahead (--sync-steps) and with the
# fused linears' epilogues off (linear, then the packed op's kernel).
OFF="--set transforms.fuse_linear_swiglu.enabled=false --set transforms.fuse_linear_qkv_rope.enabled=false"
for ws in 2 1; do
  for v in --sync-steps "" "$OFF"; do
    echo "== tp=$ws batch 1 (128/128) $v"; timeout 60 $BB $v --world-size $ws --warmup 1 --num-requests 3 --concurrency 1 --input-len 128 --output-len 128 2>&1 | g
  done
  echo "== tp=$ws 64 concurrent (128/128)"; timeout 90 $BB --world-size $ws --warmup 64 --num-requests 128 --concurrency 64 --input-len 128 --output-len 128 2>&1 | g
  echo "== tp=$ws TTFT 1024"; timeout 60 $BB --world-size $ws --warmup 2 --num-requests 5 --concurrency 1 --input-len 1024 --output-len 1 2>&1 | g
done
port=8100
for sy in --sync-steps ""; do
  echo "== multi-process tp=2: loom launch --nproc 2 -- loom serve $sy"
  $L launch --nproc 2 -- $L serve --model $M --device cuda --world-size 2 --max-batch 64 --max-tokens-per-step 2048 --port $port --log-level info $sy > $O/mp$port.log 2>&1 &
  pid=$!
  for i in $(seq 90); do curl -sf localhost:$port/health >/dev/null 2>&1 && break; sleep 1; done
  H="$L bench --url http://127.0.0.1:$port --tokenizer $M --log-level warn"
  timeout 40 $H --warmup 1 --num-requests 3 --concurrency 1 --input-len 128 --output-len 128 2>&1 | g
  timeout 60 $H --warmup 64 --num-requests 128 --concurrency 64 --input-len 128 --output-len 128 2>&1 | g
  kill $pid; wait $pid 2>/dev/null; grep -iE "one-shot|error|panic" $O/mp$port.log | head -4
  port=$((port + 1))
done
if [ "${HF:-0}" = 1 ]; then
  echo "== Hugging Face eager batch 1"; timeout 100 python3 $B/hf_llama_decode.py eager 1 2>&1 | grep -vi warn | tail -2
fi
