// FP8 weights: graph ops dequantize_fp8 and linear_fp8 (graph/catalog_quant.go). A weight
// w[N,K] is f8e4m3 (float8_e4m3fn: no infinities, NaN 0x7f/0xff) or f8e5m2 (IEEE-like), one
// byte per value, and its real value is decode(w) * scale, the scale one of
//
//   scheme 0 (tensor)  scale[0]
//   scheme 1 (channel) scale[n]
//   scheme 2 (block)   scale[(n / bn) * kb + k / bk], kb = ceil(K / bk)
//
// stored as S (f32, bf16 or f16).
//
// Kernels:
//   DEQUANT_FP8       the real values rounded to O (f32, bf16 or f16), as backend/cpu's
//                     reference does: decode exactly, one f32 product with the scale, one
//                     rounding. Bit for bit the CPU's (NaN bytes give NaN).
//   FP8_GEMV          the decode GEMV of linear_fp8, modelled on gemv.cu: out[M,N] = x[M,K] ·
//                     W[N,K]ᵀ for M <= 8, x bf16 or f32, reading the weight's bytes with
//                     16-byte loads (16 values per lane and load). The scale is applied to
//                     sums, not to each weight: the weight bytes are widened to decode(w) *
//                     2^-B (B = 120 for e4m3, 112 for e5m2: the byte's exponent and mantissa
//                     bits moved into a float's, 3 integer operations a value; e4m3 NaN and
//                     e5m2 infinity/NaN bytes read as finite numbers), x is read times 2^32
//                     (exact; products and sums stay clear of f32's subnormals), products are
//                     summed in f32, and a row's sum (tensor, channel) or each 16-value chunk's
//                     sum (block: bk a power of two >= 16) is multiplied by 2^(B-32) and the
//                     scale. Against linear_fp8's decomposition (which rounds decode(w)*scale to
//                     x's dtype before the product) this differs by that rounding only: for f32
//                     x nothing but the order of the f32 operations, for bf16 x at most 2^-9 of
//                     each |x·w|. Requires K % 16 == 0 and a 16-byte aligned w and x.
//   FP8_GEMV_GENERIC  the same product for any K, alignment and block: one warp per weight row,
//                     each weight decoded exactly, times its scale, rounded to x's dtype (as
//                     the decomposition does), products summed in f32.
//
// Every kernel waits for the previous kernel (pdl_wait) before it touches memory other than
// the weight bytes, which FP8_GEMV starts loading before the wait, as gemv.cu does.
//
// The file holds templates only: backend/cuda (fp8.go) appends the instantiation it needs,
// such as FP8_GEMV(fp8_gemv_bf16_e4m3_f32_c_m1_r2_u4, 1, 2, 4, BF16, true, F32, false), and
// compiles each on first use.

typedef unsigned char u8;
typedef unsigned short f16;

// Half16 is IEEE half precision as an element type (round to nearest even, overflow to
// infinity), through the hardware conversions.
struct Half16 {
  typedef f16 T;
  static __device__ __forceinline__ float load(const f16* p, i64 i) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(p[i]));
    return f;
  }
  static __device__ __forceinline__ void store(f16* p, i64 i, float v) {
    f16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    p[i] = h;
  }
  static __device__ __forceinline__ float round(float v) {
    f16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
  }
};

// fp8_decode is the exact value of fp8 byte b (E4M3: float8_e4m3fn, else float8_e5m2).
template <bool E4M3>
__device__ __forceinline__ float fp8_decode(unsigned b) {
  const unsigned sign = (b & 0x80u) << 24;
  if (E4M3) {
    if ((b & 0x7fu) == 0x7fu) return __uint_as_float(sign | 0x7fc00000u);
    // eeeemmm into the float's exponent and mantissa: decode(b) * 2^-120 (subnormal bytes
    // give subnormal floats), then an exact multiply by 2^120.
    return __uint_as_float(sign | ((b & 0x7fu) << 20)) * 0x1p120f;
  }
  if ((b & 0x7cu) == 0x7cu) return __uint_as_float(sign | ((b & 3u) ? 0x7fc00000u : 0x7f800000u));
  return __uint_as_float(sign | ((b & 0x7fu) << 21)) * 0x1p112f;
}

