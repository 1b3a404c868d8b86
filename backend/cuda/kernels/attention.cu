// Causal grouped-query attention for prefill, as graph op sdpa defines it, computed flash
// style: q[B,H,S,D], k and v [B,KV,S,D], positions[B,S] -> out[B,H,S,D]. Query head h reads
// KV head h / (H/KV). Key j is visible to query i when pos[j] <= pos[i] and, with window > 0,
// pos[j] > pos[i] - window. Raw scores are rounded to the dtype of q·kᵀ and scaled, as the
// decomposition does; the softmax is computed online in f32 (running max and sum), so
// probabilities are never rounded to q's dtype (the one deliberate difference from the
// decomposition). A row that sees no key gives NaN, as softmax over -inf does.
//
// Layout: a block of ATT_WARPS warps covers ATT_BR = ATT_WARPS*ATT_ROWS query rows of one
// (b, h); each warp owns ATT_ROWS rows. Keys go through shared memory in tiles of 32 (one
// key per lane for the scores; the lanes then split D for p·v). Tiles that no query of the
// block can see are skipped. DL = ceil(D/32) accumulators per lane and row.
//
// The file holds templates only: backend/cuda appends the instantiation it needs, such as
// SDPA(BF16, bf16, 4), and compiles each on first use. Positions are i32 or i64, chosen at
// run time by pos64.

#define ATT_WARPS 4
#define ATT_ROWS 4
#define ATT_BR (ATT_WARPS * ATT_ROWS)
#define ATT_BC 32

__device__ __forceinline__ i64 load_pos(const void* pos, i64 i, int pos64) {
  return pos64 ? ((const i64*)pos)[i] : (i64)((const int*)pos)[i];
}

