// Paged KV cache kernels, as graph op paged_attention defines it (graph/catalog_cache.go),
// and gather.
//
// Layouts: q and out [1,H,S,D] (out [1,S,H,D] when tm is 1: att_out in common.cuh), k and
// v [1,KV,S,D], caches [NB,BS,KV,D]; position j of a sequence lives in block
// block_tables[seq, j/BS] at offset j%BS. Query head h reads KV head
// h / (H/KV). Token t (of sequence token_seq[t], at position positions[0,t]) sees the cached
// positions lo..hi, hi = positions[0,t], lo = max(0, hi-window+1) with a window, else 0.
//
// Numerics, as the sdpa kernel: raw scores q·k rounded to R (the promoted dtype of q and the
// cache), scaled; softmax online in f32 (base 2: scores are scaled by log2(e) once); values
// summed in f32; probabilities are never rounded to q's dtype.
//
// Kernels (each launch's grid, block and shared memory depend on shapes only, so that calls
// can be captured in CUDA graphs; lengths are read on the device):
//   - paged_write: this step's k, v rows into their slots. One block per token, vector
//     loads and stores. Prefill only: paged_decode does its work for decode steps (fw).
//   - paged_decode: split-KV flash decoding. One block of 4 to 16 warps (the host picks
//     them and the splits from the shapes: splits while the GPU has room and the context
//     bound M*BS gives each warp enough keys) per (split, KV head and
//     group of up to GP of its query heads, token); the split's blocks of the token's table
//     row and the queries are staged in shared memory, keys and values are read straight
//     from the cache with vector loads (LPR lanes share a row, VEC elements each, CPL
//     chunks per lane; the next step's keys load during the current step), each warp keeps
//     its own online softmax, then the warps are merged through shared memory. With one
//     split the block writes out; otherwise it writes a partial (max, sum,
//     accumulator[D]) per query head to the workspace and paged_combine merges the splits
//     (or, as the host asks, the last block of the splits to finish merges them, counted
//     by an atomic ticket, or the splits form one thread-block cluster and merge through
//     distributed shared memory: DEC_MERGE_*).
//   - paged_prefill: tiled flash attention for many tokens: a block covers PF_BR consecutive
//     rows of the (token, query head of the KV head's group) space, i.e. several tokens and
//     all query heads sharing one KV head; keys and values of the tokens' sequence go
//     through shared memory in tiles of PF_BC positions and serve every row. Tokens of
//     several sequences in one block are handled one run of equal token_seq at a time.
//
// Bad indices are reported through err[0..3] (code, value, where, limit; the first error
// wins) and read by Device.sync: 2 a slot_mapping entry outside the cache's slots, 3 a
// block_tables entry (of a block some token reads) outside the cache's blocks, 4 a
// token_seq entry outside block_tables' rows, 5 a position that is negative or past what
// block_tables' row covers. The kernels then skip what the index names (a row that sees no
// key gives NaN). Padding entries of block_tables (such as -1) past a sequence's length are
// never read.
//
// Index inputs (positions, slots, sequences, tables) are i32 or i64, chosen at run time.
// The file holds templates only: backend/cuda appends PAGED_WRITE(X, XN, C, CN),
// PAGED_DECODE(...), PAGED_COMBINE(X, XN), PAGED_PREFILL(...) and GATHER(T, TN)
// instantiations.

// load_idx, report and LOG2E are in common.cuh (flash.cu uses them too).

// paged_write_rows writes token t's KVH head rows of k and v to slot, V elements per
// thread and vector (D a multiple of V, every operand aligned to V elements). The loads are
// issued before the slot's check, so that their latency overlaps the slot's.
template <class X, class C, int V>
__device__ __forceinline__ void paged_write_rows(typename C::T* kc, typename C::T* vc, const typename X::T* k,
                                                 const typename X::T* v, int KVH, int S, int D, int t, i64 slot,
                                                 bool ok) {
  const int per = D / V;
  for (int i = threadIdx.x; i < KVH * per; i += blockDim.x) {
    const int h = i / per, c = i - h * per;
    const i64 src = ((i64)h * S + t) * D + (i64)c * V;
    float kf[V], vf[V];
    vload<X, V>(k + src, kf);
    vload<X, V>(v + src, vf);
    if (ok) {
      const i64 dst = (slot * KVH + h) * D + (i64)c * V;
      vstore<C, V>(kc + dst, kf);
      vstore<C, V>(vc + dst, vf);
    }
  }
}

// paged_write: one block per token; vec (8, 4, 2 or 1, chosen by the host) elements per
// vector.
template <class X, class C>
__device__ __forceinline__ void paged_write_impl(typename C::T* kc, typename C::T* vc, const typename X::T* k,
                                                 const typename X::T* v, const void* slots, int s64, int KVH,
                                                 int S, int D, i64 nslots, int vec, int* err) {
  pdl_begin();
  const int t = blockIdx.x;
  const i64 slot = load_idx(slots, t, s64);
  const bool ok = slot >= 0 && slot < nslots;
  if (!ok && threadIdx.x == 0) report(err, 2, slot, t, nslots);
  switch (vec) {
    case 8:
      paged_write_rows<X, C, 8>(kc, vc, k, v, KVH, S, D, t, slot, ok);
      break;
    case 4:
      paged_write_rows<X, C, 4>(kc, vc, k, v, KVH, S, D, t, slot, ok);
      break;
    case 2:
      paged_write_rows<X, C, 2>(kc, vc, k, v, KVH, S, D, t, slot, ok);
      break;
    default:
      paged_write_rows<X, C, 1>(kc, vc, k, v, KVH, S, D, t, slot, ok);
  }
}

#define PAGED_WRITE(X, XN, C, CN)                                                                                  \
  extern "C" __global__ void paged_write_##XN##_##CN(C::T* kc, C::T* vc, const X::T* k, const X::T* v,           \
                                                     const void* slots, int s64, int KVH, int S, int D,           \
                                                     i64 nslots, int vec, int* err) {                             \
    paged_write_impl<X, C>(kc, vc, k, v, slots, s64, KVH, S, D, nslots, vec, err);                               \
  }

