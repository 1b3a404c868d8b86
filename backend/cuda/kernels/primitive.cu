// Primitive kernels: the primitive ops of the graph catalog that the fused kernels leave
// out (unary math, arithmetic and comparisons on any dtype, logic, where, casts between any
// dtypes, reductions, softmax, batched matmul, iota, topk), so that a fused op without a CUDA
// kernel of its own runs on the GPU as its decomposition (see expand.go). They compute as
// the CPU backend's reference kernels do (backend/cpu: elementwise.go, reduce.go, nn.go),
// widening and rounding in the same places and summing in the same order, so that results
// match them bit for bit except where a math function is called (exp, log, sin, tanh,
// pow, ...: double precision here and in Go, which may differ in a last bit before the
// rounding to f32). They are written for coverage, not speed: dtypes are read and written
// through a code known at run time, one thread computes one output element (a reduction,
// a softmax row or a dot product in sequence), and there is no PDL (the file is not in
// pdlFiles).

// Dtype codes (dtCode in primitive.go).
#define DT_F32 0
#define DT_BF16 1
#define DT_I32 2
#define DT_I64 3
#define DT_BOOL 4

__device__ __forceinline__ bool dt_float(int dt) { return dt == DT_F32 || dt == DT_BF16; }

// ld_at is package tensor's At: the element widened to double (bools as 0 and 1).
__device__ __forceinline__ double ld_at(const void* p, int dt, i64 i) {
  switch (dt) {
    case DT_F32:
      return (double)((const float*)p)[i];
    case DT_BF16:
      return (double)bf16_to_f32(((const bf16*)p)[i]);
    case DT_I32:
      return (double)((const int*)p)[i];
    case DT_I64:
      return (double)((const i64*)p)[i];
  }
  return ((const unsigned char*)p)[i] ? 1.0 : 0.0;
}

// ld_f32 is tensor's Float32s: float32(At(i)).
__device__ __forceinline__ float ld_f32(const void* p, int dt, i64 i) {
  if (dt == DT_F32) return ((const float*)p)[i];
  return (float)ld_at(p, dt, i);
}

// ld_f64 is backend/cpu's float64s: i64 widened to double, everything else through f32.
__device__ __forceinline__ double ld_f64(const void* p, int dt, i64 i) {
  if (dt == DT_I64) return (double)((const i64*)p)[i];
  return (double)ld_f32(p, dt, i);
}

// ld_i64 is tensor's Int64s: integers exactly, bools as 0 and 1, floats truncated.
__device__ __forceinline__ i64 ld_i64(const void* p, int dt, i64 i) {
  switch (dt) {
    case DT_I32:
      return (i64)((const int*)p)[i];
    case DT_I64:
      return ((const i64*)p)[i];
    case DT_BOOL:
      return ((const unsigned char*)p)[i] ? 1 : 0;
  }
  return (i64)ld_at(p, dt, i);
}

// st_f32 stores a float result as backend/cpu's fromF32 does (tensor.Cast from f32): bf16
// rounds to nearest even, integers truncate toward zero, bool is v != 0.
__device__ __forceinline__ void st_f32(void* p, int dt, i64 i, float v) {
  switch (dt) {
    case DT_F32:
      ((float*)p)[i] = v;
      return;
    case DT_BF16:
      ((bf16*)p)[i] = f32_to_bf16(v);
      return;
    case DT_I32:
      ((int*)p)[i] = (int)(double)v;
      return;
    case DT_I64:
      ((i64*)p)[i] = (i64)(double)v;
      return;
  }
  ((unsigned char*)p)[i] = v != 0.0f;
}

// st_i64 stores an integer result as backend/cpu's fromI64 does: i32 keeps the low 32 bits,
// bool is v != 0, floats take float32(v).
__device__ __forceinline__ void st_i64(void* p, int dt, i64 i, i64 v) {
  switch (dt) {
    case DT_I32:
      ((int*)p)[i] = (int)(unsigned int)(unsigned long long)v;
      return;
    case DT_I64:
      ((i64*)p)[i] = v;
      return;
    case DT_BOOL:
      ((unsigned char*)p)[i] = v != 0;
      return;
  }
  st_f32(p, dt, i, (float)v);
}

