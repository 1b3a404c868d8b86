// Custom one-shot all-reduce over peer memory (NVLink), for small messages, and its fusion
// with the residual add and RMSNorm that follow a row-parallel linear. backend/cuda/peer.go
// sets up the memory and launches these kernels; see PeerGroup there.
//
// The protocol pushes instead of pulling, and needs no flags: the data is its own signal
// (a "Lamport" all-reduce, as TensorRT-LLM's low-latency one). Every element of the receive
// buffers holds an empty mark until a peer's value lands there, so a reader waits for the
// values themselves, and one NVLink crossing (the writes) replaces the flag round trip and
// the remote reads of a barrier-then-read all-reduce.
//
// Memory. Every rank owns one allocation that all ranks map (peer access in one process, CUDA
// IPC across processes):
//   - data: three buffers, each of nranks slots of `slot` bytes. Call k uses buffer k%3; rank
//     q writes its input into slot q of buffer k%3 of every rank (its own included).
//   - ctl: words only this rank touches: u32 [3] an error: 0, or 1 + a rank whose values did
//     not arrive within the timeout (the group is then unusable and every later call returns
//     at once); u64 [2 + (k&1)] the bytes per slot call k wrote; u64 [32 + b] the number of
//     the last call, as block b counts it (AR_MAX_BLOCKS counters).
//
// The empty mark is the NaN with every bit set (cuMemsetD32 with 0xffffffff: 0xffff for
// bf16). An input equal to it is sent as the NaN with the sign bit clear, so NaNs stay NaNs.
//
// One call on every rank (all ranks make the same calls, in the same order, with the same
// sizes, so they launch the same grids):
//   1. k = the call's number, one more than block b's counter (every block's counter holds
//      the last call's number: block b of a call stores k in counter b, its block 0 in the
//      counters of the blocks past its grid, and block 0 stores the call's size for the
//      next call). The counters live on the device so that graph replays and back-to-back
//      calls need nothing from the host, and no block waits for another's.
//   2. Every thread writes its part of the input into slot `rank` of buffer k%3 of every
//      rank, 16 bytes per store where it can.
//   3. The threads set buffer (k-1)%3 of their own rank back to empty, over the bytes call
//      k-1 wrote.
//   4. Every thread reads the values it needs from each slot of its own buffer k%3, waiting
//      until none is empty, and reduces them in rank order 0, 1, ..., n-1 in f32 (bf16 rounds
//      once at the end), so every rank computes bit-identical results, the same as
//      dist/local's reduction.
//
// Why the buffers are safe to reuse with three of them: a rank clears buffer (k-1)%3 during
// call k. Every peer's writes of call k-1 to it have landed (this rank read each of them in
// call k-1). No peer writes to it again before call k+2, and a peer in call k+2 has read this
// rank's values of call k+1, written after this rank's call k (same stream) finished its
// clearing. A peer may run one call ahead (it needs this rank's values to finish a call), so
// call k+1's writes land in buffer (k+1)%3 while this rank still reads buffer k%3: a third
// buffer, not a second, is what keeps them apart. Loads and stores of the buffers are
// volatile (never an L1 line); stores of peer memory cross NVLink as written.
//
// The kernels need sm_70 or later. A block waits only for values that the peers' blocks of
// its own index write before they wait, never for a block of its own grid (the grids are
// still at most one block per SM, so all of a call's blocks run at once).

#define AR_MAX_RANKS 8
#define AR_FLIGHT 4  // slots whose loads a thread has in flight together
#define AR_MAX_BLOCKS 256
#define AR_DATA_OFFSET 4096  // the data's offset in a rank's allocation (peerDataOffset in peer.go)
#define AR_BUFFERS 3
#define AR_EMPTY16 0xffffu
#define AR_EMPTY32 0xffffffffu