// unpack widens n 32-bit words of cache elements to floats.
template <class C>
__device__ __forceinline__ void unpack(const unsigned* w, int n, float* o);
template <>
__device__ __forceinline__ void unpack<F32>(const unsigned* w, int n, float* o) {
  for (int i = 0; i < n; ++i) o[i] = __uint_as_float(w[i]);
}
template <>
__device__ __forceinline__ void unpack<BF16>(const unsigned* w, int n, float* o) {
  for (int i = 0; i < n; ++i) {
    o[2 * i] = __uint_as_float(w[i] << 16);
    o[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
  }
}

// Raw holds VEC cache elements as loaded: whole 32-bit words, or elements when they are
// narrower than a word in total.
template <class C, int VEC>
struct Raw {
  static constexpr int B = VEC * (int)sizeof(typename C::T);
  static constexpr int W = B >= 4 ? B / 4 : 1;
  unsigned w[W];
  typename C::T e[B >= 4 ? 1 : VEC];
  __device__ __forceinline__ void load(const typename C::T* p) {
    if constexpr (B == 16) {
      uint4 u = *(const uint4*)p;
      w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
    } else if constexpr (B == 8) {
      uint2 u = *(const uint2*)p;
      w[0] = u.x, w[1] = u.y;
    } else if constexpr (B == 4) {
      w[0] = *(const unsigned*)p;
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) e[i] = p[i];
    }
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < W; ++i) w[i] = 0;
#pragma unroll
    for (int i = 0; i < (B >= 4 ? 1 : VEC); ++i) e[i] = 0;
  }
  __device__ __forceinline__ void widen(float* o) const {
    if constexpr (B >= 4) {
      unpack<C>(w, W, o);
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) o[i] = C::load(e, i);
    }
  }
};

// The decode kernel's blocks have up to DEC_MAX_WARPS warps (the host picks 4, 8 or 16).
#define DEC_MAX_WARPS 16

// How the decode kernel merges the splits of a token's context (argument mg; with one
// split there is nothing to merge): DEC_MERGE_COMBINE writes partials for paged_combine,
// DEC_MERGE_TICKET has the last block of the splits merge them (paged_tickets counts the
// blocks done per (token, head group); each call leaves its counters at 0, so the counters
// of a stream's calls, which run one after another, start at 0: DEC_TICKETS of them),
// DEC_MERGE_CLUSTER merges through distributed shared memory (the splits are one cluster).
#define DEC_MERGE_COMBINE 0
#define DEC_MERGE_TICKET 1
#define DEC_MERGE_CLUSTER 2
#define DEC_TICKETS 4096
__device__ unsigned paged_tickets[DEC_TICKETS];

// cluster_sync is a barrier of every thread of the thread-block cluster, releasing this
// thread's shared-memory writes to the cluster and acquiring the others'.
__device__ __forceinline__ void cluster_sync() {
#if __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;" ::: "memory");
#endif
}

// ld_cluster reads the float at shared-memory address a (this block's window) in the
// shared memory of the cluster's block rank.
__device__ __forceinline__ float ld_cluster(unsigned a, int rank) {
  float v = 0.0f;
#if __CUDA_ARCH__ >= 900
  unsigned r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(r) : "memory");
#endif
  return v;
}

// TReduce sums each of a lane group's N partial values across the lanes of the group (lane
// bits O, O/2, ..., 1) by halving: at each bit, a lane keeps one half of its values, sends
// the other half to its partner and adds what it receives, so N - 1 shuffles leave each
// lane max(1, N / (2*O)) of the sums (then plain butterflies finish). A lane with lane bits
// b (of O, O/2, ...) holds the sums of indices b * N / (2*O) + i; when N < 2*O the lanes that
// differ only in the low bits hold the same sum.
template <int N, int O>
struct TReduce {
  static __device__ __forceinline__ void run(float* v, int lane) {
    if constexpr (O > 0) {
      if constexpr (N > 1) {
        constexpr int h = N / 2;
        const bool up = (lane & O) != 0;
#pragma unroll
        for (int i = 0; i < h; ++i) {
          const float send = up ? v[i] : v[i + h];
          const float keep = up ? v[i + h] : v[i];
          v[i] = keep + __shfl_xor_sync(FULL_MASK, send, O);
        }
        TReduce<h, O / 2>::run(v, lane);
      } else {
        v[0] += __shfl_xor_sync(FULL_MASK, v[0], O);
        TReduce<1, O / 2>::run(v, lane);
      }
    }
  }
};

// lds_vec reads N floats at p (aligned to 16 bytes when N is a multiple of 4, to 8 when it is
// even) with the widest shared-memory loads that fit.
template <int N>
__device__ __forceinline__ void lds_vec(const float* p, float* o) {
  if constexpr (N % 4 == 0) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const float4 t = ((const float4*)p)[i];
      o[4 * i] = t.x, o[4 * i + 1] = t.y, o[4 * i + 2] = t.z, o[4 * i + 3] = t.w;
    }
  } else if constexpr (N % 2 == 0) {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const float2 t = ((const float2*)p)[i];
      o[2 * i] = t.x, o[2 * i + 1] = t.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) o[i] = p[i];
  }
}

