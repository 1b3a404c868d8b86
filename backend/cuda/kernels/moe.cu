// The fused mixture-of-experts block, graph op moe (graph/catalog_moe.go; the CPU's
// backend/cpu/fast_moe.go gives the rounding contract): x[T,H], router [E,H], gate and up
// [L,I,H], down [L,H,I] (the L local experts from expert_offset) -> out[T,H] in x's dtype.
// Everything stays on the device, so a step with moe ops can be captured in a CUDA graph.
// backend/cuda (moe.go) queues, per op:
//
//  1. router logits [T,E] in x's dtype: moe_router (a GEMV over chunks of MT tokens) or, for
//     bf16 x and many tokens, graph op linear's cuBLAS GEMM;
//  2. moe_route: one warp per token: softmax in double rounded to f32, the top_k largest
//     (ties lowest index first, NaN above every number), renormalised (double sum, f32
//     division) when asked, rounded to weight_dtype -> ids [T,k] i32, weights [T,k] f32. The
//     last block to finish (a counter that it resets) groups the assignments by local
//     expert: counts [L], offsets [L], the list active[] of experts with tokens (expert
//     order), pos [T,k] (an assignment's row in the grouped order, -1 for an expert that is
//     not local), tok [A] (the token of each grouped row) and the tensor-core tiles of
//     MOE_BM rows (tile_e, tile_r); hdr = {active experts, tiles}. One token's grouping
//     is the ranks of its choices, written by its warp (moe_group_one);
//  3. the experts, on their own tokens only: gate and up with silu(g)*u in the epilogue ->
//     h [A,I], then down -> y [A,H], both in x's dtype, rows in the grouped order. Either the
//     grouped GEMV (moe_gate_up, moe_down: grid (row tiles, active-expert slots); a block
//     whose slot has no expert exits at once; each warp streams its weight rows once per
//     chunk of MT of the expert's tokens, as gemv.cu streams them), or, for bf16 x and
//     weights and many tokens per expert, the tensor-core GEMM (moe_mma_*: mma.sync
//     m16n8k16 bf16, tiles of 64 grouped rows by 64 outputs, MOE_STAGES cp.async stages);
//  4. moe_combine: per token and output element, its experts' rows of y in expert order: each product
//     y·weight rounded to promote(x, weight_dtype) then to x's dtype, added rounding to x's
//     dtype after each add; 0 for a token that chose no local expert.
//
// Numerics: projections are f32 dot products of x (or h) as stored, widened exactly, and the
// weights widened exactly (an f32 x is not rounded to bf16: the CPU's linear does not round
// it), rounded to x's dtype; silu in double rounded to f32 then to x's dtype, times u in
// f32, rounded. The tensor-core path takes bf16 x only (exact in bf16) and accumulates in
// f32. Only the order of the f32 sums differs from the CPU's.
//
// The file holds templates only: backend/cuda appends MOE_KERNELS(X, x, W, w, WR, wr) for the
// dtypes of x, the experts' weights and the router, and MOE_MMA_KERNELS() when x and the
// experts are bf16. Every kernel waits (pdl_begin) before it touches memory.

#define MOE_WARPS 8
#define MOE_MAX_L 1024
#define MOE_MAX_K 32
#define MOE_BM 64
#define MOE_BN 64
#define MOE_BK 32
#define MOE_SP 40  // shared row pitch of the tensor-core tiles, in elements (80 bytes)
#define MOE_STAGES 3  // tiles of MOE_BK in shared memory (45 KiB for gate/up, under 48 static)

// Offsets of the metadata block (ints): hdr[0] active experts, hdr[1] tiles.
struct MoeMeta {
  int* counts;   // [L]
  int* offsets;  // [L]
  int* active;   // [L]
  int* hdr;      // [4]
  int* tile_e;   // [max tiles]
  int* tile_r;   // [max tiles]
  int* pos;      // [T*k]
  int* tok;      // [T*k]
};

// MoeW reads 8 weights (one chunk) as Q 16-byte loads and widens them.
template <class W> struct MoeW;
template <> struct MoeW<BF16> {
  enum { Q = 1 };
  static __device__ __forceinline__ void load(const bf16* w, i64 i, uint4* r) { r[0] = ld_nc_v4(w + i); }
  static __device__ __forceinline__ void widen(const uint4* r, float* f) { bf16x8(r[0], f); }
};
template <> struct MoeW<F32> {
  enum { Q = 2 };
  static __device__ __forceinline__ void load(const float* w, i64 i, uint4* r) {
    r[0] = ld_nc_v4(w + i);
    r[1] = ld_nc_v4(w + i + 4);
  }
  static __device__ __forceinline__ void widen(const uint4* r, float* f) {
    f[0] = __uint_as_float(r[0].x);
    f[1] = __uint_as_float(r[0].y);
    f[2] = __uint_as_float(r[0].z);
    f[3] = __uint_as_float(r[0].w);
    f[4] = __uint_as_float(r[1].x);
    f[5] = __uint_as_float(r[1].y);
    f[6] = __uint_as_float(r[1].z);
    f[7] = __uint_as_float(r[1].w);
  }
};

// MoeX reads 8 activations (16-byte aligned) widened to f32, exactly.
template <class X> struct MoeX;
template <> struct MoeX<BF16> {
  static __device__ __forceinline__ void load8(const bf16* p, float* f) { bf16x8(__ldg((const uint4*)p), f); }
};
template <> struct MoeX<F32> {
  static __device__ __forceinline__ void load8(const float* p, float* f) {
    const float4 a = __ldg((const float4*)p), b = __ldg((const float4*)(p + 4));
    f[0] = a.x;
    f[1] = a.y;
    f[2] = a.z;
    f[3] = a.w;
    f[4] = b.x;
    f[5] = b.y;
    f[6] = b.z;
    f[7] = b.w;
  }
};

// moe_round rounds v to the dtype coded by r: 0 f32 (nothing), 1 bf16, 2 f16.
__device__ __forceinline__ float moe_round(float v, int r) {
  if (r == 1) return BF16::round(v);
  if (r == 2) {
    float o;
    asm("{ .reg .b16 h; cvt.rn.f16.f32 h, %1; cvt.f32.f16 %0, h; }" : "=f"(o) : "f"(v));
    return o;
  }
  return v;
}

