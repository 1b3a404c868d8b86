package cubind

import (
	"math"
	"math/rand/v2"
	"testing"
	"unsafe"

	"github.com/loom-ml/loom/internal/gputest"
)

// TestLtStructLayout checks the Go mirrors of cuBLASLt's structs against the C layout of
// cublasLt.h (no GPU needed): cublasLtMatmulAlgo_t is uint64_t data[8]; the heuristic
// result is that algo, size_t workspaceSize, cublasStatus_t state, float wavesCount and
// int reserved[4].
func TestLtStructLayout(t *testing.T) {
	var r MatmulHeuristicResult
	ptr := unsafe.Sizeof(uintptr(0))
	for _, tc := range []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(cublasLtMatmulAlgo_t)", unsafe.Sizeof(MatmulAlgo{}), 64},
		{"alignof(cublasLtMatmulAlgo_t)", unsafe.Alignof(MatmulAlgo{}), 8},
		{"offsetof(algo)", unsafe.Offsetof(r.Algo), 0},
		{"offsetof(workspaceSize)", unsafe.Offsetof(r.WorkspaceSize), 64},
		{"sizeof(workspaceSize)", unsafe.Sizeof(r.WorkspaceSize), ptr},
		{"offsetof(state)", unsafe.Offsetof(r.State), 64 + ptr},
		{"offsetof(wavesCount)", unsafe.Offsetof(r.WavesCount), 68 + ptr},
		{"offsetof(reserved)", unsafe.Offsetof(r.Reserved), 72 + ptr},
		{"sizeof(reserved)", unsafe.Sizeof(r.Reserved), 16},
		{"sizeof(cublasLtMatmulHeuristicResult_t)", unsafe.Sizeof(r), 88 + ptr},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %d, want %d", tc.what, tc.got, tc.want)
		}
	}
	if ptr == 8 && unsafe.Sizeof(r) != 96 {
		t.Errorf("sizeof(cublasLtMatmulHeuristicResult_t) = %d on a 64-bit system, want 96", unsafe.Sizeof(r))
	}
}

// TestLtEnums checks the enum values against cublasLt.h and library_types.h.
func TestLtEnums(t *testing.T) {
	for _, tc := range []struct {
		name      string
		got, want int64
	}{
		{"CUBLASLT_MATMUL_DESC_COMPUTE_TYPE", int64(MatmulDescComputeType), 0},
		{"CUBLASLT_MATMUL_DESC_SCALE_TYPE", int64(MatmulDescScaleType), 1},
		{"CUBLASLT_MATMUL_DESC_POINTER_MODE", int64(MatmulDescPointerMode), 2},
		{"CUBLASLT_MATMUL_DESC_TRANSA", int64(MatmulDescTransA), 3},
		{"CUBLASLT_MATMUL_DESC_TRANSB", int64(MatmulDescTransB), 4},
		{"CUBLASLT_MATMUL_PREF_SEARCH_MODE", int64(MatmulPrefSearchMode), 0},
		{"CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES", int64(MatmulPrefMaxWorkspaceBytes), 1},
		{"CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK", int64(MatmulPrefReductionScheme), 3},
		{"CUBLASLT_REDUCTION_SCHEME_NONE", int64(ReductionNone), 0},
		{"CUBLASLT_REDUCTION_SCHEME_INPLACE", int64(ReductionInPlace), 1},
		{"CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE", int64(ReductionComputeType), 2},
		{"CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE", int64(ReductionOutputType), 4},
		{"CUBLASLT_REDUCTION_SCHEME_MASK", int64(ReductionMask), 7},
		{"CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES", int64(MatmulPrefMinAlignmentA), 5},
		{"CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES", int64(MatmulPrefMinAlignmentB), 6},
		{"CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES", int64(MatmulPrefMinAlignmentC), 7},
		{"CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES", int64(MatmulPrefMinAlignmentD), 8},
		{"CUBLAS_COMPUTE_32F", int64(Compute32F), 68},
		{"CUDA_R_32F", int64(R32F), 0},
		{"CUDA_R_16BF", int64(R16BF), 14},
		{"CUBLAS_OP_N", int64(OpN), 0},
		{"CUBLAS_OP_T", int64(OpT), 1},
		{"CUBLAS_STATUS_NOT_SUPPORTED", cublasStatusNotSupported, 15},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %d, want %d", tc.name, tc.got, tc.want)
		}
	}
}