// st_f64 stores a double result as backend/cpu's fromF64 does: floats through float32(v),
// bool is v != 0, integers truncate toward zero.
__device__ __forceinline__ void st_f64(void* p, int dt, i64 i, double v) {
  if (dt_float(dt)) {
    st_f32(p, dt, i, (float)v);
  } else if (dt == DT_BOOL) {
    ((unsigned char*)p)[i] = v != 0.0;
  } else {
    st_i64(p, dt, i, (i64)v);
  }
}

// Go's max and min of floats: NaN wins, and max(-0, +0) = +0, min(-0, +0) = -0.
__device__ __forceinline__ float go_maxf(float a, float b) {
  if (a != a) return a;
  if (b != b) return b;
  if (a == b) return signbit(a) ? b : a;
  return a > b ? a : b;
}

__device__ __forceinline__ float go_minf(float a, float b) {
  if (a != a) return a;
  if (b != b) return b;
  if (a == b) return signbit(a) ? a : b;
  return a < b ? a : b;
}

__device__ __forceinline__ double go_max(double a, double b) {
  if (a != a) return a;
  if (b != b) return b;
  if (a == b) return signbit(a) ? b : a;
  return a > b ? a : b;
}

#define NEG_INF_D __longlong_as_double(0xfff0000000000000ULL)
#define I64_MIN ((i64)0x8000000000000000ULL)

// wrapping integer arithmetic, as Go's int64
__device__ __forceinline__ i64 wadd(i64 a, i64 b) { return (i64)((unsigned long long)a + (unsigned long long)b); }
__device__ __forceinline__ i64 wsub(i64 a, i64 b) { return (i64)((unsigned long long)a - (unsigned long long)b); }
__device__ __forceinline__ i64 wmul(i64 a, i64 b) { return (i64)((unsigned long long)a * (unsigned long long)b); }

// Bcast is the iteration space of an elementwise kernel: the output's dimensions (row-major;
// the output is contiguous) and, per input, the element strides it is read at (0 along the
// dimensions it broadcasts). Written by bcastWalk (primitive.go).
struct Bcast {
  i64 dims[MAX_RANK];
  i64 st[3][MAX_RANK];
  i64 n;
  i64 rank;
};

__device__ __forceinline__ void bcast_offsets(const Bcast& p, i64 i, i64* off) {
  off[0] = off[1] = off[2] = 0;
#pragma unroll
  for (int r = MAX_RANK - 1; r >= 0; --r) {
    if (r < p.rank) {
      const i64 idx = i % p.dims[r];
      i /= p.dims[r];
      off[0] += idx * p.st[0][r];
      off[1] += idx * p.st[1][r];
      off[2] += idx * p.st[2][r];
    }
  }
}

#define GRID_STRIDE(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

// Unary ops (unaryCodes in primitive.go). The float functions are computed in double from
// the f32-widened input and rounded to f32, as backend/cpu's unaryFloat; neg and abs in f32
// for floats and in wrapping int64 for integers.
#define U_EXP 0
#define U_LOG 1
#define U_SQRT 2
#define U_RSQRT 3
#define U_RECIP 4
#define U_SIN 5
#define U_COS 6
#define U_TANH 7
#define U_SIGMOID 8
#define U_SILU 9
#define U_NEG 10
#define U_ABS 11

__device__ __forceinline__ double unary_f(int op, double x) {
  switch (op) {
    case U_EXP:
      return exp(x);
    case U_LOG:
      return log(x);
    case U_SQRT:
      return sqrt(x);
    case U_RSQRT:
      return 1.0 / sqrt(x);
    case U_RECIP:
      return 1.0 / x;
    case U_SIN:
      return sin(x);
    case U_COS:
      return cos(x);
    case U_TANH:
      return tanh(x);
    case U_SIGMOID:
      return 1.0 / (1.0 + exp(-x));
  }
  return x / (1.0 + exp(-x));  // U_SILU
}

extern "C" __global__ void prim_unary(void* out, int odt, const void* x, int xdt, int op, i64 n) {
  GRID_STRIDE(i, n) {
    if (op == U_NEG || op == U_ABS) {
      if (dt_float(odt)) {
        const float v = ld_f32(x, xdt, i);
        st_f32(out, odt, i, op == U_NEG ? -v : fabsf(v));
      } else {
        i64 v = ld_i64(x, xdt, i);
        if (op == U_NEG || v < 0) v = wsub(0, v);
        st_i64(out, odt, i, v);
      }
    } else {
      st_f32(out, odt, i, (float)unary_f(op, (double)ld_f32(x, xdt, i)));
    }
  }
}

