// Package cubind holds Loom's low-level bindings to NVIDIA's libraries: the CUDA driver API
// (libcuda), the runtime compiler NVRTC (libnvrtc) and cuBLAS (libcublas, libcublasLt). It
// uses no cgo: the libraries are opened at run time with purego, so a binary built with
// CGO_ENABLED=0 runs on machines with or without a GPU, and asks for the libraries only when
// a GPU is used.
//
// The package imports nothing of Loom; backend/cuda and dist/nccl build on it. Its API stays
// close to the C functions it wraps, with Go types: device pointers are DevicePtr, handles are
// small integer types, sizes are in bytes, and every failure is an *Error that names the call
// and the library's status (CUDA_ERROR_OUT_OF_MEMORY, NVRTC_ERROR_COMPILATION, ...).
//
// Libraries are found by name. The folders in LOOM_CUDA_LIB_DIR (a colon-separated list) are
// tried first, then the usual places (the system loader's search, /usr/local/cuda*, the
// distribution's library folders); when none works the error lists every path tried.
//
// The driver binds a context to the calling OS thread. Callers that switch goroutines
// between calls must lock the goroutine to its thread (runtime.LockOSThread) and make the
// context current (Context.SetCurrent) before a sequence of calls; backend/cuda does this
// on every entry.
package cubind
