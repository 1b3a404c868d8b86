// Argmax over the last axis: out[row] = the index of the largest of x[row, 0:V], the lowest
// index on ties. NaN never wins, and a row whose first element is NaN gives 0 (what a
// sequential scan with ">" gives, as sample.Argmax does). One block per row.

struct Best {
  float v;
  int i;
};

__device__ __forceinline__ Best better(Best a, Best b) {
  if (b.i < 0) return a;
  if (a.i < 0) return b;
  if (b.v > a.v || (b.v == a.v && b.i < a.i)) return b;
  return a;
}

template <class X>
__device__ __forceinline__ void argmax_impl(int* out, const typename X::T* x, int V) {
  __shared__ Best partial[32];
  const typename X::T* row = x + (i64)blockIdx.x * V;
  Best best = {0.0f, -1};
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    float v = X::load(row, i);
    if (v == v) best = better(best, Best{v, i});  // skip NaN
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Best other = {__shfl_xor_sync(FULL_MASK, best.v, o), __shfl_xor_sync(FULL_MASK, best.i, o)};
    best = better(best, other);
  }
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) partial[warp] = best;
  __syncthreads();
  if (warp == 0) {
    best = lane < (int)(blockDim.x >> 5) ? partial[lane] : Best{0.0f, -1};
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      Best other = {__shfl_xor_sync(FULL_MASK, best.v, o), __shfl_xor_sync(FULL_MASK, best.i, o)};
      best = better(best, other);
    }
    if (lane == 0) {
      float first = X::load(row, 0);
      out[blockIdx.x] = (best.i < 0 || first != first) ? 0 : best.i;
    }
  }
}

extern "C" __global__ void argmax_f32(int* out, const float* x, int V) { argmax_impl<F32>(out, x, V); }
extern "C" __global__ void argmax_bf16(int* out, const bf16* x, int V) { argmax_impl<BF16>(out, x, V); }
