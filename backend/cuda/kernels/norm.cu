// RMSNorm and residual-add + RMSNorm, as graph ops rmsnorm and add_rmsnorm define them
// (Hugging Face's form): y = w * round_x(x * rsqrt(mean(x^2) + eps)), in f32 math, the sum
// of squares accumulated in double. One block per row of D elements.

template <class X, class W, class O>
__device__ __forceinline__ void rmsnorm_impl(typename O::T* out, const typename X::T* x, const typename W::T* w, int D, float eps) {
  i64 base = (i64)blockIdx.x * D;
  double ss = 0.0;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float v = X::load(x, base + d);
    ss += (double)(v * v);
  }
  ss = block_sum_d(ss);
  float mean = (float)(ss / (double)D);
  float inv = (float)(1.0 / sqrt((double)(mean + eps)));
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float v = X::load(x, base + d);
    O::store(out, base + d, W::load(w, d) * X::round(v * inv));
  }
}

// sum = round_s(x + r); normed = w * round_s(sum * inv).
template <class X, class R, class W>
__device__ __forceinline__ void add_rmsnorm_impl(typename Promote<W, typename Promote<X, R>::type>::type::T* normed,
                                                 typename Promote<X, R>::type::T* sum, const typename X::T* x,
                                                 const typename R::T* r, const typename W::T* w, int D, float eps) {
  typedef typename Promote<X, R>::type S;
  typedef typename Promote<W, S>::type N;
  i64 base = (i64)blockIdx.x * D;
  double ss = 0.0;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float s = S::round(X::load(x, base + d) + R::load(r, base + d));
    S::store(sum, base + d, s);
    ss += (double)(s * s);
  }
  ss = block_sum_d(ss);
  float mean = (float)(ss / (double)D);
  float inv = (float)(1.0 / sqrt((double)(mean + eps)));
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float s = S::load(sum, base + d);  // this thread's own store above
    N::store(normed, base + d, W::load(w, d) * S::round(s * inv));
  }
}

#define RMSNORM(NAME, X, W)                                                                                          \
  extern "C" __global__ void NAME(Promote<W, X>::type::T* out, const X::T* x, const W::T* w, int D, float eps) {     \
    rmsnorm_impl<X, W, Promote<W, X>::type>(out, x, w, D, eps);                                                      \
  }
RMSNORM(rmsnorm_f32_f32, F32, F32)
RMSNORM(rmsnorm_f32_bf16, F32, BF16)
RMSNORM(rmsnorm_bf16_f32, BF16, F32)
RMSNORM(rmsnorm_bf16_bf16, BF16, BF16)

#define ADD_RMSNORM(NAME, X, R, W)                                                                                   \
  extern "C" __global__ void NAME(Promote<W, Promote<X, R>::type>::type::T* normed, Promote<X, R>::type::T* sum,     \
                                  const X::T* x, const R::T* r, const W::T* w, int D, float eps) {                   \
    add_rmsnorm_impl<X, R, W>(normed, sum, x, r, w, D, eps);                                                         \
  }
ADD_RMSNORM(add_rmsnorm_f32_f32_f32, F32, F32, F32)
ADD_RMSNORM(add_rmsnorm_f32_f32_bf16, F32, F32, BF16)
ADD_RMSNORM(add_rmsnorm_f32_bf16_f32, F32, BF16, F32)
ADD_RMSNORM(add_rmsnorm_f32_bf16_bf16, F32, BF16, BF16)
ADD_RMSNORM(add_rmsnorm_bf16_f32_f32, BF16, F32, F32)
ADD_RMSNORM(add_rmsnorm_bf16_f32_bf16, BF16, F32, BF16)
ADD_RMSNORM(add_rmsnorm_bf16_bf16_f32, BF16, BF16, F32)
ADD_RMSNORM(add_rmsnorm_bf16_bf16_bf16, BF16, BF16, BF16)