// paged_decode: see the file comment. Grid (splits, KV*hgroups, S), block of nw warps
// (blockDim.x = 32*nw, nw <= DEC_MAX_WARPS). Shared memory: ints for the split's table
// entries (maxb of them, rounded up to 4), then per warp a work area of WORK floats
// (corrections [GP] padded to 4, then the step's scores [NS]), then floats for the warps'
// merge (nw * GP * (D + 2)).
//
// A step of a warp covers STEP = KPW * U consecutive positions: lane group kg (LPR lanes,
// VEC elements per vector, CPL vectors per lane) reads keys u * KPW + kg. Each lane forms
// partial scores of its elements for its U keys and GP heads; TReduce sums them across the
// group, leaving each score in one lane (or REP lanes), which rounds it to R, scales it and
// writes it to the work area. Then lane i takes scores i, i + 32, ... (all of head i % GP)
// for the online softmax: the step's maximum per head by shuffles, the correction and the
// probabilities, which go back to the work area; every lane reads its group's
// probabilities and the corrections to update its accumulators [GP][EPL] with the values.
// The keys and values of the next step are loaded while the current one is scored and
// accumulated.
//
// With fw (the fused cache write) the kernel also does paged_write's work for the step:
// token t's own key and value (position hi) come straight from k and v (rounded to the
// cache's dtype), the last warp of the last split (the one with the fewest keys of the
// cache, often none) folds them into its softmax state before its loop, and the blocks of
// that split and head group 0 write them to the token's slot; the splits read
// the cache for positions lo..hi-1 only. A position below hi that another token of the
// step writes (several tokens of one sequence in a step, where S <= N still picks this
// kernel) must not be read from the cache, which that token's block may not have written
// yet: each block finds the lowest such position E, the splits stop before it, and that
// warp takes E..hi-1 one at a time, each from the last token of the step that writes
// it (from k and v) or else from the cache. This relies on slot_mapping naming the slot
// block_tables gives for each token's (sequence, position), as the engine lays them out.
template <class X, class C, class R, int VEC, int LPR, int CPL, int GP, int U>
__device__ __forceinline__ void paged_decode_impl(typename X::T* out, float* part, const typename X::T* q,
                                                  typename C::T* kc, typename C::T* vc,
                                                  const typename X::T* kn, const typename X::T* vn,
                                                  const void* slots, int s64, const void* pos, int p64,
                                                  const void* seqs, int q64, const void* tables, int t64, int H,
                                                  int KVH, int S, int D, int NB, int BS, int N, int M, float scale,
                                                  int window, int maxb, int fw, int* err, int tm, int mg) {
  pdl_begin();
  constexpr int KPW = 32 / LPR;                     // keys per warp and unroll step
  constexpr int EPL = VEC * CPL;                    // elements of a row per lane
  constexpr int NV = U * GP;                        // scores of a lane group and step
  constexpr int NR = NV >= LPR ? NV / LPR : 1;      // scores a lane holds after TReduce
  constexpr int REP = NV >= LPR ? 1 : LPR / NV;     // lanes holding each of them
  constexpr int NS = KPW * NV;                      // scores of a warp and step
  constexpr int SPL = NS >= 32 ? NS / 32 : 1;       // scores per lane in the softmax
  constexpr int STEP = KPW * U;                     // positions of a warp and step
  constexpr int GPPAD = (GP + 3) & ~3;
  constexpr int WORK = GPPAD + ((NS + 3) & ~3);     // floats of a warp's work area
  extern __shared__ int dsm[];
  const int nw = blockDim.x >> 5;
  // Query rows are Dq floats, zero past D: every chunk a lane reads (LPR*CPL*VEC floats a
  // row) is there, so the loop reads them without a check.
  const int Dq = max((D + 3) & ~3, LPR * CPL * VEC);
  int* sblk = dsm;                                      // [maxb]
  float* sq = (float*)(dsm + ((maxb + 3) & ~3));        // [GP][Dq]
  float* swork = sq + GP * Dq;                          // [nw][WORK]
  float* sred = swork + nw * WORK;                      // [nw][GP][D+2]
  float* sres = sred + nw * GP * (D + 2);               // [GP][D+2], DEC_MERGE_CLUSTER only

  const int splits = gridDim.x, sp = blockIdx.x;
  const int G = H / KVH;
  const int hgroups = (G + GP - 1) / GP;
  const int g = blockIdx.y / hgroups, hg = blockIdx.y - g * hgroups;
  const int t = blockIdx.z;
  const int h0 = g * G + hg * GP;
  const int nh = min(GP, G - hg * GP);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kg = lane / LPR, c0 = lane - kg * LPR;
  const int nch = D / VEC;
  const bool reporter = sp == 0 && blockIdx.y == 0 && threadIdx.x == 0;

  // With fw, the last warp of the last split loads the token's own key and value (its
  // lanes' elements, rounded to C), and in head group 0 the slot they go to; these loads,
  // the query's (to shared memory, which every warp reads) and the indices' overlap.
  const bool own = fw && sp == splits - 1 && warp == nw - 1;
  float kown[EPL], vown[EPL];
  i64 wslot = -1;
  if (own) {
#pragma unroll
    for (int c = 0; c < CPL; ++c) {
      const int ch = c0 + c * LPR;
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const i64 src = ((i64)g * S + t) * D + ch * VEC + e;
        kown[c * VEC + e] = ch < nch ? C::round(X::load(kn, src)) : 0.0f;
        vown[c * VEC + e] = ch < nch ? C::round(X::load(vn, src)) : 0.0f;
      }
    }
    if (hg == 0) wslot = load_idx(slots, t, s64);
  }
  for (int i = threadIdx.x; i < GP * Dq; i += blockDim.x) {
    const int j = i / Dq, d = i - j * Dq;
    sq[i] = (j < nh && d < D) ? X::load(q, ((i64)(h0 + j) * S + t) * D + d) : 0.0f;
  }

  const i64 hi = load_idx(pos, t, p64);
  const i64 seq = load_idx(seqs, t, q64);
  bool ok = true;
  if (seq < 0 || seq >= N) {
    if (reporter) report(err, 4, seq, t, N);
    ok = false;
  } else if (hi < 0 || hi / BS >= M) {
    if (reporter) report(err, 5, hi, t, (i64)M * BS);
    ok = false;
  }
  i64 lo = 0;
  if (window > 0) lo = hi - window + 1 > 0 ? hi - window + 1 : 0;
  // With fw, the lowest position in lo..hi-1 that another token of the step writes (per
  // warp, then merged after the barrier).
  __shared__ int sdup[DEC_MAX_WARPS];
  if (fw) {
    int e = 0x7fffffff;
    if (ok) {
      for (int i = threadIdx.x; i < S; i += blockDim.x) {
        if (i == t) continue;
        const i64 si = load_idx(seqs, i, q64), pi = load_idx(pos, i, p64);
        if (si == seq && pi >= lo && pi < hi) e = min(e, (int)pi);
      }
    }
    e = __reduce_min_sync(FULL_MASK, e);
    if (lane == 0) sdup[warp] = e;
  }
  const i64 chi = fw ? hi - 1 : hi;  // the last position read from the cache
  int bstart = 0, bend = -1;         // the split's blocks of the table row
  if (ok && chi >= lo) {
    const int blo = (int)(lo / BS), bhi = (int)(chi / BS);
    const int cb = (bhi - blo + 1 + splits - 1) / splits;
    bstart = blo + sp * cb;
    bend = min(bhi, bstart + cb - 1);
  }
  const int nb = bend - bstart + 1;
  for (int i = threadIdx.x; i < nb; i += blockDim.x) {
    i64 b = load_idx(tables, seq * M + bstart + i, t64);
    if (b < 0 || b >= NB) {
      if (blockIdx.y == 0) report(err, 3, b, seq, NB);
      b = -1;
    }
    sblk[i] = (int)b;
  }
  __syncthreads();

  float m_own = -LOOM_INF, l_own = 0.0f;  // the softmax state of head lane % GP (l: this lane's share)
  float acc[GP][EPL];