// moe_dot computes acc[r][m] = wr[r] · xr[m] over K (a multiple of 8) for the R weight rows of
// the warp and its first n <= MT rows of activations (acc of rows m >= n is 0). Each lane
// keeps U chunks of 8 weights per row in flight; on return every lane holds the sums.
template <int MT, int R, int U, class X, class W>
__device__ __forceinline__ void moe_dot(float (&acc)[R][MT], const typename W::T* const (&wr)[R],
                                        const typename X::T* const (&xr)[MT], int n, int K) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[r][m] = 0.0f;
  const int K8 = K >> 3;
  for (int c0 = 0; c0 < K8; c0 += 32 * U) {
    uint4 raw[U][R][MoeW<W>::Q];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + 32 * u + lane;
      if (c < K8)
#pragma unroll
        for (int r = 0; r < R; ++r) MoeW<W>::load(wr[r], (i64)c * 8, raw[u][r]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + 32 * u + lane;
      if (c < K8) {
        float wf[R][8];
#pragma unroll
        for (int r = 0; r < R; ++r) MoeW<W>::widen(raw[u][r], wf[r]);
#pragma unroll
        for (int m = 0; m < MT; ++m) {
          if (m < n) {
            float xf[8];
            MoeX<X>::load8(xr[m] + (i64)c * 8, xf);
#pragma unroll
            for (int j = 0; j < 8; ++j)
#pragma unroll
              for (int r = 0; r < R; ++r) acc[r][m] = fmaf(wf[r][j], xf[j], acc[r][m]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m)
      if (m < n) acc[r][m] = warp_sum(acc[r][m]);
}

// moe_pick returns acc[r][m] for the (r, m) = (l / MT, l % MT) of lane l (unrolled selects,
// so acc stays in registers), and, with P > 0, acc[P + r][m] in *b.
template <int MT, int R, int P>
__device__ __forceinline__ float moe_pick(const float (&acc)[R][MT], int l, float* b) {
  float a = 0.f;
#pragma unroll
  for (int r = 0; r < (P > 0 ? P : R); ++r)
#pragma unroll
    for (int m = 0; m < MT; ++m)
      if (l == r * MT + m) {
        a = acc[r][m];
        if (P > 0) *b = acc[P + r][m];
      }
  return a;
}

__device__ __forceinline__ int moe_warp() { return blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); }

// moe_swiglu_store stores silu(g) * u as the CPU rounds it: g and u rounded to X, silu in
// double rounded to f32 then to X, the product in f32 rounded to X.
template <class X>
__device__ __forceinline__ void moe_swiglu_store(typename X::T* h, i64 i, float g, float u) {
  g = X::round(g);
  u = X::round(u);
  const float s = X::round((float)((double)g / (1.0 + exp(-(double)g))));
  X::store(h, i, s * u);
}

// moe_router_rows computes the calling warp's R router rows for the MT tokens of blockIdx.y
// (nothing for a warp past the rows or tokens; it does not return early, so a fused caller
// can go on to a barrier): logits[T,E] = x[T,H] · router[E,H]ᵀ rounded to X.
template <int MT, int R, int U, class X, class W>
__device__ __forceinline__ void moe_router_rows(typename X::T* logits, const typename X::T* x,
                                                const typename W::T* router, int T, int E, int H) {
  static_assert(R * MT <= 32, "a warp's lanes finish R rows of MT tokens");
  const int m0 = blockIdx.y * MT, n = min(MT, T - m0);
  const int e0 = moe_warp() * R;
  if (n > 0 && e0 < E) {
    const typename W::T* wr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wr[r] = router + (i64)min(e0 + r, E - 1) * H;
    const typename X::T* xr[MT];
#pragma unroll
    for (int m = 0; m < MT; ++m) xr[m] = x + (i64)(m0 + min(m, n - 1)) * H;
    float acc[R][MT];
    moe_dot<MT, R, U, X, W>(acc, wr, xr, n, H);
    const int l = threadIdx.x & 31;
    float unused;
    const float v = moe_pick<MT, R, 0>(acc, l, &unused);
    const int r = l / MT, m = l % MT;
    if (l < R * MT && m < n && e0 + r < E) X::store(logits, (i64)(m0 + m) * E + e0 + r, v);
  }
}

// moe_router: the router logits (moe_router_rows). Grid (ceil(E / (R * warps)), ceil(T /
// MT)); block MOE_WARPS warps, each owning R router rows for MT tokens.
template <int MT, int R, int U, class X, class W>
__device__ __forceinline__ void moe_router_impl(typename X::T* logits, const typename X::T* x,
                                                const typename W::T* router, int T, int E, int H) {
  pdl_begin();
  moe_router_rows<MT, R, U, X, W>(logits, x, router, T, E, H);
}

// moe_gt: a ranks before b (NaN above every number).
__device__ __forceinline__ bool moe_gt(float a, float b) { return a > b || (a != a && b == b); }

// moe_route_token routes token t with the calling warp (see the file comment, step 2): its
// softmax over the E logits (read through L2: a fused kernel's other blocks wrote them), the
// top k, renormalised when asked -> ids[t*k..], wts[t*k..]. pr is the warp's E floats of
// shared memory. Lane j < k returns the j-th choice's expert, the others -1.
template <class X>
__device__ __forceinline__ int moe_route_token(const typename X::T* logits, int* ids, float* wts, float* pr, int t,
                                                int E, int k, int normalize, int wround) {
  const int lane = threadIdx.x & 31;
  float mx = -LOOM_INF;
  for (int j = lane; j < E; j += 32) {
    const float v = X::load_cg(logits, (i64)t * E + j);
    pr[j] = v;
    mx = fmaxf(mx, v);
  }
  mx = warp_max(mx);
  double sum = 0.0;
  for (int j = lane; j < E; j += 32) sum += exp((double)pr[j] - (double)mx);
  sum = warp_sum_d(sum);
  for (int j = lane; j < E; j += 32) pr[j] = (float)(exp((double)pr[j] - (double)mx) / sum);
  __syncwarp();
  float val = 0.f;  // lane j < k keeps the j-th choice
  int idx = 0;
  for (int j = 0; j < k; ++j) {
    float bv = 0.f;
    int bi = -1;
    for (int i = lane; i < E; i += 32) {
      const float p = pr[i];
      if (p >= 0.f || p != p) {  // chosen entries hold -1
        if (bi < 0 || moe_gt(p, bv)) {
          bv = p;
          bi = i;
        }
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(FULL_MASK, bv, o);
      const int oi = __shfl_xor_sync(FULL_MASK, bi, o);
      if (oi >= 0 && (bi < 0 || moe_gt(ov, bv) || (!moe_gt(bv, ov) && oi < bi))) {
        bv = ov;
        bi = oi;
      }
    }
    if (lane == j) {
      val = bv;
      idx = bi;
    }
    __syncwarp();
    if (lane == 0) pr[bi] = -1.f;
    __syncwarp();
  }
  if (normalize) {
    double s = 0.0;
    for (int j = 0; j < k; ++j) s += (double)__shfl_sync(FULL_MASK, val, j);
    val /= (float)s;
  }
  if (lane < k) {
    ids[(i64)t * k + lane] = idx;
    wts[(i64)t * k + lane] = moe_round(val, wround);
  }
  return lane < k ? idx : -1;
}

// moe_last_block tells the blocks of a grid that have done their part whether they are the
// last to finish (a counter, reset by the last block, that is zero between launches); the
// last block then sees every other block's writes (read them through L2). Every thread of
// the block must call it.
__device__ __forceinline__ bool moe_last_block(unsigned* counter) {
  __shared__ int s_last;
  if (gridDim.x * gridDim.y == 1) {
    __syncthreads();
    return true;
  }
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicAdd(counter, 1u) == gridDim.x * gridDim.y - 1;
  __syncthreads();
  if (!s_last) return false;
  __threadfence();
  if (threadIdx.x == 0) *counter = 0u;
  return true;
}

// moe_group groups the assignments ids[T*k] of all tokens by local expert (see the file
// comment, step 2), with the whole calling block.
__device__ __forceinline__ void moe_group(const int* ids, MoeMeta mm, int T, int k, int L, int off) {
  __shared__ int cnt[MOE_MAX_L], cur[MOE_MAX_L];
  __shared__ int s_active, s_tiles;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const i64 A = (i64)T * k;
  for (int e = threadIdx.x; e < L; e += blockDim.x) cnt[e] = cur[e] = 0;
  __syncthreads();
  for (i64 a = threadIdx.x; a < A; a += blockDim.x) {
    const int e = __ldcg(ids + a) - off;
    if (e >= 0 && e < L) atomicAdd(&cnt[e], 1);
  }
  __syncthreads();
  if (warp == 0) {  // exclusive scans of the counts, the active flags and the tiles
    int base = 0, act = 0, tiles = 0;
    for (int e0 = 0; e0 < L; e0 += 32) {
      const int e = e0 + lane;
      const int c = e < L ? cnt[e] : 0, f = c > 0, nt = (c + MOE_BM - 1) / MOE_BM;
      int ic = c, iff = f, it = nt;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int a = __shfl_up_sync(FULL_MASK, ic, o), b = __shfl_up_sync(FULL_MASK, iff, o),
                  d = __shfl_up_sync(FULL_MASK, it, o);
        if (lane >= o) {
          ic += a;
          iff += b;
          it += d;
        }
      }
      if (e < L) {
        mm.counts[e] = c;
        mm.offsets[e] = base + ic - c;
        cur[e] = base + ic - c;  // the next free row of expert e
        if (f) mm.active[act + iff - 1] = e;
        for (int i = 0; i < nt; ++i) {
          mm.tile_e[tiles + it - nt + i] = e;
          mm.tile_r[tiles + it - nt + i] = i * MOE_BM;
        }
      }
      base += __shfl_sync(FULL_MASK, ic, 31);
      act += __shfl_sync(FULL_MASK, iff, 31);
      tiles += __shfl_sync(FULL_MASK, it, 31);
    }
    if (lane == 0) {
      s_active = act;
      s_tiles = tiles;
    }
  }
  __syncthreads();
  for (i64 a = threadIdx.x; a < A; a += blockDim.x) {
    const int e = __ldcg(ids + a) - off;
    int p = -1;
    if (e >= 0 && e < L) {
      p = atomicAdd(&cur[e], 1);
      mm.tok[p] = (int)(a / k);
    }
    mm.pos[a] = p;
  }
  if (threadIdx.x == 0) {
    mm.hdr[0] = s_active;
    mm.hdr[1] = s_tiles;
  }
}

// moe_group_one is moe_group for one token, with the calling warp alone: lane j < k holds
// the token's j-th choice e (-1 past the k choices). Each local chosen expert has one row, in
// expert order, so the grouping is the ranks of the choices: the same metadata moe_group
// writes for the experts with tokens (counts and offsets of the others are not written; no
// kernel reads them), without its block-wide passes over all L experts.
__device__ __forceinline__ void moe_group_one(int e, MoeMeta mm, int k, int L, int off) {
  const int lane = threadIdx.x & 31;
  const int le = e - off;
  const bool local = lane < k && le >= 0 && le < L;
  const unsigned mask = __ballot_sync(FULL_MASK, local);
  int rank = 0;  // local choices of a lower expert: this one's row, tile and active slot
  for (int i = 0; i < k; ++i) {
    const int li = __shfl_sync(FULL_MASK, le, i);
    if ((mask >> i & 1u) && li < le) ++rank;
  }
  if (local) {
    mm.counts[le] = 1;
    mm.offsets[le] = rank;
    mm.active[rank] = le;
    mm.tile_e[rank] = le;
    mm.tile_r[rank] = 0;
    mm.tok[rank] = 0;
  }
  if (lane < k) mm.pos[lane] = local ? rank : -1;
  if (lane == 0) mm.hdr[0] = mm.hdr[1] = __popc(mask);
}

// moe_route: see the file comment (step 2). Grid ceil(T / MOE_WARPS), block MOE_WARPS warps,
// dynamic shared memory MOE_WARPS * E floats; a warp a token, and the last block to finish
// groups. wround codes weight_dtype as moe_round does. counter is zero before the launch and
// zero after it.
template <class X>
__device__ __forceinline__ void moe_route_impl(const typename X::T* logits, int* ids, float* wts, MoeMeta mm,
                                               unsigned* counter, int T, int E, int k, int normalize, int wround,
                                               int L, int off) {
  extern __shared__ float moe_probs[];
  pdl_begin();
  const int t = blockIdx.x * MOE_WARPS + (threadIdx.x >> 5);
  if (T == 1) {  // one block
    if (t == 0) moe_group_one(moe_route_token<X>(logits, ids, wts, moe_probs, 0, E, k, normalize, wround), mm, k, L, off);
    return;
  }
  if (t < T) moe_route_token<X>(logits, ids, wts, moe_probs + (threadIdx.x >> 5) * E, t, E, k, normalize, wround);
  if (moe_last_block(counter)) moe_group(ids, mm, T, k, L, off);
}

// moe_router_route is steps 1 and 2 in one launch for at most MOE_WARPS tokens (decode): the
// router logits as moe_router computes them (MT = 8, the same bits as every MT), then the
// last block to finish routes token t with warp t and groups. Grid ceil(E / (R * warps)),
// dynamic shared memory MOE_WARPS * E floats; counter as for moe_route.
template <int R, int U, class X, class W>
__device__ __forceinline__ void moe_router_route_impl(typename X::T* logits, const typename X::T* x,
                                                      const typename W::T* router, int* ids, float* wts, MoeMeta mm,
                                                      unsigned* counter, int T, int E, int H, int k, int normalize,
                                                      int wround, int L, int off) {
  extern __shared__ float moe_probs[];
  pdl_begin();
  moe_router_rows<8, R, U, X, W>(logits, x, router, T, E, H);
  if (!moe_last_block(counter)) return;
  const int t = threadIdx.x >> 5;
  if (T == 1) {
    if (t == 0) moe_group_one(moe_route_token<X>(logits, ids, wts, moe_probs, 0, E, k, normalize, wround), mm, k, L, off);
    return;
  }
  if (t < T) moe_route_token<X>(logits, ids, wts, moe_probs + t * E, t, E, k, normalize, wround);
  __syncthreads();
  moe_group(ids, mm, T, k, L, off);
}

// moe_slot reads which expert the block's slot (blockIdx.y) serves, its row count and its
// first grouped row; false when the slot has no expert (slot >= hdr[0]). For one token
// (moe_group_one) the expert's one row is its slot, so only hdr and active are read, side by
// side: one round trip to L2 before the weights stream, not three in a chain.
__device__ __forceinline__ bool moe_slot(const MoeMeta& mm, int& e, int& cnt, int& base, bool one_token) {
  const int slot = blockIdx.y;
  if (one_token) {
    const int n = mm.hdr[0], a = mm.active[slot];  // active has a slot for every block
    e = a;
    cnt = 1;
    base = slot;
    return slot < n;
  }
  if (slot >= mm.hdr[0]) return false;
  e = mm.active[slot];
  cnt = mm.counts[e];
  base = mm.offsets[e];
  return true;
}

// moe_gate_up: h[p, j] = silu(x[tok[p]] · gate[e,j]) * (x[tok[p]] · up[e,j]) for the rows p
// of each active expert e. Grid (ceil(I / (P * warps)), slots); the block of slot s serves
// expert active[s] and exits when s >= hdr[0]. Each warp owns P outputs (their gate and up
// rows) and goes through the expert's tokens MT at a time.
template <int MT, int P, int U, class X, class W>
__device__ __forceinline__ void moe_gate_up_impl(typename X::T* h, const typename X::T* x,
                                                 const typename W::T* gate, const typename W::T* up, MoeMeta mm,
                                                 int H, int I) {
  static_assert(P * MT <= 32, "a warp's lanes finish P outputs of MT tokens");
  pdl_begin();
  const int j0 = moe_warp() * P;
  if (j0 >= I) return;
  int e, cnt, base;
  if (!moe_slot(mm, e, cnt, base, MT == 1)) return;
  const typename W::T* wr[2 * P];
#pragma unroll
  for (int r = 0; r < P; ++r) {
    const i64 j = (i64)e * I + min(j0 + r, I - 1);
    wr[r] = gate + j * H;
    wr[P + r] = up + j * H;
  }
  const int l = threadIdx.x & 31, r = l / MT, m = l % MT;
  for (int m0 = 0; m0 < cnt; m0 += MT) {
    const int n = min(MT, cnt - m0);
    const typename X::T* xr[MT];
#pragma unroll
    for (int q = 0; q < MT; ++q) xr[q] = x + (MT == 1 ? 0 : (i64)mm.tok[base + m0 + min(q, n - 1)] * H);
    float acc[2 * P][MT];
    moe_dot<MT, 2 * P, U, X, W>(acc, wr, xr, n, H);
    float u = 0.f;
    const float g = moe_pick<MT, 2 * P, P>(acc, l, &u);
    if (l < P * MT && m < n && j0 + r < I) moe_swiglu_store<X>(h, (i64)(base + m0 + m) * I + j0 + r, g, u);
  }
}

// moe_down: y[p, c] = h[p] · down[e, c] for the rows p of each active expert e. Grid
// (ceil(H / (R * warps)), slots) as moe_gate_up.
template <int MT, int R, int U, class X, class W>
__device__ __forceinline__ void moe_down_impl(typename X::T* y, const typename X::T* h, const typename W::T* down,
                                              MoeMeta mm, int H, int I) {
  static_assert(R * MT <= 32, "a warp's lanes finish R rows of MT tokens");
  pdl_begin();
  const int c0 = moe_warp() * R;
  if (c0 >= H) return;
  int e, cnt, base;
  if (!moe_slot(mm, e, cnt, base, MT == 1)) return;
  const typename W::T* wr[R];
#pragma unroll
  for (int r = 0; r < R; ++r) wr[r] = down + ((i64)e * H + min(c0 + r, H - 1)) * I;
  const int l = threadIdx.x & 31, r = l / MT, m = l % MT;
  for (int m0 = 0; m0 < cnt; m0 += MT) {
    const int n = min(MT, cnt - m0);
    const typename X::T* xr[MT];
#pragma unroll
    for (int q = 0; q < MT; ++q) xr[q] = h + (i64)(base + m0 + min(q, n - 1)) * I;
    float acc[R][MT];
    moe_dot<MT, R, U, X, W>(acc, wr, xr, n, I);
    float unused;
    const float v = moe_pick<MT, R, 0>(acc, l, &unused);
    if (l < R * MT && m < n && c0 + r < H) X::store(y, (i64)(base + m0 + m) * H + c0 + r, v);
  }
}

// moe_dot_rows computes acc[r] = wr[r] · xr[r] over K (a multiple of 8): RR weight rows,
// each with its own row of activations. Each lane adds its chunks in the order moe_dot adds
// them, and the lanes' sums are added as moe_dot adds them, so a row's result has the bits
// moe_dot gives it for one token.
template <int RR, int U, class X, class W>
__device__ __forceinline__ void moe_dot_rows(float (&acc)[RR], const typename W::T* const (&wr)[RR],
                                             const typename X::T* const (&xr)[RR], int K) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < RR; ++r) acc[r] = 0.0f;
  const int K8 = K >> 3;
  for (int c0 = 0; c0 < K8; c0 += 32 * U) {
    uint4 raw[U][RR][MoeW<W>::Q];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + 32 * u + lane;
      if (c < K8)
#pragma unroll
        for (int r = 0; r < RR; ++r) MoeW<W>::load(wr[r], (i64)c * 8, raw[u][r]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + 32 * u + lane;
      if (c < K8)
#pragma unroll
        for (int r = 0; r < RR; ++r) {
          float wf[8], xf[8];
          MoeW<W>::widen(raw[u][r], wf);
          MoeX<X>::load8(xr[r] + (i64)c * 8, xf);
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[r] = fmaf(wf[j], xf[j], acc[r]);
        }
    }
  }
#pragma unroll
  for (int r = 0; r < RR; ++r) acc[r] = warp_sum(acc[r]);
}

// moe_down_combine is steps 3 (down) and 4 in one launch for one token (decode at batch 1):
// out[c] = the combine of the token's local experts' rows y_i[c] = h[pos_i] · down[e_i, c],
// each rounded to X as moe_down stores it (the same bits), weighted and added in expert
// order as moe_combine adds them. Grid ceil(H / MOE_WARPS): warp c owns output c and streams
// the rows c of up to 8 experts at once. off is expert_offset.
template <int U, class X, class W>
__device__ __forceinline__ void moe_down_combine_impl(typename X::T* out, const typename X::T* h,
                                                      const typename W::T* down, const int* ids, const float* wts,
                                                      const int* pos, int H, int I, int k, int pround, int off) {
  __shared__ int re[MOE_MAX_K], rp[MOE_MAX_K], sp[MOE_MAX_K], se[MOE_MAX_K];
  __shared__ float rw[MOE_MAX_K], sw[MOE_MAX_K];
  pdl_begin();
  const int j = threadIdx.x;
  if (j < k) {
    const int p = pos[j];
    re[j] = p < 0 ? 0x7fffffff : ids[j];
    rp[j] = p;
    rw[j] = wts[j];
  }
  __syncthreads();
  int n = 0;
  for (int i = 0; i < k; ++i) n += re[i] != 0x7fffffff;
  if (j < k && re[j] != 0x7fffffff) {
    int rank = 0;
    for (int i = 0; i < k; ++i) rank += re[i] < re[j];
    sp[rank] = rp[j];
    sw[rank] = rw[j];
    se[rank] = re[j] - off;
  }
  __syncthreads();
  const int c = moe_warp();
  if (c >= H) return;
  float acc = 0.f;
  for (int i0 = 0; i0 < n; i0 += 8) {
    const typename W::T* wr[8];
    const typename X::T* hr[8];
#pragma unroll
    for (int r = 0; r < 8; ++r) {
      const int i = min(i0 + r, n - 1);
      wr[r] = down + ((i64)se[i] * H + c) * I;
      hr[r] = h + (i64)sp[i] * I;
    }
    float part[8];
    moe_dot_rows<8, U, X, W>(part, wr, hr, I);
#pragma unroll
    for (int r = 0; r < 8; ++r)
      if (i0 + r < n) {
        const float p = X::round(moe_round(X::round(part[r]) * sw[i0 + r], pround));
        acc = i0 + r == 0 ? p : X::round(acc + p);
      }
  }
  if ((threadIdx.x & 31) == 0) X::store(out, c, acc);
}

// moe_combine: out[t] = the sum in expert order of t's products y[pos]·weight (see the file
// comment). Grid T * ceil(H / blockDim.x), one output element per thread; pround codes
// promote(x, weight_dtype) as moe_round does. The token's entries are read by k threads at
// once and put in expert order by rank (ids are distinct), and each thread loads its k
// values of y before it adds them, so that the loads overlap.
template <class X>
__device__ __forceinline__ void moe_combine_impl(typename X::T* out, const typename X::T* y, const int* ids,
                                                 const float* wts, const int* pos, int H, int k, int pround) {
  __shared__ int re[MOE_MAX_K], rp[MOE_MAX_K], sp[MOE_MAX_K];
  __shared__ float rw[MOE_MAX_K], sw[MOE_MAX_K];
  pdl_begin();
  const int hb = (H + blockDim.x - 1) / blockDim.x;
  const i64 t = blockIdx.x / hb;
  const int c = (blockIdx.x % hb) * blockDim.x + threadIdx.x, j = threadIdx.x;
  if (j < k) {
    const int p = pos[t * k + j];
    re[j] = p < 0 ? 0x7fffffff : ids[t * k + j];
    rp[j] = p;
    rw[j] = wts[t * k + j];
  }
  __syncthreads();
  int n = 0;
  for (int i = 0; i < k; ++i) n += re[i] != 0x7fffffff;
  if (j < k && re[j] != 0x7fffffff) {
    int rank = 0;
    for (int i = 0; i < k; ++i) rank += re[i] < re[j];
    sp[rank] = rp[j];
    sw[rank] = rw[j];
  }
  __syncthreads();
  if (c >= H) return;
  float v[MOE_MAX_K];
#pragma unroll
  for (int i = 0; i < MOE_MAX_K; ++i)
    if (i < n) v[i] = X::load(y, (i64)sp[i] * H + c);
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < MOE_MAX_K; ++i)
    if (i < n) {
      const float p = X::round(moe_round(v[i] * sw[i], pround));
      acc = i == 0 ? p : X::round(acc + p);
    }
  X::store(out, t * H + c, acc);
}

