package cubind

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"unsafe"
)

var (
	fnNvrtcVersion          func(major, minor *int32) int32
	fnNvrtcGetErrorString   func(rc int32) *byte
	fnNvrtcCreateProgram    func(prog *uintptr, src, name *byte, numHeaders int32, headers, includeNames unsafe.Pointer) int32
	fnNvrtcDestroyProgram   func(prog *uintptr) int32
	fnNvrtcCompileProgram   func(prog uintptr, numOptions int32, options unsafe.Pointer) int32
	fnNvrtcGetCUBINSize     func(prog uintptr, n *uint64) int32
	fnNvrtcGetCUBIN         func(prog uintptr, cubin *byte) int32
	fnNvrtcGetPTXSize       func(prog uintptr, n *uint64) int32
	fnNvrtcGetPTX           func(prog uintptr, ptx *byte) int32
	fnNvrtcGetProgramLogSz  func(prog uintptr, n *uint64) int32
	fnNvrtcGetProgramLog    func(prog uintptr, log *byte) int32
	fnNvrtcGetNumSupArchs   func(n *int32) int32
	fnNvrtcGetSupportedArch func(archs *int32) int32
	nvrtcOnce               sync.Once
	nvrtcErrLoad            error
	nvrtcLib                *Library
)

func loadNVRTC() error {
	nvrtcOnce.Do(func() {
		lib, err := openLibrary("libnvrtc", []string{"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11.2", "libnvrtc.so"}, true, toolkitDirs())
		if err != nil {
			nvrtcErrLoad = err
			return
		}
		nvrtcLib = lib
		b := &binder{lib: lib}
		b.bind(&fnNvrtcVersion, "nvrtcVersion")
		b.bind(&fnNvrtcGetErrorString, "nvrtcGetErrorString")
		b.bind(&fnNvrtcCreateProgram, "nvrtcCreateProgram")
		b.bind(&fnNvrtcDestroyProgram, "nvrtcDestroyProgram")
		b.bind(&fnNvrtcCompileProgram, "nvrtcCompileProgram")
		b.bind(&fnNvrtcGetCUBINSize, "nvrtcGetCUBINSize")
		b.bind(&fnNvrtcGetCUBIN, "nvrtcGetCUBIN")
		b.bind(&fnNvrtcGetPTXSize, "nvrtcGetPTXSize")
		b.bind(&fnNvrtcGetPTX, "nvrtcGetPTX")
		b.bind(&fnNvrtcGetProgramLogSz, "nvrtcGetProgramLogSize")
		b.bind(&fnNvrtcGetProgramLog, "nvrtcGetProgramLog")
		b.optional(&fnNvrtcGetNumSupArchs, "nvrtcGetNumSupportedArchs")
		b.optional(&fnNvrtcGetSupportedArch, "nvrtcGetSupportedArchs")
		nvrtcErrLoad = b.err()
	})
	return nvrtcErrLoad
}

// NVRTCLibrary returns the path of the NVRTC library that was opened, or the load error.
func NVRTCLibrary() (string, error) {
	if err := loadNVRTC(); err != nil {
		return "", err
	}
	return nvrtcLib.Path, nil
}

// NVRTCVersion returns NVRTC's version (13, 0 for CUDA 13.0).
func NVRTCVersion() (major, minor int, err error) {
	if err := loadNVRTC(); err != nil {
		return 0, 0, err
	}
	var ma, mi int32
	if err := nvrtcErr("nvrtcVersion", fnNvrtcVersion(&ma, &mi)); err != nil {
		return 0, 0, err
	}
	return int(ma), int(mi), nil
}

// NVRTCSupportedArchs lists the sm_XX architectures NVRTC compiles for, as numbers (90 for
// sm_90); nil when the library cannot say.
func NVRTCSupportedArchs() ([]int, error) {
	if err := loadNVRTC(); err != nil {
		return nil, err
	}
	if fnNvrtcGetNumSupArchs == nil || fnNvrtcGetSupportedArch == nil {
		return nil, nil
	}
	var n int32
	if err := nvrtcErr("nvrtcGetNumSupportedArchs", fnNvrtcGetNumSupArchs(&n)); err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, nil
	}
	archs := make([]int32, n)
	if err := nvrtcErr("nvrtcGetSupportedArchs", fnNvrtcGetSupportedArch(&archs[0])); err != nil {
		return nil, err
	}
	out := make([]int, n)
	for i, a := range archs {
		out[i] = int(a)
	}
	return out, nil
}

