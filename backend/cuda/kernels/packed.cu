// Kernels of the fused ops over packed projections: qkv_rope, qkv_norm_rope and
// swiglu_packed. They read the parts of a fused GEMM's output in place, with the numerics of
// rope.cu, norm.cu and of swiglu in elementwise.cu.

// packed_rope_table fills tab with the cos (tab[0, half)) and sin (tab[half, 2*half)) of
// position p, rounded to X, with the block's threads, then waits for the block.
template <class X>
__device__ __forceinline__ void packed_rope_table(float* tab, float p, const float* inv_freq, int half, float scaling,
                                                  int scaled) {
  for (int f = threadIdx.x; f < half; f += blockDim.x) {
    float c, sn;
    rope_cos_sin(p, inv_freq[f], scaling, scaled, &c, &sn);
    tab[f] = X::round(c);
    tab[half + f] = X::round(sn);
  }
  __syncthreads();
}

// qkv_rope: x[B,S,(H+2*KV)*D] (per token: H heads of q, KV of k, KV of v, each D = 2*half
// wide) at positions[B,S] -> q[B,H,S,D] and k[B,KV,S,D] rotated as rope.cu rotates them,
// and v[B,KV,S,D] copied. Block (row, y) serves token row = b*S + s and the work items
// [y*span, (y+1)*span) of that row: first the (H+KV)*half rotation pairs (head, f), then the
// KV*D elements of v. The block first computes the row's cos and sin tables (half of each)
// into shared memory (8*half bytes of dynamic shared memory): angle = f32(position) *
// inv_freq[f] in f32, cos and sin in double rounded to f32, times scaling when scaled,
// rounded to x's dtype; then y1 = r(r(x1*c) + r(-x2*s)), y2 = r(r(x2*c) + r(x1*s)).
template <class X, class P>
__device__ __forceinline__ void qkv_rope_impl(typename X::T* q, typename X::T* k, typename X::T* v,
                                              const typename X::T* x, const P* pos, const float* inv_freq, int H,
                                              int KV, int S, int half, float scaling, int scaled, int span) {
  pdl_begin();
  extern __shared__ float tab[];  // cos [half], then sin [half]
  i64 row = blockIdx.x;
  packed_rope_table<X>(tab, (float)pos[row], inv_freq, half, scaling, scaled);
  int D = 2 * half;
  i64 b = row / S, s = row % S;
  const typename X::T* xr = x + row * (i64)(H + 2 * KV) * D;
  int rot = (H + KV) * half, total = rot + KV * D;
  int lo = blockIdx.y * span, hi = min(total, lo + span);
  for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    if (i < rot) {
      int h = i / half, f = i % half;  // h counts q heads, then k heads: x holds them in that order
      typename X::T* out = q;
      i64 nh = H, hh = h;
      if (h >= H) {
        out = k;
        nh = KV;
        hh = h - H;
      }
      i64 dst = ((b * nh + hh) * S + s) * D;
      float x1 = X::load(xr, (i64)h * D + f), x2 = X::load(xr, (i64)h * D + half + f);
      rope_store<X>(out, dst + f, half, x1, x2, tab[f], tab[half + f]);
    } else {
      int j = i - rot, hh = j / D, d = j % D;
      v[((b * KV + hh) * S + s) * D + d] = xr[(i64)(H + KV) * D + j];
    }
  }
}

#define QKV_ROPE(NAME, X, P)                                                                                         \
  extern "C" __global__ void NAME(X::T* q, X::T* k, X::T* v, const X::T* x, const P* pos, const float* inv_freq,     \
                                  int H, int KV, int S, int half, float scaling, int scaled, int span) {             \
    qkv_rope_impl<X, P>(q, k, v, x, pos, inv_freq, H, KV, S, half, scaling, scaled, span);                           \
  }
QKV_ROPE(qkv_rope_f32_i32, F32, int)
QKV_ROPE(qkv_rope_f32_i64, F32, i64)
QKV_ROPE(qkv_rope_bf16_i32, BF16, int)
QKV_ROPE(qkv_rope_bf16_i64, BF16, i64)

