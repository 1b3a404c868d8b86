// Tensor-core flash attention (FlashAttention-2 style) for the prefill of paged_attention
// (graph/catalog_cache.go) when q and the paged caches are bf16: backend/cuda uses it in
// place of paged.cu's paged_prefill for head sizes D that are a multiple of 16, up to 256.
// It needs sm_80 or later (mma.sync m16n8k16 bf16, ldmatrix, cp.async).
//
// Layouts, as paged.cu: q and out [1,H,S,D], caches [NB,BS,KV,D]; position j of a sequence
// lives in block block_tables[seq, j/BS] at offset j%BS. Query head h reads KV head h/(H/KV).
// Token t (of sequence token_seq[t], at position positions[0,t]) sees the cached positions
// lo..hi, hi = positions[0,t], lo = max(0, hi-window+1) with a window, else 0.
//
// Grid (KV, ceil(S*G/BR), splits), G = H/KV; block W warps (4 or 8). A block covers BR =
// 16 * W * MT consecutive rows of the (token, query head of the KV head's group) space of
// one KV head, i.e. several tokens and all G query heads that share the KV head; warp w owns
// rows 16*MT*w.. (MT m16 tiles, 1 or 2: with 2, each K and V fragment loaded from shared
// memory feeds two mmas, and Q is read from shared memory at each tile). The blocks of the latest tokens, which see the longest
// contexts, are scheduled first. Tokens of several sequences in one block are served one
// run of equal token_seq at a time; a run's keys and values go through shared memory in
// tiles of BC positions (lo..hi of all its tokens), staged with cp.async from the cache
// through the block table, two tiles in flight. A warp skips a tile none of its rows sees.
//
// Shared memory rows are padded to D+8 elements (an odd number of 16-byte chunks), so that
// the eight rows of every ldmatrix fall in distinct banks. Fragments, per warp (g = lane/4,
// c = lane%4): S = Q·Kᵀ with A = Q rows (ldmatrix x4), B = K rows (ldmatrix x4, non-
// transposed: a K row is a column of Kᵀ); O += P·V with A = P straight from the S
// accumulators (the C layout of two adjacent n8 tiles is the A layout of one k16 step) and B
// = V (ldmatrix x4 .trans). A thread holds rows g and g+8 of its warp's tile; a row's
// online softmax state is reduced over the four threads of a quad.
//
// Numerics (paged.cu's contract): raw scores q·k accumulated in f32 by the tensor cores,
// rounded to bf16 (R::round, round to nearest even) and scaled; online softmax in f32, base 2
// (scores scaled by log2(e) once); values summed in f32. The P·V product takes P in bf16:
// with PS = 2 each probability is split into hi = bf16(p) and lo = bf16(p - hi) and both are
// multiplied (two mmas), which keeps P to about 16 bits, close to the contract's unrounded
// f32 probabilities; with PS = 1 P is rounded once to bf16 (relative error 2^-9 per
// probability, as the CPU reference's own rounding of probabilities to q's dtype), which
// also passes the tests' bf16 tolerance and saves a third of the mmas. The output row is
// the f32 accumulator over the f32 sum of the probabilities, rounded to bf16.
//
// Errors are reported as paged.cu does, through err[0..3] (code, value, where, limit; the
// first error wins): 3 a block_tables entry (of a block some token reads) outside the
// cache's blocks, 4 a token_seq entry outside block_tables' rows, 5 a position that is
// negative or past what block_tables' row covers. A bad token reads nothing; a bad block's
// positions are skipped; a row that sees no key gives NaN.
//
// Index inputs are i32 or i64, chosen at run time. Positions fit in int (the host checks
// M*BS). The file holds templates only: backend/cuda appends FLASH_PREFILL(D, BC, PS, W, MT)
// instantiations.

