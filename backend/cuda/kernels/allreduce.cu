// Custom one-shot all-reduce over peer memory (NVLink), for small messages, and its fusion
// with the residual add and RMSNorm that follow a row-parallel linear. backend/cuda/peer.go
// sets up the memory and launches these kernels; see PeerGroup there.
//
// Memory. Every rank owns one allocation that all ranks map (peer access in one process, CUDA
// IPC across processes):
//   - data: two halves of `half` bytes each. Call k uses half k&1. A rank copies its input
//     into its own half, then every rank reads every rank's half.
//   - sig: flags u64[AR_MAX_BLOCKS][AR_MAX_RANKS]. Block b of rank q arriving at call k
//     writes k into sig[b][q] of every rank. 64 bits: call numbers never wrap, so a flag
//     that a block index has not touched for a long time never looks recent.
//   - ctl: words only this rank touches: u64 [0] the number of the last call begun; u32
//     [2] a ticket counting the blocks of the running call that started; u32 [3] an error:
//     0, or 1 + a rank that did not arrive within the timeout (the group is then unusable and
//     every later call returns at once).
//
// One call on every rank (all ranks make the same calls, in the same order, with the same
// sizes, so they launch the same grids):
//   1. k = ctl[0] + 1: the call's number. ctl[0] lives on the device so that graph replays
//      and back-to-back calls need nothing from the host.
//   2. Each block copies its part of the input into data half k&1 of its own rank. The
//      partition of elements (or rows) among blocks depends only on the sizes and the grid,
//      so block b of every rank copies the same range.
//   3. Barrier of block b with block b of every other rank: write k into sig[b][rank] of every
//      rank (st.release.sys), wait until sig[b][q] >= k for every q (ld.acquire.sys).
//   4. Read the range from every rank's half k&1 and reduce in rank order 0, 1, ..., n-1 in
//      f32 (bf16 rounds once at the end), so every rank computes bit-identical results, the
//      same as dist/local's reduction.
//   5. The last block to take its ticket (in step 1) sets ctl[0] = k for the next call.
// Every block passes ar_begin and ar_barrier exactly once per call.
//
// Why the data is complete when read (step 4): a block's copy (step 2) is done by all its
// threads; __syncthreads (bar.sync, which synchronizes the threads of the block) orders those
// writes before thread q's release store of the flag, and release is cumulative, so every
// write of the copy happens before the flag write at system scope. The reader's thread q
// acquires that flag value, and its __syncthreads orders the acquire before every thread's
// reads. The reads use ld.global.cg (L2, never a stale L1 line) of peer memory.
//
// Why a half is never overwritten while a peer still reads it (what a second barrier at the
// end of the call would ensure; double buffering ensures it without the wait): rank A writes
// half k&1 in call k; the last reads of it were in call k-2. A's kernel of call k-1 has
// finished before call k starts (same stream), so its blocks all passed the barrier of call
// k-1, which means every peer had started its kernel of call k-1, so every peer's kernel of
// call k-2 (same stream on that peer) had finished: its reads are done. The flags compare
// with >=: a peer may already be one call ahead, never two, since call k+1's barrier needs
// this rank's flag k+1.
//
// The kernels need sm_70 or later (release/acquire at system scope). Blocks of one grid must
// all be resident at once (the grid is at most the SM count, one block per SM fits).

#define AR_MAX_RANKS 8
#define AR_MAX_BLOCKS 256

struct PeerArgs {
  unsigned long long data[AR_MAX_RANKS];  // each rank's data (two halves), as this GPU addresses it
  unsigned long long sig[AR_MAX_RANKS];   // each rank's flags [AR_MAX_BLOCKS][AR_MAX_RANKS]
  unsigned long long ctl;                 // this rank's control words
  long long half;                         // bytes of one data half (a multiple of 256)
  unsigned long long timeout_ns;          // how long a block waits for a peer before giving up
  int rank, nranks;
};

typedef unsigned long long u64;

__device__ __forceinline__ void st_release_sys(u64* p, u64 v) {
#if __CUDA_ARCH__ >= 700
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
  __threadfence_system();
  *(volatile u64*)p = v;
#endif
}

__device__ __forceinline__ u64 ld_acquire_sys(const u64* p) {
  u64 v;
#if __CUDA_ARCH__ >= 700
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
#else
  v = *(const volatile u64*)p;
  __threadfence_system();
#endif
  return v;
}