// CompileError is a failed NVRTC compilation: the program's name, NVRTC's status and the
// compiler's log.
type CompileError struct {
	Program string
	Err     error
	Log     string
}

func (e *CompileError) Error() string {
	s := fmt.Sprintf("nvrtc: compile %s: %v", e.Program, e.Err)
	if log := strings.TrimSpace(e.Log); log != "" {
		s += "\n" + log
	}
	return s
}

func (e *CompileError) Unwrap() error { return e.Err }

// CompileCUBIN compiles CUDA C source (name is used in messages, such as "rmsnorm.cu") to a
// cubin with the given NVRTC options, which should include --gpu-architecture=sm_XX (a real
// architecture, so that NVRTC emits a cubin rather than PTX only). It returns the cubin and
// the compiler's log (warnings); a failure is a *CompileError carrying the log.
func CompileCUBIN(src, name string, options []string) (cubin []byte, log string, err error) {
	return compile(src, name, options, false)
}

// CompilePTX compiles CUDA C source as CompileCUBIN does and returns the PTX that NVRTC
// generated (the options' --gpu-architecture may name a virtual compute_XX, which skips
// the assembler). It is for looking at the code a kernel compiles to.
func CompilePTX(src, name string, options []string) (ptx, log string, err error) {
	b, log, err := compile(src, name, options, true)
	if err != nil {
		return "", log, err
	}
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b), log, nil
}

// compile compiles src and returns the cubin, or the PTX.
func compile(src, name string, options []string, ptx bool) (out []byte, log string, err error) {
	if err := loadNVRTC(); err != nil {
		return nil, "", err
	}
	sizeFn, getSize, getFn, get, empty := "nvrtcGetCUBINSize", fnNvrtcGetCUBINSize, "nvrtcGetCUBIN", fnNvrtcGetCUBIN,
		"nvrtc produced no cubin (is --gpu-architecture a real sm_XX?)"
	if ptx {
		sizeFn, getSize, getFn, get, empty = "nvrtcGetPTXSize", fnNvrtcGetPTXSize, "nvrtcGetPTX", fnNvrtcGetPTX, "nvrtc produced no PTX"
	}
	var prog uintptr
	if err := nvrtcErr("nvrtcCreateProgram", fnNvrtcCreateProgram(&prog, cStr(src), cStr(name), 0, nil, nil)); err != nil {
		return nil, "", &CompileError{Program: name, Err: err}
	}
	defer fnNvrtcDestroyProgram(&prog)
	opts := make([]*byte, len(options))
	for i, o := range options {
		opts[i] = cStr(o)
	}
	var optp unsafe.Pointer
	if len(opts) > 0 {
		optp = unsafe.Pointer(&opts[0])
	}
	rc := fnNvrtcCompileProgram(prog, int32(len(opts)), optp)
	runtime.KeepAlive(opts)
	log = programLog(prog)
	if err := nvrtcErr("nvrtcCompileProgram", rc); err != nil {
		return nil, log, &CompileError{Program: name, Err: err, Log: log}
	}
	var n uint64
	if err := nvrtcErr(sizeFn, getSize(prog, &n)); err != nil {
		return nil, log, &CompileError{Program: name, Err: err, Log: log}
	}
	if n == 0 {
		return nil, log, &CompileError{Program: name, Err: errors.New(empty), Log: log}
	}
	out = make([]byte, n)
	if err := nvrtcErr(getFn, get(prog, &out[0])); err != nil {
		return nil, log, &CompileError{Program: name, Err: err, Log: log}
	}
	return out, log, nil
}

func programLog(prog uintptr) string {
	var n uint64
	if fnNvrtcGetProgramLogSz(prog, &n) != 0 || n <= 1 {
		return ""
	}
	buf := make([]byte, n)
	if fnNvrtcGetProgramLog(prog, &buf[0]) != 0 {
		return ""
	}
	return cString(&buf[0])
}