__device__ __forceinline__ unsigned fa_smem(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// fa_cp16 copies 16 bytes from global src to shared dst asynchronously, or zeros dst when
// valid is false (src is then not read).
__device__ __forceinline__ void fa_cp16(unsigned dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}

__device__ __forceinline__ void fa_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void fa_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void fa_ldm4(unsigned addr, unsigned* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void fa_ldm4t(unsigned addr, unsigned* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// fa_mma: c[16x8] += a[16x16] · b[16x8], bf16 inputs, f32 accumulators.
__device__ __forceinline__ void fa_mma(float* c, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// fa_pack rounds lo and hi to bf16 (to nearest even) and packs them, lo in the low half.
__device__ __forceinline__ unsigned fa_pack(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

__device__ __forceinline__ float fa_lo(unsigned p) { return __uint_as_float(p << 16); }
__device__ __forceinline__ float fa_hi(unsigned p) { return __uint_as_float(p & 0xffff0000u); }

// FaTile is the position of the tile loop: the run of the block's tokens ts..te (local
// indices) of one sequence, the positions klo..khi its tokens see, and the tile's first
// position kt.
struct FaTile {
  int ts, te, klo, khi, kt;
};

// fa_advance moves it to the next tile of BC positions: the next of its run, else the first
// of the next run that sees any position. False when the block has no tile left. With
// splits > 1 a run's positions klo..khi are cut into splits parts of whole tiles and the
// block takes part z only.
__device__ __forceinline__ bool fa_advance(FaTile& it, int bc, int ntok, const int* tseq, const int* tlo,
                                           const int* thi, int z, int splits) {
  it.kt += bc;
  while (it.kt > it.khi) {
    it.ts = it.te + 1;
    if (it.ts >= ntok) return false;
    const int cur = tseq[it.ts];
    it.te = it.ts;
    while (it.te + 1 < ntok && tseq[it.te + 1] == cur) ++it.te;
    it.klo = 0x7fffffff;
    it.khi = -1;
    if (cur >= 0) {
      for (int i = it.ts; i <= it.te; ++i) {
        it.klo = min(it.klo, tlo[i]);
        it.khi = max(it.khi, thi[i]);
      }
      if (splits > 1 && it.khi >= it.klo) {
        const int part = ((it.khi - it.klo + splits) / splits + bc - 1) / bc * bc;
        const int lo = it.klo + z * part;
        it.khi = lo > it.khi - part ? it.khi : lo + part - 1;  // no overflow past khi
        it.klo = lo;
      }
    }
    it.kt = it.klo;
  }
  return true;
}

// flash_prefill: see the file comment. Shared memory (SD = D+8 elements): Qs [BR][SD],
// Ks [2][BC][SD], Vs [2][BC][SD] bf16, then ints: tile slots [3][BC], the block's tokens'
// sequence (-1: reads nothing), lo and hi [BR] each.
//
// Split-KV (gridDim.z = splits > 1, for few rows over long contexts): block z attends to
// part z of each run's positions (fa_advance) and writes, instead of out, each row's
// partial record to part [S][H][splits][D+2] f32: the row's running max m (base 2), its sum
// l and its unnormalized accumulator, as paged.cu's decode splits do; paged_combine merges
// them into out. A row that sees nothing in its part writes m = -inf, l = 0.
template <int D, int BC, int PS, int W, int MT>
__device__ __forceinline__ void flash_prefill_impl(bf16* out, float* part, const bf16* q, const bf16* kc, const bf16* vc,
                                                   const void* pos, int p64, const void* seqs, int q64,
                                                   const void* tables, int t64, int H, int KVH, int S, int NB,
                                                   int BS, int N, int M, float scale, int window, int* err,
                                                   int tm) {
  pdl_begin();
  static_assert(D % 16 == 0 && D >= 16 && D <= 256, "D must be a multiple of 16 up to 256");
  static_assert(BC % 16 == 0 && BC <= W * 32, "BC must be a multiple of 16 up to the block's threads");
  static_assert(MT == 1 || MT == 2, "MT is 1 or 2");
  constexpr int FA_BR = 16 * W * MT;  // rows of the block
  static_assert(PS == 1 || PS == 2, "PS is 1 or 2");
  constexpr int SD = D + 8;     // shared row stride in elements
  constexpr int CH = D / 8;     // 16-byte chunks per row
  constexpr int NT = BC / 8;    // n8 tiles of keys per K tile
  constexpr int DT = D / 8;     // n8 tiles of the output row
  constexpr bool QREG = D <= 128 && MT == 1;  // Q fragments held in registers
  extern __shared__ __align__(16) unsigned char fsm[];
  bf16* Qs = (bf16*)fsm;
  bf16* Ks = Qs + FA_BR * SD;
  bf16* Vs = Ks + 2 * BC * SD;
  int* slots = (int*)(Vs + 2 * BC * SD);
  int* tseq = slots + 3 * BC;
  int* tlo = tseq + FA_BR;
  int* thi = tlo + FA_BR;

  const int G = H / KVH;
  const int g = blockIdx.x;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int fr = lane >> 2, fc = lane & 3;  // fragment row and column pair
  const i64 rows = (i64)S * G;
  const i64 r0 = (i64)(gridDim.y - 1 - blockIdx.y) * FA_BR;
  const int tfirst = (int)(r0 / G);
  const int ntok = (int)((min(rows, r0 + FA_BR) - 1) / G) - tfirst + 1;

  // The block's tokens: sequence, visible positions; reported by the block of the token's
  // first row.
  for (int i = threadIdx.x; i < ntok; i += blockDim.x) {
    const int t = tfirst + i;
    const i64 hi = load_idx(pos, t, p64), seq = load_idx(seqs, t, q64);
    const bool first = g == 0 && blockIdx.z == 0 && (i64)t * G >= r0;
    int s = -1, lo = 0, h = -1;
    if (seq < 0 || seq >= N) {
      if (first) report(err, 4, seq, t, N);
    } else if (hi < 0 || hi / BS >= M) {
      if (first) report(err, 5, hi, t, (i64)M * BS);
    } else {
      s = (int)seq;
      h = (int)hi;
      if (window > 0) lo = hi - window + 1 > 0 ? (int)(hi - window + 1) : 0;
    }
    tseq[i] = s;
    tlo[i] = lo;
    thi[i] = h;
  }
  // Q rows (zeros past the last row): the first cp.async group.
  for (int i = threadIdx.x; i < FA_BR * CH; i += blockDim.x) {
    const int r = i / CH, c = i - r * CH;
    const i64 f = r0 + r;
    const bf16* src = q;
    if (f < rows) src = q + ((i64)(g * G + (int)(f % G)) * S + f / G) * D + c * 8;
    fa_cp16(fa_smem(Qs + r * SD + c * 8), src, f < rows);
  }
  fa_commit();
  __syncthreads();

  // This thread's rows (R = 2*MT of them): row j = 2*mt + e is the block's row wr + 16*mt +
  // fr + 8*e, with its local token (-1: none) and visible range.
  constexpr int R = 2 * MT;
  const int wr = warp * 16 * MT;
  int rt[R], rl[R], rh[R];
#pragma unroll
  for (int j = 0; j < R; ++j) {
    const i64 f = r0 + wr + 16 * (j >> 1) + fr + 8 * (j & 1);
    rt[j] = f < rows ? (int)(f / G) - tfirst : -1;
    rl[j] = 1;
    rh[j] = 0;
    if (rt[j] >= 0 && tseq[rt[j]] >= 0) {
      rl[j] = tlo[rt[j]];
      rh[j] = thi[rt[j]];
    } else {
      rt[j] = -1;
    }
  }

  float m[R], l[R];
#pragma unroll
  for (int j = 0; j < R; ++j) m[j] = -LOOM_INF, l[j] = 0.0f;
  float o[MT][DT][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < DT; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
  unsigned qf[QREG ? D / 16 : 1][4];
  const float sl2 = scale * LOG2E;
  const i64 kvstride = (i64)KVH * D;

  // fill_slots sets the cache slot of each position of tile it (-1: none) in slot buffer sb
  // and returns, through the barrier, whether a position it should read has a bad block.
  auto fill_slots = [&](const FaTile& it, int sb, bool valid) -> bool {
    bool bad = false;
    if (valid && threadIdx.x < BC) {
      const int p = it.kt + threadIdx.x;
      int s = -1;
      if (p <= it.khi) {
        const int cur = tseq[it.ts];
        const i64 b = load_idx(tables, (i64)cur * M + p / BS, t64);
        if (b < 0 || b >= NB) {
          if (g == 0 && blockIdx.z == 0 && (p % BS == 0 || p == it.kt)) report(err, 3, b, cur, NB);
          bad = true;
        } else {
          s = (int)b * BS + p % BS;  // below NB*BS <= 2^31-1 (checked by the host)
        }
      }
      slots[sb * BC + threadIdx.x] = s;
    }
    return __syncthreads_or(bad) != 0;
  };
  // issue starts the copies of the keys and values of the tile in slot buffer sb into stage st.
  auto issue = [&](int sb, int st) {
    for (int i = threadIdx.x; i < BC * CH; i += blockDim.x) {
      const int r = i / CH, c = i - r * CH;
      const int s = slots[sb * BC + r];
      const i64 off = (s < 0 ? 0 : (i64)s * kvstride) + (i64)g * D + c * 8;
      const int so = (st * BC + r) * SD + c * 8;
      fa_cp16(fa_smem(Ks + so), kc + off, s >= 0);
      fa_cp16(fa_smem(Vs + so), vc + off, s >= 0);
    }
  };

  FaTile it = {0, -1, 0x7fffffff, -1, 0};
  const int z = blockIdx.z, splits = gridDim.z;
  bool valid = fa_advance(it, BC, ntok, tseq, tlo, thi, z, splits);  // uniform: from shared memory
  bool bad = fill_slots(it, 0, valid);
  if (valid) issue(0, 0);
  fa_commit();
  int st = 0, sb = 0;
  bool qloaded = false;
  while (valid) {
    FaTile nx = it;
    const bool nvalid = fa_advance(nx, BC, ntok, tseq, tlo, thi, z, splits);
    const int nsb = sb == 2 ? 0 : sb + 1;
    // The barrier also says every warp is done with stage st^1 (the tile before it).
    const bool nbad = fill_slots(nx, nsb, nvalid);
    if (nvalid) issue(nsb, st ^ 1);
    fa_commit();
    fa_wait<1>();
    __syncthreads();

    if (QREG && !qloaded) {
#pragma unroll
      for (int kk = 0; kk < (QREG ? D / 16 : 1); ++kk)
        fa_ldm4(fa_smem(Qs + (wr + (lane & 15)) * SD + kk * 16 + (lane >> 4) * 8), qf[kk]);
      qloaded = true;
    }
    const int kt = it.kt, kend = it.kt + BC - 1;
    bool in[R], full[R];
    bool sees = false;
#pragma unroll
    for (int j = 0; j < R; ++j) {
      in[j] = rt[j] >= it.ts && rt[j] <= it.te;  // rt -1 is never in
      full[j] = in[j] && !bad && rl[j] <= kt && rh[j] >= kend;
      sees |= in[j] && rl[j] <= kend && rh[j] >= kt;
    }
    if (__any_sync(FULL_MASK, sees)) {
      const bf16* Kt = Ks + st * BC * SD;
      const bf16* Vt = Vs + st * BC * SD;
      float sc[MT][NT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < NT; ++i) sc[mt][i][0] = sc[mt][i][1] = sc[mt][i][2] = sc[mt][i][3] = 0.0f;
      // S = Q·Kᵀ: each K fragment serves the warp's MT row tiles.
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        unsigned a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (QREG) {
            a[mt][0] = qf[kk][0], a[mt][1] = qf[kk][1], a[mt][2] = qf[kk][2], a[mt][3] = qf[kk][3];
          } else {
            fa_ldm4(fa_smem(Qs + (wr + 16 * mt + (lane & 15)) * SD + kk * 16 + (lane >> 4) * 8), a[mt]);
          }
        }
#pragma unroll
        for (int nn = 0; nn < BC / 16; ++nn) {
          unsigned b[4];
          fa_ldm4(fa_smem(Kt + (nn * 16 + (lane & 7) + (lane >> 4) * 8) * SD + kk * 16 + ((lane >> 3) & 1) * 8), b);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            fa_mma(sc[mt][2 * nn], a[mt], b[0], b[1]);
            fa_mma(sc[mt][2 * nn + 1], a[mt], b[2], b[3]);
          }
        }
      }
      // Scores: round to bf16, scale (base 2), mask; row maxima over the quad.
      float mx[R];
#pragma unroll
      for (int j = 0; j < R; ++j) mx[j] = m[j];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < NT; ++i) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int j = 2 * mt + e;
            const unsigned r = fa_pack(sc[mt][i][2 * e], sc[mt][i][2 * e + 1]);
            float x0 = fa_lo(r) * sl2, x1 = fa_hi(r) * sl2;
            if (!full[j]) {
              const int c = i * 8 + 2 * fc, p = kt + c;
              const bool v0 = in[j] && p >= rl[j] && p <= rh[j] && (!bad || slots[sb * BC + c] >= 0);
              const bool v1 = in[j] && p + 1 >= rl[j] && p + 1 <= rh[j] && (!bad || slots[sb * BC + c + 1] >= 0);
              if (!v0) x0 = -LOOM_INF;
              if (!v1) x1 = -LOOM_INF;
            }
            sc[mt][i][2 * e] = x0;
            sc[mt][i][2 * e + 1] = x1;
            mx[j] = fmaxf(mx[j], fmaxf(x0, x1));
          }
        }
      float mref[R];
#pragma unroll
      for (int j = 0; j < R; ++j) {
        mx[j] = fmaxf(mx[j], __shfl_xor_sync(FULL_MASK, mx[j], 1));
        mx[j] = fmaxf(mx[j], __shfl_xor_sync(FULL_MASK, mx[j], 2));
        mref[j] = mx[j] == -LOOM_INF ? 0.0f : mx[j];  // a row with nothing seen yet stays empty
        const float corr = exp2f(m[j] - mref[j]);
        m[j] = mx[j];
        l[j] *= corr;
        const int mt = j >> 1, e = j & 1;
#pragma unroll
        for (int n = 0; n < DT; ++n) {
          o[mt][n][2 * e] *= corr;
          o[mt][n][2 * e + 1] *= corr;
        }
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < NT; ++i)
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const int j = 2 * mt + (u >> 1);
            const float p = exp2f(sc[mt][i][u] - mref[j]);
            sc[mt][i][u] = p;
            l[j] += p;
          }
      // O += P·V, one k16 step of keys at a time; each V fragment serves the MT row tiles.
#pragma unroll
      for (int kk = 0; kk < BC / 16; ++kk) {
        unsigned ph[MT][4], pl[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const float* src = sc[mt][2 * kk + (u >> 1)] + 2 * (u & 1);
            ph[mt][u] = fa_pack(src[0], src[1]);
            if constexpr (PS == 2) pl[mt][u] = fa_pack(src[0] - fa_lo(ph[mt][u]), src[1] - fa_hi(ph[mt][u]));
          }
#pragma unroll
        for (int dn = 0; dn < D / 16; ++dn) {
          unsigned b[4];
          fa_ldm4t(fa_smem(Vt + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * SD + dn * 16 + (lane >> 4) * 8), b);
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            fa_mma(o[mt][2 * dn], ph[mt], b[0], b[1]);
            fa_mma(o[mt][2 * dn + 1], ph[mt], b[2], b[3]);
            if constexpr (PS == 2) {
              fa_mma(o[mt][2 * dn], pl[mt], b[0], b[1]);
              fa_mma(o[mt][2 * dn + 1], pl[mt], b[2], b[3]);
            }
          }
        }
      }
    }
    it = nx;
    valid = nvalid;
    bad = nbad;
    st ^= 1;
    sb = nsb;
  }
  fa_wait<0>();
  __syncthreads();  // every copy into Qs has landed and no warp reads it any more

  float inv[R];