#pragma unroll
  for (int j = 0; j < GP; ++j)
#pragma unroll
    for (int e = 0; e < EPL; ++e) acc[j][e] = 0.0f;
  float* scorr = swork + warp * WORK;  // [GP]
  float* sprob = scorr + GPPAD;        // [NS]: scores, then probabilities
  const float sl2 = scale * LOG2E;
  i64 kend = chi;  // the splits read the cache up to kend
  if (fw) {
    int e = 0x7fffffff;
    for (int w = 0; w < nw; ++w) e = min(e, sdup[w]);
    if (e != 0x7fffffff) kend = min(kend, (i64)e - 1);
  }
  // absorb folds one key (the lane's elements kf of it, as the main loop's lanes hold
  // them, in every key group) and its value vf into the warp's softmax state.
  auto absorb = [&](const float* kf, const float* vf) {
    float s[GP];
#pragma unroll
    for (int j = 0; j < GP; ++j) {
      float a = 0.0f;
#pragma unroll
      for (int c = 0; c < CPL; ++c) {
        const int ch = c0 + c * LPR;
        if (ch < nch) {
          float qv[VEC];
          lds_vec<VEC>(sq + j * Dq + ch * VEC, qv);
#pragma unroll
          for (int e = 0; e < VEC; ++e) a = __fmaf_rn(qv[e], kf[c * VEC + e], a);
        }
      }
      s[j] = a;
    }
#pragma unroll
    for (int o = 1; o < LPR; o <<= 1)
#pragma unroll
      for (int j = 0; j < GP; ++j) s[j] += __shfl_xor_sync(FULL_MASK, s[j], o);
    float mm = m_own, mc = 1.0f, mp = 0.0f;
#pragma unroll
    for (int j = 0; j < GP; ++j) {
      const float sj = R::round(s[j]) * sl2;
      const float mj = __shfl_sync(FULL_MASK, m_own, j);
      const float mn = fmaxf(mj, sj);
      const float cr = exp2f(mj - mn), pj = exp2f(sj - mn);
#pragma unroll
      for (int e = 0; e < EPL; ++e) acc[j][e] = __fmaf_rn(acc[j][e], cr, kg == 0 ? pj * vf[e] : 0.0f);
      if (j == lane % GP) mm = mn, mc = cr, mp = pj;
    }
    l_own = l_own * mc + (lane < GP ? mp : 0.0f);
    m_own = mm;
  };
  if (own) {
    if (ok) absorb(kown, vown);
    if (hg == 0) {
      const i64 nslots = (i64)NB * BS;
      if (wslot >= 0 && wslot < nslots) {
        if (kg == 0) {
#pragma unroll
          for (int c = 0; c < CPL; ++c) {
            const int ch = c0 + c * LPR;
            if (ch < nch) {
              const i64 dst = (wslot * KVH + g) * D + ch * VEC;
              vstore<C, VEC>(kc + dst, kown + c * VEC);
              vstore<C, VEC>(vc + dst, vown + c * VEC);
            }
          }
        }
      } else if (lane == 0) {
        report(err, 2, wslot, t, nslots);
      }
    }
  }
  const i64 p0l = max(lo, (i64)bstart * BS), p1l = min(kend, (i64)(bend + 1) * BS - 1);
  if (nb > 0 && p0l <= p1l) {
    // Positions fit in 31 bits (the host checks M*BS), so p / BS is a multiply and a shift.
    const unsigned p0 = (unsigned)p0l, p1 = (unsigned)p1l;
    const unsigned bs = (unsigned)BS, bsh = 32 - __clz(bs - 1);
    const unsigned bmul = (unsigned)(((1ull << 32) * ((1ull << bsh) - bs)) / bs + 1);
    // slot[u]: the cache slot of key u of this lane's group, -1 when there is none (past
    // the split or in a bad block). Slots fit in 31 bits (the host checks NB*BS).
    int slot[U];
    Raw<C, VEC> kr[U][CPL], vr[U][CPL];
    auto locate = [&](unsigned base) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const unsigned p = base + u * KPW + kg;
        const unsigned b = fast_div(min(p, p1), bmul, bsh);
        const int blk = sblk[b - bstart];
        slot[u] = p <= p1 && blk >= 0 ? blk * BS + (int)(p - b * bs) : -1;
      }
    };
    auto fetch = [&](Raw<C, VEC>(&r)[U][CPL], const typename C::T* cache) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const typename C::T* row = cache + ((i64)slot[u] * KVH + g) * D;
#pragma unroll
        for (int c = 0; c < CPL; ++c) {
          const int ch = c0 + c * LPR;
          if (slot[u] >= 0 && ch < nch)
            r[u][c].load(row + ch * VEC);
          else
            r[u][c].zero();
        }
      }
    };
    unsigned base = p0 + warp * STEP;
    locate(base);
    fetch(kr, kc);
    fetch(vr, vc);
    for (; base <= p1; base += nw * STEP) {
      unsigned valid = 0;
#pragma unroll
      for (int u = 0; u < U; ++u) valid |= slot[u] >= 0 ? 1u << u : 0u;
      float s[NV];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float kf[EPL];
#pragma unroll
        for (int c = 0; c < CPL; ++c) kr[u][c].widen(kf + c * VEC);
#pragma unroll
        for (int j = 0; j < GP; ++j) {
          float qv[EPL];  // zeros past D, where kf is zero too
#pragma unroll
          for (int c = 0; c < CPL; ++c) lds_vec<VEC>(sq + j * Dq + (c0 + c * LPR) * VEC, qv + c * VEC);
          float a = 0.0f;
#pragma unroll
          for (int e = 0; e < EPL; ++e) a = __fmaf_rn(qv[e], kf[e], a);
          s[u * GP + j] = a;
        }
      }
      locate(base + nw * STEP);  // the next step's keys load during the rest of the step,
      fetch(kr, kc);             // its values once this step's are used
      TReduce<NV, LPR / 2>::run(s, lane);
      __syncwarp();  // the previous step's readers of the work area are done
      if (c0 % REP == 0) {
#pragma unroll
        for (int i = 0; i < NR; ++i) {
          const int idx = (c0 / REP) * NR + i, u = idx / GP;
          sprob[kg * NV + idx] = (valid >> u) & 1u ? R::round(s[i]) * sl2 : -LOOM_INF;
        }
      }
      __syncwarp();
      float sc[SPL];
      float tm = -LOOM_INF;