// fp8_scale is the scale of weight (n, k).
template <class S>
__device__ __forceinline__ float fp8_scale(const typename S::T* scale, int scheme, int n, int k, int bn, int bk,
                                           int kb) {
  if (scheme == 0) return S::load(scale, 0);
  if (scheme == 1) return S::load(scale, n);
  return S::load(scale, (i64)(n / bn) * kb + k / bk);
}

// dequant_fp8_impl: out[N,K] = decode(w) * scale rounded to O. Grid: x over columns in
// blocks of blockDim.x, y over rows (grid-stride).
template <bool E4M3, class O, class S>
__device__ __forceinline__ void dequant_fp8_impl(typename O::T* __restrict__ out, const u8* __restrict__ w,
                                                 const typename S::T* __restrict__ scale, int N, int K, int scheme,
                                                 int bn, int bk, int kb) {
  pdl_begin();
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= K) return;
  for (int n = blockIdx.y; n < N; n += gridDim.y) {
    const i64 i = (i64)n * K + k;
    O::store(out, i, fp8_decode<E4M3>(w[i]) * fp8_scale<S>(scale, scheme, n, k, bn, bk, kb));
  }
}

#define DEQUANT_FP8(NAME, E4M3, O, S)                                                                        \
  extern "C" __global__ void __launch_bounds__(256)                                                          \
      NAME(O::T* out, const u8* w, const S::T* scale, int N, int K, int scheme, int bn, int bk, int kb) {    \
    dequant_fp8_impl<E4M3, O, S>(out, w, scale, N, K, scheme, bn, bk, kb);                                   \
  }

// fp8x4 widens the 4 fp8 bytes of q (in memory order) to decode * 2^-B in f[0..3]: two
// bytes at a time into the bf16 halves of a word (SHIFT 4 for e4m3, 3 for e5m2), then into
// floats.
template <bool E4M3>
__device__ __forceinline__ void fp8x4(unsigned q, float* f) {
  const int SHIFT = E4M3 ? 4 : 3;
  const unsigned odd = (q & 0x80008000u) | ((q & 0x7f007f00u) >> SHIFT);  // bytes 1 and 3
  const unsigned q8 = q << 8;
  const unsigned even = (q8 & 0x80008000u) | ((q8 & 0x7f007f00u) >> SHIFT);  // bytes 0 and 2
  f[0] = __uint_as_float(even << 16);
  f[1] = __uint_as_float(odd << 16);
  f[2] = __uint_as_float(even & 0xffff0000u);
  f[3] = __uint_as_float(odd & 0xffff0000u);
}

// Fp8X reads 8 elements of x from a 16-byte aligned position, widened to f32 and times 2^32.
template <class X> struct Fp8X;

template <> struct Fp8X<BF16> {
  static __device__ __forceinline__ void load8(const bf16* x, i64 i, float* f) {
    bf16x8(__ldg((const uint4*)(x + i)), f);
#pragma unroll
    for (int j = 0; j < 8; ++j) f[j] *= 0x1p32f;
  }
};

template <> struct Fp8X<F32> {
  static __device__ __forceinline__ void load8(const float* x, i64 i, float* f) {
    const float4 a = __ldg((const float4*)(x + i)), b = __ldg((const float4*)(x + i + 4));
    f[0] = a.x * 0x1p32f;
    f[1] = a.y * 0x1p32f;
    f[2] = a.z * 0x1p32f;
    f[3] = a.w * 0x1p32f;
    f[4] = b.x * 0x1p32f;
    f[5] = b.y * 0x1p32f;
    f[6] = b.z * 0x1p32f;
    f[7] = b.w * 0x1p32f;
  }
};

