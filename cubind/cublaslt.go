package cubind

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"
)

// cuBLASLt: the matmul API whose algorithms can be listed, timed and chosen one by one.
//
// A product D = alpha·op(A)·op(B) + beta·C is described by a MatmulDesc (compute and scale
// types, the transposes), a MatrixLayout per operand (element type, rows, columns, leading
// dimension, column-major), and a MatmulPreference that bounds the search (workspace,
// pointer alignment). Lt.AlgoGetHeuristic lists candidate algorithms, best guess first;
// Lt.Matmul runs one of them. A matmul with a fixed algorithm and a workspace given by the
// caller allocates nothing and can be captured into a CUDA graph.

// MatmulDescAttribute is a cublasLtMatmulDescAttributes_t.
type MatmulDescAttribute int32

// Matmul descriptor attributes (cublasLtMatmulDescAttributes_t values).
const (
	MatmulDescComputeType MatmulDescAttribute = 0  // CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, int32
	MatmulDescScaleType   MatmulDescAttribute = 1  // CUBLASLT_MATMUL_DESC_SCALE_TYPE, int32
	MatmulDescPointerMode MatmulDescAttribute = 2  // CUBLASLT_MATMUL_DESC_POINTER_MODE, int32
	MatmulDescTransA      MatmulDescAttribute = 3  // CUBLASLT_MATMUL_DESC_TRANSA, int32 (cublasOperation_t)
	MatmulDescTransB      MatmulDescAttribute = 4  // CUBLASLT_MATMUL_DESC_TRANSB, int32 (cublasOperation_t)
	MatmulDescAScalePtr   MatmulDescAttribute = 17 // CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, device pointer
	MatmulDescBScalePtr   MatmulDescAttribute = 18 // CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, device pointer
	MatmulDescAScaleMode  MatmulDescAttribute = 31 // CUBLASLT_MATMUL_DESC_A_SCALE_MODE, int32 (MatrixScale)
	MatmulDescBScaleMode  MatmulDescAttribute = 32 // CUBLASLT_MATMUL_DESC_B_SCALE_MODE, int32 (MatrixScale)
)

// MatrixScale is a cublasLtMatmulMatrixScale_t: what an FP8 operand's scale pointer holds.
// D = scaleA ⊙ scaleB ⊙ (op(A)·op(B)), op(A) being m×k and op(B) k×n.
type MatrixScale int32

// Scale modes (cublasLtMatmulMatrixScale_t values).
const (
	ScaleScalar32F      MatrixScale = 0 // CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F: one f32 for the matrix
	ScaleOuterVec32F    MatrixScale = 3 // CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: f32 per row of op(A) (m) or per column of op(B) (n)
	ScaleVec128_32F     MatrixScale = 4 // CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: f32 per 128 consecutive k of a row or column
	ScaleBlk128x128_32F MatrixScale = 5 // CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: f32 per 128x128 block
)

// MatmulPreferenceAttribute is a cublasLtMatmulPreferenceAttributes_t.
type MatmulPreferenceAttribute int32

// Matmul preference attributes (cublasLtMatmulPreferenceAttributes_t values).
const (
	MatmulPrefSearchMode        MatmulPreferenceAttribute = 0 // CUBLASLT_MATMUL_PREF_SEARCH_MODE, uint32
	MatmulPrefMaxWorkspaceBytes MatmulPreferenceAttribute = 1 // CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64
	MatmulPrefReductionScheme   MatmulPreferenceAttribute = 3 // CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, uint32
	MatmulPrefMinAlignmentA     MatmulPreferenceAttribute = 5 // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32
	MatmulPrefMinAlignmentB     MatmulPreferenceAttribute = 6 // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, uint32
	MatmulPrefMinAlignmentC     MatmulPreferenceAttribute = 7 // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, uint32
	MatmulPrefMinAlignmentD     MatmulPreferenceAttribute = 8 // CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, uint32
)

// ReductionScheme is a cublasLtReductionScheme_t: how a split-K algorithm adds the partial
// products of its slices of K. Algorithms that do not split K (scheme none) pass every
// mask.
type ReductionScheme uint32

// Reduction schemes (cublasLtReductionScheme_t values), combined as a mask by
// MatmulPreference.SetReductionSchemes.
const (
	ReductionNone        ReductionScheme = 0 // CUBLASLT_REDUCTION_SCHEME_NONE: K is not split
	ReductionInPlace     ReductionScheme = 1 // CUBLASLT_REDUCTION_SCHEME_INPLACE: summed in the output (its type)
	ReductionComputeType ReductionScheme = 2 // CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE: partials in the compute type
	ReductionOutputType  ReductionScheme = 4 // CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE: partials in the output type
	ReductionMask        ReductionScheme = 7 // CUBLASLT_REDUCTION_SCHEME_MASK: all of them (the default)
)

