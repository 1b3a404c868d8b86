// RMSNorm and residual-add + RMSNorm, as graph ops rmsnorm and add_rmsnorm define them
// (Hugging Face's form): y = w * round_x(x * rsqrt(mean(x^2) + eps)), in f32 math, the sum
// of squares accumulated in double. One block per row of D elements.

template <class X, class W, class O>
__device__ __forceinline__ void rmsnorm_impl(typename O::T* out, const typename X::T* x, const typename W::T* w, int D, float eps) {
  pdl_begin();
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
  pdl_begin();
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

// The register forms, for rows of at most NV * VEC * 1024 elements (NV * VEC <= 32): a
// block of blockDim.x threads (a multiple of 32) per row; thread i holds the vectors i,
// i + blockDim.x, ... (NV of them, VEC elements each, read with one vector load per
// operand) in registers, so x and r are read once and sum is never read back. w is loaded
// with x when a thread holds at most 16 elements, else after the reduction (fewer
// registers). The sum of squares accumulates in double per thread, then across the block
// with one barrier. D is a multiple of VEC and every operand aligned to VEC elements (the
// host checks). backend/cuda appends RMSNORM_VEC and ADD_RMSNORM_VEC instantiations.

template <class X, class W, class O, int VEC, int NV>
__device__ __forceinline__ void rmsnorm_vec_impl(typename O::T* out, const typename X::T* x, const typename W::T* w,
                                                 int D, float eps) {
  pdl_begin();
  const i64 base = (i64)blockIdx.x * D;
  const int nvec = D / VEC;
  constexpr bool early = NV * VEC <= 16;  // w loaded with x
  float xv[NV][VEC], wv[early ? NV : 1][VEC];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c < nvec) {
      vload<X, VEC>(x + base + (i64)c * VEC, xv[k]);
      if constexpr (early) vload<W, VEC>(w + (i64)c * VEC, wv[k]);
    }
  }
  double ss = 0.0;
#pragma unroll
  for (int k = 0; k < NV; ++k)
    if (threadIdx.x + k * blockDim.x < nvec)
#pragma unroll
      for (int e = 0; e < VEC; ++e) ss += (double)(xv[k][e] * xv[k][e]);
  const float inv = rms_inv(block_sum_d1(ss), D, eps);
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c < nvec) {
      const int kw = early ? k : 0;
      if constexpr (!early) vload<W, VEC>(w + (i64)c * VEC, wv[0]);
      float o[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) o[e] = wv[kw][e] * X::round(xv[k][e] * inv);
      vstore<O, VEC>(out + base + (i64)c * VEC, o);
    }
  }
}

// sum = round_s(x + r); normed = w * round_s(sum * inv), as add_rmsnorm_impl.
template <class X, class R, class W, int VEC, int NV>
__device__ __forceinline__ void add_rmsnorm_vec_impl(typename Promote<W, typename Promote<X, R>::type>::type::T* normed,
                                                     typename Promote<X, R>::type::T* sum, const typename X::T* x,
                                                     const typename R::T* r, const typename W::T* w, int D, float eps) {
  pdl_begin();
  typedef typename Promote<X, R>::type S;
  typedef typename Promote<W, S>::type N;
  const i64 base = (i64)blockIdx.x * D;
  const int nvec = D / VEC;
  constexpr bool early = NV * VEC <= 16;  // w loaded with x
  float sv[NV][VEC], wv[early ? NV : 1][VEC];
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c < nvec) {
      float rv[VEC];
      vload<X, VEC>(x + base + (i64)c * VEC, sv[k]);
      vload<R, VEC>(r + base + (i64)c * VEC, rv);
      if constexpr (early) vload<W, VEC>(w + (i64)c * VEC, wv[k]);
#pragma unroll
      for (int e = 0; e < VEC; ++e) sv[k][e] = S::round(sv[k][e] + rv[e]);
    }
  }
  double ss = 0.0;
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c < nvec) {
      vstore<S, VEC>(sum + base + (i64)c * VEC, sv[k]);
#pragma unroll
      for (int e = 0; e < VEC; ++e) ss += (double)(sv[k][e] * sv[k][e]);
    }
  }
  const float inv = rms_inv(block_sum_d1(ss), D, eps);
#pragma unroll
  for (int k = 0; k < NV; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c < nvec) {
      const int kw = early ? k : 0;
      if constexpr (!early) vload<W, VEC>(w + (i64)c * VEC, wv[0]);
      float o[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) o[e] = wv[kw][e] * S::round(sv[k][e] * inv);
      vstore<N, VEC>(normed + base + (i64)c * VEC, o);
    }
  }
}

#define RMSNORM_VEC(X, XN, W, WN, VEC, NV)                                                                          \
  extern "C" __global__ void __launch_bounds__(1024) rmsnorm_##XN##_##WN##_v##VEC##_n##NV(                          \
      Promote<W, X>::type::T* out, const X::T* x, const W::T* w, int D, float eps) {                                \
    rmsnorm_vec_impl<X, W, Promote<W, X>::type, VEC, NV>(out, x, w, D, eps);                                        \
  }

#define ADD_RMSNORM_VEC(X, XN, R, RN, W, WN, VEC, NV)                                                               \
  extern "C" __global__ void __launch_bounds__(1024) add_rmsnorm_##XN##_##RN##_##WN##_v##VEC##_n##NV(               \
      Promote<W, Promote<X, R>::type>::type::T* normed, Promote<X, R>::type::T* sum, const X::T* x, const R::T* r,  \
      const W::T* w, int D, float eps) {                                                                            \
    add_rmsnorm_vec_impl<X, R, W, VEC, NV>(normed, sum, x, r, w, D, eps);                                           \
  }