// ld_cg loads 16 bytes through L2 only. volatile and the memory clobber keep it after the
// barrier.
__device__ __forceinline__ uint4 ld_cg(const void* p) {
  uint4 v;
  asm volatile("ld.global.cg.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ar_begin sets *k to the call's number for every thread of the block; it returns false
// when the group is broken (a timeout). It also counts the block in the call's ticket; the
// last block to do so stores k as the counter, for the next call. Every block has read the
// counter by then, so none sees the new value. The ticket is taken at the start, by the
// block's last thread, so that its latency overlaps the copy (at the end, its fence would
// wait for the block's output stores).
__device__ __forceinline__ bool ar_begin(const PeerArgs& p, u64* k) {
  __shared__ u64 s_k;
  __shared__ unsigned s_ok;
  if (threadIdx.x == 0) {
    s_ok = ((volatile unsigned*)p.ctl)[3] == 0;
    s_k = *(volatile u64*)p.ctl + 1;
  }
  __syncthreads();
  *k = s_k;
  bool ok = s_ok != 0;
  if (ok && threadIdx.x == blockDim.x - 1) {
    unsigned* ctl = (unsigned*)p.ctl;
    __threadfence();  // thread 0's read of the counter (ordered by the barrier) before the ticket
    unsigned t = atomicAdd(ctl + 2, 1u);
    if (t == gridDim.x - 1) {
      __threadfence();  // every block's ticket, so every block's read, before the store
      ((volatile unsigned*)ctl)[2] = 0;
      *(volatile u64*)ctl = *k;
    }
  }
  __syncthreads();  // every thread has read s_k and s_ok before any thread returns
  return ok;
}

// ar_barrier waits until block blockIdx.x of every rank has arrived at call k (see the
// ordering argument at the top).
__device__ __forceinline__ void ar_barrier(const PeerArgs& p, u64 k) {
  __syncthreads();
  int q = threadIdx.x;
  if (q < p.nranks) {
    u64* to = (u64*)p.sig[q] + blockIdx.x * AR_MAX_RANKS + p.rank;
    st_release_sys(to, k);
    const u64* from = (const u64*)p.sig[p.rank] + blockIdx.x * AR_MAX_RANKS + q;
    u64 t0 = 0;
    unsigned spins = 0;
    while (ld_acquire_sys(from) < k) {
      if ((++spins & 1023u) == 0) {
        u64 now = global_ns();
        if (t0 == 0) {
          t0 = now;
        } else if (now - t0 > p.timeout_ns) {
          atomicCAS((unsigned*)p.ctl + 3, 0u, 1u + (unsigned)q);
          break;
        }
      }
    }
  }
  __syncthreads();
}

// Pack<X> handles 16 bytes of elements of X: N of them.
template <class X> struct Pack;
template <> struct Pack<F32> {
  static const int N = 4;
  static __device__ __forceinline__ void unpack(uint4 v, float* f) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
  }
  static __device__ __forceinline__ uint4 pack(const float* f) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
  }
  static __device__ __forceinline__ float load_cg(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
    return v;
  }
};
template <> struct Pack<BF16> {
  static const int N = 8;
  static __device__ __forceinline__ void unpack2(unsigned w, float* f) {
    f[0] = __uint_as_float(w << 16);
    f[1] = __uint_as_float(w & 0xffff0000u);
  }
  static __device__ __forceinline__ void unpack(uint4 v, float* f) {
    unpack2(v.x, f);
    unpack2(v.y, f + 2);
    unpack2(v.z, f + 4);
    unpack2(v.w, f + 6);
  }
  static __device__ __forceinline__ unsigned pack2(const float* f) {
    return (unsigned)f32_to_bf16(f[0]) | ((unsigned)f32_to_bf16(f[1]) << 16);
  }
  static __device__ __forceinline__ uint4 pack(const float* f) {
    return make_uint4(pack2(f), pack2(f + 2), pack2(f + 4), pack2(f + 6));
  }
  static __device__ __forceinline__ float load_cg(const bf16* p) {
    unsigned short v;
    asm volatile("ld.global.cg.u16 %0, [%1];" : "=h"(v) : "l"(p) : "memory");
    return bf16_to_f32(v);
  }
};

// reduce_pack sums pack i of every rank's buffer (base addresses plus off bytes) in rank
// order into acc.
template <class X>
__device__ __forceinline__ void reduce_pack(const PeerArgs& p, long long off, long long i, float* acc) {
  const int N = Pack<X>::N;
  uint4 v[AR_MAX_RANKS];
#pragma unroll
  for (int q = 0; q < AR_MAX_RANKS; q++)
    if (q < p.nranks) v[q] = ld_cg((const uint4*)(p.data[q] + off) + i);
  Pack<X>::unpack(v[0], acc);
#pragma unroll
  for (int q = 1; q < AR_MAX_RANKS; q++) {
    if (q < p.nranks) {
      float f[N];
      Pack<X>::unpack(v[q], f);
#pragma unroll
      for (int j = 0; j < N; j++) acc[j] += f[j];
    }
  }
}

