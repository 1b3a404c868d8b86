// Sampling of one token per row of logits [N,V] (f32), with per-row parameters. One block
// of SAMPLE_THREADS threads per row; launches depend on N only.
//
// A row with temperature <= 0 (or NaN) takes the argmax: the lowest index of the largest
// logit, NaN never wins, a row whose first logit is NaN gives 0 (as the argmax kernel).
//
// Otherwise, with y_i = (x_i - max) * log2(e) / temperature and weights w_i = 2^y_i:
//   1. top-k (0 < k < V) keeps the k largest, ties to the lowest index;
//   2. top-p (0 < p < 1) keeps the shortest prefix, in that order, whose weight reaches p
//      times the weight of what top-k kept;
//   3. min-p (> 0) keeps the tokens with w_i >= min_p (w of the top token is 1);
//   4. the token is the argmax over the kept i of y_i - log2(E_i), E_i = -ln(U_i) and U_i
//      uniform in (0,1) from a hash of (seed, counter, i): an exponential race, which picks
//      i with probability w_i / sum of kept w (ties to the lowest index). U_i does not depend
//      on the row or the launch, so a seed and counter reproduce the token.
// Weights are summed in fixed point (2^40 = weight 1) so that the truncation is exact and
// deterministic. NaN logits count as -inf; a row of -inf only is sampled uniformly.
//
// Passes over the row: 1. max, argmax, the sum of weights (f32, only to bound the
// candidates) and a histogram of counts over the top SAMPLE_HBITS bits of the ordered key
// of each logit; from it, the lowest bucket that can hold a kept token. 2. When the buckets
// at or above it hold at most cap logits, they are copied (key, index) to the row's
// workspace [cap] and the exact selection reads only them; otherwise it reads the row.
// Selections are radix selects over 8-bit digits of the key (counts for top-k, weights for
// top-p), then of the index for ties.

#define SAMPLE_THREADS 1024
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
#define SAMPLE_HBITS 13
#define SAMPLE_HB (1 << SAMPLE_HBITS)
#define WONE 1099511627776.0f  // 2^40

typedef unsigned long long u64;

// SampleParams is one row of parameters, 32 bytes (the Go SampleRow).
struct SampleParams {
  float temperature, top_p, min_p;
  int top_k;
  u64 seed, counter;
};

