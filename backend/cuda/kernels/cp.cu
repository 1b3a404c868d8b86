// Context-parallel attention kernels (graph/catalog_cp.go): attention_partial,
// paged_attention_partial (and its cache write) and attention_merge.
//
// attention_partial and paged_attention_partial share one flash loop (cp_flash): a block of
// CP_WARPS warps owns CP_BR query rows (CP_ROWS per warp) that read the same keys; keys go
// through shared memory in tiles of CP_BC, one key per lane for the scores, the lanes then
// splitting D for p·v; a tile that no row of the block can see is skipped. The rows of a
// block are, for attention_partial, CP_BR consecutive queries of one (query block, batch
// row, head), and for paged_attention_partial up to CP_BR query heads of one KV head and one
// query (the keys are that query's sequence's entries). A Keys type says where key j lives
// and its position (CP_HIDDEN for a key no query may see: a kv_pos of -1).
//
// Numerics, as the CPU reference kernels: q, k, v widened to f32, scores q·k in f32 (never
// rounded to q's dtype) times scale, softmax in f32 computed online (running max and sum;
// the reference's two passes round differently, within a few f32 ulps), o = Σ p·v / Σ p and
// lse = max + log(Σ p) (log in double, rounded to f32). A row that sees no key gets o = 0
// and lse = -inf. Outputs are f32.
//
// attention_merge is elementwise and exact: w = f32(exp(double(lse - m))) and the f32
// arithmetic of the CPU kernel, operation for operation (the file is compiled without
// fused multiply-add contraction, as every file but attention.cu).
//
// Bad indices of paged_attention_partial are reported through err[0..3] with the codes of
// paged.cu (2 a slot outside the cache, 3 a block_tables entry outside the cache's blocks,
// 4 a q_seq entry outside block_tables' rows) and the entry is skipped.
//
// The file holds templates and one plain kernel: backend/cuda appends CP_PARTIAL(X, XN, DL),
// CP_PAGED(X, XN, C, CN, DL) and CP_WRITE(X, XN, C, CN) instantiations as it needs them.

#define CP_WARPS 4
#define CP_ROWS 4
#define CP_BR (CP_WARPS * CP_ROWS)
#define CP_BC 32
#define CP_HIDDEN ((i64)1 << 62)

// Dynamic shared memory of cp_flash (cpShared in cp.go): Ks[CP_BC][D+1] (padded against
// bank conflicts), Vs[CP_BC][D], Qs[CP_BR][D] as floats, then Kpos[CP_BC] as i64 at an
// 8-byte aligned offset.

