// Embedding lookup: out[row, :] = table[ids[row], :], converted to the output's dtype. One
// block per id. An id outside [0, V) writes a zero row and records itself in err[0..3]
// (flag, id, position, V) for the host to report.

template <class T, class O, class I>
__device__ __forceinline__ void embedding_impl(typename O::T* out, const typename T::T* table, const I* ids, int V, int D, int* err) {
  pdl_begin();
  i64 row = blockIdx.x;
  i64 id = (i64)ids[row];
  i64 dst = row * D;
  if (id < 0 || id >= V) {
    if (threadIdx.x == 0 && atomicCAS(err, 0, 1) == 0) {
      err[1] = (int)id;
      err[2] = (int)row;
      err[3] = V;
    }
    for (int d = threadIdx.x; d < D; d += blockDim.x) O::store(out, dst + d, 0.0f);
    return;
  }
  i64 src = id * D;
  for (int d = threadIdx.x; d < D; d += blockDim.x) O::store(out, dst + d, T::load(table, src + d));
}

#define EMBEDDING(NAME, TAB, OUT, ID)                                                                                \
  extern "C" __global__ void NAME(OUT::T* out, const TAB::T* table, const ID* ids, int V, int D, int* err) {         \
    embedding_impl<TAB, OUT, ID>(out, table, ids, V, D, err);                                                        \
  }
EMBEDDING(embedding_f32_f32_i32, F32, F32, int)
EMBEDDING(embedding_f32_f32_i64, F32, F32, i64)
EMBEDDING(embedding_bf16_bf16_i32, BF16, BF16, int)
EMBEDDING(embedding_bf16_bf16_i64, BF16, BF16, i64)
EMBEDDING(embedding_bf16_f32_i32, BF16, F32, int)
EMBEDDING(embedding_bf16_f32_i64, BF16, F32, i64)
EMBEDDING(embedding_f32_bf16_i32, F32, BF16, int)
EMBEDDING(embedding_f32_bf16_i64, F32, BF16, i64)