// fp8_fma16 adds to part[r][m] the products of the 16 weights wv[r] (bytes k..k+16 of row r)
// with x[m, k..k+16), 8 weights at a time.
template <int M, int R, class X, bool E4M3>
__device__ __forceinline__ void fp8_fma16(float (&part)[R][M], const uint4 (&wv)[R], const typename X::T* x, int K,
                                          i64 k) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float wf[R][8];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      fp8x4<E4M3>(h ? wv[r].z : wv[r].x, wf[r]);
      fp8x4<E4M3>(h ? wv[r].w : wv[r].y, wf[r] + 4);
    }
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float xf[8];
      Fp8X<X>::load8(x, (i64)m * K + k + 8 * h, xf);
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int r = 0; r < R; ++r) part[r][m] = fmaf(wf[r][j], xf[j], part[r][m]);
    }
  }
}

// fp8_chunk adds chunk c (16 bytes) of the warp's R rows to acc: directly, or (BLOCK) as a
// partial sum times the chunk's block scale (srow[r]: the scales of row r's block of rows).
template <int M, int R, class X, bool E4M3, class S, bool BLOCK>
__device__ __forceinline__ void fp8_chunk(float (&acc)[R][M], const uint4 (&wv)[R], const typename X::T* x, int K,
                                          int c, const typename S::T* const (&srow)[R], int bkshift) {
  if (!BLOCK) {
    fp8_fma16<M, R, X, E4M3>(acc, wv, x, K, (i64)c * 16);
    return;
  }
  float part[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) part[r][m] = 0.0f;
  fp8_fma16<M, R, X, E4M3>(part, wv, x, K, (i64)c * 16);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float s = S::load(srow[r], (c * 16) >> bkshift);
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = fmaf(part[r][m], s, acc[r][m]);
  }
}

// fp8_gemv_impl: each warp owns R consecutive weight rows (rows past N repeat the last row
// and are not stored); each lane keeps U 16-byte loads per row in flight. Grid:
// ceil(N / (R * warps per block)).
template <int M, int R, int U, class X, bool E4M3, class S, bool BLOCK>
__device__ __forceinline__ void fp8_gemv_impl(typename X::T* __restrict__ out, const typename X::T* __restrict__ x,
                                              const u8* __restrict__ w, const typename S::T* __restrict__ scale, int N,
                                              int K, int scheme, int bn, int bkshift, int kb) {
  const i64 n0 = ((i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
  if (n0 >= N) return;  // touches no memory
  const int lane = threadIdx.x & 31;
  const uint4* wr[R];
  const typename S::T* srow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const i64 n = n0 + r < N ? n0 + r : (i64)N - 1;
    wr[r] = (const uint4*)(w + n * K);
    srow[r] = BLOCK ? scale + (n / bn) * kb : scale;
  }
  float acc[R][M];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < M; ++m) acc[r][m] = 0.0f;
  const int K16 = K >> 4;  // 16-byte chunks per row
  const int full = K16 / (32 * U) * (32 * U);
  uint4 wv[U][R];
  if (full > 0) {
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int r = 0; r < R; ++r) wv[u][r] = ld_nc_v4(wr[r] + 32 * u + lane);
  }
  pdl_begin();
  for (int c0 = 0; c0 < full; c0 += 32 * U) {
    if (c0 > 0) {
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int r = 0; r < R; ++r) wv[u][r] = ld_nc_v4(wr[r] + c0 + 32 * u + lane);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) fp8_chunk<M, R, X, E4M3, S, BLOCK>(acc, wv[u], x, K, c0 + 32 * u + lane, srow, bkshift);
  }
  for (int c = full + lane; c < K16; c += 32) {
    uint4 v[R];
#pragma unroll
    for (int r = 0; r < R; ++r) v[r] = ld_nc_v4(wr[r] + c);
    fp8_chunk<M, R, X, E4M3, S, BLOCK>(acc, v, x, K, c, srow, bkshift);
  }
  const float unbias = E4M3 ? 0x1p88f : 0x1p80f;  // 2^(B - 32)
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float s = BLOCK ? 1.0f : S::load(scale, scheme == 1 ? n0 + r < N ? n0 + r : (i64)N - 1 : 0);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float v = warp_sum(acc[r][m]);
      if (lane == 0 && n0 + r < N) X::store(out, (i64)m * N + n0 + r, (v * unbias) * s);
    }
  }
}

