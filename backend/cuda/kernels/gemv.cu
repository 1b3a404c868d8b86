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
// K must be a multiple of 8 and x and w 16-byte aligned (backend/cuda sends other products
// to cuBLAS).
//
// The file holds templates only: backend/cuda appends the instantiation it needs, such as
// GEMV(gemv_bf16_m1_r1_u4, 1, 1, 4, BF16), and compiles each on first use.

__device__ __forceinline__ uint4 gemv_load_w(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// gemv_bf16x8 widens the 8 bf16 of v (in memory order) to f.
__device__ __forceinline__ void gemv_bf16x8(uint4 v, float* f) {
  f[0] = __uint_as_float(v.x << 16);
  f[1] = __uint_as_float(v.x & 0xffff0000u);
  f[2] = __uint_as_float(v.y << 16);
  f[3] = __uint_as_float(v.y & 0xffff0000u);
  f[4] = __uint_as_float(v.z << 16);
  f[5] = __uint_as_float(v.z & 0xffff0000u);
  f[6] = __uint_as_float(v.w << 16);
  f[7] = __uint_as_float(v.w & 0xffff0000u);
}

// GemvX reads 8 elements of x from a 16-byte aligned position as bf16 values widened to f32.
template <class X> struct GemvX;

template <> struct GemvX<BF16> {
  static __device__ __forceinline__ void load8(const bf16* x, i64 i, float* f) {
    gemv_bf16x8(__ldg((const uint4*)(x + i)), f);
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
  for (int r = 0; r < R; ++r) gemv_bf16x8(wv[r], wf[r]);
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

template <int M, int R, int U, class X>
__device__ __forceinline__ void gemv_impl(typename X::T* __restrict__ out, const typename X::T* __restrict__ x,
                                          const bf16* __restrict__ w, int N, int K) {
  const int lane = threadIdx.x & 31;
  const i64 n0 = ((i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
  if (n0 >= N) return;  // touches no memory
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  const uint4* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = (const uint4*)(w + (n0 + r < N ? n0 + r : (i64)N - 1) * K);

  const int K8 = K >> 3;  // 16-byte chunks per row
  const int full = K8 / (32 * U) * (32 * U);
  // The first weights are constant: they load while the previous kernel finishes (PDL).
  uint4 wv[U][R];
  if (full > 0) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) wv[u][r] = gemv_load_w(wr[r] + 32 * u + lane);
  }
  pdl_begin();
  for (int c0 = 0; c0 < full; c0 += 32 * U) {
    if (c0 > 0) {
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < R; ++r) wv[u][r] = gemv_load_w(wr[r] + c0 + 32 * u + lane);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) gemv_fma8<M, R, X>(acc, wv[u], x, K, (i64)(c0 + 32 * u + lane) * 8);
  }
  for (int c = full + lane; c < K8; c += 32) {
    uint4 wv[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wv[r] = gemv_load_w(wr[r] + c);
    gemv_fma8<M, R, X>(acc, wv, x, K, (i64)c * 8);
  }

#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float v = warp_sum(acc[r][m]);
      if (lane == 0 && n0 + r < N) X::store(out, (i64)m * N + n0 + r, v);
    }
}

// GEMV instantiates one kernel: blocks of up to 256 threads (whole warps), grid
// ceil(N / (R * warps per block)).
#define GEMV(NAME, M, R, U, X)                                                                                \
  extern "C" __global__ void __launch_bounds__(256) NAME(X::T* out, const X::T* x, const bf16* w, int N, int K) { \
    gemv_impl<M, R, U, X>(out, x, w, N, K);                                                                   \
  }
