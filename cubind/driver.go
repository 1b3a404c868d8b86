package cubind

import (
	"fmt"
	"math"
	"runtime"
	"sync"
	"time"
	"unsafe"
)

// Handles of the driver API. They are opaque values owned by the driver.
type (
	// DevicePtr is an address in device memory (CUdeviceptr).
	DevicePtr uint64
	// Device is a GPU ordinal as the driver numbers it (CUdevice).
	Device int32
	// Context is a CUDA context (CUcontext).
	Context uintptr
	// Stream is a CUDA stream (CUstream); the zero Stream is the legacy default stream.
	Stream uintptr
	// Event is a CUDA event (CUevent).
	Event uintptr
	// Module is a loaded cubin or PTX image (CUmodule).
	Module uintptr
	// Function is a kernel of a module (CUfunction).
	Function uintptr
	// Graph is a captured CUDA graph (CUgraph).
	Graph uintptr
	// GraphExec is an instantiated, launchable CUDA graph (CUgraphExec).
	GraphExec uintptr
)

// DeviceAttribute is a CUdevice_attribute.
type DeviceAttribute int32

// Device attributes used by Loom (values of CUdevice_attribute).
const (
	AttrMaxThreadsPerBlock           DeviceAttribute = 1
	AttrMaxSharedMemoryPerBlock      DeviceAttribute = 8
	AttrWarpSize                     DeviceAttribute = 10
	AttrMultiprocessorCount          DeviceAttribute = 16
	AttrL2CacheSize                  DeviceAttribute = 38
	AttrMaxThreadsPerMultiprocessor  DeviceAttribute = 39
	AttrComputeCapabilityMajor       DeviceAttribute = 75
	AttrComputeCapabilityMinor       DeviceAttribute = 76
	AttrMaxSharedMemoryPerBlockOptin DeviceAttribute = 97
)

// Flags of streams, events and stream capture.
const (
	StreamNonBlocking = 1 // CU_STREAM_NON_BLOCKING: no implicit sync with the legacy stream

	EventDefault       = 0 // CU_EVENT_DEFAULT
	EventBlockingSync  = 1 // CU_EVENT_BLOCKING_SYNC
	EventDisableTiming = 2 // CU_EVENT_DISABLE_TIMING

	CaptureModeGlobal      = 0 // CU_STREAM_CAPTURE_MODE_GLOBAL
	CaptureModeThreadLocal = 1 // CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
	CaptureModeRelaxed     = 2 // CU_STREAM_CAPTURE_MODE_RELAXED

	funcAttrMaxDynamicSharedSizeBytes = 8 // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
	funcAttrNumRegs                   = 4 // CU_FUNC_ATTRIBUTE_NUM_REGS
)