#pragma unroll
      for (int r = 0; r < SPL; ++r) {
        const int i = lane + 32 * r;
        sc[r] = i < NS ? sprob[i] : -LOOM_INF;
        tm = fmaxf(tm, sc[r]);
      }
#pragma unroll
      for (int o = GP; o < 32; o <<= 1) tm = fmaxf(tm, __shfl_xor_sync(FULL_MASK, tm, o));
      const float mnew = fmaxf(m_own, tm);
      const float corr = mnew == -LOOM_INF ? 1.0f : exp2f(m_own - mnew);
      float psum = 0.0f;
#pragma unroll
      for (int r = 0; r < SPL; ++r) {
        const int i = lane + 32 * r;
        const float pr = mnew == -LOOM_INF ? 0.0f : exp2f(sc[r] - mnew);
        if (i < NS) sprob[i] = pr;
        psum += pr;
      }
      l_own = l_own * corr + psum;
      m_own = mnew;
      if (lane < GP) scorr[lane] = corr;
      const bool rescale = __any_sync(FULL_MASK, corr != 1.0f);
      __syncwarp();
      if (rescale) {
        float cr[GP];
        lds_vec<GP>(scorr, cr);
#pragma unroll
        for (int j = 0; j < GP; ++j)
#pragma unroll
          for (int e = 0; e < EPL; ++e) acc[j][e] *= cr[j];
      }
      float pr[NV];
      lds_vec<NV>(sprob + kg * NV, pr);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float vf[EPL];
#pragma unroll
        for (int c = 0; c < CPL; ++c) vr[u][c].widen(vf + c * VEC);
#pragma unroll
        for (int j = 0; j < GP; ++j)
#pragma unroll
          for (int e = 0; e < EPL; ++e) acc[j][e] = __fmaf_rn(pr[u * GP + j], vf[e], acc[j][e]);
      }
      fetch(vr, vc);
    }
  }
  // Positions kend+1..hi-1 (only when other tokens of the step write some of them): each
  // from the last token of the step that writes it, else from the cache.
  if (own && ok && kend + 1 < hi) {
    for (i64 p = kend + 1; p < hi; ++p) {
      int best = -1;
      for (int i = lane; i < S; i += 32)
        if (i != t && load_idx(seqs, i, q64) == seq && load_idx(pos, i, p64) == p) best = i;
      best = __reduce_max_sync(FULL_MASK, best);
      i64 row = -1;  // element offset of the row in the cache
      if (best < 0) {
        const i64 b = load_idx(tables, seq * M + p / BS, t64);
        if (b < 0 || b >= NB) {
          if (lane == 0 && blockIdx.y == 0) report(err, 3, b, seq, NB);
          continue;
        }
        row = ((b * BS + p % BS) * KVH + g) * D;
      }
      float kf[EPL], vf[EPL];
#pragma unroll
      for (int c = 0; c < CPL; ++c) {
        const int ch = c0 + c * LPR;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const int d = ch * VEC + e;
          float kx = 0.0f, vx = 0.0f;
          if (ch < nch) {
            if (best >= 0) {
              const i64 src = ((i64)g * S + best) * D + d;
              kx = C::round(X::load(kn, src));
              vx = C::round(X::load(vn, src));
            } else {
              kx = C::load(kc, row + d);
              vx = C::load(vc, row + d);
            }
          }
          kf[c * VEC + e] = kx;
          vf[c * VEC + e] = vx;
        }
      }
      absorb(kf, vf);
    }
  }
  // Merge the key groups of the warp (lanes that share c0) and the lanes of each head's sum,
  // then the warps.
#pragma unroll
  for (int o = LPR; o < 32; o <<= 1)
#pragma unroll
    for (int j = 0; j < GP; ++j)
#pragma unroll
      for (int e = 0; e < EPL; ++e) acc[j][e] += __shfl_xor_sync(FULL_MASK, acc[j][e], o);