// ---- Tensor cores (bf16 x and weights) ----

__device__ __forceinline__ unsigned moe_smem(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void moe_cp16(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}

__device__ __forceinline__ void moe_ldm4(unsigned addr, unsigned* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void moe_mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// moe_mma_impl computes one tile of MOE_BM grouped rows by MOE_BN outputs of the expert of
// tile blockIdx.y (tile_e, tile_r; exits when blockIdx.y >= hdr[1]): with GATED, h = silu(A ·
// w0ᵀ) * (A · w1ᵀ) with A the rows x[tok[p]] (w0 gate, w1 up, N = I, K = H); else y = A ·
// w0ᵀ with A the rows h[p] (w0 down, N = H, K = I). Grid (ceil(N / MOE_BN), max tiles),
// block 128 threads: 4 warps of 32 rows by 32 outputs. K is a multiple of 8; tiles of
// MOE_BK go through shared memory with cp.async, MOE_STAGES - 1 in flight.
template <bool GATED>
__device__ __forceinline__ void moe_mma_impl(bf16* out, const bf16* a_src, const bf16* w0, const bf16* w1, MoeMeta mm,
                                             int N, int K) {
  __shared__ __align__(16) bf16 As[MOE_STAGES][MOE_BM][MOE_SP];
  __shared__ __align__(16) bf16 B0s[MOE_STAGES][MOE_BN][MOE_SP];
  __shared__ __align__(16) bf16 B1s[GATED ? MOE_STAGES : 1][GATED ? MOE_BN : 1][MOE_SP];
  pdl_begin();
  const int tile = blockIdx.y;
  if (tile >= mm.hdr[1]) return;
  const int e = mm.tile_e[tile], r0 = mm.tile_r[tile];
  const int rows = min(MOE_BM, mm.counts[e] - r0), base = mm.offsets[e] + r0;
  const int n0 = blockIdx.x * MOE_BN;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 1, wn = warp & 1;
  // This thread's two chunks of each tile: rows tid/4 and tid/4 + 32, chunk tid%4.
  const int lr = tid >> 2, kc = (tid & 3) * 8;
  const bf16* ap[2];
  const bf16* b0p[2];
  const bf16* b1p[2];
  bool av[2], bv[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = lr + 32 * i;
    av[i] = r < rows;
    const i64 arow = av[i] ? (GATED ? (i64)mm.tok[base + r] : (i64)(base + r)) : 0;
    ap[i] = a_src + arow * K;
    bv[i] = n0 + r < N;
    const i64 brow = (i64)e * N + (bv[i] ? n0 + r : 0);
    b0p[i] = w0 + brow * K;
    b1p[i] = GATED ? w1 + brow * K : w0;
  }
  auto load = [&](int s, int k0) {
    const int k = k0 + kc;
    const bool kin = k < K;
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int r = lr + 32 * i;
      moe_cp16(moe_smem(&As[s][r][kc]), av[i] && kin ? ap[i] + k : a_src, av[i] && kin);
      moe_cp16(moe_smem(&B0s[s][r][kc]), bv[i] && kin ? b0p[i] + k : w0, bv[i] && kin);
      if constexpr (GATED) moe_cp16(moe_smem(&B1s[s][r][kc]), bv[i] && kin ? b1p[i] + k : w0, bv[i] && kin);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  };
  float acc0[2][4][4], acc1[GATED ? 2 : 1][4][4];
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int b = 0; b < 4; ++b)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        acc0[a][b][c] = 0.f;
        if constexpr (GATED) acc1[a][b][c] = 0.f;
      }
  // MOE_STAGES tiles in shared memory: while one is multiplied, the next MOE_STAGES - 1 are
  // on their way (a decode batch has few rows an expert: the weights' stream is the work).
  const int nk = (K + MOE_BK - 1) / MOE_BK;
#pragma unroll
  for (int st = 0; st < MOE_STAGES - 1; ++st) {
    if (st < nk) {
      load(st, st * MOE_BK);
    } else {
      asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
  }
  for (int kt = 0; kt < nk; ++kt) {
    const int s = kt % MOE_STAGES;
    asm volatile("cp.async.wait_group %0;\n" ::"n"(MOE_STAGES - 2) : "memory");
    __syncthreads();  // tile kt is in; every warp is done with tile kt - 1, whose stage is refilled
    const int kn = kt + MOE_STAGES - 1;
    if (kn < nk) {
      load(kn % MOE_STAGES, kn * MOE_BK);
    } else {
      asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
#pragma unroll
    for (int kk = 0; kk < MOE_BK; kk += 16) {
      unsigned a[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) moe_ldm4(moe_smem(&As[s][wm * 32 + mt * 16 + (lane & 15)][kk + (lane >> 4) * 8]), a[mt]);
#pragma unroll
      for (int np = 0; np < 2; ++np) {
        const int br = wn * 32 + np * 16 + (lane >> 4) * 8 + (lane & 7), bc = kk + ((lane >> 3) & 1) * 8;
        unsigned b[4];
        moe_ldm4(moe_smem(&B0s[s][br][bc]), b);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          moe_mma16816(acc0[mt][2 * np], a[mt], b[0], b[1]);
          moe_mma16816(acc0[mt][2 * np + 1], a[mt], b[2], b[3]);
        }
        if constexpr (GATED) {
          moe_ldm4(moe_smem(&B1s[s][br][bc]), b);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            moe_mma16816(acc1[mt][2 * np], a[mt], b[0], b[1]);
            moe_mma16816(acc1[mt][2 * np + 1], a[mt], b[2], b[3]);
          }
        }
      }
    }
  }
  const int g = lane >> 2, c = lane & 3;
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        const int r = wm * 32 + mt * 16 + g + hh * 8;
        if (r >= rows) continue;
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int col = n0 + wn * 32 + nt * 8 + 2 * c + q;
          if (col >= N) continue;
          const i64 o = (i64)(base + r) * N + col;
          if constexpr (GATED) {
            moe_swiglu_store<BF16>(out, o, acc0[mt][nt][hh * 2 + q], acc1[mt][nt][hh * 2 + q]);
          } else {
            BF16::store(out, o, acc0[mt][nt][hh * 2 + q]);
          }
        }
      }
}