// MatmulAlgo is a cublasLtMatmulAlgo_t: an opaque, copyable description of one algorithm
// and its configuration, valid with the cuBLASLt library that produced it.
type MatmulAlgo struct {
	Data [8]uint64
}

// MatmulHeuristicResult is a cublasLtMatmulHeuristicResult_t: one algorithm the heuristic
// proposes. Its fields mirror the C struct exactly (96 bytes on 64-bit systems).
type MatmulHeuristicResult struct {
	Algo          MatmulAlgo // the algorithm, to pass to Matmul
	WorkspaceSize uintptr    // size_t: the workspace it needs, in bytes
	State         int32      // cublasStatus_t: the other fields are valid only when 0
	WavesCount    float32    // device utilisation: 1.0 fills every SM once
	Reserved      [4]int32
}

var (
	fnLtCreate                  func(h *uintptr) int32
	fnLtDestroy                 func(h uintptr) int32
	fnLtMatmulDescCreate        func(d *uintptr, compute int32, scale int32) int32
	fnLtMatmulDescDestroy       func(d uintptr) int32
	fnLtMatmulDescSetAttribute  func(d uintptr, attr int32, buf unsafe.Pointer, n uintptr) int32
	fnLtMatrixLayoutCreate      func(l *uintptr, typ int32, rows, cols uint64, ld int64) int32
	fnLtMatrixLayoutDestroy     func(l uintptr) int32
	fnLtMatmulPreferenceCreate  func(p *uintptr) int32
	fnLtMatmulPreferenceDestroy func(p uintptr) int32
	fnLtMatmulPreferenceSetAttr func(p uintptr, attr int32, buf unsafe.Pointer, n uintptr) int32
	fnLtMatmulAlgoGetHeuristic  func(h, desc, a, b, c, d, pref uintptr, requested int32, results unsafe.Pointer, returned *int32) int32
	fnLtMatmul                  func(h, desc uintptr, alpha unsafe.Pointer, a uint64, adesc uintptr, b uint64, bdesc uintptr, beta unsafe.Pointer, c uint64, cdesc uintptr, d uint64, ddesc uintptr, algo unsafe.Pointer, ws uint64, wsSize uintptr, s uintptr) int32
	// ltErrLoad says which cuBLASLt symbols the opened library lacks (set by bindLt).
	ltErrLoad error
)

