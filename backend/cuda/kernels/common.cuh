// Shared definitions of Loom's CUDA kernels. backend/cuda prepends this file to every
// kernel file before NVRTC compiles it, so kernels need no headers at all.
//
// Element types are traits: load widens an element to float, store rounds a float to the
// element type (round to nearest even, as package tensor does), round does both.

typedef unsigned short bf16;
typedef long long i64;

#define LOOM_INF __int_as_float(0x7f800000)
#define LOOM_NAN __int_as_float(0x7fc00000)
#define FULL_MASK 0xffffffffu

__device__ __forceinline__ float bf16_to_f32(bf16 h) { return __uint_as_float(((unsigned int)h) << 16); }

__device__ __forceinline__ bf16 f32_to_bf16(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16)((u >> 16) | 0x40u);  // NaN stays quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return (bf16)(u >> 16);
}

struct F32 {
  typedef float T;
  static __device__ __forceinline__ float load(const float* p, i64 i) { return p[i]; }
  static __device__ __forceinline__ float load_cg(const float* p, i64 i) { return __ldcg(p + i); }  // through L2
  static __device__ __forceinline__ void store(float* p, i64 i, float v) { p[i] = v; }
  static __device__ __forceinline__ float round(float v) { return v; }
};

struct BF16 {
  typedef bf16 T;
  static __device__ __forceinline__ float load(const bf16* p, i64 i) { return bf16_to_f32(p[i]); }
  static __device__ __forceinline__ float load_cg(const bf16* p, i64 i) { return bf16_to_f32(__ldcg(p + i)); }
  static __device__ __forceinline__ void store(bf16* p, i64 i, float v) { p[i] = f32_to_bf16(v); }
  static __device__ __forceinline__ float round(float v) { return bf16_to_f32(f32_to_bf16(v)); }
};

// rope_cos_sin gives the rotary cos and sin at position p and inverse frequency f as the
// decomposition computes them: the angle f32(p) * f in f32, cos and sin in double rounded
// to f32, times scaling when scaled (the caller rounds them to the table dtype).
__device__ __forceinline__ void rope_cos_sin(float p, float f, float scaling, int scaled, float* c, float* s) {
  double sd, cd;
  sincos((double)(p * f), &sd, &cd);
  *c = (float)cd;
  *s = (float)sd;
  if (scaled) {
    *c *= scaling;
    *s *= scaling;
  }
}

// rope_store rotates the pair (x1, x2) of a row by (c, s) and stores it at out[i] and
// out[i + half], rounding as the decomposition does: y1 = r(r(x1*c) + r(-x2*s)),
// y2 = r(r(x2*c) + r(x1*s)).
template <class X>
__device__ __forceinline__ void rope_store(typename X::T* out, i64 i, i64 half, float x1, float x2, float c, float s) {
  X::store(out, i, X::round(X::round(x1 * c) + X::round(-x2 * s)));
  X::store(out, i + half, X::round(X::round(x2 * c) + X::round(x1 * s)));
}

// Promote<A, B>::type is the dtype of a binary op's result: bf16 only when both are bf16.
template <class A, class B> struct Promote { typedef F32 type; };
template <> struct Promote<BF16, BF16> { typedef BF16 type; };

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
  return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
  return v;
}