struct PeerArgs {
  unsigned long long data[AR_MAX_RANKS];  // each rank's data (three buffers of nranks slots), as this GPU addresses it
  unsigned long long ctl;                 // this rank's control words
  long long slot;                         // bytes of one slot (a multiple of 256)
  unsigned long long timeout_ns;          // how long a thread waits for a peer's values before giving up
  int rank, nranks;
};

typedef unsigned long long u64;

__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ uint4 ld_volatile4(const void* p) {
  uint4 v;
  asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p)
               : "memory");
  return v;
}

__device__ __forceinline__ void st_volatile4(void* p, uint4 v) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}

// Pack<X> handles 16 bytes of elements of X: N of them. mark/empty work on raw bits: U is
// the element's bit type.
template <class X> struct Pack;
template <> struct Pack<F32> {
  static const int N = 4;
  typedef unsigned U;
  static __device__ __forceinline__ void unpack(uint4 v, float* f) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
  }
  static __device__ __forceinline__ uint4 pack(const float* f) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
  }
  static __device__ __forceinline__ U bits(float v) { return __float_as_uint(v); }
  static __device__ __forceinline__ float value(U b) { return __uint_as_float(b); }
  static __device__ __forceinline__ U send(U b) { return b == AR_EMPTY32 ? 0x7fffffffu : b; }
  static __device__ __forceinline__ bool empty(U b) { return b == AR_EMPTY32; }
  static __device__ __forceinline__ uint4 send4(uint4 v) { return make_uint4(send(v.x), send(v.y), send(v.z), send(v.w)); }
  static __device__ __forceinline__ bool empty4(uint4 v) { return empty(v.x) | empty(v.y) | empty(v.z) | empty(v.w); }
  static __device__ __forceinline__ U ld_volatile(const U* p) {
    U v;
    asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
  }
  static __device__ __forceinline__ void st_volatile(U* p, U v) {
    asm volatile("st.volatile.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
  }
};
template <> struct Pack<BF16> {
  static const int N = 8;
  typedef unsigned short U;
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
  static __device__ __forceinline__ U bits(bf16 v) { return v; }
  static __device__ __forceinline__ float value(U b) { return bf16_to_f32(b); }
  static __device__ __forceinline__ U send(U b) { return b == AR_EMPTY16 ? (U)0x7fff : b; }
  static __device__ __forceinline__ bool empty(U b) { return b == AR_EMPTY16; }
  static __device__ __forceinline__ unsigned send2(unsigned w) {
    return (unsigned)send((U)(w & 0xffffu)) | ((unsigned)send((U)(w >> 16)) << 16);
  }
  static __device__ __forceinline__ bool empty2(unsigned w) { return ((w & 0xffffu) == AR_EMPTY16) | ((w >> 16) == AR_EMPTY16); }
  static __device__ __forceinline__ uint4 send4(uint4 v) { return make_uint4(send2(v.x), send2(v.y), send2(v.z), send2(v.w)); }
  static __device__ __forceinline__ bool empty4(uint4 v) { return empty2(v.x) | empty2(v.y) | empty2(v.z) | empty2(v.w); }
  static __device__ __forceinline__ U ld_volatile(const U* p) {
    U v;
    asm volatile("ld.volatile.global.u16 %0, [%1];" : "=h"(v) : "l"(p) : "memory");
    return v;
  }
  static __device__ __forceinline__ void st_volatile(U* p, U v) {
    asm volatile("st.volatile.global.u16 [%0], %1;" ::"l"(p), "h"(v) : "memory");
  }
};

// ArCall is one call as a thread sees it: its number and the bytes per slot the previous
// call wrote (what step 3 clears).
struct ArCall {
  u64 k;
  long long prev;
  bool ok;
};