// Binary arithmetic (binaryCodes in primitive.go), broadcasting: in f32 when the output is a
// float, else in wrapping int64 (div and pow of integers are refused by the host).
#define B_ADD 0
#define B_SUB 1
#define B_MUL 2
#define B_DIV 3
#define B_POW 4
#define B_MAX 5
#define B_MIN 6

extern "C" __global__ void prim_binary(void* out, int odt, const void* a, int adt, const void* b, int bdt, int op, Bcast p) {
  GRID_STRIDE(i, p.n) {
    i64 off[3];
    bcast_offsets(p, i, off);
    if (dt_float(odt)) {
      const float x = ld_f32(a, adt, off[0]), y = ld_f32(b, bdt, off[1]);
      float r;
      switch (op) {
        case B_ADD:
          r = x + y;
          break;
        case B_SUB:
          r = x - y;
          break;
        case B_MUL:
          r = x * y;
          break;
        case B_DIV:
          r = x / y;
          break;
        case B_POW:
          // x^2 exactly (the product of two floats is exact in double), as math.Pow gives it.
          r = y == 2.0f ? (float)((double)x * (double)x) : (float)pow((double)x, (double)y);
          break;
        case B_MAX:
          r = go_maxf(x, y);
          break;
        default:
          r = go_minf(x, y);
      }
      st_f32(out, odt, i, r);
    } else {
      const i64 x = ld_i64(a, adt, off[0]), y = ld_i64(b, bdt, off[1]);
      i64 r;
      switch (op) {
        case B_ADD:
          r = wadd(x, y);
          break;
        case B_SUB:
          r = wsub(x, y);
          break;
        case B_MUL:
          r = wmul(x, y);
          break;
        case B_MAX:
          r = x > y ? x : y;
          break;
        default:
          r = x < y ? x : y;
      }
      st_i64(out, odt, i, r);
    }
  }
}

// Comparisons (compareCodes in primitive.go) to bool, broadcasting: as doubles (exact for
// every stored float) when either side is a float, else as int64. NaN compares unequal and
// unordered.
#define C_EQ 0
#define C_NE 1
#define C_LT 2
#define C_LE 3
#define C_GT 4
#define C_GE 5

extern "C" __global__ void prim_compare(unsigned char* out, const void* a, int adt, const void* b, int bdt, int op, int as_float, Bcast p) {
  GRID_STRIDE(i, p.n) {
    i64 off[3];
    bcast_offsets(p, i, off);
    int c;  // the sign of a - b; 2 when unordered
    if (as_float) {
      const double x = ld_f64(a, adt, off[0]), y = ld_f64(b, bdt, off[1]);
      c = x < y ? -1 : x > y ? 1 : x == y ? 0 : 2;
    } else {
      const i64 x = ld_i64(a, adt, off[0]), y = ld_i64(b, bdt, off[1]);
      c = x < y ? -1 : x > y ? 1 : 0;
    }
    bool r;
    switch (op) {
      case C_EQ:
        r = c == 0;
        break;
      case C_NE:
        r = c != 0;
        break;
      case C_LT:
        r = c == -1;
        break;
      case C_LE:
        r = c == -1 || c == 0;
        break;
      case C_GT:
        r = c == 1;
        break;
      default:
        r = c == 1 || c == 0;
    }
    out[i] = r;
  }
}

// logical_and, logical_or (broadcasting) and logical_not on bools.
#define L_AND 0
#define L_OR 1
#define L_NOT 2

extern "C" __global__ void prim_logical(unsigned char* out, const unsigned char* a, const unsigned char* b, int op, Bcast p) {
  GRID_STRIDE(i, p.n) {
    i64 off[3];
    bcast_offsets(p, i, off);
    const bool x = a[off[0]] != 0;
    bool r;
    if (op == L_NOT) {
      r = !x;
    } else {
      const bool y = b[off[1]] != 0;
      r = op == L_AND ? (x && y) : (x || y);
    }
    out[i] = r;
  }
}