// bindLt binds the cuBLASLt matmul API from the opened library lt (called by loadCublas).
// A library that lacks a symbol leaves cuBLASLt unavailable (LtAvailable says why); cuBLAS
// itself does not need it.
func bindLt(lt *Library) {
	b := &binder{lib: lt}
	b.bind(&fnLtCreate, "cublasLtCreate")
	b.bind(&fnLtDestroy, "cublasLtDestroy")
	b.bind(&fnLtMatmulDescCreate, "cublasLtMatmulDescCreate")
	b.bind(&fnLtMatmulDescDestroy, "cublasLtMatmulDescDestroy")
	b.bind(&fnLtMatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute")
	b.bind(&fnLtMatrixLayoutCreate, "cublasLtMatrixLayoutCreate")
	b.bind(&fnLtMatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy")
	b.bind(&fnLtMatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate")
	b.bind(&fnLtMatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy")
	b.bind(&fnLtMatmulPreferenceSetAttr, "cublasLtMatmulPreferenceSetAttribute")
	b.bind(&fnLtMatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic")
	b.bind(&fnLtMatmul, "cublasLtMatmul")
	ltErrLoad = b.err()
}

// LtAvailable reports whether the cuBLASLt matmul API was loaded with cuBLAS.
func LtAvailable() error {
	if err := loadCublas(); err != nil {
		return err
	}
	if ltLib == nil {
		return errors.New("cubind: libcublasLt was not found beside libcublas")
	}
	return ltErrLoad
}

// Lt is a cuBLASLt handle. Its methods must run with the context current in which it was
// created; it is not safe for concurrent use.
type Lt struct {
	h uintptr
}

// NewLt creates a cuBLASLt handle in the current context.
func NewLt() (*Lt, error) {
	if err := LtAvailable(); err != nil {
		return nil, err
	}
	var h uintptr
	if err := cublasErr("cublasLtCreate", fnLtCreate(&h)); err != nil {
		return nil, err
	}
	return &Lt{h: h}, nil
}

// Destroy frees the handle.
func (l *Lt) Destroy() error {
	if l == nil || l.h == 0 {
		return nil
	}
	err := cublasErr("cublasLtDestroy", fnLtDestroy(l.h))
	l.h = 0
	return err
}

// MatmulDesc is a cublasLtMatmulDesc_t.
type MatmulDesc uintptr

// NewMatmulDesc creates a matmul descriptor accumulating in compute with alpha and beta
// of type scale (R32F for Compute32F).
func NewMatmulDesc(compute ComputeType, scale DataType) (MatmulDesc, error) {
	if err := LtAvailable(); err != nil {
		return 0, err
	}
	var d uintptr
	if err := cublasErr("cublasLtMatmulDescCreate", fnLtMatmulDescCreate(&d, int32(compute), int32(scale))); err != nil {
		return 0, err
	}
	return MatmulDesc(d), nil
}

// SetInt32 sets an int32 attribute of the descriptor.
func (d MatmulDesc) SetInt32(attr MatmulDescAttribute, v int32) error {
	rc := fnLtMatmulDescSetAttribute(uintptr(d), int32(attr), unsafe.Pointer(&v), unsafe.Sizeof(v))
	if err := cublasErr("cublasLtMatmulDescSetAttribute", rc); err != nil {
		return fmt.Errorf("attribute %d = %d: %w", attr, v, err)
	}
	return nil
}

// SetPointer sets a device-pointer attribute of the descriptor (MatmulDescAScalePtr,
// MatmulDescBScalePtr).
func (d MatmulDesc) SetPointer(attr MatmulDescAttribute, p DevicePtr) error {
	v := uint64(p)
	rc := fnLtMatmulDescSetAttribute(uintptr(d), int32(attr), unsafe.Pointer(&v), unsafe.Sizeof(v))
	if err := cublasErr("cublasLtMatmulDescSetAttribute", rc); err != nil {
		return fmt.Errorf("attribute %d = %#x: %w", attr, v, err)
	}
	return nil
}

// SetTranspose sets the operations applied to A and B (TRANSA and TRANSB).
func (d MatmulDesc) SetTranspose(a, b Operation) error {
	if err := d.SetInt32(MatmulDescTransA, int32(a)); err != nil {
		return err
	}
	return d.SetInt32(MatmulDescTransB, int32(b))
}

// Destroy frees the descriptor (no-op for 0).
func (d MatmulDesc) Destroy() error {
	if d == 0 {
		return nil
	}
	return cublasErr("cublasLtMatmulDescDestroy", fnLtMatmulDescDestroy(uintptr(d)))
}

// MatrixLayout is a cublasLtMatrixLayout_t: a column-major rows×cols matrix of element
// type typ whose columns are ld elements apart.
type MatrixLayout uintptr

// NewMatrixLayout creates a matrix layout.
func NewMatrixLayout(typ DataType, rows, cols uint64, ld int64) (MatrixLayout, error) {
	if err := LtAvailable(); err != nil {
		return 0, err
	}
	var l uintptr
	if err := cublasErr("cublasLtMatrixLayoutCreate", fnLtMatrixLayoutCreate(&l, int32(typ), rows, cols, ld)); err != nil {
		return 0, fmt.Errorf("%d×%d ld %d: %w", rows, cols, ld, err)
	}
	return MatrixLayout(l), nil
}

// Destroy frees the layout (no-op for 0).
func (l MatrixLayout) Destroy() error {
	if l == 0 {
		return nil
	}
	return cublasErr("cublasLtMatrixLayoutDestroy", fnLtMatrixLayoutDestroy(uintptr(l)))
}

// MatmulPreference is a cublasLtMatmulPreference_t: the bounds of a heuristic search.
type MatmulPreference uintptr

// NewMatmulPreference creates a preference with cuBLASLt's defaults (no workspace,
// operands aligned to 256 bytes).
func NewMatmulPreference() (MatmulPreference, error) {
	if err := LtAvailable(); err != nil {
		return 0, err
	}
	var p uintptr
	if err := cublasErr("cublasLtMatmulPreferenceCreate", fnLtMatmulPreferenceCreate(&p)); err != nil {
		return 0, err
	}
	return MatmulPreference(p), nil
}

func (p MatmulPreference) set(attr MatmulPreferenceAttribute, buf unsafe.Pointer, n uintptr, v any) error {
	rc := fnLtMatmulPreferenceSetAttr(uintptr(p), int32(attr), buf, n)
	if err := cublasErr("cublasLtMatmulPreferenceSetAttribute", rc); err != nil {
		return fmt.Errorf("attribute %d = %v: %w", attr, v, err)
	}
	return nil
}

// SetUint64 sets a uint64 attribute (MatmulPrefMaxWorkspaceBytes).
func (p MatmulPreference) SetUint64(attr MatmulPreferenceAttribute, v uint64) error {
	return p.set(attr, unsafe.Pointer(&v), unsafe.Sizeof(v), v)
}

// SetUint32 sets a uint32 attribute (MatmulPrefSearchMode, MatmulPrefReductionScheme,
// MatmulPrefMinAlignment*).
func (p MatmulPreference) SetUint32(attr MatmulPreferenceAttribute, v uint32) error {
	return p.set(attr, unsafe.Pointer(&v), unsafe.Sizeof(v), v)
}

// SetMaxWorkspace allows algorithms that need up to n bytes of workspace.
func (p MatmulPreference) SetMaxWorkspace(n uint64) error {
	return p.SetUint64(MatmulPrefMaxWorkspaceBytes, n)
}

// SetMinAlignment declares that A, B, C and D are aligned to at least bytes (a power of
// two; cuBLASLt assumes 256), which excludes algorithms that need more.
func (p MatmulPreference) SetMinAlignment(bytes uint32) error {
	for _, a := range []MatmulPreferenceAttribute{MatmulPrefMinAlignmentA, MatmulPrefMinAlignmentB, MatmulPrefMinAlignmentC, MatmulPrefMinAlignmentD} {
		if err := p.SetUint32(a, bytes); err != nil {
			return err
		}
	}
	return nil
}

// SetReductionSchemes restricts split-K algorithms to the reduction schemes in mask
// (ReductionComputeType alone: partial sums stay in the compute type; algorithms that do
// not split K remain).
func (p MatmulPreference) SetReductionSchemes(mask ReductionScheme) error {
	return p.SetUint32(MatmulPrefReductionScheme, uint32(mask))
}

// Destroy frees the preference (no-op for 0).
func (p MatmulPreference) Destroy() error {
	if p == 0 {
		return nil
	}
	return cublasErr("cublasLtMatmulPreferenceDestroy", fnLtMatmulPreferenceDestroy(uintptr(p)))
}

// AlgoGetHeuristic returns up to n algorithms for the matmul described by desc and the
// layouts of A, B, C and D within the bounds of pref, best guess first, keeping only those
// whose State is success. No algorithm is not an error: the result is then empty.
func (l *Lt) AlgoGetHeuristic(desc MatmulDesc, a, b, c, d MatrixLayout, pref MatmulPreference, n int) ([]MatmulHeuristicResult, error) {
	if n <= 0 {
		return nil, nil
	}
	res := make([]MatmulHeuristicResult, n)
	var got int32
	rc := fnLtMatmulAlgoGetHeuristic(l.h, uintptr(desc), uintptr(a), uintptr(b), uintptr(c), uintptr(d), uintptr(pref),
		int32(n), unsafe.Pointer(&res[0]), &got)
	runtime.KeepAlive(res)
	if rc == cublasStatusNotSupported {
		return nil, nil // no algorithm fits
	}
	if err := cublasErr("cublasLtMatmulAlgoGetHeuristic", rc); err != nil {
		return nil, err
	}
	out := res[:0]
	for _, r := range res[:max(0, min(int(got), n))] {
		if r.State == 0 {
			out = append(out, r)
		}
	}
	return out, nil
}

// cublasStatusNotSupported is CUBLAS_STATUS_NOT_SUPPORTED.
const cublasStatusNotSupported = 15

// Matmul queues D = alpha·op(A)·op(B) + beta·C on stream s with algorithm algo and the
// workspace of wsSize bytes at ws (at least what the heuristic said the algorithm needs).
// alpha and beta are host values of the descriptor's scale type (f32 here).
func (l *Lt) Matmul(desc MatmulDesc, alpha float32, A DevicePtr, Adesc MatrixLayout, B DevicePtr, Bdesc MatrixLayout,
	beta float32, C DevicePtr, Cdesc MatrixLayout, D DevicePtr, Ddesc MatrixLayout, algo *MatmulAlgo, ws DevicePtr, wsSize uint64, s Stream) error {
	rc := fnLtMatmul(l.h, uintptr(desc), unsafe.Pointer(&alpha), uint64(A), uintptr(Adesc), uint64(B), uintptr(Bdesc),
		unsafe.Pointer(&beta), uint64(C), uintptr(Cdesc), uint64(D), uintptr(Ddesc), unsafe.Pointer(algo), uint64(ws), uintptr(wsSize), uintptr(s))
	runtime.KeepAlive(algo)
	return cublasErr("cublasLtMatmul", rc)
}