#define FP8_GEMV(NAME, M, R, U, X, E4M3, S, BLOCK)                                                             \
  extern "C" __global__ void __launch_bounds__(256)                                                           \
      NAME(X::T* out, const X::T* x, const u8* w, const S::T* scale, int N, int K, int scheme, int bn, int bkshift, \
           int kb) {                                                                                          \
    fp8_gemv_impl<M, R, U, X, E4M3, S, BLOCK>(out, x, w, scale, N, K, scheme, bn, bkshift, kb);                \
  }

// fp8_gemv_generic_impl: one warp per weight row n, lanes over k; each weight is decoded,
// scaled and rounded to x's dtype as dequantize_fp8 computes it, and multiplied by x in f32.
// Grid: ceil(N / warps per block).
template <int M, class X, bool E4M3, class S>
__device__ __forceinline__ void fp8_gemv_generic_impl(typename X::T* __restrict__ out,
                                                      const typename X::T* __restrict__ x, const u8* __restrict__ w,
                                                      const typename S::T* __restrict__ scale, int N, int K,
                                                      int scheme, int bn, int bk, int kb) {
  pdl_begin();
  const i64 n = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (n >= N) return;
  const int lane = threadIdx.x & 31;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  for (int k = lane; k < K; k += 32) {
    const float wv =
        X::round(fp8_decode<E4M3>(w[n * K + k]) * fp8_scale<S>(scale, scheme, (int)n, k, bn, bk, kb));
#pragma unroll
    for (int m = 0; m < M; ++m) acc[m] = fmaf(wv, X::load(x, (i64)m * K + k), acc[m]);
  }
#pragma unroll
  for (int m = 0; m < M; ++m) {
    const float v = warp_sum(acc[m]);
    if (lane == 0) X::store(out, (i64)m * N + n, v);
  }
}

#define FP8_GEMV_GENERIC(NAME, M, X, E4M3, S)                                                                 \
  extern "C" __global__ void __launch_bounds__(256)                                                          \
      NAME(X::T* out, const X::T* x, const u8* w, const S::T* scale, int N, int K, int scheme, int bn, int bk, \
           int kb) {                                                                                         \
    fp8_gemv_generic_impl<M, X, E4M3, S>(out, x, w, scale, N, K, scheme, bn, bk, kb);                        \
  }

