// Skinny GEMM for decode: out[M,N] = x[M,K] · w[N,K]ᵀ with w bf16 row-major, x f32 or bf16,
// out of x's dtype and 1 <= M <= 8, as graph op linear computes it on the cuBLAS path: f32 x
// is rounded to bf16 first (as linear's cast does before its bf16 GEMM), products are summed
// in f32 and a bf16 result is rounded once, at the end (round to nearest even).
//
// Layout: each warp owns R consecutive weight rows (output columns n) for all M rows of x;
// rows past N repeat the last row and are not stored. The warp streams its rows with 16-byte
// loads (8 bf16 per lane, 512 contiguous bytes per warp and row), U loads per row in flight
// before it multiplies them, and reads the matching 8 elements of each row of x through the
// read-only cache (x is small and every warp reads the same bytes). Weight loads skip L1 so
// they do not evict x. Each lane keeps R*M partial sums; warp shuffles reduce them and lane
// 0 stores. Blocks are independent: the grid is ceil(N / (R * warps per block)).
//
// The fused forms (linear_swiglu, linear_qkv_rope) pick the warp's R rows so that its
// epilogue has every pair it needs (gate row j and up row I + j; rows f and half + f of one
// head) and finish one output per lane, instead of storing the projections.
//
// K must be a multiple of 8 and x and w 16-byte aligned (backend/cuda sends other products
// to cuBLAS).
//
// The file holds templates only: backend/cuda appends the instantiation it needs, such as
// GEMV(gemv_bf16_m1_r1_u4, 1, 1, 4, BF16), and compiles each on first use.

// GemvX reads 8 elements of x from a 16-byte aligned position as bf16 values widened to f32.
template <class X> struct GemvX;

template <> struct GemvX<BF16> {
  static __device__ __forceinline__ void load8(const bf16* x, i64 i, float* f) {
    bf16x8(__ldg((const uint4*)(x + i)), f);
  }
};

template <> struct GemvX<F32> {
  static __device__ __forceinline__ void load8(const float* x, i64 i, float* f) {
    float4 a = __ldg((const float4*)(x + i)), b = __ldg((const float4*)(x + i + 4));
    f[0] = BF16::round(a.x);
    f[1] = BF16::round(a.y);
    f[2] = BF16::round(a.z);
    f[3] = BF16::round(a.w);
    f[4] = BF16::round(b.x);
    f[5] = BF16::round(b.y);
    f[6] = BF16::round(b.z);
    f[7] = BF16::round(b.w);
  }
};

// gemv_fma8 adds to acc[r][m] the products of the 8 weights wv[r] with x[m, k..k+8).
template <int M, int R, class X>
__device__ __forceinline__ void gemv_fma8(float (&acc)[R][M], const uint4 (&wv)[R], const typename X::T* x, int K,
                                          i64 k) {
  float wf[R][8];
#pragma unroll
  for (int r = 0; r < R; ++r) bf16x8(wv[r], wf[r]);
#pragma unroll
  for (int m = 0; m < M; ++m) {
    float xf[8];
    GemvX<X>::load8(x, (i64)m * K + k, xf);
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r][m] = fmaf(wf[r][j], xf[j], acc[r][m]);
  }
}

// gemv_dot_impl computes, for the R weight rows wr[r] of K and the M rows of x, the dot products
// acc[r][m]; on return every lane of the warp holds them. The first weights are constant:
// they load while the previous kernel finishes (PDL); after_wait() runs right after the
// wait, before the rest of the weights stream in (an epilogue's reads of inputs other
// kernels write go there, their latency hidden behind the loads in flight).
template <int M, int R, int U, class X, class F>
__device__ __forceinline__ void gemv_dot_impl(float (&acc)[R][M], const uint4* const (&wr)[R],
                                         const typename X::T* __restrict__ x, int K, F after_wait) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  const int K8 = K >> 3;  // 16-byte chunks per row
  const int full = K8 / (32 * U) * (32 * U);
  uint4 wv[U][R];
  if (full > 0) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) wv[u][r] = ld_nc_v4(wr[r] + 32 * u + lane);
  }
  pdl_begin();
  after_wait();
  for (int c0 = 0; c0 < full; c0 += 32 * U) {
    if (c0 > 0) {
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < R; ++r) wv[u][r] = ld_nc_v4(wr[r] + c0 + 32 * u + lane);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) gemv_fma8<M, R, X>(acc, wv[u], x, K, (i64)(c0 + 32 * u + lane) * 8);
  }
  for (int c = full + lane; c < K8; c += 32) {
    uint4 wv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wv[r] = ld_nc_v4(wr[r] + c);
    gemv_fma8<M, R, X>(acc, wv, x, K, (i64)c * 8);
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = warp_sum(acc[r][m]);
}