// ---- Tensor-core GEMV (bf16 x and weights, decode batches) ----

// moe_mmv_impl is moe_gate_up / moe_down for a few rows an expert (a decode batch: the weights'
// stream is the work, and f32 FMAs of up to 8 tokens on every weight hold the GEMV's warps to
// few in flight): mma.sync m16n8k16 with 16 weight rows as A and 8 of the expert's grouped
// rows as B, NN such groups at once, so the weights are read once for up to 8·NN rows and
// the products cost the warp nothing. With GATED, h = silu(x[tok[p]] · w0ᵀ) * (x[tok[p]] ·
// w1ᵀ) (w0 gate, w1 up, N = I, K = H); else y = h[p] · w0ᵀ (w0 down, N = H, K = I). Grid
// (ceil(N / (16 · MOE_WARPS)), slots), block MOE_WARPS warps of 16 output rows each.
//
// Lane (g, c) = (lane / 4, lane % 4) loads its rows g and g + 8 of the weights, and row g of
// the activations, at k = 16c .. 16c + 15 of every 64: two 16-byte loads a row, each lane
// group of a row reading 128 contiguous bytes. The four k-steps of 16 take those values in
// the order mma's fragments want them for a fixed permutation of k inside the 64 (step s
// reads each lane's k = 16c + 4s .. 16c + 4s + 3), the same for weights and activations, so
// the dot products are unchanged but for the order of their f32 sums. U chunks of 64 are in
// flight at once.
template <bool GATED, int NN, int U>
__device__ __forceinline__ void moe_mmv_impl(bf16* out, const bf16* a_src, const bf16* w0, const bf16* w1, MoeMeta mm,
                                             int N, int K) {
  pdl_begin();
  const int r0 = moe_warp() * 16;
  if (r0 >= N) return;
  int e, cnt, base;
  if (!moe_slot(mm, e, cnt, base, false)) return;
  const int lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
  const i64 ra = ((i64)e * N + min(r0 + g, N - 1)) * K, rb = ((i64)e * N + min(r0 + g + 8, N - 1)) * K;
  const bf16* wr[2][2] = {{w0 + ra, w0 + rb}, {(GATED ? w1 : w0) + ra, (GATED ? w1 : w0) + rb}};
  constexpr int NM = GATED ? 2 : 1;  // weight matrices
  const uint4 z = make_uint4(0u, 0u, 0u, 0u);
  for (int m0 = 0; m0 < cnt; m0 += 8 * NN) {
    const bf16* xr[NN];
    bool xv[NN];
#pragma unroll
    for (int nn = 0; nn < NN; ++nn) {
      const int t = m0 + nn * 8 + g;
      xv[nn] = t < cnt;
      const int p = base + (xv[nn] ? t : 0);
      xr[nn] = a_src + (GATED ? (i64)mm.tok[p] : (i64)p) * K;
    }
    float acc[NM][NN][4];
#pragma unroll
    for (int mt = 0; mt < NM; ++mt)
#pragma unroll
      for (int nn = 0; nn < NN; ++nn)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][nn][i] = 0.f;
    for (int k0 = 0; k0 < K; k0 += 64 * U) {
      uint4 w[U][NM][2][2];  // [chunk][matrix][row g, g + 8][half]
      uint4 xa[U][NN][2];
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int k = k0 + 64 * u + 16 * c + 8 * hf;
          const bool in = k < K;
#pragma unroll
          for (int mt = 0; mt < NM; ++mt)
#pragma unroll
            for (int rr = 0; rr < 2; ++rr) w[u][mt][rr][hf] = in ? ld_nc_v4(wr[mt][rr] + k) : z;
#pragma unroll
          for (int nn = 0; nn < NN; ++nn) xa[u][nn][hf] = in && xv[nn] ? __ldg((const uint4*)(xr[nn] + k)) : z;
        }
#pragma unroll
      for (int u = 0; u < U; ++u)
#pragma unroll
        for (int s = 0; s < 4; ++s) {
          const int hf = s >> 1;
          const bool hi = s & 1;
#pragma unroll
          for (int mt = 0; mt < NM; ++mt) {
            const uint4 A = w[u][mt][0][hf], B = w[u][mt][1][hf];
            const unsigned a[4] = {hi ? A.z : A.x, hi ? B.z : B.x, hi ? A.w : A.y, hi ? B.w : B.y};
#pragma unroll
            for (int nn = 0; nn < NN; ++nn) {
              const uint4 X = xa[u][nn][hf];
              moe_mma16816(acc[mt][nn], a, hi ? X.z : X.x, hi ? X.w : X.y);
            }
          }
        }
    }