// TestLtMatmul runs an f32 product through every algorithm the heuristic proposes and
// checks each against the host (needs a GPU).
func TestLtMatmul(t *testing.T) {
	withGPU(t)
	gputest.Missing(t, "cuBLASLt", LtAvailable())
	lt, err := NewLt()
	if err != nil {
		t.Fatal(err)
	}
	defer lt.Destroy()
	s, err := StreamCreate(StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	// out[M,N] = x[M,K]·w[N,K]ᵀ, row-major: column-major outᵀ = op(A)·B with A = w viewed as
	// K×N (transposed) and B = x viewed as K×M.
	const M, N, K = 5, 37, 70
	rng := rand.New(rand.NewPCG(3, 3))
	x, w := make([]float32, M*K), make([]float32, N*K)
	for i := range x {
		x[i] = float32(rng.Float64()*2 - 1)
	}
	for i := range w {
		w[i] = float32(rng.Float64()*2 - 1)
	}
	const wsBytes = 4 << 20
	var ptrs [4]DevicePtr
	for i, n := range []uint64{4 * M * K, 4 * N * K, 4 * M * N, wsBytes} {
		if ptrs[i], err = MemAlloc(n); err != nil {
			t.Fatal(err)
		}
		defer MemFree(ptrs[i])
	}
	dx, dw, dout, ws := ptrs[0], ptrs[1], ptrs[2], ptrs[3]
	if err := MemcpyHtoDAsync(dx, x, s); err != nil {
		t.Fatal(err)
	}
	if err := MemcpyHtoDAsync(dw, w, s); err != nil {
		t.Fatal(err)
	}
	desc, err := NewMatmulDesc(Compute32F, R32F)
	if err != nil {
		t.Fatal(err)
	}
	defer desc.Destroy()
	if err := desc.SetTranspose(OpT, OpN); err != nil {
		t.Fatal(err)
	}
	a, err := NewMatrixLayout(R32F, K, N, K)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Destroy()
	b, err := NewMatrixLayout(R32F, K, M, K)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Destroy()
	c, err := NewMatrixLayout(R32F, N, M, N)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Destroy()
	pref, err := NewMatmulPreference()
	if err != nil {
		t.Fatal(err)
	}
	defer pref.Destroy()
	if err := pref.SetMaxWorkspace(wsBytes); err != nil {
		t.Fatal(err)
	}
	if err := pref.SetMinAlignment(256); err != nil {
		t.Fatal(err)
	}
	algos, err := lt.AlgoGetHeuristic(desc, a, b, c, c, pref, 8)
	if err != nil {
		t.Fatal(err)
	}
	if len(algos) == 0 {
		t.Fatal("the heuristic proposes no algorithm for an f32 product")
	}
	got := make([]float32, M*N)
	for i, r := range algos {
		if err := MemsetD32Async(dout, 0x7fc00000, M*N, s); err != nil { // NaN
			t.Fatal(err)
		}
		if err := lt.Matmul(desc, 1, dw, a, dx, b, 0, dout, c, dout, c, &r.Algo, ws, wsBytes, s); err != nil {
			t.Fatalf("algorithm %d (workspace %d, waves %.2f): %v", i, r.WorkspaceSize, r.WavesCount, err)
		}
		if err := MemcpyDtoHAsync(got, dout, s); err != nil {
			t.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
		for m := range M {
			for n := range N {
				want, mag := 0.0, 0.0
				for k := range K {
					p := float64(x[m*K+k]) * float64(w[n*K+k])
					want += p
					mag += math.Abs(p)
				}
				// TF32 is not allowed by Compute32F: f32 products, f32 sums.
				if e := math.Abs(float64(got[m*N+n]) - want); !(e <= 1e-5*mag) {
					t.Fatalf("algorithm %d: out[%d,%d] = %v, want %v", i, m, n, got[m*N+n], want)
				}
			}
		}
	}
	t.Logf("%d algorithms checked", len(algos))
}