// ar_begin reads the call's number and the previous call's size (ok is false when the group
// is broken by a timeout) and stores the counters and this call's size for the next call (a
// kernel's stores are visible to the next kernel of the stream; the sizes alternate between
// two words, so none reads the word being written).
__device__ __forceinline__ ArCall ar_begin(const PeerArgs& p, long long bytes) {
  volatile u64* ctl = (volatile u64*)p.ctl;
  volatile u64* count = ctl + 32;
  ArCall c;
  c.k = count[blockIdx.x] + 1;
  c.prev = (long long)ctl[2 + ((c.k - 1) & 1)];
  c.ok = ((volatile unsigned*)p.ctl)[3] == 0;
  __syncthreads();  // every thread has read the counter before it changes
  if (blockIdx.x == 0) {
    for (int b = gridDim.x + threadIdx.x; b < AR_MAX_BLOCKS; b += blockDim.x) count[b] = c.k;
    if (threadIdx.x == 0) ctl[2 + (c.k & 1)] = (u64)bytes;
  }
  if (threadIdx.x == 0) count[blockIdx.x] = c.k;
  return c;
}

// ar_slot is slot q of buffer k%3 of rank r's data; ar_own is ar_slot of this rank (its
// address is its ctl's plus AR_DATA_OFFSET, which keeps p.data from being indexed by a
// run-time rank, which would copy it to local memory).
__device__ __forceinline__ char* ar_slot(const PeerArgs& p, int r, u64 k, int q) {
  return (char*)p.data[r] + ((long long)(k % AR_BUFFERS) * p.nranks + q) * p.slot;
}

__device__ __forceinline__ char* ar_own(const PeerArgs& p, u64 k, int q) {
  return (char*)p.ctl + AR_DATA_OFFSET + ((long long)(k % AR_BUFFERS) * p.nranks + q) * p.slot;
}

// ar_clear sets the first c.prev bytes of every slot of this rank's buffer (k-1)%3 back to
// empty, spread over the grid's threads.
__device__ __forceinline__ void ar_clear(const PeerArgs& p, const ArCall& c) {
  long long per = (c.prev + 15) / 16, total = per * p.nranks;
  long long stride = (long long)gridDim.x * blockDim.x;
  const uint4 e = make_uint4(AR_EMPTY32, AR_EMPTY32, AR_EMPTY32, AR_EMPTY32);
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
    long long q = i / per, j = i - q * per;
    st_volatile4((uint4*)ar_own(p, c.k + AR_BUFFERS - 1, (int)q) + j, e);
  }
}

// ArWait is one thread's wait for peers' values: it gives up after the timeout, or at once
// when another thread has (the group's error word is set), recording the late rank.
struct ArWait {
  u64 t0 = 0;
  unsigned spins = 0;
  // late reports whether to stop waiting for rank q's values.
  __device__ __forceinline__ bool late(const PeerArgs& p, int q) {
    if ((++spins & 1023u) != 0) return false;
    if (((volatile unsigned*)p.ctl)[3] != 0) return true;
    u64 now = global_ns();
    if (t0 == 0) {
      t0 = now;
      return false;
    }
    if (now - t0 <= p.timeout_ns) return false;
    atomicCAS((unsigned*)p.ctl + 3, 0u, 1u + (unsigned)q);
    return true;
  }
};

// ar_sum4 sums, in rank order, the 16 bytes at byte offset off of every slot of this rank's
// buffer k%3, once none of their elements is empty (or the wait gives up). The first loads
// of AR_FLIGHT slots at a time are in flight together.
template <class X>
__device__ __forceinline__ void ar_sum4(const PeerArgs& p, u64 k, long long off, ArWait& w, float* acc) {
  const int N = Pack<X>::N;
#pragma unroll
  for (int q0 = 0; q0 < AR_MAX_RANKS; q0 += AR_FLIGHT) {
    if (q0 < p.nranks) {
      uint4 v[AR_FLIGHT];
#pragma unroll
      for (int j = 0; j < AR_FLIGHT; j++)
        if (q0 + j < p.nranks) v[j] = ld_volatile4(ar_own(p, k, q0 + j) + off);
#pragma unroll
      for (int j = 0; j < AR_FLIGHT; j++) {
        const int q = q0 + j;
        if (q < p.nranks) {
          while (Pack<X>::empty4(v[j]) && !w.late(p, q)) v[j] = ld_volatile4(ar_own(p, k, q) + off);
          float f[N];
          Pack<X>::unpack(v[j], f);
#pragma unroll
          for (int e = 0; e < N; e++) acc[e] = q == 0 ? f[e] : acc[e] + f[e];
        }
      }
    }
  }
}