// cp_flash runs the online softmax of the block's rows over nkeys keys and writes each
// active row's o (f32, D elements at orow[j]) and lse (at lrow[j]). Qs must hold the rows'
// queries (zeros for inactive rows) and every thread must call it.
template <int DL, class Keys>
__device__ __forceinline__ void cp_flash(float* smem, const Keys& keys, int nkeys, int D, float scale, int window,
                                         const bool (&active)[CP_ROWS], const i64 (&qpos)[CP_ROWS], i64 qmin,
                                         i64 qmax, float* const (&orow)[CP_ROWS], float* const (&lrow)[CP_ROWS]) {
  float* Ks = smem;
  float* Vs = Ks + CP_BC * (D + 1);
  float* Qs = Vs + CP_BC * D;
  i64* Kpos = (i64*)(Qs + CP_BR * D + (CP_BR * D) % 2);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;

  float m[CP_ROWS], l[CP_ROWS], acc[CP_ROWS][DL];
#pragma unroll
  for (int j = 0; j < CP_ROWS; ++j) {
    m[j] = -LOOM_INF;
    l[j] = 0.0f;
#pragma unroll
    for (int u = 0; u < DL; ++u) acc[j][u] = 0.0f;
  }
  __syncthreads();  // Qs is loaded

  for (int t0 = 0; t0 < nkeys; t0 += CP_BC) {
    int any = 0;
    if (threadIdx.x < CP_BC) {
      int j = t0 + threadIdx.x;
      i64 kp = CP_HIDDEN;
      if (j < nkeys) {
        kp = keys.pos(j);
        any = kp != CP_HIDDEN && kp <= qmax && (window <= 0 || kp + window > qmin);
      }
      Kpos[threadIdx.x] = kp;
    }
    if (!__syncthreads_or(any)) continue;
    for (int i = threadIdx.x; i < CP_BC * D; i += blockDim.x) {
      int jj = i / D, d = i - jj * D, j = t0 + jj;
      float kx = 0.0f, vx = 0.0f;
      if (Kpos[jj] != CP_HIDDEN) {
        kx = keys.k(j, d);
        vx = keys.v(j, d);
      }
      Ks[jj * (D + 1) + d] = kx;
      Vs[jj * D + d] = vx;
    }
    __syncthreads();
    const i64 kp = Kpos[lane];
#pragma unroll
    for (int j = 0; j < CP_ROWS; ++j) {
      if (!active[j]) continue;  // uniform across the warp
      const float* qr = Qs + (warp * CP_ROWS + j) * D;
      const float* kr = Ks + lane * (D + 1);
      float dot = 0.0f;
#pragma unroll 4
      for (int d = 0; d < D; ++d) dot += qr[d] * kr[d];
      bool vis = kp != CP_HIDDEN && kp <= qpos[j] && (window <= 0 || kp + window > qpos[j]);
      float sc = vis ? dot * scale : -LOOM_INF;
      float mnew = fmaxf(m[j], warp_max(sc));
      if (mnew == -LOOM_INF) continue;  // nothing visible yet; uniform across the warp
      float p = vis ? expf(sc - mnew) : 0.0f;
      float corr = expf(m[j] - mnew);
      l[j] = l[j] * corr + warp_sum(p);
#pragma unroll
      for (int u = 0; u < DL; ++u) acc[j][u] *= corr;
#pragma unroll 4
      for (int jj = 0; jj < CP_BC; ++jj) {
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
  for (int j = 0; j < CP_ROWS; ++j) {
    if (!active[j]) continue;
    bool seen = l[j] > 0.0f;
    float inv = seen ? 1.0f / l[j] : 0.0f;
#pragma unroll
    for (int u = 0; u < DL; ++u) {
      int d = lane + 32 * u;
      if (d < D) orow[j][d] = seen ? acc[j][u] * inv : 0.0f;
    }
    if (lane == 0) *lrow[j] = seen ? m[j] + (float)log((double)l[j]) : -LOOM_INF;
  }
}

// PartialKeys: keys of attention_partial, k, v[NK,B,KV,Sk,D] at k_pos[NK,B,Sk]; key j is
// position j%Sk of block j/Sk, for batch row b and KV head kh.
template <class X>
struct PartialKeys {
  const typename X::T* kt;
  const typename X::T* vt;
  const void* kp;
  int kp64, B, KV, Sk, D, b, kh;
  __device__ __forceinline__ i64 pos(int j) const {
    int c = j / Sk, jj = j - c * Sk;
    return load_idx(kp, ((i64)c * B + b) * Sk + jj, kp64);
  }
  __device__ __forceinline__ i64 off(int j, int d) const {
    int c = j / Sk, jj = j - c * Sk;
    return ((((i64)c * B + b) * KV + kh) * Sk + jj) * D + d;
  }
  __device__ __forceinline__ float k(int j, int d) const { return X::load(kt, off(j, d)); }
  __device__ __forceinline__ float v(int j, int d) const { return X::load(vt, off(j, d)); }
};

// cp_partial: grid (ceil(Sq/CP_BR), H, NQ*B), CP_WARPS*32 threads. q[NQ,B,H,Sq,D],
// q_pos[NQ,B,Sq]; o f32[NQ,B,H,Sq,D], lse f32[NQ,B,H,Sq].
template <class X, int DL>
__device__ __forceinline__ void cp_partial_impl(float* o, float* lse, const typename X::T* q, const typename X::T* k,
                                                const typename X::T* v, const void* qp, int qp64, const void* kp,
                                                int kp64, int B, int H, int KV, int Sq, int Sk, int NK, int D,
                                                float scale, int window) {
  extern __shared__ float smem[];
  float* Qs = smem + CP_BC * (D + 1) + CP_BC * D;
  const int warp = threadIdx.x >> 5;
  const int ab = blockIdx.z, b = ab % B, h = blockIdx.y;
  const int row0 = blockIdx.x * CP_BR;
  const i64 head = (i64)ab * H + h;  // (a, b, h) flattened
  const typename X::T* qh = q + head * Sq * D;
  const i64 pbase = (i64)ab * Sq;

  for (int i = threadIdx.x; i < CP_BR * D; i += blockDim.x) {
    int r = i / D, d = i - r * D, s = row0 + r;
    Qs[i] = s < Sq ? X::load(qh, (i64)s * D + d) : 0.0f;
  }
  i64 qmax = -CP_HIDDEN, qmin = CP_HIDDEN;
  for (int r = 0; r < CP_BR && row0 + r < Sq; ++r) {
    i64 p = load_idx(qp, pbase + row0 + r, qp64);
    qmax = p > qmax ? p : qmax;
    qmin = p < qmin ? p : qmin;
  }
  bool active[CP_ROWS];
  i64 qpos[CP_ROWS];
  float* orow[CP_ROWS];
  float* lrow[CP_ROWS];
#pragma unroll
  for (int j = 0; j < CP_ROWS; ++j) {
    int s = row0 + warp * CP_ROWS + j;
    active[j] = s < Sq;
    qpos[j] = active[j] ? load_idx(qp, pbase + s, qp64) : 0;
    orow[j] = o + (head * Sq + s) * D;
    lrow[j] = lse + head * Sq + s;
  }
  PartialKeys<X> keys;
  keys.kt = k;
  keys.vt = v;
  keys.kp = kp;
  keys.kp64 = kp64;
  keys.B = B;
  keys.KV = KV;
  keys.Sk = Sk;
  keys.D = D;
  keys.b = b;
  keys.kh = h / (H / KV);
  cp_flash<DL>(smem, keys, NK * Sk, D, scale, window, active, qpos, qmin, qmax, orow, lrow);
}

// CP_PARTIAL(X, XN, DL) instantiates cp_partial_<XN>_d<DL>.
#define CP_PARTIAL(X, XN, DL)                                                                                        \
  extern "C" __global__ void __launch_bounds__(CP_WARPS * 32)                                                        \
      cp_partial_##XN##_d##DL(float* o, float* lse, const X::T* q, const X::T* k, const X::T* v, const void* qp,     \
                              int qp64, const void* kp, int kp64, int B, int H, int KV, int Sq, int Sk, int NK,      \
                              int D, float scale, int window) {                                                      \
    cp_partial_impl<X, DL>(o, lse, q, k, v, qp, qp64, kp, kp64, B, H, KV, Sq, Sk, NK, D, scale, window);             \
  }

// PagedKeys: the entries of sequence s on this rank: entry j at kv_pos[s, j] (< 0: none),
// in block block_tables[s, j/BS] at offset j%BS of caches [NB,BS,KV,D], KV head g.
template <class C>
struct PagedKeys {
  const typename C::T* kc;
  const typename C::T* vc;
  const void* tables;
  const void* kvp;
  int t64, p64, L, M, BS, KV, D, NB, g;
  i64 s;
  int* err;
  __device__ __forceinline__ i64 pos(int j) const {
    i64 p = load_idx(kvp, s * L + j, p64);
    if (p < 0) return CP_HIDDEN;
    i64 blk = load_idx(tables, s * M + j / BS, t64);
    if (blk < 0 || blk >= NB) {
      report(err, 3, blk, s, NB);
      return CP_HIDDEN;
    }
    return p;
  }
  __device__ __forceinline__ i64 off(int j, int d) const {
    i64 blk = load_idx(tables, s * M + j / BS, t64);
    return ((blk * BS + j % BS) * KV + g) * D + d;
  }
  __device__ __forceinline__ float k(int j, int d) const { return C::load(kc, off(j, d)); }
  __device__ __forceinline__ float v(int j, int d) const { return C::load(vc, off(j, d)); }
};

// cp_paged: grid (NQ*Sq, KV, ceil(rep/CP_BR)), CP_WARPS*32 threads; block (i, g, z) serves
// query i (query i%Sq of block i/Sq) for query heads g*rep + z*CP_BR + r. q[NQ,1,H,Sq,D],
// q_pos[NQ,1,Sq], q_seq[NQ,Sq]; o f32[NQ,1,H,Sq,D], lse f32[NQ,1,H,Sq].
template <class X, class C, int DL>
__device__ __forceinline__ void cp_paged_impl(float* o, float* lse, const typename X::T* q, const typename C::T* kc,
                                              const typename C::T* vc, const void* qp, int qp64, const void* qseq,
                                              int qs64, const void* tables, int t64, const void* kvp, int p64, int H,
                                              int KV, int Sq, int D, int N, int M, int L, int BS, int NB, float scale,
                                              int window, int* err) {
  extern __shared__ float smem[];
  float* Qs = smem + CP_BC * (D + 1) + CP_BC * D;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int i = blockIdx.x, g = blockIdx.y, a = i / Sq, ii = i - a * Sq;
  const int rep = H / KV, h0 = g * rep + blockIdx.z * CP_BR;
  const int nrows = min(CP_BR, rep - (int)blockIdx.z * CP_BR);
  const i64 s = load_idx(qseq, i, qs64);
  const i64 pq = load_idx(qp, i, qp64);
  bool active[CP_ROWS];
  i64 qpos[CP_ROWS];
  float* orow[CP_ROWS];
  float* lrow[CP_ROWS];
#pragma unroll
  for (int j = 0; j < CP_ROWS; ++j) {
    int r = warp * CP_ROWS + j;
    active[j] = r < nrows;
    qpos[j] = pq;
    i64 row = ((i64)a * H + h0 + r) * Sq + ii;
    orow[j] = o + row * D;
    lrow[j] = lse + row;
  }
  if (s < 0 || s >= N) {  // block-uniform: no query here, or a bad sequence
    if (s >= N && threadIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) report(err, 4, s, i, N);
#pragma unroll
    for (int j = 0; j < CP_ROWS; ++j) {
      if (!active[j]) continue;
      for (int d = lane; d < D; d += 32) orow[j][d] = 0.0f;
      if (lane == 0) *lrow[j] = -LOOM_INF;
    }
    return;
  }
  for (int e = threadIdx.x; e < CP_BR * D; e += blockDim.x) {
    int r = e / D, d = e - r * D;
    Qs[e] = r < nrows ? X::load(q, (((i64)a * H + h0 + r) * Sq + ii) * D + d) : 0.0f;
  }
  PagedKeys<C> keys;
  keys.kc = kc;
  keys.vc = vc;
  keys.tables = tables;
  keys.kvp = kvp;
  keys.t64 = t64;
  keys.p64 = p64;
  keys.L = L;
  keys.M = M;
  keys.BS = BS;
  keys.KV = KV;
  keys.D = D;
  keys.NB = NB;
  keys.g = g;
  keys.s = s;
  keys.err = err;
  cp_flash<DL>(smem, keys, L, D, scale, window, active, qpos, pq, pq, orow, lrow);
}

// CP_PAGED(X, XN, C, CN, DL) instantiates cp_paged_<XN>_<CN>_d<DL>.
#define CP_PAGED(X, XN, C, CN, DL)                                                                                   \
  extern "C" __global__ void __launch_bounds__(CP_WARPS * 32) cp_paged_##XN##_##CN##_d##DL(                          \
      float* o, float* lse, const X::T* q, const C::T* kc, const C::T* vc, const void* qp, int qp64, const void* qseq, \
      int qs64, const void* tables, int t64, const void* kvp, int p64, int H, int KV, int Sq, int D, int N, int M,   \
      int L, int BS, int NB, float scale, int window, int* err) {                                                    \
    cp_paged_impl<X, C, DL>(o, lse, q, kc, vc, qp, qp64, qseq, qs64, tables, t64, kvp, p64, H, KV, Sq, D, N, M, L,   \
                            BS, NB, scale, window, err);                                                             \
  }

// cp_write: the rank's own k, v[1,KV,Sk,D] into caches [NB,BS,KV,D] at slot_mapping[Sk]
// (a slot < 0 is not written; one at or past nslots is reported and skipped), rounded to
// the cache's dtype. A grid-stride loop over Sk*KV*D elements.
template <class X, class C>
__device__ __forceinline__ void cp_write_impl(typename C::T* kc, typename C::T* vc, const typename X::T* k,
                                              const typename X::T* v, const void* slots, int s64, int KV, int Sk,
                                              int D, i64 nslots, int* err) {
  const i64 n = (i64)Sk * KV * D;
  for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (i64)gridDim.x * blockDim.x) {
    i64 t = e / ((i64)KV * D), r = e - t * KV * D, g = r / D, d = r - g * D;
    i64 slot = load_idx(slots, t, s64);
    if (slot < 0) continue;
    if (slot >= nslots) {
      if (r == 0) report(err, 2, slot, t, nslots);
      continue;
    }
    i64 src = (g * Sk + t) * D + d, dst = (slot * KV + g) * D + d;
    C::store(kc, dst, X::load(k, src));
    C::store(vc, dst, X::load(v, src));
  }
}