// reduce_elem is reduce_pack for one element.
template <class X>
__device__ __forceinline__ float reduce_elem(const PeerArgs& p, long long off, long long e) {
  typedef typename X::T T;
  float v[AR_MAX_RANKS];
#pragma unroll
  for (int q = 0; q < AR_MAX_RANKS; q++)
    if (q < p.nranks) v[q] = Pack<X>::load_cg((const T*)(p.data[q] + off) + e);
  float acc = v[0];
#pragma unroll
  for (int q = 1; q < AR_MAX_RANKS; q++)
    if (q < p.nranks) acc += v[q];
  return acc;
}

// out[n] = sum over ranks of x[n]. Elements go in packs of 16 bytes, pack i to thread i of
// the grid-stride loop; x and out need no alignment (unaligned ones are copied element by
// element; the partition stays the same).
template <class X>
__device__ __forceinline__ void allreduce_impl(typename X::T* out, const typename X::T* x, long long n, const PeerArgs& p) {
  typedef typename X::T T;
  const int N = Pack<X>::N;
  pdl_begin();
  u64 k;
  if (!ar_begin(p, &k)) return;
  long long off = (long long)(k & 1) * p.half;
  T* mine = (T*)(p.data[p.rank] + off);
  bool xa = ((unsigned long long)x & 15) == 0, oa = ((unsigned long long)out & 15) == 0;
  long long packs = (n + N - 1) / N, stride = (long long)gridDim.x * blockDim.x;
  long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (long long i = first; i < packs; i += stride) {
    long long e = i * N;
    if (xa && e + N <= n) {
      ((uint4*)mine)[i] = ((const uint4*)x)[i];
    } else {
      for (long long j = e; j < e + N && j < n; j++) mine[j] = x[j];
    }
  }
  ar_barrier(p, k);
  for (long long i = first; i < packs; i += stride) {
    float acc[N];
    reduce_pack<X>(p, off, i, acc);
    long long e = i * N;
    if (oa && e + N <= n) {
      ((uint4*)out)[i] = Pack<X>::pack(acc);
    } else {
      for (int j = 0; j < N && e + j < n; j++) X::store(out, e + j, acc[j]);
    }
  }
}

#define ALLREDUCE(NAME, X)                                                                              \
  extern "C" __global__ void __launch_bounds__(1024) NAME(X::T* out, const X::T* x, long long n, PeerArgs p) { \
    allreduce_impl<X>(out, x, n, p);                                                                  \
  }
ALLREDUCE(allreduce_f32, F32)
ALLREDUCE(allreduce_bf16, BF16)

// AR_E is the most elements of a row one thread keeps in registers in
// ar_add_rmsnorm_impl: rowBlock (ops.go) gives every thread at most 8 elements for D up to
// 8192.
#define AR_E 8