// out[n] = sum over ranks of x[n]. Elements go in packs of 16 bytes, pack i to thread i of
// the grid-stride loop; x and out need no alignment (unaligned ones are loaded and stored
// element by element; the slots hold whole packs, the tail padded with zeros).
template <class X>
__device__ __forceinline__ void allreduce_impl(typename X::T* out, const typename X::T* x, long long n, const PeerArgs& p) {
  typedef typename X::T T;
  const int N = Pack<X>::N;
  pdl_begin();
  long long packs = (n + N - 1) / N;
  bool xa = ((unsigned long long)x & 15) == 0, oa = ((unsigned long long)out & 15) == 0;
  long long stride = (long long)gridDim.x * blockDim.x;
  long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  // The first pack of x loads while ar_begin reads the call's counter: two memory latencies
  // overlap instead of adding up.
  const bool whole = xa && first < packs && first * N + N <= n;
  uint4 v0 = make_uint4(0, 0, 0, 0);
  if (whole) v0 = ((const uint4*)x)[first];
  ArCall c = ar_begin(p, packs * 16);
  if (!c.ok) return;
  for (long long i = first; i < packs; i += stride) {
    long long e = i * N;
    uint4 v;
    if (i == first && whole) {
      v = v0;
    } else if (xa && e + N <= n) {
      v = ((const uint4*)x)[i];
    } else {
      union {
        uint4 v;
        T t[N];
      } u;
      for (int j = 0; j < N; j++) u.t[j] = e + j < n ? x[e + j] : (T)0;
      v = u.v;
    }
    v = Pack<X>::send4(v);
#pragma unroll
    for (int q = 0; q < AR_MAX_RANKS; q++)
      if (q < p.nranks) st_volatile4((uint4*)ar_slot(p, q, c.k, p.rank) + i, v);
  }
  ar_clear(p, c);
  ArWait w;
  for (long long i = first; i < packs; i += stride) {
    float acc[N];
    ar_sum4<X>(p, c.k, i * 16, w, acc);
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

// ar_send writes element e of x to slot `rank` of buffer k%3 of every rank.
template <class X>
__device__ __forceinline__ void ar_send(const PeerArgs& p, u64 k, const typename X::T* x, long long e) {
  typedef typename Pack<X>::U U;
  U v = Pack<X>::send(Pack<X>::bits(x[e]));
#pragma unroll
  for (int q = 0; q < AR_MAX_RANKS; q++)
    if (q < p.nranks) Pack<X>::st_volatile((U*)ar_slot(p, q, k, p.rank) + e, v);
}

// ar_sum is the sum over ranks, in rank order, of element e of this rank's buffer k%3, once
// no slot's element is empty (or the wait gives up). The first loads of AR_FLIGHT slots at a
// time are in flight together.
template <class X>
__device__ __forceinline__ float ar_sum(const PeerArgs& p, u64 k, long long e, ArWait& w) {
  typedef typename Pack<X>::U U;
  float acc = 0.f;
#pragma unroll
  for (int q0 = 0; q0 < AR_MAX_RANKS; q0 += AR_FLIGHT) {
    if (q0 < p.nranks) {
      U v[AR_FLIGHT];
#pragma unroll
      for (int j = 0; j < AR_FLIGHT; j++)
        if (q0 + j < p.nranks) v[j] = Pack<X>::ld_volatile((const U*)ar_own(p, k, q0 + j) + e);
#pragma unroll
      for (int j = 0; j < AR_FLIGHT; j++) {
        const int q = q0 + j;
        if (q < p.nranks) {
          while (Pack<X>::empty(v[j]) && !w.late(p, q)) v[j] = Pack<X>::ld_volatile((const U*)ar_own(p, k, q) + e);
          acc = q == 0 ? Pack<X>::value(v[j]) : acc + Pack<X>::value(v[j]);
        }
      }
    }
  }
  return acc;
}

// ar_bytes is the bytes per slot of a call with n elements of T: whole 16-byte packs.
template <class T>
__device__ __forceinline__ long long ar_bytes(long long n) {
  return (n * (long long)sizeof(T) + 15) / 16 * 16;
}

// all_reduce_add_rmsnorm over rows[rows, D]: a = round_x(sum over ranks of x); sum =
// round_s(a + r); normed = w * round_s(sum * inv), exactly as allreduce followed by the
// add_rmsnorm kernel for the same operands computes it, bit for bit.
//
// ar_add_rmsnorm_vec_impl is the form for rows that add_rmsnorm_vec_impl (norm.cu) takes with
// one vector per thread of 16 bytes of the widest operand (VEC elements; planNorm in ops.go
// decides, as for add_rmsnorm): rows go to blocks round robin; thread t owns vector t of a
// row, sends it (a block sends all its rows first), sums every rank's copy of it and
// normalises it in registers, with the same sum of squares as add_rmsnorm_vec_impl. Vectors
// of x of 16 bytes travel as one store and one load per rank; narrower ones (x narrower than
// another operand) element by element.
template <class X, class R, class W>
__device__ __forceinline__ void ar_add_rmsnorm_vec_impl(typename Promote<W, typename Promote<X, R>::type>::type::T* normed,
                                                        typename Promote<X, R>::type::T* sum, const typename X::T* x,
                                                        const typename R::T* r, const typename W::T* w, int rows, int D,
                                                        float eps, const PeerArgs& p) {
  typedef typename Promote<X, R>::type S;
  typedef typename Promote<W, S>::type Nt;
  typedef typename X::T T;
  const int wide = sizeof(T) > sizeof(typename R::T) ? sizeof(T) : sizeof(typename R::T);
  const int VEC = 16 / (wide > (int)sizeof(typename W::T) ? wide : (int)sizeof(typename W::T));
  const bool direct = VEC * sizeof(T) == 16;
  pdl_begin();
  const int v = threadIdx.x;
  const bool mine = v < D / VEC;
  // The thread's vector of its first row loads while ar_begin reads the call's counter.
  uint4 x0 = make_uint4(0, 0, 0, 0);
  if (direct && mine && (int)blockIdx.x < rows) x0 = *(const uint4*)(x + (i64)blockIdx.x * D + (i64)v * VEC);
  ArCall c = ar_begin(p, ar_bytes<T>((long long)rows * D));
  if (!c.ok) return;
  for (int row = blockIdx.x; row < rows && mine; row += gridDim.x) {
    const i64 e0 = (i64)row * D + (i64)v * VEC;
    if (direct) {
      uint4 u = Pack<X>::send4(row == (int)blockIdx.x ? x0 : *(const uint4*)(x + e0));
#pragma unroll
      for (int q = 0; q < AR_MAX_RANKS; q++)
        if (q < p.nranks) st_volatile4((uint4*)(ar_slot(p, q, c.k, p.rank) + e0 * (i64)sizeof(T)), u);
    } else {
#pragma unroll
      for (int e = 0; e < VEC; e++) ar_send<X>(p, c.k, x, e0 + e);
    }
  }
  ar_clear(p, c);
  float wv[VEC];
  if (mine) vload<W, VEC>(w + (i64)v * VEC, wv);
  ArWait aw;
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const i64 e0 = (i64)row * D + (i64)v * VEC;
    float sv[VEC], rv[VEC];
    double ss = 0.0;
    if (mine) {
      vload<R, VEC>(r + e0, rv);
      if (direct) {
        ar_sum4<X>(p, c.k, e0 * (i64)sizeof(T), aw, sv);
      } else {
#pragma unroll
        for (int e = 0; e < VEC; e++) sv[e] = ar_sum<X>(p, c.k, e0 + e, aw);
      }
#pragma unroll
      for (int e = 0; e < VEC; e++) sv[e] = S::round(X::round(sv[e]) + rv[e]);
      vstore<S, VEC>(sum + e0, sv);
#pragma unroll
      for (int e = 0; e < VEC; e++) ss += (double)(sv[e] * sv[e]);
    }
    const float inv = rms_inv(block_sum_d(ss), D, eps);
    if (mine) {
      float o[VEC];
#pragma unroll
      for (int e = 0; e < VEC; e++) o[e] = wv[e] * S::round(sv[e] * inv);
      vstore<Nt, VEC>(normed + e0, o);
    }
  }
}

// ar_add_rmsnorm_impl is the form for any other rows (D not a multiple of the vector, rows
// longer than one vector per thread, unaligned operands), as add_rmsnorm_impl (norm.cu)
// computes them: rows go to blocks round robin; a block sends all its rows, then for each
// row sums every rank's values element by element (thread t taking elements t, t + blockDim,
// ...), stores sum, and normalises it read back.
template <class X, class R, class W>
__device__ __forceinline__ void ar_add_rmsnorm_impl(typename Promote<W, typename Promote<X, R>::type>::type::T* normed,
                                                    typename Promote<X, R>::type::T* sum, const typename X::T* x,
                                                    const typename R::T* r, const typename W::T* w, int rows, int D,
                                                    float eps, const PeerArgs& p) {
  typedef typename Promote<X, R>::type S;
  typedef typename Promote<W, S>::type Nt;
  pdl_begin();
  ArCall c = ar_begin(p, ar_bytes<typename X::T>((long long)rows * D));
  if (!c.ok) return;
  int tid = threadIdx.x, bs = blockDim.x;
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    long long base = (long long)row * D;
    for (int d = tid; d < D; d += bs) ar_send<X>(p, c.k, x, base + d);
  }
  ar_clear(p, c);
  ArWait aw;
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    long long base = (long long)row * D;
    for (int d = tid; d < D; d += bs) {
      float a = ar_sum<X>(p, c.k, base + d, aw);
      S::store(sum, base + d, S::round(X::round(a) + R::load(r, base + d)));
    }
    __syncthreads();  // sum of the row is complete for every thread of the block
    double ss = 0.0;
    for (int d = tid; d < D; d += bs) {
      float s = S::load(sum, base + d);
      ss += (double)(s * s);
    }
    ss = block_sum_d(ss);
    float inv = rms_inv(ss, D, eps);
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
  }                                                                                                                   \
  extern "C" __global__ void __launch_bounds__(1024)                                                                  \
      NAME##_vec(Promote<W, Promote<X, R>::type>::type::T* normed, Promote<X, R>::type::T* sum, const X::T* x,         \
                 const R::T* r, const W::T* w, int rows, int D, float eps, PeerArgs p) {                               \
    ar_add_rmsnorm_vec_impl<X, R, W>(normed, sum, x, r, w, rows, D, eps, p);                                          \
  }
AR_ADD_RMSNORM(ar_add_rmsnorm_f32_f32_f32, F32, F32, F32)
AR_ADD_RMSNORM(ar_add_rmsnorm_f32_f32_bf16, F32, F32, BF16)
AR_ADD_RMSNORM(ar_add_rmsnorm_f32_bf16_f32, F32, BF16, F32)
AR_ADD_RMSNORM(ar_add_rmsnorm_f32_bf16_bf16, F32, BF16, BF16)
AR_ADD_RMSNORM(ar_add_rmsnorm_bf16_f32_f32, BF16, F32, F32)
AR_ADD_RMSNORM(ar_add_rmsnorm_bf16_f32_bf16, BF16, F32, BF16)
AR_ADD_RMSNORM(ar_add_rmsnorm_bf16_bf16_f32, BF16, BF16, F32)
AR_ADD_RMSNORM(ar_add_rmsnorm_bf16_bf16_bf16, BF16, BF16, BF16)
