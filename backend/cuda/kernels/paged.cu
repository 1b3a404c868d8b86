// Paged KV cache kernels, as graph op paged_attention defines it (graph/catalog_cache.go),
// and gather.
//
// paged_write stores this step's k, v [1,KV,S,D] rows into k_cache, v_cache [NB,BS,KV,D] at
// slot_mapping[t] (one block per token t). paged_attend then runs one warp per (token,
// query head): the token's sequence's cached positions lo..hi are read through its
// block_tables row, scores rounded to the dtype of q·kᵀ and scaled, softmax computed online
// in f32, values summed in f32. An index outside the cache or the tables is skipped (the
// row then gives NaN, as a row that sees no key); the engine never passes one.
//
// Index inputs (positions, slots, sequences, tables) are i32 or i64, chosen at run time.
// The file holds templates only: backend/cuda appends PAGED(X, XN, C, CN, DL) and
// GATHER(T, TN) instantiations.

__device__ __forceinline__ i64 load_idx(const void* p, i64 i, int is64) {
  return is64 ? ((const i64*)p)[i] : (i64)((const int*)p)[i];
}

template <class X, class C>
__device__ __forceinline__ void paged_write_impl(typename C::T* kc, typename C::T* vc, const typename X::T* k,
                                                 const typename X::T* v, const void* slots, int s64, int KVH,
                                                 int S, int D, i64 nslots) {
  const int t = blockIdx.x;
  const i64 slot = load_idx(slots, t, s64);
  if (slot < 0 || slot >= nslots) return;
  for (int i = threadIdx.x; i < KVH * D; i += blockDim.x) {
    int h = i / D, d = i - h * D;
    i64 src = ((i64)h * S + t) * D + d;
    i64 dst = slot * KVH * D + i;
    C::store(kc, dst, X::load(k, src));
    C::store(vc, dst, X::load(v, src));
  }
}

// Scores: q·k rounded to R (the promoted dtype of q and the cache).
template <class X, class C, class R, int DL>
__device__ __forceinline__ void paged_attend_impl(typename X::T* out, const typename X::T* q,
                                                  const typename C::T* kc, const typename C::T* vc, const void* pos,
                                                  int p64, const void* seqs, int q64, const void* tables, int t64,
                                                  int H, int KVH, int S, int D, int NB, int BS, int N, int M,
                                                  float scale, int window) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const i64 task = (i64)blockIdx.x * (blockDim.x >> 5) + warp;
  if (task >= (i64)S * H) return;  // uniform across the warp
  const int t = (int)(task / H), h = (int)(task % H);
  const int kvh = h / (H / KVH);
  const i64 hi = load_idx(pos, t, p64);
  const i64 seq = load_idx(seqs, t, q64);
  i64 lo = 0;
  if (window > 0) lo = hi - window + 1 > 0 ? hi - window + 1 : 0;
  float qr[DL], acc[DL];
#pragma unroll
  for (int u = 0; u < DL; ++u) {
    int d = lane + 32 * u;
    qr[u] = d < D ? X::load(q, ((i64)h * S + t) * D + d) : 0.0f;
    acc[u] = 0.0f;
  }
  float m = -LOOM_INF, l = 0.0f;
  const bool ok = hi >= 0 && seq >= 0 && seq < N && hi / BS < M;
  for (i64 j = lo; ok && j <= hi; ++j) {
    i64 blk = load_idx(tables, seq * M + j / BS, t64);
    if (blk < 0 || blk >= NB) continue;
    i64 base = ((blk * BS + j % BS) * KVH + kvh) * D;
    float dot = 0.0f;
#pragma unroll
    for (int u = 0; u < DL; ++u) {
      int d = lane + 32 * u;
      if (d < D) dot += qr[u] * C::load(kc, base + d);
    }
    dot = warp_sum(dot);
    float sc = R::round(dot) * scale;
    float mnew = fmaxf(m, sc);
    float corr = expf(m - mnew), p = expf(sc - mnew);
    l = l * corr + p;
#pragma unroll
    for (int u = 0; u < DL; ++u) {
      int d = lane + 32 * u;
      acc[u] = acc[u] * corr + (d < D ? p * C::load(vc, base + d) : 0.0f);
    }
    m = mnew;
  }
  float inv = l > 0.0f ? 1.0f / l : LOOM_NAN;
#pragma unroll
  for (int u = 0; u < DL; ++u) {
    int d = lane + 32 * u;
    if (d < D) X::store(out, ((i64)h * S + t) * D + d, acc[u] * inv);
  }
}

// PAGED(X, XN, C, CN, DL) instantiates paged_write_<XN>_<CN> and paged_attend_<XN>_<CN>_d<DL>.
#define PAGED(X, XN, C, CN, DL)                                                                                      \
  extern "C" __global__ void paged_write_##XN##_##CN(C::T* kc, C::T* vc, const X::T* k, const X::T* v,             \
                                                     const void* slots, int s64, int KVH, int S, int D,             \
                                                     i64 nslots) {                                                  \
    paged_write_impl<X, C>(kc, vc, k, v, slots, s64, KVH, S, D, nslots);                                           \
  }                                                                                                                \
  extern "C" __global__ void paged_attend_##XN##_##CN##_d##DL(                                                      \
      X::T* out, const X::T* q, const C::T* kc, const C::T* vc, const void* pos, int p64, const void* seqs, int q64, \
      const void* tables, int t64, int H, int KVH, int S, int D, int NB, int BS, int N, int M, float scale,          \
      int window) {                                                                                                 \
    paged_attend_impl<X, C, Promote<X, C>::type, DL>(out, q, kc, vc, pos, p64, seqs, q64, tables, t64, H, KVH, S, D, \
                                                     NB, BS, N, M, scale, window);                                  \
  }

// gather copies x[outer, A, inner] rows by idx[n] into out[outer, n, inner]; an index
// outside [0, A) gives zeros.
template <class T>
__device__ __forceinline__ void gather_impl(T* out, const T* x, const void* idx, int i64idx, i64 outer, i64 A,
                                            i64 n, i64 inner) {
  i64 total = outer * n * inner;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) {
    i64 in = i % inner, r = i / inner, j = r % n, o = r / n;
    i64 a = load_idx(idx, j, i64idx);
    out[i] = (a >= 0 && a < A) ? x[(o * A + a) * inner + in] : (T)0;
  }
}

#define GATHER(T, TN)                                                                                   \
  extern "C" __global__ void gather_##TN(T* out, const T* x, const void* idx, int i64idx, i64 outer, i64 A, \
                                         i64 n, i64 inner) {                                             \
    gather_impl<T>(out, x, idx, i64idx, outer, A, n, inner);                                              \
  }