#pragma unroll
    for (int nn = 0; nn < NN; ++nn)
#pragma unroll
      for (int hh = 0; hh < 2; ++hh)
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int row = r0 + g + 8 * hh, t = m0 + nn * 8 + 2 * c + q;
          if (row >= N || t >= cnt) continue;
          const i64 o = (i64)(base + t) * N + row;
          if constexpr (GATED) {
            moe_swiglu_store<BF16>(out, o, acc[0][nn][2 * hh + q], acc[NM - 1][nn][2 * hh + q]);
          } else {
            BF16::store(out, o, acc[0][nn][2 * hh + q]);
          }
        }
  }
}

#define MOE_ROUTER(X, xn, W, wn, MT, R, U)                                                                        \
  extern "C" __global__ void __launch_bounds__(256)                                                              \
      moe_router_##xn##_##wn##_m##MT(X::T* logits, const X::T* x, const W::T* router, int T, int E, int H) {   \
    moe_router_impl<MT, R, U, X, W>(logits, x, router, T, E, H);                                                 \
  }

#define MOE_GATE_UP(X, xn, W, wn, MT, P, U)                                                                      \
  extern "C" __global__ void __launch_bounds__(256) moe_gate_up_##xn##_##wn##_m##MT##_p##P##_u##U(              \
      X::T* h, const X::T* x, const W::T* gate, const W::T* up, MoeMeta mm, int H, int I) {                     \
    moe_gate_up_impl<MT, P, U, X, W>(h, x, gate, up, mm, H, I);                                                  \
  }