__device__ __forceinline__ unsigned fkey(float x) {
  if (x != x) x = -LOOM_INF;
  unsigned u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float keyf(unsigned k) {
  unsigned u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
  return __uint_as_float(u);
}

__device__ __forceinline__ u64 mix64(u64 z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

struct Row {
  float m;  // max logit
  float c;  // log2(e) / temperature
  __device__ __forceinline__ float y(float x) const { return x == m ? 0.0f : (x - m) * c; }
  __device__ __forceinline__ u64 wq(float x) const { return __float2ull_rn(exp2f(y(x)) * WONE); }
};

// Sources of (key, index) pairs. each calls f(valid, key, idx) with every lane of a warp
// together (valid false past the end), so that f may use warp intrinsics.
struct RowSrc {
  const float* x;
  int n;
  template <class F>
  __device__ __forceinline__ void each(F f) const {
    for (int base = threadIdx.x & ~31; base < n; base += blockDim.x) {
      const int i = base + (threadIdx.x & 31);
      const bool v = i < n;
      f(v, v ? fkey(x[i]) : 0u, i);
    }
  }
};

struct ListSrc {
  const uint2* l;
  int n;
  template <class F>
  __device__ __forceinline__ void each(F f) const {
    for (int base = threadIdx.x & ~31; base < n; base += blockDim.x) {
      const int i = base + (threadIdx.x & 31);
      const bool v = i < n;
      uint2 e = v ? l[i] : make_uint2(0u, 0u);
      f(v, e.x, (int)e.y);
    }
  }
};

__device__ __forceinline__ unsigned lanemask_lt() { return (1u << (threadIdx.x & 31)) - 1u; }

// hist_add adds v to h[b] for the lanes with on, one atomic per distinct bucket of the warp.
// Every lane of the warp must call it.
__device__ __forceinline__ void hist_add(u64* h, bool on, int b, u64 v) {
  const unsigned peers = __match_any_sync(FULL_MASK, on ? b : -1);
  if (__all_sync(FULL_MASK, __popc(peers) == 1 || !on)) {
    if (on) atomicAdd(&h[b], v);
    return;
  }
  u64 sum = 0;
  for (int src = 0; src < 32; ++src) {
    const u64 o = __shfl_sync(FULL_MASK, v, src);
    if ((peers >> src) & 1u) sum += o;
  }
  if (on && (peers & lanemask_lt()) == 0) atomicAdd(&h[b], sum);
}

__device__ __forceinline__ u64 warp_sum_u64(u64 v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
  return v;
}

struct SampleShared {
  unsigned hist13[SAMPLE_HB];
  u64 hist[256];
  float redf[SAMPLE_WARPS][2];
  int redi[SAMPLE_WARPS];
  u64 redu[SAMPLE_WARPS];
  int b, bk, bp;
  u64 before;
  unsigned count;
};

// block_sum_u64 returns the sum of v over the block to every thread.
__device__ __forceinline__ u64 block_sum_u64(u64 v, SampleShared& sh) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  v = warp_sum_u64(v);
  if (lane == 0) sh.redu[warp] = v;
  __syncthreads();
  v = lane < SAMPLE_WARPS ? sh.redu[lane] : 0;
  v = warp_sum_u64(v);
  __syncthreads();
  return v;
}

// find_cross (warp 0) finds, scanning the 256 buckets of sh.hist downwards (desc) or
// upwards, the bucket where the running sum first reaches target; sh.b gets it and
// sh.before the sum of the buckets scanned before it.
__device__ __forceinline__ void find_cross(SampleShared& sh, u64 target, bool desc) {
  const int lane = threadIdx.x & 31;
  u64 s = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int pos = lane * 8 + i;
    s += sh.hist[desc ? 255 - pos : pos];
  }
  u64 incl = s;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const u64 t = __shfl_up_sync(FULL_MASK, incl, o);
    if (lane >= o) incl += t;
  }
  const u64 excl = incl - s;
  const u64 total = __shfl_sync(FULL_MASK, incl, 31);
  if (total < target) {  // cannot happen for a consistent target; take the last bucket
    if (lane == 0) {
      int last = desc ? 0 : 255;
      sh.b = last;
      sh.before = total - sh.hist[last];
    }
    return;
  }
  if (excl < target && incl >= target) {
    u64 c = excl;
    for (int i = 0; i < 8; ++i) {
      const int b = desc ? 255 - (lane * 8 + i) : lane * 8 + i;
      const u64 v = sh.hist[b];
      if (c + v >= target) {
        sh.b = b;
        sh.before = c;
        break;
      }
      c += v;
    }
  }
}

// radix_select finds, among the elements that pick(key, idx, &digitkey, &val) accepts, the
// digit key where the running sum of val, in descending (desc) or ascending digit key order,
// first reaches target. It returns that digit key; before gets the sum of val over the
// accepted elements ordered before it and eq the sum over those equal to it. Every thread
// of the block must call it.
template <class Src, class Pick>
__device__ unsigned radix_select(const Src& src, Pick pick, u64 target, bool desc, SampleShared& sh, u64* before,
                                 u64* eq) {
  unsigned prefix = 0, mask = 0;
  u64 bef = 0, e = 0;
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) sh.hist[i] = 0;
    __syncthreads();
    src.each([&](bool valid, unsigned key, int idx) {
      unsigned dk = 0;
      u64 v = 0;
      const bool on = valid && pick(key, idx, &dk, &v) && (dk & mask) == prefix;
      hist_add(sh.hist, on, (int)((dk >> shift) & 255u), v);
    });
    __syncthreads();
    if (threadIdx.x < 32) find_cross(sh, target - bef, desc);
    __syncthreads();
    bef += sh.before;
    prefix |= (unsigned)sh.b << shift;
    mask |= 255u << shift;
    e = sh.hist[sh.b];
    __syncthreads();
  }
  *before = bef;
  *eq = e;
  return prefix;
}