var (
	fnInit               func(flags uint32) int32
	fnDriverGetVersion   func(v *int32) int32
	fnGetErrorName       func(rc int32, p **byte) int32
	fnGetErrorString     func(rc int32, p **byte) int32
	fnDeviceGetCount     func(n *int32) int32
	fnDeviceGet          func(d *int32, ordinal int32) int32
	fnDeviceGetName      func(name *byte, n int32, d int32) int32
	fnDeviceGetAttribute func(v *int32, attr int32, d int32) int32
	fnDeviceTotalMem     func(bytes *uint64, d int32) int32
	fnPrimaryCtxRetain   func(ctx *uintptr, d int32) int32
	fnPrimaryCtxRelease  func(d int32) int32
	fnCtxSetCurrent      func(ctx uintptr) int32
	fnCtxSynchronize     func() int32
	fnMemAlloc           func(p *uint64, n uint64) int32
	fnMemFree            func(p uint64) int32
	fnMemGetInfo         func(free, total *uint64) int32
	fnMemHostAlloc       func(p *unsafe.Pointer, n uint64, flags uint32) int32
	fnMemFreeHost        func(p unsafe.Pointer) int32
	fnMemcpyHtoDAsync    func(dst uint64, src unsafe.Pointer, n uint64, s uintptr) int32
	fnMemcpyDtoHAsync    func(dst unsafe.Pointer, src uint64, n uint64, s uintptr) int32
	fnMemcpyDtoDAsync    func(dst, src uint64, n uint64, s uintptr) int32
	fnMemsetD8Async      func(dst uint64, v uint8, n uint64, s uintptr) int32
	fnMemsetD32Async     func(dst uint64, v uint32, n uint64, s uintptr) int32
	fnStreamCreate       func(s *uintptr, flags uint32) int32
	fnStreamDestroy      func(s uintptr) int32
	fnStreamSynchronize  func(s uintptr) int32
	fnStreamWaitEvent    func(s, e uintptr, flags uint32) int32
	fnEventCreate        func(e *uintptr, flags uint32) int32
	fnEventDestroy       func(e uintptr) int32
	fnEventRecord        func(e, s uintptr) int32
	fnEventSynchronize   func(e uintptr) int32
	fnEventQuery         func(e uintptr) int32
	fnEventElapsedTime   func(ms *float32, start, end uintptr) int32
	fnModuleLoadData     func(m *uintptr, image unsafe.Pointer) int32
	fnModuleUnload       func(m uintptr) int32
	fnModuleGetFunction  func(f *uintptr, m uintptr, name *byte) int32
	fnFuncSetAttribute   func(f uintptr, attr int32, v int32) int32
	fnFuncGetAttribute   func(v *int32, attr int32, f uintptr) int32
	fnLaunchKernel       func(f uintptr, gx, gy, gz, bx, by, bz, shared uint32, s uintptr, params, extra unsafe.Pointer) int32
	fnStreamBeginCapture func(s uintptr, mode int32) int32
	fnStreamEndCapture   func(s uintptr, g *uintptr) int32
	fnGraphInstantiate   func(e *uintptr, g uintptr, flags uint64) int32
	fnGraphLaunch        func(e, s uintptr) int32
	fnGraphExecDestroy   func(e uintptr) int32
	fnGraphDestroy       func(g uintptr) int32
	driverOnce           sync.Once
	driverErrLoad        error
	driverLib            *Library
)