// where(cond, a, b), broadcasting all three: the chosen value in f32 for a float output,
// else in int64.
extern "C" __global__ void prim_where(void* out, int odt, const unsigned char* c, const void* a, int adt, const void* b, int bdt, Bcast p) {
  GRID_STRIDE(i, p.n) {
    i64 off[3];
    bcast_offsets(p, i, off);
    const bool take = c[off[0]] != 0;
    if (dt_float(odt)) {
      st_f32(out, odt, i, take ? ld_f32(a, adt, off[1]) : ld_f32(b, bdt, off[2]));
    } else {
      st_i64(out, odt, i, take ? ld_i64(a, adt, off[1]) : ld_i64(b, bdt, off[2]));
    }
  }
}

// cast between any two dtypes, as tensor.Cast: floats from float32(At), integers from
// At truncated, bool from At != 0.
extern "C" __global__ void prim_cast(void* out, int odt, const void* x, int xdt, i64 n) {
  GRID_STRIDE(i, n) {
    const double v = ld_at(x, xdt, i);
    switch (odt) {
      case DT_F32:
        ((float*)out)[i] = (float)v;
        break;
      case DT_BF16:
        ((bf16*)out)[i] = f32_to_bf16((float)v);
        break;
      case DT_I32:
        ((int*)out)[i] = (int)v;
        break;
      case DT_I64:
        ((i64*)out)[i] = (i64)v;
        break;
      default:
        ((unsigned char*)out)[i] = v != 0.0;
    }
  }
}

// Reduce is the layout of a reduction over x: the kept dimensions (row-major: the output's
// order) and the reduced ones, each with x's element strides along them. Written by
// reducePrim (primitive.go).
struct Reduce {
  i64 kdims[MAX_RANK];
  i64 kst[MAX_RANK];
  i64 rdims[MAX_RANK];
  i64 rst[MAX_RANK];
  i64 nout;
  i64 count;
  i64 krank;
  i64 rrank;
};

__device__ __forceinline__ i64 unravel(i64 i, const i64* dims, const i64* st, i64 rank) {
  i64 off = 0;
#pragma unroll
  for (int r = MAX_RANK - 1; r >= 0; --r) {
    if (r < rank) {
      off += (i % dims[r]) * st[r];
      i /= dims[r];
    }
  }
  return off;
}

// Reductions (reduceCodes in primitive.go): one thread per output element, over the reduced
// elements in x's order, as backend/cpu's reduce: in double when x is a float or the op is
// mean, else in wrapping int64.
#define R_SUM 0
#define R_MEAN 1
#define R_MAX 2

extern "C" __global__ void prim_reduce(void* out, int odt, const void* x, int xdt, int op, int as_float, Reduce p) {
  GRID_STRIDE(o, p.nout) {
    const i64 base = unravel(o, p.kdims, p.kst, p.krank);
    if (as_float) {
      double acc = op == R_MAX ? NEG_INF_D : 0.0;
      for (i64 j = 0; j < p.count; ++j) {
        const double v = ld_f64(x, xdt, base + unravel(j, p.rdims, p.rst, p.rrank));
        acc = op == R_MAX ? go_max(acc, v) : acc + v;
      }
      if (op == R_MEAN) acc /= (double)p.count;
      st_f64(out, odt, o, acc);
    } else {
      i64 acc = op == R_MAX ? I64_MIN : 0;
      for (i64 j = 0; j < p.count; ++j) {
        const i64 v = ld_i64(x, xdt, base + unravel(j, p.rdims, p.rst, p.rrank));
        acc = op == R_MAX ? (v > acc ? v : acc) : wadd(acc, v);
      }
      st_i64(out, odt, o, acc);
    }
  }
}

// softmax along an axis of length L (x viewed as [outer, L, inner]): one thread per row, in
// double as backend/cpu's softmax (the exponentials are computed twice instead of kept).
extern "C" __global__ void prim_softmax(void* out, int odt, const void* x, int xdt, i64 outer, i64 L, i64 inner) {
  GRID_STRIDE(r, outer * inner) {
    const i64 base = (r / inner) * L * inner + r % inner;
    double m = NEG_INF_D;
    for (i64 j = 0; j < L; ++j) m = go_max(m, (double)ld_f32(x, xdt, base + j * inner));
    double sum = 0.0;
    for (i64 j = 0; j < L; ++j) sum += exp((double)ld_f32(x, xdt, base + j * inner) - m);
    for (i64 j = 0; j < L; ++j) {
      const double e = exp((double)ld_f32(x, xdt, base + j * inner) - m);
      st_f32(out, odt, base + j * inner, (float)(e / sum));
    }
  }
}