// select_row runs steps 1-4 of the file comment over the candidates of src. total is the
// fixed-point weight of the whole row (used by top-p without top-k). Returns the token, or
// -1 when nothing is kept.
template <class Src>
__device__ int select_row(const Src& src, const Row& r, const SampleParams& p, int V, u64 total, u64 rowkey,
                          SampleShared& sh) {
  u64 bef, eq;
  // 1. top-k: keep key > vk, or key == vk and idx <= ik.
  unsigned vk = 0, ik = 0xffffffffu;
  if (p.top_k > 0 && p.top_k < V) {
    vk = radix_select(src, [](unsigned key, int idx, unsigned* dk, u64* v) { *dk = key; *v = 1; return true; },
                      (u64)p.top_k, true, sh, &bef, &eq);
    const u64 rank = (u64)p.top_k - bef;  // how many of the equal keys to keep
    if (rank < eq) {
      ik = radix_select(src, [vk](unsigned key, int idx, unsigned* dk, u64* v) {
             *dk = (unsigned)idx;
             *v = 1;
             return key == vk;
           }, rank, false, sh, &bef, &eq);
    }
  }
  auto in_k = [vk, ik](unsigned key, int idx) { return key > vk || (key == vk && (unsigned)idx <= ik); };
  // 2. top-p: keep key > vp, or key == vp and idx <= ip.
  unsigned vp = 0, ip = 0xffffffffu;
  if (p.top_p > 0.0f && p.top_p < 1.0f) {
    u64 T = total;
    if (p.top_k > 0 && p.top_k < V) {
      u64 s = 0;
      src.each([&](bool valid, unsigned key, int idx) {
        if (valid && in_k(key, idx)) s += r.wq(keyf(key));
      });
      T = block_sum_u64(s, sh);
    }
    u64 R = (u64)ceil((double)p.top_p * (double)T);
    if (R < 1) R = 1;
    vp = radix_select(src, [&](unsigned key, int idx, unsigned* dk, u64* v) {
           *dk = key;
           *v = r.wq(keyf(key));
           return in_k(key, idx);
         }, R, true, sh, &bef, &eq);
    const u64 wv = r.wq(keyf(vp));
    if (wv > 0) {
      const u64 need = (R - bef + wv - 1) / wv;  // equal keys needed to reach R
      if (need < eq / wv) {
        ip = radix_select(src, [&](unsigned key, int idx, unsigned* dk, u64* v) {
               *dk = (unsigned)idx;
               *v = 1;
               return key == vp && in_k(key, idx);
             }, need, false, sh, &bef, &eq);
      }
    }
  }
  // 3. min-p and 4. the race.
  const float minp = p.min_p;
  float best = -LOOM_INF;
  int besti = -1;
  src.each([&](bool valid, unsigned key, int idx) {
    if (!valid || !in_k(key, idx) || (key < vp || (key == vp && (unsigned)idx > ip))) return;
    const float y = r.y(keyf(key));
    if (minp > 0.0f && !(exp2f(y) >= minp)) return;
    const u64 h = mix64(rowkey + (u64)(idx + 1) * 0x9e3779b97f4a7c15ULL);
    const float u = ((float)(h >> 40) + 0.5f) * (1.0f / 16777216.0f);
    const float s = y - log2f(-logf(u));
    if (s > best || (s == best && idx < besti) || besti < 0) {
      best = s;
      besti = idx;
    }
  });
  // Block argmax, ties to the lowest index.
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(FULL_MASK, best, o);
    const int oi = __shfl_xor_sync(FULL_MASK, besti, o);
    if (oi >= 0 && (besti < 0 || ob > best || (ob == best && oi < besti))) {
      best = ob;
      besti = oi;
    }
  }
  if (lane == 0) {
    sh.redf[warp][0] = best;
    sh.redi[warp] = besti;
  }
  __syncthreads();
  if (warp == 0) {
    best = lane < SAMPLE_WARPS ? sh.redf[lane][0] : -LOOM_INF;
    besti = lane < SAMPLE_WARPS ? sh.redi[lane] : -1;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(FULL_MASK, best, o);
      const int oi = __shfl_xor_sync(FULL_MASK, besti, o);
      if (oi >= 0 && (besti < 0 || ob > best || (ob == best && oi < besti))) {
        best = ob;
        besti = oi;
      }
    }
    if (lane == 0) sh.redi[0] = besti;
  }
  __syncthreads();
  const int tok = sh.redi[0];
  __syncthreads();
  return tok;
}