// loadDriver opens libcuda, binds its functions and calls cuInit(0), once.
func loadDriver() error {
	driverOnce.Do(func() {
		lib, err := openLibrary("libcuda", []string{"libcuda.so.1", "libcuda.so"}, true,
			append([]string{"/usr/local/nvidia/lib64", "/usr/local/nvidia/lib", "/usr/lib/wsl/lib"}, systemLibDirs()...))
		if err != nil {
			driverErrLoad = err
			return
		}
		driverLib = lib
		b := &binder{lib: lib}
		b.bind(&fnInit, "cuInit")
		b.bind(&fnDriverGetVersion, "cuDriverGetVersion")
		b.bind(&fnGetErrorName, "cuGetErrorName")
		b.bind(&fnGetErrorString, "cuGetErrorString")
		b.bind(&fnDeviceGetCount, "cuDeviceGetCount")
		b.bind(&fnDeviceGet, "cuDeviceGet")
		b.bind(&fnDeviceGetName, "cuDeviceGetName")
		b.bind(&fnDeviceGetAttribute, "cuDeviceGetAttribute")
		b.bind(&fnDeviceTotalMem, "cuDeviceTotalMem_v2")
		b.bind(&fnPrimaryCtxRetain, "cuDevicePrimaryCtxRetain")
		b.bind(&fnPrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease")
		b.bind(&fnCtxSetCurrent, "cuCtxSetCurrent")
		b.bind(&fnCtxSynchronize, "cuCtxSynchronize")
		b.bind(&fnMemAlloc, "cuMemAlloc_v2")
		b.bind(&fnMemFree, "cuMemFree_v2")
		b.bind(&fnMemGetInfo, "cuMemGetInfo_v2")
		b.bind(&fnMemHostAlloc, "cuMemHostAlloc")
		b.bind(&fnMemFreeHost, "cuMemFreeHost")
		b.bind(&fnMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2")
		b.bind(&fnMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2")
		b.bind(&fnMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2")
		b.bind(&fnMemsetD8Async, "cuMemsetD8Async")
		b.bind(&fnMemsetD32Async, "cuMemsetD32Async")
		b.bind(&fnStreamCreate, "cuStreamCreate")
		b.bind(&fnStreamDestroy, "cuStreamDestroy_v2", "cuStreamDestroy")
		b.bind(&fnStreamSynchronize, "cuStreamSynchronize")
		b.bind(&fnStreamWaitEvent, "cuStreamWaitEvent")
		b.bind(&fnEventCreate, "cuEventCreate")
		b.bind(&fnEventDestroy, "cuEventDestroy_v2", "cuEventDestroy")
		b.bind(&fnEventRecord, "cuEventRecord")
		b.bind(&fnEventSynchronize, "cuEventSynchronize")
		b.bind(&fnEventQuery, "cuEventQuery")
		b.bind(&fnEventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime")
		b.bind(&fnModuleLoadData, "cuModuleLoadData")
		b.bind(&fnModuleUnload, "cuModuleUnload")
		b.bind(&fnModuleGetFunction, "cuModuleGetFunction")
		b.bind(&fnFuncSetAttribute, "cuFuncSetAttribute")
		b.bind(&fnFuncGetAttribute, "cuFuncGetAttribute")
		b.bind(&fnLaunchKernel, "cuLaunchKernel")
		b.optional(&fnLaunchKernelEx, "cuLaunchKernelEx") // CUDA 12.0 and later: LaunchKernelPDL
		b.bind(&fnStreamBeginCapture, "cuStreamBeginCapture_v2", "cuStreamBeginCapture")
		b.bind(&fnStreamEndCapture, "cuStreamEndCapture")
		b.bind(&fnGraphInstantiate, "cuGraphInstantiateWithFlags")
		b.bind(&fnGraphLaunch, "cuGraphLaunch")
		b.bind(&fnGraphExecDestroy, "cuGraphExecDestroy")
		b.bind(&fnGraphDestroy, "cuGraphDestroy")
		bindPeer(b)
		if err := b.err(); err != nil {
			driverErrLoad = err
			return
		}
		if err := driverErr("cuInit", fnInit(0)); err != nil {
			driverErrLoad = fmt.Errorf("cubind: %s: %w", lib.Path, err)
		}
	})
	return driverErrLoad
}

// Init loads the driver library and initialises it (cuInit). Every other driver call does
// this itself; Init only reports the outcome early. It is safe to call more than once.
func Init() error { return loadDriver() }

// DriverLibrary returns the path of the driver library that was opened ("" before Init).
func DriverLibrary() string {
	if loadDriver() != nil {
		return ""
	}
	return driverLib.Path
}

// DriverVersion returns the CUDA version the driver supports, as major*1000 + minor*10
// (13000 for CUDA 13.0).
func DriverVersion() (int, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	var v int32
	if err := driverErr("cuDriverGetVersion", fnDriverGetVersion(&v)); err != nil {
		return 0, err
	}
	return int(v), nil
}

// DeviceCount returns the number of GPUs the driver sees.
func DeviceCount() (int, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	var n int32
	if err := driverErr("cuDeviceGetCount", fnDeviceGetCount(&n)); err != nil {
		return 0, err
	}
	return int(n), nil
}

// GetDevice returns the device of the given ordinal (0 for the first GPU).
func GetDevice(ordinal int) (Device, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	var d int32
	if err := driverErr("cuDeviceGet", fnDeviceGet(&d, int32(ordinal))); err != nil {
		return 0, fmt.Errorf("device %d: %w", ordinal, err)
	}
	return Device(d), nil
}

// Name returns the device's product name, such as "NVIDIA H200".
func (d Device) Name() (string, error) {
	if err := loadDriver(); err != nil {
		return "", err
	}
	buf := make([]byte, 256)
	if err := driverErr("cuDeviceGetName", fnDeviceGetName(&buf[0], int32(len(buf)), int32(d))); err != nil {
		return "", err
	}
	return cString(&buf[0]), nil
}

// Attribute returns one device attribute.
func (d Device) Attribute(a DeviceAttribute) (int, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	var v int32
	if err := driverErr("cuDeviceGetAttribute", fnDeviceGetAttribute(&v, int32(a), int32(d))); err != nil {
		return 0, fmt.Errorf("attribute %d: %w", a, err)
	}
	return int(v), nil
}

// ComputeCapability returns the device's compute capability (9, 0 for an H100 or H200).
func (d Device) ComputeCapability() (major, minor int, err error) {
	if major, err = d.Attribute(AttrComputeCapabilityMajor); err != nil {
		return 0, 0, err
	}
	if minor, err = d.Attribute(AttrComputeCapabilityMinor); err != nil {
		return 0, 0, err
	}
	return major, minor, nil
}

// TotalMem returns the device's memory size in bytes.
func (d Device) TotalMem() (uint64, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	var n uint64
	if err := driverErr("cuDeviceTotalMem_v2", fnDeviceTotalMem(&n, int32(d))); err != nil {
		return 0, err
	}
	return n, nil
}

// PrimaryCtxRetain retains the device's primary context (creating it on first use). Pair
// it with PrimaryCtxRelease.
func (d Device) PrimaryCtxRetain() (Context, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	var c uintptr
	if err := driverErr("cuDevicePrimaryCtxRetain", fnPrimaryCtxRetain(&c, int32(d))); err != nil {
		return 0, err
	}
	return Context(c), nil
}

// PrimaryCtxRelease releases a reference taken by PrimaryCtxRetain.
func (d Device) PrimaryCtxRelease() error {
	if err := loadDriver(); err != nil {
		return err
	}
	return driverErr("cuDevicePrimaryCtxRelease_v2", fnPrimaryCtxRelease(int32(d)))
}

// SetCurrent binds the context to the calling OS thread (cuCtxSetCurrent).
func (c Context) SetCurrent() error {
	if err := loadDriver(); err != nil {
		return err
	}
	return driverErr("cuCtxSetCurrent", fnCtxSetCurrent(uintptr(c)))
}

// CtxSynchronize waits for all work of the current context.
func CtxSynchronize() error {
	if err := loadDriver(); err != nil {
		return err
	}
	return driverErr("cuCtxSynchronize", fnCtxSynchronize())
}

// MemAlloc allocates n bytes of device memory in the current context.
func MemAlloc(n uint64) (DevicePtr, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	var p uint64
	if err := driverErr("cuMemAlloc_v2", fnMemAlloc(&p, n)); err != nil {
		return 0, fmt.Errorf("allocate %d bytes: %w", n, err)
	}
	return DevicePtr(p), nil
}

// MemFree frees memory from MemAlloc.
func MemFree(p DevicePtr) error {
	if err := loadDriver(); err != nil {
		return err
	}
	return driverErr("cuMemFree_v2", fnMemFree(uint64(p)))
}

// MemGetInfo returns the free and total device memory of the current context's device.
func MemGetInfo() (free, total uint64, err error) {
	if err := loadDriver(); err != nil {
		return 0, 0, err
	}
	err = driverErr("cuMemGetInfo_v2", fnMemGetInfo(&free, &total))
	return free, total, err
}

// MemHostAlloc allocates n bytes of page-locked host memory, which the device reads and
// writes by DMA: a copy from it with MemcpyHtoDAsync runs while the host goes on. It is not
// Go memory: free it with MemFreeHost, and only once every copy from it has completed.
func MemHostAlloc(n int) ([]byte, error) {
	if err := loadDriver(); err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, fmt.Errorf("allocate %d bytes of pinned host memory", n)
	}
	var p unsafe.Pointer
	if err := driverErr("cuMemHostAlloc", fnMemHostAlloc(&p, uint64(n), 0)); err != nil {
		return nil, fmt.Errorf("allocate %d bytes of pinned host memory: %w", n, err)
	}
	return unsafe.Slice((*byte)(p), n), nil
}

// MemFreeHost frees memory from MemHostAlloc.
func MemFreeHost(b []byte) error {
	if err := loadDriver(); err != nil {
		return err
	}
	if len(b) == 0 {
		return nil
	}
	return driverErr("cuMemFreeHost", fnMemFreeHost(unsafe.Pointer(unsafe.SliceData(b))))
}

// bytesOf returns the address and byte size of a slice's elements.
func bytesOf[T any](s []T) (unsafe.Pointer, uint64) {
	if len(s) == 0 {
		return nil, 0
	}
	var zero T
	return unsafe.Pointer(&s[0]), uint64(len(s)) * uint64(unsafe.Sizeof(zero))
}

// MemcpyHtoDAsync copies src, a slice of plain values (float32, uint16, int32, bytes ...),
// to device memory at dst on stream s. From pageable Go memory the driver has read src by
// the time the call returns, so src may be reused at once; from pinned memory (MemHostAlloc)
// the copy runs on after the call, and src must stay as it is until the stream has done it.
func MemcpyHtoDAsync[T any](dst DevicePtr, src []T, s Stream) error {
	if err := loadDriver(); err != nil {
		return err
	}
	p, n := bytesOf(src)
	if n == 0 {
		return nil
	}
	err := driverErr("cuMemcpyHtoDAsync_v2", fnMemcpyHtoDAsync(uint64(dst), p, n, uintptr(s)))
	runtime.KeepAlive(src)
	return err
}

// MemcpyDtoHAsync copies len(dst) elements from device memory at src into dst on stream s.
// Into pageable Go memory the copy has completed when the call returns (the driver
// synchronises), so dst may be read at once.
func MemcpyDtoHAsync[T any](dst []T, src DevicePtr, s Stream) error {
	if err := loadDriver(); err != nil {
		return err
	}
	p, n := bytesOf(dst)
	if n == 0 {
		return nil
	}
	err := driverErr("cuMemcpyDtoHAsync_v2", fnMemcpyDtoHAsync(p, uint64(src), n, uintptr(s)))
	runtime.KeepAlive(dst)
	return err
}

// MemcpyDtoDAsync copies n bytes between device buffers on stream s.
func MemcpyDtoDAsync(dst, src DevicePtr, n uint64, s Stream) error {
	if err := loadDriver(); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	return driverErr("cuMemcpyDtoDAsync_v2", fnMemcpyDtoDAsync(uint64(dst), uint64(src), n, uintptr(s)))
}

// MemsetD8Async sets n bytes at dst to v on stream s.
func MemsetD8Async(dst DevicePtr, v uint8, n uint64, s Stream) error {
	if err := loadDriver(); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	return driverErr("cuMemsetD8Async", fnMemsetD8Async(uint64(dst), v, n, uintptr(s)))
}

// MemsetD32Async sets n 32-bit words at dst (4-byte aligned) to v on stream s.
func MemsetD32Async(dst DevicePtr, v uint32, n uint64, s Stream) error {
	if err := loadDriver(); err != nil {
		return err
	}
	if n == 0 {
		return nil
	}
	return driverErr("cuMemsetD32Async", fnMemsetD32Async(uint64(dst), v, n, uintptr(s)))
}

// StreamCreate creates a stream in the current context (flags: 0 or StreamNonBlocking).
func StreamCreate(flags uint32) (Stream, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	var s uintptr
	if err := driverErr("cuStreamCreate", fnStreamCreate(&s, flags)); err != nil {
		return 0, err
	}
	return Stream(s), nil
}

// Destroy destroys the stream once its work is done.
func (s Stream) Destroy() error {
	if err := loadDriver(); err != nil {
		return err
	}
	return driverErr("cuStreamDestroy_v2", fnStreamDestroy(uintptr(s)))
}

// Synchronize waits for the stream's work to finish.
func (s Stream) Synchronize() error {
	if err := loadDriver(); err != nil {
		return err
	}
	return driverErr("cuStreamSynchronize", fnStreamSynchronize(uintptr(s)))
}

// WaitEvent makes later work on s wait for e.
func (s Stream) WaitEvent(e Event) error {
	if err := loadDriver(); err != nil {
		return err
	}
	return driverErr("cuStreamWaitEvent", fnStreamWaitEvent(uintptr(s), uintptr(e), 0))
}

// BeginCapture starts capturing the work issued to s into a graph (mode: CaptureMode*).
// Work issued while capturing is recorded, not run.
func (s Stream) BeginCapture(mode int) error {
	if err := loadDriver(); err != nil {
		return err
	}
	return driverErr("cuStreamBeginCapture_v2", fnStreamBeginCapture(uintptr(s), int32(mode)))
}

// EndCapture ends a capture and returns the recorded graph.
func (s Stream) EndCapture() (Graph, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	var g uintptr
	if err := driverErr("cuStreamEndCapture", fnStreamEndCapture(uintptr(s), &g)); err != nil {
		return 0, err
	}
	return Graph(g), nil
}

// Instantiate makes a launchable graph.
func (g Graph) Instantiate() (GraphExec, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	var e uintptr
	if err := driverErr("cuGraphInstantiateWithFlags", fnGraphInstantiate(&e, uintptr(g), 0)); err != nil {
		return 0, err
	}
	return GraphExec(e), nil
}

// Destroy frees the graph (instantiated graphs stay valid).
func (g Graph) Destroy() error {
	if err := loadDriver(); err != nil {
		return err
	}
	return driverErr("cuGraphDestroy", fnGraphDestroy(uintptr(g)))
}

// Launch runs the graph on stream s.
func (e GraphExec) Launch(s Stream) error {
	if err := loadDriver(); err != nil {
		return err
	}
	return driverErr("cuGraphLaunch", fnGraphLaunch(uintptr(e), uintptr(s)))
}

// Destroy frees the instantiated graph.
func (e GraphExec) Destroy() error {
	if err := loadDriver(); err != nil {
		return err
	}
	return driverErr("cuGraphExecDestroy", fnGraphExecDestroy(uintptr(e)))
}

// EventCreate creates an event (flags: Event*).
func EventCreate(flags uint32) (Event, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	var e uintptr
	if err := driverErr("cuEventCreate", fnEventCreate(&e, flags)); err != nil {
		return 0, err
	}
	return Event(e), nil
}

// Destroy destroys the event.
func (e Event) Destroy() error {
	if err := loadDriver(); err != nil {
		return err
	}
	return driverErr("cuEventDestroy_v2", fnEventDestroy(uintptr(e)))
}

// Record records the event on stream s.
func (e Event) Record(s Stream) error {
	if err := loadDriver(); err != nil {
		return err
	}
	return driverErr("cuEventRecord", fnEventRecord(uintptr(e), uintptr(s)))
}

// Synchronize waits for the event.
func (e Event) Synchronize() error {
	if err := loadDriver(); err != nil {
		return err
	}
	return driverErr("cuEventSynchronize", fnEventSynchronize(uintptr(e)))
}

// Done reports whether the work before the event has finished.
func (e Event) Done() (bool, error) {
	if err := loadDriver(); err != nil {
		return false, err
	}
	return queryResult("cuEventQuery", fnEventQuery(uintptr(e)))
}

// queryResult reads the code of a query call (cuEventQuery, cuStreamQuery): not ready is
// (false, nil), success (true, nil), any other code an error.
func queryResult(fn string, rc int32) (bool, error) {
	if rc == CudaErrorNotReady {
		return false, nil
	}
	if err := driverErr(fn, rc); err != nil {
		return false, err
	}
	return true, nil
}

// Elapsed returns the time between two recorded, completed events (resolution about 0.5 µs).
func Elapsed(start, end Event) (time.Duration, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	var ms float32
	if err := driverErr("cuEventElapsedTime", fnEventElapsedTime(&ms, uintptr(start), uintptr(end))); err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// ModuleLoadData loads a cubin (or NUL-terminated PTX) image into the current context.
func ModuleLoadData(image []byte) (Module, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	if len(image) == 0 {
		return 0, fmt.Errorf("cuModuleLoadData: empty image")
	}
	var m uintptr
	err := driverErr("cuModuleLoadData", fnModuleLoadData(&m, unsafe.Pointer(&image[0])))
	runtime.KeepAlive(image)
	if err != nil {
		return 0, err
	}
	return Module(m), nil
}

// Unload unloads the module.
func (m Module) Unload() error {
	if err := loadDriver(); err != nil {
		return err
	}
	return driverErr("cuModuleUnload", fnModuleUnload(uintptr(m)))
}

// Function returns the kernel of the given (extern "C") name.
func (m Module) Function(name string) (Function, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	var f uintptr
	if err := driverErr("cuModuleGetFunction", fnModuleGetFunction(&f, uintptr(m), cStr(name))); err != nil {
		return 0, fmt.Errorf("kernel %q: %w", name, err)
	}
	return Function(f), nil
}

// SetMaxDynamicSharedMemory allows launches of f with up to n bytes of dynamic shared
// memory (needed above 48 KiB).
func (f Function) SetMaxDynamicSharedMemory(n int) error {
	if err := loadDriver(); err != nil {
		return err
	}
	return driverErr("cuFuncSetAttribute", fnFuncSetAttribute(uintptr(f), funcAttrMaxDynamicSharedSizeBytes, int32(n)))
}

// NumRegs returns the number of registers each thread of f uses.
func (f Function) NumRegs() (int, error) {
	if err := loadDriver(); err != nil {
		return 0, err
	}
	var v int32
	if err := driverErr("cuFuncGetAttribute", fnFuncGetAttribute(&v, funcAttrNumRegs, uintptr(f))); err != nil {
		return 0, err
	}
	return int(v), nil
}

// Dim3 is a grid or block size.
type Dim3 struct{ X, Y, Z int }

// Args holds kernel arguments in the layout cuLaunchKernel reads: an array of pointers,
// one per argument, to the argument's bytes. Scalars take an 8-byte slot each (the driver
// reads as many bytes as the kernel's parameter has); structs passed by value keep their
// own bytes. Reuse one Args (after Reset) to launch without allocating.
type Args struct {
	slots []uint64
	blobs [][]byte
	order []argRef
	ptrs  []unsafe.Pointer
}

// argRef locates one argument: a slot, or a blob when blob is set.
type argRef struct {
	blob bool
	idx  int
}

// Reset empties the argument list.
func (a *Args) Reset() {
	a.slots, a.blobs, a.order, a.ptrs = a.slots[:0], a.blobs[:0], a.order[:0], a.ptrs[:0]
}

// Len is the number of arguments.
func (a *Args) Len() int { return len(a.order) }

func (a *Args) slot(v uint64) *Args {
	a.order = append(a.order, argRef{idx: len(a.slots)})
	a.slots = append(a.slots, v)
	return a
}

// Ptr appends a device pointer argument.
func (a *Args) Ptr(p DevicePtr) *Args { return a.slot(uint64(p)) }

// I32 appends an int argument.
func (a *Args) I32(v int32) *Args { return a.slot(uint64(uint32(v))) }

// I64 appends a long long argument.
func (a *Args) I64(v int64) *Args { return a.slot(uint64(v)) }

// F32 appends a float argument.
func (a *Args) F32(v float32) *Args { return a.slot(uint64(math.Float32bits(v))) }

// Struct appends an argument passed by value whose bytes, in the C layout, are b.
func (a *Args) Struct(b []byte) *Args {
	a.order = append(a.order, argRef{blob: true, idx: len(a.blobs)})
	a.blobs = append(a.blobs, b)
	return a
}

// params builds the pointer array. The slots and blobs are heap memory that does not move
// and stays referenced from a until the launch returns.
func (a *Args) params() (unsafe.Pointer, error) {
	a.ptrs = a.ptrs[:0]
	for _, r := range a.order {
		if r.blob {
			if len(a.blobs[r.idx]) == 0 {
				return nil, fmt.Errorf("kernel argument %d is an empty struct", len(a.ptrs))
			}
			a.ptrs = append(a.ptrs, unsafe.Pointer(&a.blobs[r.idx][0]))
			continue
		}
		a.ptrs = append(a.ptrs, unsafe.Pointer(&a.slots[r.idx]))
	}
	if len(a.ptrs) == 0 {
		return nil, nil
	}
	return unsafe.Pointer(&a.ptrs[0]), nil
}

// LaunchKernel launches f with the given grid, block, dynamic shared memory and arguments
// on stream s.
func LaunchKernel(f Function, grid, block Dim3, sharedMem int, s Stream, args *Args) error {
	if err := loadDriver(); err != nil {
		return err
	}
	var params unsafe.Pointer
	if args != nil {
		var err error
		if params, err = args.params(); err != nil {
			return fmt.Errorf("cuLaunchKernel: %w", err)
		}
	}
	rc := fnLaunchKernel(uintptr(f), uint32(grid.X), uint32(grid.Y), uint32(grid.Z),
		uint32(block.X), uint32(block.Y), uint32(block.Z), uint32(sharedMem), uintptr(s), params, nil)
	runtime.KeepAlive(args)
	if rc != 0 {
		return fmt.Errorf("grid %v block %v shared %d: %w", grid, block, sharedMem, driverErr("cuLaunchKernel", rc))
	}
	return nil
}