// fp8_quant_rows_impl prepares the FP8 GEMM of linear_fp8 (activation_scheme dynamic or
// static): x[M,K] (bf16) is quantized to float8_e4m3fn, q[M,K] = e4m3(x * (448 / amax))
// (round to nearest even, saturating at 448) with amax the largest |x| of the row (GROUPS
// false) or of each group of 128 values of the row, and its scale amax / 448 (1 for a group
// of zeros) goes to sx[m] (rows) or sx[g * gs + m * ms] (group g). The weight's scale is
// widened to f32 in sw: sw[i] = scale[0] (wmode 0) or scale[i % ld] (wmode 1, ld = N: the
// channel scales, repeated over the groups of 128 k when nsw > N), or the block scales
// (wmode 2) as stored, each row of ceil(K/128) padded with zeros to ld.
// Blocks 0..rows-1 take one row each (blockDim 256, K % 8 == 0, x 16-byte aligned): rows
// from M on pad the product (q zeros, scales 1); the blocks after them write sw, 256 values
// each.
template <class S, bool GROUPS>
__device__ __forceinline__ void fp8_quant_rows_impl(u8* __restrict__ q, float* __restrict__ sx, float* __restrict__ sw,
                                                    const bf16* __restrict__ x,
                                                    const typename S::T* __restrict__ scale, int M, int rows, int K,
                                                    int ms, int gs, int nsw, int wmode, int ld) {
  __shared__ float red[8];
  pdl_begin();
  if ((int)blockIdx.x >= rows) {
    const int i = ((int)blockIdx.x - rows) * 256 + threadIdx.x;
    if (i < nsw) {
      if (wmode < 2) {
        sw[i] = S::load(scale, wmode == 0 ? 0 : i % ld);
      } else {  // block scales [nsw / ld, kb] into rows of ld (kb = ceil(K / 128)), zeros after
        const int kb = (K + 127) >> 7, r = i / ld, c = i - r * ld;
        sw[i] = c < kb ? S::load(scale, (i64)r * kb + c) : 0.0f;
      }
    }
    return;
  }
  const int m = blockIdx.x;
  if (m >= M) {
    for (int k = threadIdx.x * 8; k < K; k += 256 * 8) *(uint2*)(q + (i64)m * K + k) = make_uint2(0, 0);
    for (int g = threadIdx.x; g < (GROUPS ? K >> 7 : 1); g += 256) sx[(i64)g * gs + (i64)m * ms] = 1.0f;
    return;
  }
  const bf16* row = x + (i64)m * K;
  float inv = 1.0f;
  if (!GROUPS) {
    float amax = 0.0f;
    for (int k = threadIdx.x * 8; k < K; k += 256 * 8) {
      float f[8];
      bf16x8(__ldg((const uint4*)(row + k)), f);
#pragma unroll
      for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(f[j]));
    }
    amax = warp_max(amax);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = amax;
    __syncthreads();
    amax = red[0];
#pragma unroll
    for (int i = 1; i < 8; ++i) amax = fmaxf(amax, red[i]);
    inv = amax > 0.0f ? 448.0f / amax : 1.0f;
    if (threadIdx.x == 0) sx[m] = amax > 0.0f ? amax / 448.0f : 1.0f;
  }
  // GROUPS: 16 lanes (8 values each) hold one group of 128; every lane runs every round so
  // that the shuffles see the whole warp.
  for (int k0 = 0; k0 < K; k0 += 256 * 8) {
    const int k = k0 + threadIdx.x * 8;
    if (!GROUPS && k >= K) break;
    float f[8];
    if (k < K) {
      bf16x8(__ldg((const uint4*)(row + k)), f);
    } else {
#pragma unroll
      for (int j = 0; j < 8; ++j) f[j] = 0.0f;
    }
    if (GROUPS) {
      float amax = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) amax = fmaxf(amax, fabsf(f[j]));
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, o));
      inv = amax > 0.0f ? 448.0f / amax : 1.0f;
      if (k < K && (threadIdx.x & 15) == 0) sx[(i64)(k >> 7) * gs + (i64)m * ms] = amax > 0.0f ? amax / 448.0f : 1.0f;
    }
    if (k >= K) continue;
    unsigned short p[4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
      asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(p[j]) : "f"(f[2 * j + 1] * inv), "f"(f[2 * j] * inv));
    uint2 v;
    v.x = (unsigned)p[0] | ((unsigned)p[1] << 16);
    v.y = (unsigned)p[2] | ((unsigned)p[3] << 16);
    *(uint2*)(q + (i64)m * K + k) = v;
  }
}

#define FP8_QUANT_ROWS(NAME, S, GROUPS)                                                                      \
  extern "C" __global__ void __launch_bounds__(256) NAME(u8* q, float* sx, float* sw, const bf16* x,          \
                                                         const S::T* scale, int M, int rows, int K, int ms,   \
                                                         int gs, int nsw, int wmode, int ld) {                \
    fp8_quant_rows_impl<S, GROUPS>(q, sx, sw, x, scale, M, rows, K, ms, gs, nsw, wmode, ld);                 \
  }