// warp_max_sum_argmax merges, over a warp, each lane's running max m, sum s of
// exp2((x - m) * c) and argmax am (-1: none yet; ties to the lowest index), leaving the
// warp's in every lane.
__device__ __forceinline__ void warp_max_sum_argmax(float& m, float& s, int& am, float c) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float om = __shfl_xor_sync(FULL_MASK, m, o), os = __shfl_xor_sync(FULL_MASK, s, o);
    const int oi = __shfl_xor_sync(FULL_MASK, am, o);
    if (oi >= 0 && (am < 0 || om > m || (om == m && oi < am))) {
      s = (am < 0 || om == -LOOM_INF) ? os : os + s * exp2f((m - om) * c);
      m = om;
      am = oi;
    } else if (oi >= 0) {
      s += (m == -LOOM_INF) ? os : os * exp2f((om - m) * c);
    }
  }
}


extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS, 1)
    sample_rows(int* ids, const float* logits, const SampleParams* params, uint2* ws, int V, int cap) {
  __shared__ SampleShared sh;
  const int row = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float* x = logits + (i64)row * V;
  const SampleParams p = params[row];
  const bool greedy = !(p.temperature > 0.0f);
  const float c = greedy ? 1.0f : 1.4426950408889634f / p.temperature;
  const bool tk = p.top_k > 0 && p.top_k < V, tp = p.top_p > 0.0f && p.top_p < 1.0f, tm = p.min_p > 0.0f;
  const bool want_sum = !greedy && tp && !tk;  // the sum bounds top-p's candidates
  const bool want_hist = !greedy && (tk || tp || tm);

  // Pass 1: max and argmax (NaN skipped), sum of 2^((x-max)c) online, key histogram.
  for (int i = threadIdx.x; i < SAMPLE_HB; i += blockDim.x) sh.hist13[i] = 0;
  __syncthreads();
  float m = -LOOM_INF, s = 0.0f;
  int am = -1;
  for (int base = threadIdx.x & ~31; base < V; base += blockDim.x) {
    const int i = base + lane;
    const bool v = i < V;
    const float xi = v ? x[i] : -LOOM_INF;
    if (v && xi == xi) {
      if (am < 0 || xi > m) {
        if (want_sum) s = (am < 0 || m == -LOOM_INF) ? 0.0f : s * exp2f((m - xi) * c);
        m = xi;
        am = i;
      }
      if (want_sum) s += xi == m ? 1.0f : exp2f((xi - m) * c);
    }
    if (want_hist) {
      const int b = (int)(fkey(xi) >> (32 - SAMPLE_HBITS));
      const unsigned peers = __match_any_sync(FULL_MASK, v ? b : -1);
      if (v && (peers & lanemask_lt()) == 0) atomicAdd(&sh.hist13[b], __popc(peers));
    }
  }
  // Block reduce (max, sum, argmax).
  warp_max_sum_argmax(m, s, am, c);
  if (lane == 0) {
    sh.redf[warp][0] = m;
    sh.redf[warp][1] = s;
    sh.redi[warp] = am;
  }
  __syncthreads();
  if (warp == 0) {
    m = lane < SAMPLE_WARPS ? sh.redf[lane][0] : -LOOM_INF;
    s = lane < SAMPLE_WARPS ? sh.redf[lane][1] : 0.0f;
    am = lane < SAMPLE_WARPS ? sh.redi[lane] : -1;
    warp_max_sum_argmax(m, s, am, c);
    if (lane == 0) {
      sh.redf[0][0] = m;
      sh.redf[0][1] = s;
      sh.redi[0] = am;
    }
  }
  __syncthreads();
  m = sh.redf[0][0];
  s = sh.redf[0][1];
  am = sh.redi[0];
  const float x0 = x[0];
  const int argmax = (am < 0 || x0 != x0) ? 0 : am;
  __syncthreads();
  if (greedy) {
    if (threadIdx.x == 0) ids[row] = argmax;
    return;
  }
  Row r{m, c};
  if (m == -LOOM_INF) r.m = -LOOM_INF;  // every logit -inf (or NaN): y = 0 for all
  const u64 rowkey = mix64(p.seed + mix64(p.counter + 0x632be59bd9b4e019ULL));

  // The lowest histogram bucket that can hold a kept token (0 without truncation): each
  // thread takes 8 buckets, from the top down; a block scan of their counts and of lower
  // bounds of their weights finds where top-k's count and top-p's weight are reached.
  int lowest = 0;
  unsigned ncand = (unsigned)V;
  if (tk || tp || tm) {
    if (threadIdx.x == 0) {
      sh.bk = -1;
      sh.bp = -1;
    }
    unsigned cnt[8];
    float low[8];
    unsigned tc = 0;
    float tl = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int b = SAMPLE_HB - 1 - (threadIdx.x * 8 + j);
      cnt[j] = sh.hist13[b];
      low[j] = cnt[j] ? (float)cnt[j] * exp2f(r.y(keyf((unsigned)b << (32 - SAMPLE_HBITS)))) : 0.0f;
      tc += cnt[j];
      tl += low[j];
    }
    // Inclusive block scan of (tc, tl) over threads.
    unsigned ic = tc;
    float il = tl;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const unsigned c2 = __shfl_up_sync(FULL_MASK, ic, o);
      const float l2 = __shfl_up_sync(FULL_MASK, il, o);
      if (lane >= o) {
        ic += c2;
        il += l2;
      }
    }
    if (lane == 31) {
      sh.redi[warp] = (int)ic;
      sh.redf[warp][0] = il;
    }
    __syncthreads();
    if (warp == 0) {
      unsigned wc = sh.redi[lane];
      float wl = sh.redf[lane][0];
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const unsigned c2 = __shfl_up_sync(FULL_MASK, wc, o);
        const float l2 = __shfl_up_sync(FULL_MASK, wl, o);
        if (lane >= o) {
          wc += c2;
          wl += l2;
        }
      }
      sh.redi[lane] = (int)wc;  // inclusive over warps
      sh.redf[lane][0] = wl;
    }
    __syncthreads();
    unsigned ec = ic - tc + (warp > 0 ? (unsigned)sh.redi[warp - 1] : 0u);
    float el = il - tl + (warp > 0 ? sh.redf[warp - 1][0] : 0.0f);
    const float ptarget = p.top_p * s * 1.001f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int b = SAMPLE_HB - 1 - (threadIdx.x * 8 + j);
      if (tk && ec < (unsigned)p.top_k && ec + cnt[j] >= (unsigned)p.top_k) sh.bk = b;
      if (tp && el < ptarget && el + low[j] >= ptarget) sh.bp = b;
      ec += cnt[j];
      el += low[j];
    }
    __syncthreads();
    int bm = 0;
    if (tm) {
      // w >= min_p  <=>  y >= log2(min_p)  <=>  x >= m + log2(min_p)/c; one bucket of margin.
      const float xt = m + log2f(p.min_p) / c;
      bm = xt == xt ? (int)(fkey(xt) >> (32 - SAMPLE_HBITS)) - 1 : 0;
    }
    // Top-k's selection needs all of top-k's set (its weight is top-p's reference), and
    // top-p's needs its whole prefix: min-p only narrows the candidates when alone.
    lowest = max(tk ? sh.bk : (tp ? sh.bp : bm), 0);
    unsigned n = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) n += SAMPLE_HB - 1 - (threadIdx.x * 8 + j) >= lowest ? cnt[j] : 0u;
    ncand = (unsigned)block_sum_u64(n, sh);
  }
  int tok;
  if ((tk || tp || tm) && ncand <= (unsigned)cap) {
    // Pass 2: copy the candidates; the row's total weight for top-p without top-k.
    uint2* list = ws + (i64)row * cap;
    if (threadIdx.x == 0) sh.count = 0;
    __syncthreads();
    u64 tot = 0;
    const bool need_total = tp && !tk;
    const unsigned lowkey = (unsigned)lowest << (32 - SAMPLE_HBITS);
    for (int base = threadIdx.x & ~31; base < V; base += blockDim.x) {
      const int i = base + lane;
      const bool v = i < V;
      const float xi = v ? x[i] : -LOOM_INF;
      const unsigned k = fkey(xi);
      if (v && need_total) tot += r.wq(keyf(k));
      const bool on = v && k >= lowkey;
      const unsigned bal = __ballot_sync(FULL_MASK, on);
      unsigned at = 0;
      if (lane == 0 && bal) at = atomicAdd(&sh.count, __popc(bal));
      at = __shfl_sync(FULL_MASK, at, 0);
      if (on) list[at + __popc(bal & lanemask_lt())] = make_uint2(k, (unsigned)i);
    }
    tot = need_total ? block_sum_u64(tot, sh) : 0;
    __syncthreads();
    const int n = (int)sh.count;
    __syncthreads();
    tok = select_row(ListSrc{list, n}, r, p, V, tot, rowkey, sh);
  } else {
    u64 tot = 0;
    if (tp && !tk) {
      for (int i = threadIdx.x; i < V; i += blockDim.x) tot += r.wq(x[i] != x[i] ? -LOOM_INF : x[i]);
      tot = block_sum_u64(tot, sh);
    }
    tok = select_row(RowSrc{x, V}, r, p, V, tot, rowkey, sh);
  }
  if (threadIdx.x == 0) ids[row] = tok >= 0 ? tok : argmax;
}