#define MOE_DOWN(X, xn, W, wn, MT, R, U)                                                                         \
  extern "C" __global__ void __launch_bounds__(256)                                                              \
      moe_down_##xn##_##wn##_m##MT##_r##R##_u##U(X::T* y, const X::T* h, const W::T* down, MoeMeta mm, int H, int I) { \
    moe_down_impl<MT, R, U, X, W>(y, h, down, mm, H, I);                                                          \
  }

#define MOE_ROUTE(X, xn)                                                                                         \
  extern "C" __global__ void __launch_bounds__(256)                                                              \
      moe_route_##xn(const X::T* logits, int* ids, float* wts, MoeMeta mm, unsigned* counter, int T, int E, int k, \
                     int normalize, int wround, int L, int off) {                                                \
    moe_route_impl<X>(logits, ids, wts, mm, counter, T, E, k, normalize, wround, L, off);                        \
  }

#define MOE_ROUTER_ROUTE(X, xn, W, wn, R, U)                                                                     \
  extern "C" __global__ void __launch_bounds__(256) moe_router_route_##xn##_##wn(                               \
      X::T* logits, const X::T* x, const W::T* router, int* ids, float* wts, MoeMeta mm, unsigned* counter,       \
      int T, int E, int H, int k, int normalize, int wround, int L, int off) {                                   \
    moe_router_route_impl<R, U, X, W>(logits, x, router, ids, wts, mm, counter, T, E, H, k, normalize, wround,    \
                                      L, off);                                                                   \
  }

