package cubind

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"
)

// DataType is a cudaDataType_t: the element type of a GEMM operand.
type DataType int32

// Element types (cudaDataType_t values).
const (
	R32F   DataType = 0  // CUDA_R_32F
	R16F   DataType = 2  // CUDA_R_16F
	R16BF  DataType = 14 // CUDA_R_16BF
	R8E4M3 DataType = 28 // CUDA_R_8F_E4M3 (float8_e4m3fn)
	R8E5M2 DataType = 29 // CUDA_R_8F_E5M2
)

// ComputeType is a cublasComputeType_t: the precision a GEMM accumulates in.
type ComputeType int32

// Compute types (cublasComputeType_t values).
const (
	Compute32F         ComputeType = 68 // CUBLAS_COMPUTE_32F: f32 accumulation, f32 products
	Compute32FFastTF32 ComputeType = 77 // CUBLAS_COMPUTE_32F_FAST_TF32
)

// Operation is a cublasOperation_t.
type Operation int32

// Operations on a GEMM operand.
const (
	OpN Operation = 0 // CUBLAS_OP_N: as stored
	OpT Operation = 1 // CUBLAS_OP_T: transposed
)

// GemmDefault is CUBLAS_GEMM_DEFAULT: cuBLAS picks the algorithm.
const GemmDefault = -1

var (
	fnCublasCreate          func(h *uintptr) int32
	fnCublasDestroy         func(h uintptr) int32
	fnCublasSetStream       func(h, s uintptr) int32
	fnCublasGetVersion      func(h uintptr, v *int32) int32
	fnCublasSetWorkspace    func(h uintptr, ws uint64, n uint64) int32
	fnCublasGetStatusName   func(rc int32) *byte
	fnCublasGetStatusString func(rc int32) *byte
	fnCublasGemmEx          func(h uintptr, ta, tb int32, m, n, k int32, alpha unsafe.Pointer, a uint64, at int32, lda int32,
		b uint64, bt int32, ldb int32, beta unsafe.Pointer, c uint64, ct int32, ldc int32, compute int32, algo int32) int32
	fnCublasGemmStridedBatchedEx func(h uintptr, ta, tb int32, m, n, k int32, alpha unsafe.Pointer, a uint64, at int32, lda int32, strideA int64,
		b uint64, bt int32, ldb int32, strideB int64, beta unsafe.Pointer, c uint64, ct int32, ldc int32, strideC int64, batch int32, compute int32, algo int32) int32
	fnCublasLtGetVersion func() uint64
	cublasOnce           sync.Once
	cublasErrLoad        error
	cublasLib, ltLib     *Library
)

func loadCublas() error {
	cublasOnce.Do(func() {
		if err := loadDriver(); err != nil {
			cublasErrLoad = err
			return
		}
		names := []string{"libcublas.so.13", "libcublas.so.12", "libcublas.so"}
		// cuBLAS needs cuBLASLt of the same release: open it first from the folder where
		// cuBLAS is found, so the dynamic loader resolves cuBLAS's dependency to that copy.
		lib, err := openLibrary("libcublas", names, true, toolkitDirs())
		if err != nil {
			cublasErrLoad = err
			return
		}
		cublasLib = lib
		ltName := strings.Replace(filepath.Base(lib.Path), "libcublas", "libcublasLt", 1)
		dirs := toolkitDirs()
		if filepath.IsAbs(lib.Path) {
			dirs = append([]string{filepath.Dir(lib.Path)}, dirs...)
		}
		if lt, err := openLibrary("libcublasLt", []string{ltName}, true, dirs); err == nil {
			ltLib = lt
			lb := &binder{lib: lt}
			lb.optional(&fnCublasLtGetVersion, "cublasLtGetVersion")
			bindLt(lt)
		}
		b := &binder{lib: lib}
		b.bind(&fnCublasCreate, "cublasCreate_v2")
		b.bind(&fnCublasDestroy, "cublasDestroy_v2")
		b.bind(&fnCublasSetStream, "cublasSetStream_v2")
		b.bind(&fnCublasGetVersion, "cublasGetVersion_v2")
		b.bind(&fnCublasGemmEx, "cublasGemmEx")
		b.bind(&fnCublasGemmStridedBatchedEx, "cublasGemmStridedBatchedEx")
		b.optional(&fnCublasSetWorkspace, "cublasSetWorkspace_v2")
		b.optional(&fnCublasGetStatusName, "cublasGetStatusName")
		b.optional(&fnCublasGetStatusString, "cublasGetStatusString")
		cublasErrLoad = b.err()
	})
	return cublasErrLoad
}