// topk_greater orders floats as backend/cpu's topk does: NaN above every number (NaNs equal
// among themselves), otherwise a > b.
__device__ __forceinline__ bool topk_greater(float a, float b) {
  const bool an = a != a, bn = b != b;
  if (an || bn) return an && !bn;
  return a > b;
}

// topk_above reports whether element (a at index i) comes before (b at index j) in topk's
// order: larger first, equal values lowest index first.
__device__ __forceinline__ bool topk_above(float a, i64 i, float b, i64 j) {
  if (topk_greater(a, b)) return true;
  if (topk_greater(b, a)) return false;
  return i < j;
}

// topk: the k first entries of each row of x [rows, N] in topk_above's order, their values
// (copied: x's dtype, its bits) into vals [rows, k] and their indices into idx [rows, k]
// (i32), as backend/cpu's topk (a stable sort by value). One thread per row: pick j is the
// first element that comes after pick j-1, found in one pass over the row, so k passes and
// no scratch memory (k and N are small: a router's experts).
extern "C" __global__ void prim_topk(void* vals, int vdt, int* idx, const void* x, int xdt, i64 rows, i64 N, i64 k) {
  GRID_STRIDE(r, rows) {
    const i64 base = r * N;
    float pv = 0.0f;
    i64 pi = -1;
    for (i64 j = 0; j < k; ++j) {
      float bv = 0.0f;
      i64 best = -1;
      for (i64 i = 0; i < N; ++i) {
        const float v = ld_f32(x, xdt, base + i);
        if (pi >= 0 && !topk_above(pv, pi, v, i)) continue;  // at or before the previous pick
        if (best < 0 || topk_above(v, i, bv, best)) {
          best = i;
          bv = v;
        }
      }
      st_f32(vals, vdt, r * k + j, bv);
      idx[r * k + j] = (int)best;
      pv = bv;
      pi = best;
    }
  }
}

// Matmul is the layout of a batched matmul a[...,M,K] @ b[...,K,N]: the broadcast batch
// dimensions with a's and b's element strides along them. Written by matmulPrim.
struct Matmul {
  i64 bdims[MAX_RANK];
  i64 ast[MAX_RANK];
  i64 bst[MAX_RANK];
  i64 M, K, N, nbatch, brank;
};

// matmul: one thread per output element, the products summed over k in order, in f32 for a
// float output (no fused multiply-add: the file is compiled with --fmad=false) and in
// wrapping int64 otherwise, as backend/cpu's matmul.
extern "C" __global__ void prim_matmul(void* out, int odt, const void* a, int adt, const void* b, int bdt, Matmul p) {
  GRID_STRIDE(i, p.nbatch * p.M * p.N) {
    const i64 j = i % p.N, m = (i / p.N) % p.M;
    i64 bi = i / (p.M * p.N), ao = 0, bo = 0;
#pragma unroll
    for (int r = MAX_RANK - 1; r >= 0; --r) {
      if (r < p.brank) {
        const i64 idx = bi % p.bdims[r];
        bi /= p.bdims[r];
        ao += idx * p.ast[r];
        bo += idx * p.bst[r];
      }
    }
    ao += m * p.K;
    bo += j;
    if (dt_float(odt)) {
      float acc = 0.0f;
      for (i64 k = 0; k < p.K; ++k) acc += ld_f32(a, adt, ao + k) * ld_f32(b, bdt, bo + k * p.N);
      st_f32(out, odt, i, acc);
    } else {
      i64 acc = 0;
      for (i64 k = 0; k < p.K; ++k) acc = wadd(acc, wmul(ld_i64(a, adt, ao + k), ld_i64(b, bdt, bo + k * p.N)));
      st_i64(out, odt, i, acc);
    }
  }
}

// iota: out[i] = its index along an axis of size size whose elements lie stride apart.
extern "C" __global__ void prim_iota(void* out, int odt, i64 n, i64 stride, i64 size) {
  GRID_STRIDE(i, n) st_i64(out, odt, i, (i / stride) % size);
}
