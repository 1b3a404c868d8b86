// Rotary position embedding of x[B,N,S,D] (q with N=H heads, or k with N=KV) at
// positions[B,S], as graph op rope defines it: angle = f32(position) * inv_freq[i] in f32,
// cos and sin in double rounded to f32, times scaling when scaled, rounded to the tables'
// dtype T; then y1 = r(r(x1*c) + r(-x2*s)), y2 = r(r(x2*c) + r(x1*s)) with r rounding to
// x's dtype. One thread per (row, i) for i < D/2.

template <class X, class T, class P>
__device__ __forceinline__ void rope_impl(typename X::T* out, const typename X::T* x, const P* pos, const float* inv_freq,
                                          int heads, int S, int half, float scaling, int scaled, i64 total) {
  pdl_begin();
  i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= total) return;
  int f = (int)(i % half);
  i64 row = i / half;
  int s = (int)(row % S);
  i64 b = row / ((i64)heads * S);
  float c, sn;
  rope_cos_sin((float)pos[b * S + s], inv_freq[f], scaling, scaled, &c, &sn);
  c = T::round(c);
  sn = T::round(sn);
  i64 base = row * (2 * (i64)half);
  float x1 = X::load(x, base + f), x2 = X::load(x, base + half + f);
  rope_store<X>(out, base + f, half, x1, x2, c, sn);
}

#define ROPE(NAME, X, TAB, P)                                                                                        \
  extern "C" __global__ void NAME(X::T* out, const X::T* x, const P* pos, const float* inv_freq, int heads, int S,   \
                                  int half, float scaling, int scaled, i64 total) {                                  \
    rope_impl<X, TAB, P>(out, x, pos, inv_freq, heads, S, half, scaling, scaled, total);                             \
  }
ROPE(rope_f32_i32, F32, F32, int)
ROPE(rope_f32_i64, F32, F32, i64)
ROPE(rope_bf16_i32, BF16, BF16, int)
ROPE(rope_bf16_i64, BF16, BF16, i64)
