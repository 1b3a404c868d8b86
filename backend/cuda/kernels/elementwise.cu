// Elementwise kernels: add and mul (same shape, or broadcast through strides), swiglu, and
// strided copies (transpose, slice, concat, expand, cast). Grid-stride loops; f32 math;
// results rounded to the output dtype.

#define OP_ADD 0
#define OP_MUL 1

template <int OP> __device__ __forceinline__ float binop(float x, float y) { return OP == OP_ADD ? x + y : x * y; }

// out[i] = a[i] op b[i] for n elements of one shape.
template <class A, class B, int OP>
__device__ __forceinline__ void binary_flat_impl(typename Promote<A, B>::type::T* out, const typename A::T* a,
                                                 const typename B::T* b, i64 n) {
  pdl_begin();
  typedef typename Promote<A, B>::type O;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    O::store(out, i, binop<OP>(A::load(a, i), B::load(b, i)));
}

// out[i] = a[sa(i)] op b[sb(i)] with broadcasting strides: p.ss are a's strides and p.ds
// b's strides over the output's dims (0 where an operand broadcasts).
template <class A, class B, int OP>
__device__ __forceinline__ void binary_bcast_impl(typename Promote<A, B>::type::T* out, const typename A::T* a,
                                                  const typename B::T* b, Strided p) {
  pdl_begin();
  typedef typename Promote<A, B>::type O;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += (i64)gridDim.x * blockDim.x) {
    i64 oa, ob;
    strided_offsets(p, i, &oa, &ob);
    O::store(out, i, binop<OP>(A::load(a, oa), B::load(b, ob)));
  }
}

#define BINARY(OPNAME, OP, SUF, A, B)                                                                                \
  extern "C" __global__ void OPNAME##_flat_##SUF(Promote<A, B>::type::T* out, const A::T* a, const B::T* b, i64 n) { \
    binary_flat_impl<A, B, OP>(out, a, b, n);                                                                        \
  }                                                                                                                  \
  extern "C" __global__ void OPNAME##_bcast_##SUF(Promote<A, B>::type::T* out, const A::T* a, const B::T* b,         \
                                                  Strided p) {                                                       \
    binary_bcast_impl<A, B, OP>(out, a, b, p);                                                                       \
  }
BINARY(add, OP_ADD, f32_f32, F32, F32)
BINARY(add, OP_ADD, f32_bf16, F32, BF16)
BINARY(add, OP_ADD, bf16_f32, BF16, F32)
BINARY(add, OP_ADD, bf16_bf16, BF16, BF16)
BINARY(mul, OP_MUL, f32_f32, F32, F32)
BINARY(mul, OP_MUL, f32_bf16, F32, BF16)
BINARY(mul, OP_MUL, bf16_f32, BF16, F32)
BINARY(mul, OP_MUL, bf16_bf16, BF16, BF16)

// swiglu: out = round_g(silu(g)) * u, silu(x) = x / (1 + exp(-x)).
template <class G, class U>
__device__ __forceinline__ void swiglu_impl(typename Promote<G, U>::type::T* out, const typename G::T* g,
                                            const typename U::T* u, i64 n) {
  pdl_begin();
  typedef typename Promote<G, U>::type O;
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    float x = G::load(g, i);
    float s = G::round(x / (1.0f + expf(-x)));
    O::store(out, i, s * U::load(u, i));
  }
}

#define SWIGLU(NAME, G, U)                                                                                           \
  extern "C" __global__ void NAME(Promote<G, U>::type::T* out, const G::T* g, const U::T* u, i64 n) {                \
    swiglu_impl<G, U>(out, g, u, n);                                                                                 \
  }
SWIGLU(swiglu_f32_f32, F32, F32)
SWIGLU(swiglu_f32_bf16, F32, BF16)
SWIGLU(swiglu_bf16_f32, BF16, F32)
SWIGLU(swiglu_bf16_bf16, BF16, BF16)

// Strided copy converting between float dtypes.
template <class S, class D>
__device__ __forceinline__ void cast_impl(typename D::T* dst, const typename S::T* src, Strided p) {
  pdl_begin();
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += (i64)gridDim.x * blockDim.x) {
    i64 so, dof;
    strided_offsets(p, i, &so, &dof);
    D::store(dst, dof, S::load(src, so));
  }
}

#define CAST(NAME, S, D)                                                                                             \
  extern "C" __global__ void NAME(D::T* dst, const S::T* src, Strided p) { cast_impl<S, D>(dst, src, p); }
CAST(cast_f32_f32, F32, F32)
CAST(cast_f32_bf16, F32, BF16)
CAST(cast_bf16_f32, BF16, F32)
CAST(cast_bf16_bf16, BF16, BF16)