#pragma unroll
  for (int j = 0; j < R; ++j) {
    l[j] += __shfl_xor_sync(FULL_MASK, l[j], 1);
    l[j] += __shfl_xor_sync(FULL_MASK, l[j], 2);
    inv[j] = l[j] > 0.0f ? 1.0f / l[j] : LOOM_NAN;
  }
  if (splits > 1) {
    // The rows' partial records: m and l from the quad's first thread, the accumulator's
    // columns from the thread that holds them.
#pragma unroll
    for (int j = 0; j < R; ++j) {
      const int mt = j >> 1, e = j & 1;
      const i64 f = r0 + wr + 16 * mt + fr + 8 * e;
      if (f >= rows) continue;
      float* rec = part + (((f / G) * H + g * G + (int)(f % G)) * splits + z) * (D + 2);
      if (fc == 0) {
        rec[0] = m[j];
        rec[1] = l[j];
      }
#pragma unroll
      for (int n = 0; n < DT; ++n)
        *(float2*)(rec + 2 + n * 8 + 2 * fc) = make_float2(o[mt][n][2 * e], o[mt][n][2 * e + 1]);
    }
    return;
  }
  // Normalize, stage the warp's rows in its Qs rows as bf16, store them in 16-byte chunks.
#pragma unroll
  for (int j = 0; j < R; ++j) {
    const int mt = j >> 1, e = j & 1;
#pragma unroll
    for (int n = 0; n < DT; ++n)
      *(unsigned*)(Qs + (wr + 16 * mt + fr + 8 * e) * SD + n * 8 + 2 * fc) =
          fa_pack(o[mt][n][2 * e] * inv[j], o[mt][n][2 * e + 1] * inv[j]);
  }
  __syncwarp();
  for (int i = lane; i < 16 * MT * CH; i += 32) {
    const int r = i / CH, c = i - r * CH;
    const i64 f = r0 + wr + r;
    if (f < rows) {
      const i64 dst = att_out(g * G + (int)(f % G), f / G, H, S, D, tm) + c * 8;
      *(uint4*)(out + dst) = *(const uint4*)(Qs + (wr + r) * SD + c * 8);
    }
  }
}

#define FLASH_PREFILL(D, BC, PS, W, MT)                                                                          \
  extern "C" __global__ void __launch_bounds__(W * 32) flash_prefill_bf16_d##D##_c##BC##_p##PS##_w##W##_m##MT(  \
      bf16* out, float* part, const bf16* q, const bf16* kc, const bf16* vc, const void* pos, int p64,           \
      const void* seqs,                                                                                          \
      int q64, const void* tables, int t64, int H, int KVH, int S, int NB, int BS, int N, int M, float scale,   \
      int window, int* err, int tm) {                                                                                \
    flash_prefill_impl<D, BC, PS, W, MT>(out, part, q, kc, vc, pos, p64, seqs, q64, tables, t64, H, KVH, S, NB, BS, N, M,    \
                                  scale, window, err, tm);                                                          \
  }