#pragma unroll
  for (int o = GP; o < 32; o <<= 1) l_own += __shfl_xor_sync(FULL_MASK, l_own, o);
  const int rec = D + 2;
  if (lane < GP) {
    float* r = sred + (warp * GP + lane) * rec;
    r[0] = m_own;
    r[1] = l_own;
  }
  if (kg == 0) {
#pragma unroll
    for (int j = 0; j < GP; ++j) {
      float* r = sred + (warp * GP + j) * rec;
#pragma unroll
      for (int c = 0; c < CPL; ++c) {
        const int ch = c0 + c * LPR;
        if (ch < nch)
#pragma unroll
          for (int e = 0; e < VEC; ++e) r[2 + ch * VEC + e] = acc[j][c * VEC + e];
      }
    }
  }
  __syncthreads();
  // Each warp's factor exp2(max_w - max) per head, once (0 for a warp that saw no key, and
  // for every warp of a head no warp saw a key of), and the heads' maxima, into the work
  // areas, which the loop no longer uses (nw * WORK >= (nw + 1) * GP floats).
  float* sfac = swork;            // [nw][GP]
  float* smax = swork + nw * GP;  // [GP]
  for (int i = threadIdx.x; i < nw * GP; i += blockDim.x) {
    const int w = i / GP, j = i - w * GP;
    float mx = -LOOM_INF;
    for (int v = 0; v < nw; ++v) mx = fmaxf(mx, sred[(v * GP + j) * rec]);
    sfac[i] = mx == -LOOM_INF ? 0.0f : exp2f(sred[i * rec] - mx);
    if (w == 0) smax[j] = mx;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < nh * D; i += blockDim.x) {
    const int j = i / D, d = i - j * D;
    const float mx = smax[j];
    float L = 0.0f, A = 0.0f;
    const float* r = sred + j * rec;
    const float* fp = sfac + j;
#pragma unroll 4
    for (int w = 0; w < nw; ++w, r += GP * rec, fp += GP) {
      const float f = *fp;
      L += r[1] * f;
      A += r[2 + d] * f;
    }
    const int h = h0 + j;
    if (splits == 1) {
      X::store(out, att_out(h, t, H, S, D, tm) + d, L > 0.0f ? A / L : LOOM_NAN);
    } else {
      float* pr = mg == DEC_MERGE_CLUSTER ? sres + j * rec : part + (((i64)t * H + h) * splits + sp) * rec;
      if (d == 0) {
        pr[0] = mx;
        pr[1] = L;
      }
      pr[2 + d] = A;
    }
  }
  if (splits == 1) return;
  if (mg == DEC_MERGE_TICKET) {
    // The block that finishes last among the splits of this (token, head group) merges
    // their partials: every block's partials are written (barrier) and made visible at
    // device scope (thread 0's fence) before it takes its ticket; the last block resets the
    // counter for the next call and reads the partials past L1.
    __shared__ int slast;
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      unsigned* tk = paged_tickets + (t * gridDim.y + blockIdx.y);
      const bool last = atomicAdd(tk, 1u) == (unsigned)splits - 1;
      if (last) atomicExch(tk, 0u);
      __threadfence();
      slast = last;
    }
    __syncthreads();
    if (!slast) return;
    for (int i = threadIdx.x; i < nh * D; i += blockDim.x) {
      const int j = i / D, d = i - j * D;
      const int h = h0 + j;
      const float* pr = part + ((i64)t * H + h) * splits * rec;
      float mx = -LOOM_INF;
      for (int s = 0; s < splits; ++s) mx = fmaxf(mx, __ldcg(pr + s * rec));
      float L = 0.0f, A = 0.0f;
      if (mx != -LOOM_INF) {
        for (int s = 0; s < splits; ++s) {
          const float f = exp2f(__ldcg(pr + s * rec) - mx);  // 0 for an empty split (max -inf)
          L += __ldcg(pr + s * rec + 1) * f;
          A += __ldcg(pr + s * rec + 2 + d) * f;
        }
      }
      X::store(out, att_out(h, t, H, S, D, tm) + d, L > 0.0f ? A / L : LOOM_NAN);
    }
  } else if (mg == DEC_MERGE_CLUSTER) {
    // The splits are one thread-block cluster (blockIdx.x is the rank): each block's
    // partials are in its shared memory (sres); after a cluster barrier block sp merges
    // outputs sp, sp + splits, ... (in units of blockDim.x) reading every block's partials
    // through distributed shared memory, and a second barrier keeps them alive until all
    // blocks are done.
    cluster_sync();
    const unsigned base = (unsigned)__cvta_generic_to_shared(sres);
    for (int i = threadIdx.x + sp * blockDim.x; i < nh * D; i += splits * blockDim.x) {
      const int j = i / D, d = i - j * D;
      const int h = h0 + j;
      const unsigned r0 = base + (unsigned)(j * rec) * 4u;
      float mx = -LOOM_INF;
      for (int s = 0; s < splits; ++s) mx = fmaxf(mx, ld_cluster(r0, s));
      float L = 0.0f, A = 0.0f;
      if (mx != -LOOM_INF) {
        for (int s = 0; s < splits; ++s) {
          const float f = exp2f(ld_cluster(r0, s) - mx);  // 0 for an empty split (max -inf)
          L += ld_cluster(r0 + 4u, s) * f;
          A += ld_cluster(r0 + (unsigned)(2 + d) * 4u, s) * f;
        }
      }
      X::store(out, att_out(h, t, H, S, D, tm) + d, L > 0.0f ? A / L : LOOM_NAN);
    }
    cluster_sync();
  }
}

#define PAGED_DECODE(X, XN, C, CN, VEC, LPR, CPL, GP, U)                                                          \
  extern "C" __global__ void __launch_bounds__(DEC_MAX_WARPS * 32)                                                \
      paged_decode_##XN##_##CN##_v##VEC##_l##LPR##_c##CPL##_g##GP##_u##U(                                         \
          X::T* out, float* part, const X::T* q, C::T* kc, C::T* vc, const X::T* kn, const X::T* vn,              \
          const void* slots, int s64, const void* pos, int p64, const void* seqs, int q64, const void* tables,    \
          int t64, int H, int KVH, int S, int D, int NB, int BS, int N, int M, float scale, int window, int maxb, \
          int fw, int* err, int tm, int mg) {                                                                      \
    paged_decode_impl<X, C, Promote<X, C>::type, VEC, LPR, CPL, GP, U>(                                            \
        out, part, q, kc, vc, kn, vn, slots, s64, pos, p64, seqs, q64, tables, t64, H, KVH, S, D, NB, BS, N, M,    \
        scale, window, maxb, fw, err, tm, mg);                                                                     \
  }

// paged_combine merges the splits' partials [S][H][splits][D+2] (max in base 2, sum,
// accumulator) into out[1,H,S,D]. One block per (head, token).
template <class X>
__device__ __forceinline__ void paged_combine_impl(typename X::T* out, const float* part, int H, int S, int D,
                                                   int splits, int tm) {
  pdl_begin();
  const int h = blockIdx.x, t = blockIdx.y;
  const int rec = D + 2;
  const float* pr = part + ((i64)t * H + h) * splits * rec;
  // CMB_CHUNK splits at a time, every load of a chunk issued at once: one chunk holds the
  // splits of most plans; later chunks are merged online into the first.
  constexpr int CMB_CHUNK = 8;
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float mx = -LOOM_INF, L = 0.0f, A = 0.0f;
    for (int s0 = 0; s0 < splits; s0 += CMB_CHUNK) {
      float m[CMB_CHUNK], l[CMB_CHUNK], a[CMB_CHUNK];
#pragma unroll
      for (int k = 0; k < CMB_CHUNK; ++k) {
        const float* r = pr + (i64)(s0 + k) * rec;
        const bool in = s0 + k < splits;
        m[k] = in ? r[0] : -LOOM_INF;
        l[k] = in ? r[1] : 0.0f;
        a[k] = in ? r[2 + d] : 0.0f;
      }
      float cm = mx;
#pragma unroll
      for (int k = 0; k < CMB_CHUNK; ++k) cm = fmaxf(cm, m[k]);
      if (cm == -LOOM_INF) continue;
      const float c = exp2f(mx - cm);  // 0 before the first split that saw a key
      L *= c;
      A *= c;
#pragma unroll
      for (int k = 0; k < CMB_CHUNK; ++k) {
        const float f = exp2f(m[k] - cm);  // 0 for an empty split (max -inf)
        L += l[k] * f;
        A += a[k] * f;
      }
      mx = cm;
    }
    X::store(out, att_out(h, t, H, S, D, tm) + d, L > 0.0f ? A / L : LOOM_NAN);
  }
}