// gemv_warp is the warp's index in the grid.
__device__ __forceinline__ i64 gemv_warp() { return (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); }

template <int M, int R, int U, class X>
__device__ __forceinline__ void gemv_impl(typename X::T* __restrict__ out, const typename X::T* __restrict__ x,
                                          const bf16* __restrict__ w, int N, int K) {
  const i64 n0 = gemv_warp() * R;
  if (n0 >= N) return;  // touches no memory
  const uint4* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = (const uint4*)(w + (n0 + r < N ? n0 + r : (i64)N - 1) * K);
  float acc[R][M];
  gemv_dot_impl<M, R, U, X>(acc, wr, x, K, [] {});
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m)
      if (lane == 0 && n0 + r < N) X::store(out, (i64)m * N + n0 + r, acc[r][m]);
}

// gemv_pick returns acc[r][m] and acc[P + r][m] for the (r, m) = (l / M, l % M) of lane l <
// P*M: the two halves of one epilogue item (unrolled selects, so acc stays in registers).
template <int M, int R>
__device__ __forceinline__ void gemv_pick(const float (&acc)[R][M], int l, float* a, float* b) {
  const int P = R / 2;
#pragma unroll
  for (int r = 0; r < P; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m)
      if (l == r * M + m) {
        *a = acc[r][m];
        *b = acc[P + r][m];
      }
}

// gemv_swiglu_impl is linear_swiglu on the gemv: out[M,I] = silu(g) * u with g = x · w[j]
// and u = x · w[I + j] rounded to X, then as swiglu_packed (packed.cu) computes it. Each warp
// owns P = R/2 outputs j0..j0+P-1 and reads their gate rows and up rows; lane r*M + m
// finishes output (j0 + r, m). Grid: ceil(I / (P * warps per block)).
template <int M, int R, int U, class X>
__device__ __forceinline__ void gemv_swiglu_impl(typename X::T* __restrict__ out, const typename X::T* __restrict__ x,
                                                 const bf16* __restrict__ w, int I, int K) {
  const int P = R / 2;
  const i64 j0 = gemv_warp() * P;
  if (j0 >= I) return;
  const uint4* wr[R];
#pragma unroll
  for (int r = 0; r < P; ++r) {
    const i64 j = j0 + r < I ? j0 + r : (i64)I - 1;
    wr[r] = (const uint4*)(w + j * K);
    wr[P + r] = (const uint4*)(w + (I + j) * K);
  }
  float acc[R][M];
  gemv_dot_impl<M, R, U, X>(acc, wr, x, K, [] {});
  const int l = threadIdx.x & 31;
  if (l >= P * M || j0 + l / M >= I) return;
  float g, u;
  gemv_pick<M, R>(acc, l, &g, &u);
  g = X::round(g);
  const float sg = X::round(g / (1.0f + expf(-g)));
  X::store(out, (i64)(l % M) * I + j0 + l / M, sg * X::round(u));
}