// Greedy rows in two passes over many blocks (GreedyRows): a row of 128256 logits read by
// one block takes ~38 µs; split over ~128 blocks it takes a few. greedy_partial: grid
// (chunks, N), block GREEDY_THREADS; block (c, row) writes the (value bits, index) of the
// largest non-NaN logit of its chunk [c*chunk, (c+1)*chunk), ties to the lowest index,
// index -1 when the chunk has none, to part[row*chunks + c]. greedy_merge: grid N, one warp;
// merges a row's partials with the same rule and applies the first-logit-NaN rule of the
// argmax kernel.

#define GREEDY_THREADS 256

__device__ __forceinline__ void greedy_better(float& m, int& am, float v, int i) {
  if (i >= 0 && (am < 0 || v > m || (v == m && i < am))) {
    m = v;
    am = i;
  }
}

__device__ __forceinline__ void greedy_warp(float& m, int& am) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float om = __shfl_xor_sync(FULL_MASK, m, o);
    const int oi = __shfl_xor_sync(FULL_MASK, am, o);
    greedy_better(m, am, om, oi);
  }
}

extern "C" __global__ void __launch_bounds__(GREEDY_THREADS)
    greedy_partial(uint2* part, const float* logits, int V, int chunk) {
  __shared__ float sm[GREEDY_THREADS / 32];
  __shared__ int si[GREEDY_THREADS / 32];
  const int row = blockIdx.y, c = blockIdx.x, chunks = gridDim.x;
  const float* x = logits + (i64)row * V;
  const int lo = c * chunk, hi = min(V, lo + chunk);
  float m = -LOOM_INF;
  int am = -1;
  for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const float v = x[i];
    if (v == v) greedy_better(m, am, v, i);
  }
  greedy_warp(m, am);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    sm[warp] = m;
    si[warp] = am;
  }
  __syncthreads();
  if (warp == 0) {
    m = lane < GREEDY_THREADS / 32 ? sm[lane] : -LOOM_INF;
    am = lane < GREEDY_THREADS / 32 ? si[lane] : -1;
    greedy_warp(m, am);
    if (lane == 0) part[(i64)row * chunks + c] = make_uint2(__float_as_uint(m), (unsigned)am);
  }
}

extern "C" __global__ void greedy_merge(int* ids, const uint2* part, const float* logits, int V, int chunks) {
  const int row = blockIdx.x;
  float m = -LOOM_INF;
  int am = -1;
  for (int c = threadIdx.x; c < chunks; c += 32) {
    const uint2 p = part[(i64)row * chunks + c];
    greedy_better(m, am, __uint_as_float(p.x), (int)p.y);
  }
  greedy_warp(m, am);
  if (threadIdx.x == 0) {
    const float x0 = logits[(i64)row * V];
    ids[row] = (am < 0 || x0 != x0) ? 0 : am;
  }
}