#define PAGED_COMBINE(X, XN)                                                                                     \
  extern "C" __global__ void paged_combine_##XN(X::T* out, const float* part, int H, int S, int D, int splits, int tm) { \
    paged_combine_impl<X>(out, part, H, S, D, splits, tm);                                                          \
  }

#define PF_WARPS 4
#define PF_ROWS 8
#define PF_BR (PF_WARPS * PF_ROWS)
#define PF_BC 32

// paged_prefill: see the file comment. Grid (ceil(S*G/PF_BR), KV), block PF_WARPS*32.
// Shared memory (Dp = D rounded up to 4): Qs [PF_BR][Dp], Ks [PF_BC][Dp+4], Vs [PF_BC][Dp],
// Ps [PF_BR][PF_BC] floats, then Kslot [PF_BC] i64. VEC cache elements per vector load.
template <class X, class C, class R, int DL, int VEC>
__device__ __forceinline__ void paged_prefill_impl(typename X::T* out, const typename X::T* q,
                                                   const typename C::T* kc, const typename C::T* vc,
                                                   const void* pos, int p64, const void* seqs, int q64,
                                                   const void* tables, int t64, int H, int KVH, int S, int D,
                                                   int NB, int BS, int N, int M, float scale, int window, int* err, int tm) {
  pdl_begin();
  extern __shared__ float psm[];
  const int Dp = (D + 3) & ~3;
  float* Qs = psm;
  float* Ks = Qs + PF_BR * Dp;
  float* Vs = Ks + PF_BC * (Dp + 4);
  float* Ps = Vs + PF_BC * Dp;
  i64* Kslot = (i64*)(Ps + PF_BR * PF_BC);

  const int G = H / KVH;
  const int g = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const i64 rows = (i64)S * G;
  const i64 r0 = (i64)blockIdx.x * PF_BR;
  const int nch = D / VEC;

  // Zero the padding columns of Ks and Vs once; loads never write them.
  for (int i = threadIdx.x; i < PF_BC * 8; i += blockDim.x) {
    const int jj = i >> 3, d = D + (i & 7);
    if (d < Dp + 4) Ks[jj * (Dp + 4) + d] = 0.0f;
    if (d < Dp) Vs[jj * Dp + d] = 0.0f;
  }
  for (int i = threadIdx.x; i < PF_BR * Dp; i += blockDim.x) {
    const int r = i / Dp, d = i - r * Dp;
    const i64 f = r0 + r;
    float x = 0.0f;
    if (f < rows && d < D) {
      const int t = (int)(f / G), h = g * G + (int)(f % G);
      x = X::load(q, ((i64)h * S + t) * D + d);
    }
    Qs[i] = x;
  }
  // This warp's rows: token, bounds, state.
  int rtok[PF_ROWS], rlo[PF_ROWS], rhi[PF_ROWS];  // positions fit in int (checked by the host)
  bool rok[PF_ROWS];
  float m[PF_ROWS], l[PF_ROWS], acc[PF_ROWS][DL];
#pragma unroll
  for (int j = 0; j < PF_ROWS; ++j) {
    const i64 f = r0 + warp * PF_ROWS + j;
    rok[j] = f < rows;
    rtok[j] = rok[j] ? (int)(f / G) : -1;
    rlo[j] = 0;
    rhi[j] = -1;
    if (rok[j]) {
      const i64 hi = load_idx(pos, rtok[j], p64), seq = load_idx(seqs, rtok[j], q64);
      const bool first = g == 0 && f % G == 0 && lane == 0;  // one report per token
      if (seq < 0 || seq >= N) {
        if (first) report(err, 4, seq, rtok[j], N);
        rok[j] = false;
      } else if (hi < 0 || hi / BS >= M) {
        if (first) report(err, 5, hi, rtok[j], (i64)M * BS);
        rok[j] = false;
      } else {
        rhi[j] = (int)hi;
        if (window > 0) rlo[j] = hi - window + 1 > 0 ? (int)(hi - window + 1) : 0;
      }
    }
    m[j] = -LOOM_INF;
    l[j] = 0.0f;
#pragma unroll
    for (int u = 0; u < DL; ++u) acc[j][u] = 0.0f;
  }
  const float sl2 = scale * LOG2E;
  const int tfirst = (int)(r0 / G);
  const int tlast = (int)((min(rows, r0 + PF_BR) - 1) / G);
  // Runs of tokens of one sequence, in order.
  for (int ts = tfirst; ts <= tlast;) {
    const i64 cur = load_idx(seqs, ts, q64);
    int te = ts;
    i64 klo = (i64)1 << 62, khi = -1;
    for (;; ++te) {
      const i64 hi = load_idx(pos, te, p64);
      if (cur >= 0 && cur < N && hi >= 0 && hi / BS < M) {
        i64 lo = 0;
        if (window > 0) lo = hi - window + 1 > 0 ? hi - window + 1 : 0;
        klo = min(klo, lo);
        khi = max(khi, hi);
      }
      if (te + 1 > tlast || load_idx(seqs, te + 1, q64) != cur) break;
    }
    // Rows of this run that this warp owns, and the last position any of them sees.
    bool in[PF_ROWS];
    int whi = -1, wlo = 0x7fffffff;
#pragma unroll
    for (int j = 0; j < PF_ROWS; ++j) {
      in[j] = rok[j] && rtok[j] >= ts && rtok[j] <= te;
      if (in[j]) {
        whi = max(whi, rhi[j]);
        wlo = min(wlo, rlo[j]);
      }
    }
    for (i64 kt = klo; kt <= khi; kt += PF_BC) {
      if (threadIdx.x < PF_BC) {
        const i64 p = kt + threadIdx.x;
        i64 slot = -1;
        if (p <= khi) {
          i64 b = load_idx(tables, cur * M + p / BS, t64);
          if (b < 0 || b >= NB) {
            if (g == 0 && (p % BS == 0 || p == kt)) report(err, 3, b, cur, NB);
          } else {
            slot = b * BS + p % BS;
          }
        }
        Kslot[threadIdx.x] = slot;
      }
      __syncthreads();
      for (int i = threadIdx.x; i < PF_BC * nch; i += blockDim.x) {
        const int jj = i / nch, ch = i - jj * nch;
        const i64 slot = Kslot[jj];
        Raw<C, VEC> kr, vr;
        if (slot >= 0) {
          const i64 off = (slot * KVH + g) * D + ch * VEC;
          kr.load(kc + off);
          vr.load(vc + off);
        } else {
          kr.zero();
          vr.zero();
        }
        float kf[VEC], vf[VEC];
        kr.widen(kf);
        vr.widen(vf);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          Ks[jj * (Dp + 4) + ch * VEC + e] = kf[e];
          Vs[jj * Dp + ch * VEC + e] = vf[e];
        }
      }
      __syncthreads();
      // The warp skips tiles none of its rows of this run sees (uniform across the warp).
      if (whi >= kt && wlo < kt + PF_BC) {
        const int p = (int)kt + lane;
        const bool kin = Kslot[lane] >= 0;
        float sc[PF_ROWS];
#pragma unroll
        for (int j = 0; j < PF_ROWS; ++j) sc[j] = 0.0f;
        const float4* kr4 = (const float4*)(Ks + lane * (Dp + 4));
        const float4* q4 = (const float4*)(Qs + warp * PF_ROWS * Dp);
        for (int d4 = 0; d4 < Dp / 4; ++d4) {
          const float4 kv = kr4[d4];
#pragma unroll
          for (int j = 0; j < PF_ROWS; ++j) {
            const float4 qv = q4[j * (Dp / 4) + d4];
            sc[j] = __fmaf_rn(qv.x, kv.x, sc[j]);
            sc[j] = __fmaf_rn(qv.y, kv.y, sc[j]);
            sc[j] = __fmaf_rn(qv.z, kv.z, sc[j]);
            sc[j] = __fmaf_rn(qv.w, kv.w, sc[j]);
          }
        }
        float* pw = Ps + warp * PF_ROWS * PF_BC;
#pragma unroll
        for (int j = 0; j < PF_ROWS; ++j) {
          const bool vis = in[j] && kin && p >= rlo[j] && p <= rhi[j];
          const float s = vis ? R::round(sc[j]) * sl2 : -LOOM_INF;
          const float mnew = fmaxf(m[j], warp_max(s));
          float pj = 0.0f;
          if (mnew != -LOOM_INF) {  // uniform across the warp
            pj = vis ? exp2f(s - mnew) : 0.0f;
            const float corr = exp2f(m[j] - mnew);
            l[j] = l[j] * corr + warp_sum(pj);
#pragma unroll
            for (int u = 0; u < DL; ++u) acc[j][u] *= corr;
            m[j] = mnew;
          }
          pw[j * PF_BC + lane] = pj;
        }
        __syncwarp();
        for (int jj = 0; jj < PF_BC; jj += 4) {
          float vv[4][DL];
#pragma unroll
          for (int a = 0; a < 4; ++a)
#pragma unroll
            for (int u = 0; u < DL; ++u) {
              const int d = lane + 32 * u;
              vv[a][u] = d < Dp ? Vs[(jj + a) * Dp + d] : 0.0f;
            }
#pragma unroll
          for (int j = 0; j < PF_ROWS; ++j) {
            const float4 p4 = *(const float4*)(pw + j * PF_BC + jj);
#pragma unroll
            for (int u = 0; u < DL; ++u) {
              float a = acc[j][u];
              a = __fmaf_rn(p4.x, vv[0][u], a);
              a = __fmaf_rn(p4.y, vv[1][u], a);
              a = __fmaf_rn(p4.z, vv[2][u], a);
              a = __fmaf_rn(p4.w, vv[3][u], a);
              acc[j][u] = a;
            }
          }
        }
        __syncwarp();
      }
      __syncthreads();
    }
    ts = te + 1;
  }
