package cubind

import (
	"errors"
	"fmt"
	"unsafe"
)

// Error is a failed call into a CUDA library: the function called, the status it returned
// and that status's name, such as "cuMemAlloc_v2: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory".
type Error struct {
	Call   string // the C function that failed
	Code   int    // the library's status code (CUresult, nvrtcResult, cublasStatus_t)
	Name   string // the status's name
	Detail string // a description of the status or of the call, when known
}

func (e *Error) Error() string {
	s := fmt.Sprintf("%s: %s (%d)", e.Call, e.Name, e.Code)
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// Driver API status codes that callers act on.
const (
	CudaSuccess             = 0
	CudaErrorOutOfMemory    = 2
	CudaErrorNotInitialized = 3
	CudaErrorNoDevice       = 100
	CudaErrorNotReady       = 600
)

// IsOutOfMemory reports whether err is a driver or cuBLAS out-of-memory failure.
func IsOutOfMemory(err error) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	return e.Name == "CUDA_ERROR_OUT_OF_MEMORY" || e.Name == "CUBLAS_STATUS_ALLOC_FAILED"
}

// cString copies a NUL-terminated C string.
func cString(p *byte) string {
	if p == nil {
		return ""
	}
	n := 0
	for *(*byte)(unsafe.Add(unsafe.Pointer(p), n)) != 0 {
		n++
	}
	return string(unsafe.Slice(p, n))
}

// cStr returns a NUL-terminated copy of s for a C call.
func cStr(s string) *byte {
	b := make([]byte, len(s)+1)
	copy(b, s)
	return &b[0]
}

// driverErr turns a CUresult into an *Error (nil for CUDA_SUCCESS), with the name and text
// the driver gives for it.
func driverErr(call string, rc int32) error {
	if rc == 0 {
		return nil
	}
	e := &Error{Call: call, Code: int(rc), Name: fmt.Sprintf("CUresult(%d)", rc)}
	if fnGetErrorName != nil {
		var p *byte
		if fnGetErrorName(rc, &p) == 0 && p != nil {
			e.Name = cString(p)
		}
	}
	if fnGetErrorString != nil {
		var p *byte
		if fnGetErrorString(rc, &p) == 0 && p != nil {
			e.Detail = cString(p)
		}
	}
	return e
}

// cublasStatusNames are the cublasStatus_t names, for libraries without cublasGetStatusName.
var cublasStatusNames = map[int32]string{
	0: "CUBLAS_STATUS_SUCCESS", 1: "CUBLAS_STATUS_NOT_INITIALIZED", 3: "CUBLAS_STATUS_ALLOC_FAILED",
	7: "CUBLAS_STATUS_INVALID_VALUE", 8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
	13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR", 15: "CUBLAS_STATUS_NOT_SUPPORTED",
	16: "CUBLAS_STATUS_LICENSE_ERROR",
}

func cublasErr(call string, rc int32) error {
	if rc == 0 {
		return nil
	}
	e := &Error{Call: call, Code: int(rc), Name: fmt.Sprintf("cublasStatus(%d)", rc)}
	if n, ok := cublasStatusNames[rc]; ok {
		e.Name = n
	}
	if fnCublasGetStatusName != nil {
		if p := fnCublasGetStatusName(rc); p != nil {
			e.Name = cString(p)
		}
	}
	if fnCublasGetStatusString != nil {
		if p := fnCublasGetStatusString(rc); p != nil {
			e.Detail = cString(p)
		}
	}
	return e
}

func nvrtcErr(call string, rc int32) error {
	if rc == 0 {
		return nil
	}
	e := &Error{Call: call, Code: int(rc), Name: fmt.Sprintf("nvrtcResult(%d)", rc)}
	if fnNvrtcGetErrorString != nil {
		if p := fnNvrtcGetErrorString(rc); p != nil {
			e.Name = cString(p)
		}
	}
	return e
}