// CublasLibrary returns the paths of the cuBLAS and cuBLASLt libraries that were opened.
func CublasLibrary() (cublas, cublasLt string, err error) {
	if err := loadCublas(); err != nil {
		return "", "", err
	}
	if ltLib != nil {
		cublasLt = ltLib.Path
	}
	return cublasLib.Path, cublasLt, nil
}

// CublasLtVersion returns cuBLASLt's version number (such as 130000), or 0 when unknown.
func CublasLtVersion() int {
	if loadCublas() != nil || fnCublasLtGetVersion == nil {
		return 0
	}
	return int(fnCublasLtGetVersion())
}

// BLAS is a cuBLAS handle, bound to the context current when it was created. Its methods
// must run with that context current; a handle is not safe for concurrent use.
type BLAS struct {
	h uintptr
}

// NewBLAS creates a cuBLAS handle in the current context.
func NewBLAS() (*BLAS, error) {
	if err := loadCublas(); err != nil {
		return nil, err
	}
	var h uintptr
	if err := cublasErr("cublasCreate_v2", fnCublasCreate(&h)); err != nil {
		return nil, err
	}
	return &BLAS{h: h}, nil
}

// Destroy frees the handle.
func (b *BLAS) Destroy() error {
	if b == nil || b.h == 0 {
		return nil
	}
	err := cublasErr("cublasDestroy_v2", fnCublasDestroy(b.h))
	b.h = 0
	return err
}

// SetStream makes later calls run on stream s.
func (b *BLAS) SetStream(s Stream) error {
	return cublasErr("cublasSetStream_v2", fnCublasSetStream(b.h, uintptr(s)))
}

// SetWorkspace gives cuBLAS a device workspace of n bytes at p (useful for capturing
// GEMMs into CUDA graphs). No-op when the library lacks cublasSetWorkspace.
func (b *BLAS) SetWorkspace(p DevicePtr, n uint64) error {
	if fnCublasSetWorkspace == nil {
		return nil
	}
	return cublasErr("cublasSetWorkspace_v2", fnCublasSetWorkspace(b.h, uint64(p), n))
}

// Version returns cuBLAS's version number (such as 130000).
func (b *BLAS) Version() (int, error) {
	var v int32
	if err := cublasErr("cublasGetVersion_v2", fnCublasGetVersion(b.h, &v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// Matrix is one GEMM operand: column-major, as cuBLAS sees it, with leading dimension LD.
type Matrix struct {
	Ptr  DevicePtr
	Type DataType
	LD   int
}

// GemmEx computes C = alpha*op(A)*op(B) + beta*C in cuBLAS's column-major convention:
// op(A) is m×k, op(B) is k×n and C is m×n, accumulated in compute precision.
func (b *BLAS) GemmEx(ta, tb Operation, m, n, k int, alpha float32, A, B Matrix, beta float32, C Matrix, compute ComputeType) error {
	rc := fnCublasGemmEx(b.h, int32(ta), int32(tb), int32(m), int32(n), int32(k), unsafe.Pointer(&alpha),
		uint64(A.Ptr), int32(A.Type), int32(A.LD), uint64(B.Ptr), int32(B.Type), int32(B.LD),
		unsafe.Pointer(&beta), uint64(C.Ptr), int32(C.Type), int32(C.LD), int32(compute), GemmDefault)
	if err := cublasErr("cublasGemmEx", rc); err != nil {
		return fmt.Errorf("m=%d n=%d k=%d: %w", m, n, k, err)
	}
	return nil
}

// GemmStridedBatchedEx is GemmEx over batch independent problems whose operands are
// strideA, strideB and strideC elements apart.
func (b *BLAS) GemmStridedBatchedEx(ta, tb Operation, m, n, k int, alpha float32, A Matrix, strideA int64, B Matrix, strideB int64,
	beta float32, C Matrix, strideC int64, batch int, compute ComputeType) error {
	rc := fnCublasGemmStridedBatchedEx(b.h, int32(ta), int32(tb), int32(m), int32(n), int32(k), unsafe.Pointer(&alpha),
		uint64(A.Ptr), int32(A.Type), int32(A.LD), strideA, uint64(B.Ptr), int32(B.Type), int32(B.LD), strideB,
		unsafe.Pointer(&beta), uint64(C.Ptr), int32(C.Type), int32(C.LD), strideC, int32(batch), int32(compute), GemmDefault)
	if err := cublasErr("cublasGemmStridedBatchedEx", rc); err != nil {
		return fmt.Errorf("m=%d n=%d k=%d batch=%d: %w", m, n, k, batch, err)
	}
	return nil
}