#define MOE_DOWN_COMBINE(X, xn, W, wn, U)                                                                        \
  extern "C" __global__ void __launch_bounds__(256) moe_down_combine_##xn##_##wn(                               \
      X::T* out, const X::T* h, const W::T* down, const int* ids, const float* wts, const int* pos, int H, int I, \
      int k, int pround, int off) {                                                                              \
    moe_down_combine_impl<U, X, W>(out, h, down, ids, wts, pos, H, I, k, pround, off);                           \
  }

#define MOE_COMBINE(X, xn)                                                                                       \
  extern "C" __global__ void __launch_bounds__(256) moe_combine_##xn(                                           \
      X::T* out, const X::T* y, const int* ids, const float* wts, const int* pos, int H, int k, int pround) {   \
    moe_combine_impl<X>(out, y, ids, wts, pos, H, k, pround);                                                    \
  }

// MOE_KERNELS instantiates the kernels of one set of dtypes: x (X, its name xn), the experts'
// weights (W, wn) and the router (WR, wrn); MT 1 for one token, 8 otherwise.
#define MOE_KERNELS(X, xn, W, wn, WR, wrn) \
  MOE_ROUTER(X, xn, WR, wrn, 1, 1, 4)      \
  MOE_ROUTER(X, xn, WR, wrn, 8, 1, 2)      \
  MOE_GATE_UP(X, xn, W, wn, 1, 1, 4)       \
  MOE_GATE_UP(X, xn, W, wn, 8, 1, 2)       \
  MOE_GATE_UP(X, xn, W, wn, 8, 4, 1)       \
  MOE_DOWN(X, xn, W, wn, 1, 1, 4)          \
  MOE_DOWN(X, xn, W, wn, 8, 2, 2)          \
  MOE_DOWN(X, xn, W, wn, 8, 4, 1)          \
  MOE_ROUTE(X, xn)                         \
  MOE_ROUTER_ROUTE(X, xn, WR, wrn, 1, 2)   \
  MOE_DOWN_COMBINE(X, xn, W, wn, 1)        \
  MOE_COMBINE(X, xn)