// Strided copy of raw elements of 1, 2, 4 or 8 bytes (any dtype of that size).
template <class E>
__device__ __forceinline__ void copy_impl(E* dst, const E* src, Strided p) {
  pdl_begin();
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += (i64)gridDim.x * blockDim.x) {
    i64 so, dof;
    strided_offsets(p, i, &so, &dof);
    dst[dof] = src[so];
  }
}

extern "C" __global__ void copy_b1(unsigned char* dst, const unsigned char* src, Strided p) { copy_impl(dst, src, p); }
extern "C" __global__ void copy_b2(unsigned short* dst, const unsigned short* src, Strided p) { copy_impl(dst, src, p); }
extern "C" __global__ void copy_b4(unsigned int* dst, const unsigned int* src, Strided p) { copy_impl(dst, src, p); }
extern "C" __global__ void copy_b8(unsigned long long* dst, const unsigned long long* src, Strided p) { copy_impl(dst, src, p); }
extern "C" __global__ void copy_b16(uint4* dst, const uint4* src, Strided p) { copy_impl(dst, src, p); }

// The 32-bit forms of the strided copies (Strided32: the host checks that counts and
// offsets fit). The host also folds a row that is contiguous in both operands into vectors
// of up to 16 bytes where the row's length, offsets and strides allow, so that a copy_b2
// of rows of 128 bf16 runs as copy32_b16. Each thread moves up to COPY_UNROLL elements,
// all loads before the stores; the grid is at most what one pass of that needs.
#define COPY_UNROLL 4

template <class E>
__device__ __forceinline__ void copy32_impl(E* dst, const E* src, const Strided32& p) {
  pdl_begin();
  const unsigned step = gridDim.x * blockDim.x;
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += COPY_UNROLL * step) {
    E v[COPY_UNROLL];
    unsigned dof[COPY_UNROLL];
#pragma unroll
    for (int u = 0; u < COPY_UNROLL; ++u) {
      const unsigned j = i + u * step;
      if (j < p.n) {
        unsigned so;
        strided_offsets32(p, j, &so, &dof[u]);
        v[u] = src[so];
      }
    }
#pragma unroll
    for (int u = 0; u < COPY_UNROLL; ++u)
      if (i + u * step < p.n) dst[dof[u]] = v[u];
  }
}

extern "C" __global__ void copy32_b1(unsigned char* dst, const unsigned char* src, Strided32 p) { copy32_impl(dst, src, p); }
extern "C" __global__ void copy32_b2(unsigned short* dst, const unsigned short* src, Strided32 p) { copy32_impl(dst, src, p); }
extern "C" __global__ void copy32_b4(unsigned int* dst, const unsigned int* src, Strided32 p) { copy32_impl(dst, src, p); }
extern "C" __global__ void copy32_b8(uint2* dst, const uint2* src, Strided32 p) { copy32_impl(dst, src, p); }
extern "C" __global__ void copy32_b16(uint4* dst, const uint4* src, Strided32 p) { copy32_impl(dst, src, p); }

// cast32: the 32-bit cast, V elements (one vector of each operand) per index of the walk,
// whose strides and offsets the host gives in units of V elements.
template <class S, class D, int V>
__device__ __forceinline__ void cast32_impl(typename D::T* dst, const typename S::T* src, const Strided32& p) {
  pdl_begin();
  const unsigned step = gridDim.x * blockDim.x;
  for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < p.n; i += COPY_UNROLL * step) {
    float v[COPY_UNROLL][V];
    unsigned dof[COPY_UNROLL];
#pragma unroll
    for (int u = 0; u < COPY_UNROLL; ++u) {
      const unsigned j = i + u * step;
      if (j < p.n) {
        unsigned so;
        strided_offsets32(p, j, &so, &dof[u]);
        vload<S, V>(src + (size_t)so * V, v[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < COPY_UNROLL; ++u)
      if (i + u * step < p.n) vstore<D, V>(dst + (size_t)dof[u] * V, v[u]);
  }
}

#define CAST32(SN, DN, S, D, V)                                                                                      \
  extern "C" __global__ void cast32_##SN##_##DN##_v##V(D::T* dst, const S::T* src, Strided32 p) {                    \
    cast32_impl<S, D, V>(dst, src, p);                                                                               \
  }
#define CAST32_ALL(SN, DN, S, D) CAST32(SN, DN, S, D, 1) CAST32(SN, DN, S, D, 2) CAST32(SN, DN, S, D, 4)
CAST32_ALL(f32, f32, F32, F32)
CAST32_ALL(f32, bf16, F32, BF16)
CAST32_ALL(bf16, f32, BF16, F32)
CAST32_ALL(bf16, bf16, BF16, BF16)