// CP_WRITE(X, XN, C, CN) instantiates cp_write_<XN>_<CN>.
#define CP_WRITE(X, XN, C, CN)                                                                                       \
  extern "C" __global__ void cp_write_##XN##_##CN(C::T* kc, C::T* vc, const X::T* k, const X::T* v,               \
                                                  const void* slots, int s64, int KV, int Sk, int D, i64 nslots,     \
                                                  int* err) {                                                        \
    cp_write_impl<X, C>(kc, vc, k, v, slots, s64, KV, Sk, D, nslots, err);                                           \
  }

// attention_merge: o1, o2 f32[rows, D], lse1, lse2 f32[rows] -> o f32[rows, D], lse
// f32[rows]. A grid-stride loop over rows*max(D, 1) elements; element 0 of a row also
// writes its lse.
extern "C" __global__ void cp_merge(float* o, float* lse, const float* o1, const float* l1, const float* o2,
                                    const float* l2, i64 rows, int D) {
  const int Dp = D > 0 ? D : 1;
  const i64 n = rows * Dp;
  for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (i64)gridDim.x * blockDim.x) {
    i64 r = e / Dp;
    int d = (int)(e - r * Dp);
    float a = l1[r], b = l2[r];
    float m = fmaxf(a, b);
    if (m == -LOOM_INF) {  // no key on either side
      if (D > 0) o[e] = 0.0f;
      if (d == 0) lse[r] = m;
      continue;
    }
    float w1 = (float)exp((double)(a - m));
    float w2 = (float)exp((double)(b - m));
    float sum = w1 + w2;
    if (D > 0) o[e] = (o1[e] * w1 + o2[e] * w2) / sum;
    if (d == 0) lse[r] = m + (float)log((double)sum);
  }
}