// all_reduce_add_rmsnorm over rows[rows, D]: a = round_x(sum over ranks of x); sum =
// round_s(a + r); normed = w * round_s(sum * inv), exactly as allreduce followed by
// add_rmsnorm_impl (norm.cu) computes it: the sum of squares runs over the same threads in the
// same order (one block of the same size per row, thread t taking elements t, t + blockDim,
// ...), so results are bit-identical. Rows go to blocks round robin; a block copies all its
// rows, passes one barrier, then reduces and normalises them one by one.
//
// When every thread has at most AR_E elements of a row (D <= 8192), it keeps them in
// registers: w and the first row's residual are loaded before the barrier, and nothing is
// read back from global memory. Otherwise sum is stored, then read back as add_rmsnorm_impl
// does.
template <class X, class R, class W>
__device__ __forceinline__ void ar_add_rmsnorm_impl(typename Promote<W, typename Promote<X, R>::type>::type::T* normed,
                                                    typename Promote<X, R>::type::T* sum, const typename X::T* x,
                                                    const typename R::T* r, const typename W::T* w, int rows, int D,
                                                    float eps, const PeerArgs& p) {
  typedef typename Promote<X, R>::type S;
  typedef typename Promote<W, S>::type Nt;
  typedef typename X::T T;
  const int N = Pack<X>::N;
  pdl_begin();
  u64 k;
  if (!ar_begin(p, &k)) return;
  long long off = (long long)(k & 1) * p.half;
  T* mine = (T*)(p.data[p.rank] + off);
  bool packed = D % N == 0;
  bool xa = packed && ((unsigned long long)x & 15) == 0;
  int packs = D / N;
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    long long base = (long long)row * D;
    if (xa) {
      for (int i = threadIdx.x; i < packs; i += blockDim.x) ((uint4*)(mine + base))[i] = ((const uint4*)(x + base))[i];
    } else {
      for (int d = threadIdx.x; d < D; d += blockDim.x) mine[base + d] = x[base + d];
    }
  }
  int tid = threadIdx.x, bs = blockDim.x;
  if ((D + bs - 1) / bs <= AR_E) {
    float wv[AR_E], rv[AR_E];
    int row = blockIdx.x;
#pragma unroll
    for (int j = 0; j < AR_E; j++) {
      int d = tid + j * bs;
      if (d < D) {
        wv[j] = W::load(w, d);
        if (row < rows) rv[j] = R::load(r, (long long)row * D + d);
      }
    }
    ar_barrier(p, k);
    for (; row < rows; row += gridDim.x) {
      long long base = (long long)row * D;
      float sv[AR_E];
#pragma unroll
      for (int q = 0; q < AR_MAX_RANKS; q++) {
        if (q < p.nranks) {
          const T* buf = (const T*)(p.data[q] + off) + base;
#pragma unroll
          for (int j = 0; j < AR_E; j++) {
            int d = tid + j * bs;
            if (d < D) {
              float v = Pack<X>::load_cg(buf + d);
              sv[j] = q == 0 ? v : sv[j] + v;
            }
          }
        }
      }
      double ss = 0.0;
#pragma unroll
      for (int j = 0; j < AR_E; j++) {
        int d = tid + j * bs;
        if (d < D) {
          float s = S::round(X::round(sv[j]) + rv[j]);
          S::store(sum, base + d, s);
          sv[j] = s;
          ss += (double)(s * s);
        }
      }
      int next = row + gridDim.x;
      if (next < rows) {
#pragma unroll
        for (int j = 0; j < AR_E; j++) {
          int d = tid + j * bs;
          if (d < D) rv[j] = R::load(r, (long long)next * D + d);
        }
      }
      ss = block_sum_d(ss);
      float mean = (float)(ss / (double)D);
      float inv = (float)(1.0 / sqrt((double)(mean + eps)));
#pragma unroll
      for (int j = 0; j < AR_E; j++) {
        int d = tid + j * bs;
        if (d < D) Nt::store(normed, base + d, wv[j] * S::round(sv[j] * inv));
      }
    }
      return;
  }
  ar_barrier(p, k);
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    long long base = (long long)row * D;
    if (packed) {
      for (int i = tid; i < packs; i += bs) {
        float acc[N];
        reduce_pack<X>(p, off, base / N + i, acc);
#pragma unroll
        for (int j = 0; j < N; j++) {
          long long e = base + (long long)i * N + j;
          S::store(sum, e, S::round(X::round(acc[j]) + R::load(r, e)));
        }
      }
    } else {
      for (int d = tid; d < D; d += bs) {
        float a = reduce_elem<X>(p, off, base + d);
        S::store(sum, base + d, S::round(X::round(a) + R::load(r, base + d)));
      }
    }
    __syncthreads();  // sum of the row is complete for every thread of the block
    double ss = 0.0;
    for (int d = tid; d < D; d += bs) {
      float s = S::load(sum, base + d);
      ss += (double)(s * s);
    }
    ss = block_sum_d(ss);
    float mean = (float)(ss / (double)D);
    float inv = (float)(1.0 / sqrt((double)(mean + eps)));
    for (int d = tid; d < D; d += bs) {
      float s = S::load(sum, base + d);
      Nt::store(normed, base + d, W::load(w, d) * S::round(s * inv));
    }
  }
}

#define AR_ADD_RMSNORM(NAME, X, R, W)                                                                                 \
  extern "C" __global__ void __launch_bounds__(1024)                                                                  \
      NAME(Promote<W, Promote<X, R>::type>::type::T* normed, Promote<X, R>::type::T* sum, const X::T* x,               \
           const R::T* r, const W::T* w, int rows, int D, float eps, PeerArgs p) {                                     \
    ar_add_rmsnorm_impl<X, R, W>(normed, sum, x, r, w, rows, D, eps, p);                                              \
  }
AR_ADD_RMSNORM(ar_add_rmsnorm_f32_f32_f32, F32, F32, F32)
AR_ADD_RMSNORM(ar_add_rmsnorm_f32_f32_bf16, F32, F32, BF16)
AR_ADD_RMSNORM(ar_add_rmsnorm_f32_bf16_f32, F32, BF16, F32)
AR_ADD_RMSNORM(ar_add_rmsnorm_f32_bf16_bf16, F32, BF16, BF16)
AR_ADD_RMSNORM(ar_add_rmsnorm_bf16_f32_f32, BF16, F32, F32)
AR_ADD_RMSNORM(ar_add_rmsnorm_bf16_f32_bf16, BF16, F32, BF16)
AR_ADD_RMSNORM(ar_add_rmsnorm_bf16_bf16_f32, BF16, BF16, F32)
AR_ADD_RMSNORM(ar_add_rmsnorm_bf16_bf16_bf16, BF16, BF16, BF16)