// qkv_norm_rope: qkv_rope with each head of q and of k normalised first, as rmsnorm
// (norm.cu) normalises a row: ss = the f32 squares summed in double, inv = rms_inv(ss),
// y = r(w[d] * r(v * inv)) with w = q_norm[D] for q's heads and k_norm[D] for k's (the host
// takes only weights whose promotion with X is X); then (y1, y2) rotated as qkv_rope rotates
// them. v is copied. Block (row, y) serves token row = b*S + s and one warp per head: the
// heads y*warps + w, y*warps + w + gridDim.y*warps, ... of the row's H + 2*KV (q's, k's,
// then v's, in x's order). 8*half bytes of dynamic shared memory hold the cos and sin tables.
template <class X, class W, class P>
__device__ __forceinline__ void qkv_norm_rope_impl(typename X::T* q, typename X::T* k, typename X::T* v,
                                                   const typename X::T* x, const typename W::T* qw,
                                                   const typename W::T* kw, const P* pos, const float* inv_freq,
                                                   int H, int KV, int S, int half, float scaling, int scaled,
                                                   float eps) {
  pdl_begin();
  extern __shared__ float tab[];  // cos [half], then sin [half]
  const i64 row = blockIdx.x;
  packed_rope_table<X>(tab, (float)pos[row], inv_freq, half, scaling, scaled);
  const int D = 2 * half, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  const i64 b = row / S, s = row % S;
  const typename X::T* xr = x + row * (i64)(H + 2 * KV) * D;
  for (int h = blockIdx.y * warps + (threadIdx.x >> 5); h < H + 2 * KV; h += gridDim.y * warps) {
    if (h >= H + KV) {
      const int hh = h - H - KV;
      for (int d = lane; d < D; d += 32) v[((b * KV + hh) * S + s) * D + d] = xr[(i64)h * D + d];
      continue;
    }
    const typename W::T* w = h < H ? qw : kw;
    typename X::T* out = h < H ? q : k;
    const i64 nh = h < H ? H : KV, hh = h < H ? h : h - H;
    double ss = 0.0;
    for (int f = lane; f < half; f += 32) {
      const float x1 = X::load(xr, (i64)h * D + f), x2 = X::load(xr, (i64)h * D + half + f);
      ss += (double)(x1 * x1);
      ss += (double)(x2 * x2);
    }
    const float inv = rms_inv(warp_sum_d(ss), D, eps);
    const i64 dst = ((b * nh + hh) * S + s) * D;
    for (int f = lane; f < half; f += 32) {
      const float x1 = X::load(xr, (i64)h * D + f), x2 = X::load(xr, (i64)h * D + half + f);
      const float y1 = X::round(W::load(w, f) * X::round(x1 * inv));
      const float y2 = X::round(W::load(w, half + f) * X::round(x2 * inv));
      rope_store<X>(out, dst + f, half, y1, y2, tab[f], tab[half + f]);
    }
  }
}

#define QKV_NORM_ROPE(NAME, X, W, P)                                                                             \
  extern "C" __global__ void NAME(X::T* q, X::T* k, X::T* v, const X::T* x, const W::T* qw, const W::T* kw,      \
                                  const P* pos, const float* inv_freq, int H, int KV, int S, int half,           \
                                  float scaling, int scaled, float eps) {                                        \
    qkv_norm_rope_impl<X, W, P>(q, k, v, x, qw, kw, pos, inv_freq, H, KV, S, half, scaling, scaled, eps);        \
  }
QKV_NORM_ROPE(qkv_norm_rope_f32_f32_i32, F32, F32, int)
QKV_NORM_ROPE(qkv_norm_rope_f32_f32_i64, F32, F32, i64)
QKV_NORM_ROPE(qkv_norm_rope_f32_bf16_i32, F32, BF16, int)
QKV_NORM_ROPE(qkv_norm_rope_f32_bf16_i64, F32, BF16, i64)
QKV_NORM_ROPE(qkv_norm_rope_bf16_bf16_i32, BF16, BF16, int)
QKV_NORM_ROPE(qkv_norm_rope_bf16_bf16_i64, BF16, BF16, i64)

// swiglu_packed: x[rows, 2I] (gate then up per row) -> out[rows, I] = round(silu(gate)) * up,
// silu(x) = x / (1 + exp(-x)) as swiglu in elementwise.cu. Grid-stride over the n = rows*I
// outputs.
template <class X>
__device__ __forceinline__ void swiglu_packed_impl(typename X::T* out, const typename X::T* x, i64 I, i64 n) {
  pdl_begin();
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    i64 r = i / I, j = i % I;
    float g = X::load(x, 2 * r * I + j);
    float sg = X::round(g / (1.0f + expf(-g)));
    X::store(out, i, sg * X::load(x, (2 * r + 1) * I + j));
  }
}

#define SWIGLU_PACKED(NAME, X)                                                                                       \
  extern "C" __global__ void NAME(X::T* out, const X::T* x, i64 I, i64 n) { swiglu_packed_impl<X>(out, x, I, n); }
SWIGLU_PACKED(swiglu_packed_f32, F32)
SWIGLU_PACKED(swiglu_packed_bf16, BF16)