#define MOE_MMA(NAME, GATED)                                                                                    \
  extern "C" __global__ void __launch_bounds__(128)                                                              \
      NAME(bf16* out, const bf16* a, const bf16* w0, const bf16* w1, MoeMeta mm, int N, int K) {                 \
    moe_mma_impl<GATED>(out, a, w0, w1, mm, N, K);                                                                \
  }

#define MOE_MMV(NAME, GATED, NN, U)                                                                             \
  extern "C" __global__ void __launch_bounds__(256)                                                              \
      NAME(bf16* out, const bf16* a, const bf16* w0, const bf16* w1, MoeMeta mm, int N, int K) {                 \
    moe_mmv_impl<GATED, NN, U>(out, a, w0, w1, mm, N, K);                                                         \
  }

// MOE_MMA_KERNELS instantiates the tensor-core kernels (bf16 x and experts).
#define MOE_MMA_KERNELS()                     \
  MOE_MMA(moe_mma_gate_up, true)              \
  MOE_MMA(moe_mma_down, false)                \
  MOE_MMV(moe_mmv_gate_up_n1, true, 1, 1)     \
  MOE_MMV(moe_mmv_gate_up_n2, true, 2, 1)     \
  MOE_MMV(moe_mmv_down_n1, false, 1, 2)       \
  MOE_MMV(moe_mmv_down_n2, false, 2, 2)