template <class X, int DL>
__device__ __forceinline__ void sdpa_impl(typename X::T* out, const typename X::T* q, const typename X::T* k,
                                          const typename X::T* v, const void* pos, int pos64, int H, int KVH, int S,
                                          int D, float scale, int window) {
  extern __shared__ float smem[];
  float* Ks = smem;                                  // [ATT_BC][D+1], padded against bank conflicts
  float* Vs = Ks + ATT_BC * (D + 1);                 // [ATT_BC][D]
  float* Qs = Vs + ATT_BC * D;                       // [ATT_BR][D]
  i64* Kpos = (i64*)(Qs + ATT_BR * D + (ATT_BR * D) % 2);  // [ATT_BC], 8-byte aligned

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int b = blockIdx.z, h = blockIdx.y;
  const int kvh = h / (H / KVH);
  const int row0 = blockIdx.x * ATT_BR;
  const typename X::T* qh = q + ((i64)b * H + h) * S * D;
  const typename X::T* kh = k + ((i64)b * KVH + kvh) * S * D;
  const typename X::T* vh = v + ((i64)b * KVH + kvh) * S * D;
  typename X::T* oh = out + ((i64)b * H + h) * S * D;
  const i64 pbase = (i64)b * S;

  for (int i = threadIdx.x; i < ATT_BR * D; i += blockDim.x) {
    int r = i / D, d = i - r * D, s = row0 + r;
    Qs[i] = s < S ? X::load(qh, (i64)s * D + d) : 0.0f;
  }
  // The block's query positions bound which key tiles matter.
  i64 qmax = -((i64)1 << 62), qmin = (i64)1 << 62;
  for (int r = 0; r < ATT_BR && row0 + r < S; ++r) {
    i64 p = load_pos(pos, pbase + row0 + r, pos64);
    qmax = p > qmax ? p : qmax;
    qmin = p < qmin ? p : qmin;
  }
  i64 qpos[ATT_ROWS];
  bool active[ATT_ROWS];
  float m[ATT_ROWS], l[ATT_ROWS], acc[ATT_ROWS][DL];
#pragma unroll
  for (int j = 0; j < ATT_ROWS; ++j) {
    int s = row0 + warp * ATT_ROWS + j;
    active[j] = s < S;
    qpos[j] = active[j] ? load_pos(pos, pbase + s, pos64) : 0;
    m[j] = -LOOM_INF;
    l[j] = 0.0f;
#pragma unroll
    for (int u = 0; u < DL; ++u) acc[j][u] = 0.0f;
  }
  __syncthreads();

  for (int t0 = 0; t0 < S; t0 += ATT_BC) {
    int any = 0;
    if (threadIdx.x < ATT_BC) {
      int j = t0 + threadIdx.x;
      i64 kp = (i64)1 << 62;
      if (j < S) {
        kp = load_pos(pos, pbase + j, pos64);
        any = kp <= qmax && (window <= 0 || kp + window > qmin);
      }
      Kpos[threadIdx.x] = kp;
    }
    if (!__syncthreads_or(any)) continue;
    for (int i = threadIdx.x; i < ATT_BC * D; i += blockDim.x) {
      int jj = i / D, d = i - jj * D, j = t0 + jj;
      float kx = 0.0f, vx = 0.0f;
      if (j < S) {
        kx = X::load(kh, (i64)j * D + d);
        vx = X::load(vh, (i64)j * D + d);
      }
      Ks[jj * (D + 1) + d] = kx;
      Vs[jj * D + d] = vx;
    }
    __syncthreads();
    const i64 kp = Kpos[lane];
    const bool kin = t0 + lane < S;
#pragma unroll
    for (int j = 0; j < ATT_ROWS; ++j) {
      if (!active[j]) continue;  // uniform across the warp
      const float* qr = Qs + (warp * ATT_ROWS + j) * D;
      const float* kr = Ks + lane * (D + 1);
      float dot = 0.0f;
#pragma unroll 4
      for (int d = 0; d < D; ++d) dot += qr[d] * kr[d];
      bool vis = kin && kp <= qpos[j] && (window <= 0 || kp + window > qpos[j]);
      float sc = vis ? X::round(dot) * scale : -LOOM_INF;
      float mnew = fmaxf(m[j], warp_max(sc));
      if (mnew == -LOOM_INF) continue;  // nothing visible yet; uniform across the warp
      float p = vis ? expf(sc - mnew) : 0.0f;
      float corr = expf(m[j] - mnew);
      l[j] = l[j] * corr + warp_sum(p);
#pragma unroll
      for (int u = 0; u < DL; ++u) acc[j][u] *= corr;
#pragma unroll 4
      for (int jj = 0; jj < ATT_BC; ++jj) {
        float pj = __shfl_sync(FULL_MASK, p, jj);
        const float* vr = Vs + jj * D;
#pragma unroll
        for (int u = 0; u < DL; ++u) {
          int d = lane + 32 * u;
          if (d < D) acc[j][u] += pj * vr[d];
        }
      }
      m[j] = mnew;
    }
    __syncthreads();
  }

#pragma unroll
  for (int j = 0; j < ATT_ROWS; ++j) {
    if (!active[j]) continue;
    i64 base = (i64)(row0 + warp * ATT_ROWS + j) * D;
    float inv = l[j] > 0.0f ? 1.0f / l[j] : LOOM_NAN;
#pragma unroll
    for (int u = 0; u < DL; ++u) {
      int d = lane + 32 * u;
      if (d < D) X::store(oh, base + d, acc[j][u] * inv);
    }
  }
}

// SDPA(X, XN, DL) instantiates sdpa_<XN>_d<DL>.
#define SDPA(X, XN, DL)                                                                                              \
  extern "C" __global__ void __launch_bounds__(ATT_WARPS * 32)                                                       \
      sdpa_##XN##_d##DL(X::T* out, const X::T* q, const X::T* k, const X::T* v, const void* pos, int pos64, int H,   \
                        int KVH, int S, int D, float scale, int window) {                                            \
    sdpa_impl<X, DL>(out, q, k, v, pos, pos64, H, KVH, S, D, scale, window);                                         \
  }