#pragma unroll
  for (int j = 0; j < PF_ROWS; ++j) {
    const i64 f = r0 + warp * PF_ROWS + j;
    if (f >= rows) continue;
    const int t = (int)(f / G), h = g * G + (int)(f % G);
    const float inv = l[j] > 0.0f ? 1.0f / l[j] : LOOM_NAN;
#pragma unroll
    for (int u = 0; u < DL; ++u) {
      const int d = lane + 32 * u;
      if (d < D) X::store(out, att_out(h, t, H, S, D, tm) + d, acc[j][u] * inv);
    }
  }
}

#define PAGED_PREFILL(X, XN, C, CN, DL, VEC)                                                                     \
  extern "C" __global__ void __launch_bounds__(PF_WARPS * 32) paged_prefill_##XN##_##CN##_d##DL##_v##VEC(       \
      X::T* out, const X::T* q, const C::T* kc, const C::T* vc, const void* pos, int p64, const void* seqs,      \
      int q64, const void* tables, int t64, int H, int KVH, int S, int D, int NB, int BS, int N, int M,          \
      float scale, int window, int* err, int tm) {                                                                      \
    paged_prefill_impl<X, C, Promote<X, C>::type, DL, VEC>(out, q, kc, vc, pos, p64, seqs, q64, tables, t64, H, \
                                                           KVH, S, D, NB, BS, N, M, scale, window, err, tm);        \
  }

// gather copies x[outer, A, inner] rows by idx[n] into out[outer, n, inner]; an index
// outside [0, A) gives zeros.
template <class T>
__device__ __forceinline__ void gather_impl(T* out, const T* x, const void* idx, int i64idx, i64 outer, i64 A,
                                            i64 n, i64 inner) {
  pdl_begin();
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