// block_sum_d returns the sum of v over the block (blockDim.x a multiple of 32, at most
// 1024) to every thread. Every thread of the block must call it.
__device__ __forceinline__ double block_sum_d(double v) {
  __shared__ double partial[32];
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum_d(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < warps ? partial[lane] : 0.0;
  v = warp_sum_d(v);
  __syncthreads();  // partial may be reused by a later call
  return v;
}

// block_sum_d1 is block_sum_d for a kernel that calls it once: one barrier. Every warp sums
// the warps' partials in the same order, so every thread gets the same value.
__device__ __forceinline__ double block_sum_d1(double v) {
  __shared__ double partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_sum_d(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  return warp_sum_d(lane < warps ? partial[lane] : 0.0);
}

// rms_inv is rsqrt(mean + eps) of a row's sum of squares as the loop kernels compute it.
__device__ __forceinline__ float rms_inv(double ss, int D, float eps) {
  const float mean = (float)(ss / (double)D);
  return (float)(1.0 / sqrt((double)(mean + eps)));
}

// Strided describes a copy over up to 6 dimensions: element i of the iteration space dims
// (row-major) goes from src[src_off + sum(idx*ss)] to dst[dst_off + sum(idx*ds)].
#define MAX_RANK 6
struct Strided {
  i64 dims[MAX_RANK];
  i64 ss[MAX_RANK];
  i64 ds[MAX_RANK];
  i64 n;
  i64 src_off;
  i64 dst_off;
  int rank;
  int pad;
};

__device__ __forceinline__ void strided_offsets(const Strided& p, i64 i, i64* so, i64* dof) {
  i64 s = p.src_off, d = p.dst_off;
#pragma unroll
  for (int r = MAX_RANK - 1; r >= 0; --r) {
    if (r < p.rank) {
      i64 idx = i % p.dims[r];
      i /= p.dims[r];
      s += idx * p.ss[r];
      d += idx * p.ds[r];
    }
  }
  *so = s;
  *dof = d;
}

// Programmatic dependent launch (sm_90+; see cubind.LaunchKernelPDL). backend/cuda
// launches the kernels of the files listed in pdlFiles (pdl.go) so that they may start
// while the previous kernel on the stream is still running. Every kernel of such a file
// calls pdl_wait before it reads or writes memory that another kernel writes or reads:
// the wait returns when the previous kernel has completed and its writes are visible
// (immediately when the kernel was launched without PDL). pdl_trigger lets the next kernel
// start early; kernels call it right after their wait, so that at most two kernels of a
// stream are resident at once. pdl_begin does both.
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

__device__ __forceinline__ void pdl_begin() {
  pdl_wait();
  pdl_trigger();
}

// VecN is V elements of type T loaded or stored as one vector (V * sizeof(T) is 2, 4, 8 or
// 16 bytes; the address must be aligned to that size).
template <class T, int V>
struct alignas(sizeof(T) * V) VecN {
  T v[V];
};

// vload widens the V elements of X at p (aligned to V elements) to floats; vstore rounds V
// floats to O's type and stores them at p with one vector store.
template <class X, int V>
__device__ __forceinline__ void vload(const typename X::T* p, float* o) {
  const VecN<typename X::T, V> r = *(const VecN<typename X::T, V>*)p;
#pragma unroll
  for (int e = 0; e < V; ++e) o[e] = X::load(r.v, e);
}

template <class O, int V>
__device__ __forceinline__ void vstore(typename O::T* p, const float* x) {
  VecN<typename O::T, V> r;
#pragma unroll
  for (int e = 0; e < V; ++e) O::store(r.v, e, x[e]);
  *(VecN<typename O::T, V>*)p = r;
}

// Strided32 is Strided for walks whose element counts and offsets all fit in 31 bits (the
// host checks): 32-bit index math, the divisions by dims done as a multiply and a shift
// (q = (umulhi(i, mul) + i) >> shr, exact for i < 2^31; see fastDiv in strided.go).
struct Strided32 {
  unsigned dims[MAX_RANK];
  unsigned mul[MAX_RANK];
  unsigned shr[MAX_RANK];
  unsigned ss[MAX_RANK];
  unsigned ds[MAX_RANK];
  unsigned n;
  unsigned src_off;
  unsigned dst_off;
  int rank;
};

__device__ __forceinline__ unsigned fast_div(unsigned i, unsigned mul, unsigned shr) {
  return (__umulhi(i, mul) + i) >> shr;
}

__device__ __forceinline__ void strided_offsets32(const Strided32& p, unsigned i, unsigned* so, unsigned* dof) {
  unsigned s = p.src_off, d = p.dst_off;
#pragma unroll
  for (int r = MAX_RANK - 1; r >= 0; --r) {
    if (r < p.rank) {
      unsigned idx = i;
      if (r > 0) {  // the outermost index is what is left
        const unsigned q = fast_div(i, p.mul[r], p.shr[r]);
        idx = i - q * p.dims[r];
        i = q;
      }
      s += idx * p.ss[r];
      d += idx * p.ds[r];
    }
  }
  *so = s;
  *dof = d;
}

// att_out is the offset of row (query head h, token t) of an attention output of H heads,
// S tokens and D dims: [1,H,S,D] (tm 0) or token-major [1,S,H,D] (tm 1, paged_attention's
// token_major).
__device__ __forceinline__ i64 att_out(int h, i64 t, int H, int S, int D, int tm) {
  return tm ? (t * H + h) * D : ((i64)h * S + t) * D;
}

// The index inputs and error word of the paged-attention kernels (paged.cu, flash.cu).

#define LOG2E 1.4426950408889634f

// load_idx reads entry i of an index input of i32 or (is64) i64 entries.
__device__ __forceinline__ i64 load_idx(const void* p, i64 i, int is64) {
  return is64 ? ((const i64*)p)[i] : (i64)((const int*)p)[i];
}

__device__ __forceinline__ int clamp32(i64 v) {
  return v > 2147483647LL ? 2147483647 : (v < -2147483647LL ? -2147483647 : (int)v);
}

// report records the first error of the step in err[0..3]: code and three values.
__device__ __forceinline__ void report(int* err, int code, i64 a, i64 b, i64 c) {
  if (atomicCAS(err, 0, code) == 0) {
    err[1] = clamp32(a);
    err[2] = clamp32(b);
    err[3] = clamp32(c);
  }
}

// ld_nc_v4 loads 16 bytes of weights through the read-only path without allocating them in
// L1 (streamed weights would evict the activations every warp re-reads).
__device__ __forceinline__ uint4 ld_nc_v4(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// bf16x8 widens the 8 bf16 of v (in memory order) to f.
__device__ __forceinline__ void bf16x8(uint4 v, float* f) {
  f[0] = __uint_as_float(v.x << 16);
  f[1] = __uint_as_float(v.x & 0xffff0000u);
  f[2] = __uint_as_float(v.y << 16);
  f[3] = __uint_as_float(v.y & 0xffff0000u);
  f[4] = __uint_as_float(v.z << 16);
  f[5] = __uint_as_float(v.z & 0xffff0000u);
  f[6] = __uint_as_float(v.w << 16);
  f[7] = __uint_as_float(v.w & 0xffff0000u);
}