// gemv_qkv_rope_impl is linear_qkv_rope on the gemv: the packed q|k|v projections of x[M =
// B*S, K] (H heads of q, then KV of k, then KV of v, each D = 2*half wide) rounded to X, laid
// out as q[B,H,S,D], k[B,KV,S,D], v[B,KV,S,D], q and k rotated at positions[B,S] as qkv_rope
// (packed.cu) rotates them. Each warp owns P = R/2 rotation pairs (head, f0..f0+P-1) of one
// head (P divides half) and reads their rows f and half + f; lane r*M + m finishes pair
// (f0 + r) of token m, its cos and sin computed while the weights stream in. Grid:
// ceil((H + 2*KV) * half / (P * warps per block)).
template <int M, int R, int U, class X, class Pos>
__device__ __forceinline__ void gemv_qkv_rope_impl(typename X::T* q, typename X::T* k, typename X::T* v,
                                                   const typename X::T* __restrict__ x, const bf16* __restrict__ w,
                                                   const Pos* pos, const float* inv_freq, int H, int KV, int S, int half,
                                                   float scaling, int scaled, int K) {
  const int P = R / 2;
  const i64 p0 = gemv_warp() * P;
  if (p0 >= (i64)(H + 2 * KV) * half) return;
  const int head = (int)(p0 / half), f0 = (int)(p0 % half), D = 2 * half;
  const uint4* wr[R];
#pragma unroll
  for (int r = 0; r < P; ++r) {
    wr[r] = (const uint4*)(w + ((i64)head * D + f0 + r) * K);
    wr[P + r] = (const uint4*)(w + ((i64)head * D + half + f0 + r) * K);
  }
  const int l = threadIdx.x & 31, m = l % M, f = f0 + l / M;
  const bool mine = l < P * M, rotated = head < H + KV;
  float c = 0.f, sn = 0.f;
  float acc[R][M];
  gemv_dot_impl<M, R, U, X>(acc, wr, x, K, [&] {
    if (mine && rotated) {
      rope_cos_sin((float)pos[m], inv_freq[f], scaling, scaled, &c, &sn);
      c = X::round(c);
      sn = X::round(sn);
    }
  });
  if (!mine) return;
  float x1, x2;
  gemv_pick<M, R>(acc, l, &x1, &x2);
  x1 = X::round(x1);
  x2 = X::round(x2);
  const i64 b = m / S, s = m % S;
  if (head < H) {
    rope_store<X>(q, ((b * H + head) * S + s) * D + f, half, x1, x2, c, sn);
  } else if (rotated) {
    rope_store<X>(k, ((b * KV + head - H) * S + s) * D + f, half, x1, x2, c, sn);
  } else {
    const i64 i = ((b * KV + head - H - KV) * S + s) * D + f;
    X::store(v, i, x1);
    X::store(v, i + half, x2);
  }
}

// GEMV instantiates one kernel: blocks of up to 256 threads (whole warps), grid
// ceil(N / (R * warps per block)).
#define GEMV(NAME, M, R, U, X)                                                                                \
  extern "C" __global__ void __launch_bounds__(256) NAME(X::T* out, const X::T* x, const bf16* w, int N, int K) { \
    gemv_impl<M, R, U, X>(out, x, w, N, K);                                                                   \
  }

// GEMV_SWIGLU instantiates linear_swiglu's kernel (R even): grid ceil(I / (R/2 * warps)).
#define GEMV_SWIGLU(NAME, M, R, U, X)                                                                          \
  extern "C" __global__ void __launch_bounds__(256) NAME(X::T* out, const X::T* x, const bf16* w, int I, int K) { \
    gemv_swiglu_impl<M, R, U, X>(out, x, w, I, K);                                                            \
  }

// GEMV_QKV_ROPE instantiates linear_qkv_rope's kernel (R even, R/2 dividing half) for
// positions of type POS: grid ceil((H + 2*KV) * half / (R/2 * warps)).
#define GEMV_QKV_ROPE(NAME, M, R, U, X, POS)                                                                   \
  extern "C" __global__ void __launch_bounds__(256)                                                           \
      NAME(X::T* q, X::T* k, X::T* v, const X::T* x, const bf16* w, const POS* pos, const float* inv_freq, int H, \
           int KV, int S, int half, float scaling, int scaled, int K) {                                          \
    gemv_qkv_rope_impl<M, R, U, X, POS>(q, k, v, x, w, pos, inv_freq, H, KV, S, half, scaling, scaled, K);      \
  }
