#!/bin/bash
# Final benchmarks on the GPU host: loom serve + loom bench on a synthesized Llama-3.1-8B (tp=1, tp=2) and HF eager batch-1.
set -u
export NCCL_NVLS_ENABLE=0
L=${LOOM:-.bin/me/loom}; M=/dev/shm/l8b
nvidia-smi --query-gpu=name --format=csv,noheader | head -1
[ -f $M/config.json ] || $L synth llama-3.1-8b --out $M >/dev/null 2>&1
bench_server() { # $1 label, rest: serve flags
  label=$1; shift
  $L serve --model $M --device cuda --max-batch 64 --max-tokens-per-step 2048 --port 8100 --log-level warn "$@" > /tmp/serve.log 2>&1 &
  pid=$!
  for i in $(seq 120); do curl -sf localhost:8100/health >/dev/null 2>&1 && break; sleep 1; done
  B="$L bench --url http://127.0.0.1:8100 --tokenizer $M --log-level warn"
  echo "== $label batch 1 (128 in / 128 out)"; $B --warmup 1 --num-requests 3 --concurrency 1 --input-len 128 --output-len 128 2>&1 | grep -E "output tokens/s|time per output|inter-token|time to first"
  echo "== $label 64 concurrent (128/128)"; $B --warmup 64 --num-requests 128 --concurrency 64 --input-len 128 --output-len 128 2>&1 | grep -E "output tokens/s|time per output|time to first"
  echo "== $label TTFT 1024"; $B --warmup 2 --num-requests 5 --concurrency 1 --input-len 1024 --output-len 1 2>&1 | grep -E "time to first"
  kill $pid; wait $pid 2>/dev/null
  grep -iE "error|panic" /tmp/serve.log | head -5
}
bench_server "tp=1"
echo "== HF eager batch 1"; timeout 90 python3 tools/hf_llama_decode.py eager 1 2>&1 | grep -vi warn | tail -3
bench_server "tp=2" --world-size 2
