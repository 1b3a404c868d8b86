package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/tensor"
)

// Device is one GPU ready to run Loom's kernels: its primary context, one stream on which
// all work is queued in order, a cuBLAS handle, a pooling allocator and the kernels compiled
// so far. It is the runtime only: the launchers of the kernels are functions of this
// package that take the Device (RMSNorm(d, ...); see ops.go). Its methods, and the exported
// launchers, are safe for concurrent use; they run one at a time.
//
// Calls that queue work (kernels, copies into device memory) return once it is queued;
// Download and Sync wait for it. Errors of queued work surface at the next Sync or Download.
type Device struct {
	mu      sync.Mutex
	ordinal int
	dev     cubind.Device
	ctx     cubind.Context
	stream  cubind.Stream
	// side is a second stream for reading results back while the next step runs on stream
	// (see sideStream).
	side    cubind.Stream
	blas    *cubind.BLAS
	alloc   *Allocator
	comp    compiler
	info    DeviceInfo
	modules map[string]cubind.Module
	funcs   map[string]cubind.Function
	compile []CompileStats
	errWord cubind.DevicePtr // int32[4]: flag, id, position, V of a bad embedding id
	args    cubind.Args
	closed  bool
	// capturing is set while a Program captures a CUDA graph: allocating then is an error
	// (a captured pointer must not go back to the pool).
	capturing bool
	// blasWork is cuBLAS's workspace, set explicitly so that GEMMs can be captured.
	blasWork *block
	// pdl: launch the kernels of pdlFiles with programmatic dependent launch (usePDL).
	pdl bool
	// copied is set when a copy or memset was queued after the last kernel (copyHtoD and
	// the rest): the next kernel then launches without PDL. Its pdl_wait waits for the
	// grid before it, not for the copy, which it could otherwise overtake.
	copied bool
	// gemmTune holds the cuBLASLt handle and the GEMM algorithm chosen per shape
	// (gemm_tune.go); nil until linear first tunes.
	gemmTune *gemmTuner
}

// DeviceInfo describes a device.
type DeviceInfo struct {
	Ordinal         int
	Name            string
	Arch            string // the NVRTC target, such as "sm_90"
	Major, Minor    int    // compute capability
	SMs             int
	TotalMem        uint64
	SharedOptin     int // the most dynamic shared memory a block may ask for
	NVRTC           string
	CublasVersion   int
	DriverVersion   int
	KernelCacheDir  string
	DriverLibrary   string
	NVRTCLibrary    string
	CublasLibraries [2]string
	PDL             bool // kernels of pdlFiles use programmatic dependent launch
}

func (i DeviceInfo) String() string {
	pdl := ""
	if i.PDL {
		pdl = ", programmatic dependent launch"
	}
	return fmt.Sprintf("GPU %d %s (%s, %d SMs, %.0f GiB), driver CUDA %d.%d, NVRTC %s, cuBLAS %d%s",
		i.Ordinal, i.Name, i.Arch, i.SMs, float64(i.TotalMem)/(1<<30), i.DriverVersion/1000, i.DriverVersion%1000/10, i.NVRTC, i.CublasVersion, pdl)
}

// Open prepares GPU ordinal for use. It fails, naming what is missing, when the driver,
// NVRTC or cuBLAS cannot be loaded or the GPU does not exist.
func Open(ordinal int) (*Device, error) {
	if err := cubind.Available(); err != nil {
		return nil, fmt.Errorf("cuda: open GPU %d: %w", ordinal, err)
	}
	dev, err := cubind.GetDevice(ordinal)
	if err != nil {
		return nil, fmt.Errorf("cuda: open GPU %d: %w", ordinal, err)
	}
	d := &Device{ordinal: ordinal, dev: dev, alloc: newAllocator(), modules: map[string]cubind.Module{}, funcs: map[string]cubind.Function{}}
	if err := d.describe(); err != nil {
		return nil, fmt.Errorf("cuda: open GPU %d: %w", ordinal, err)
	}
	d.pdl = usePDL(d.info.Major, cubind.HasPDL())
	d.info.PDL = d.pdl
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if d.ctx, err = dev.PrimaryCtxRetain(); err != nil {
		return nil, fmt.Errorf("cuda: open GPU %d: %w", ordinal, err)
	}
	fail := func(err error) (*Device, error) {
		d.release()
		return nil, fmt.Errorf("cuda: open GPU %d: %w", ordinal, err)
	}
	if err := d.ctx.SetCurrent(); err != nil {
		return fail(err)
	}
	if d.stream, err = cubind.StreamCreate(cubind.StreamNonBlocking); err != nil {
		return fail(err)
	}
	if d.blas, err = cubind.NewBLAS(); err != nil {
		return fail(err)
	}
	if err := d.blas.SetStream(d.stream); err != nil {
		return fail(err)
	}
	if d.info.CublasVersion, err = d.blas.Version(); err != nil {
		return fail(err)
	}
	if d.blasWork, err = d.alloc.alloc(blasWorkspaceBytes); err != nil {
		return fail(err)
	}
	if err := d.blas.SetWorkspace(d.blasWork.ptr, blasWorkspaceBytes); err != nil {
		return fail(err)
	}
	b, err := d.alloc.alloc(16)
	if err != nil {
		return fail(err)
	}
	d.errWord = b.ptr
	if err := d.memset32(d.errWord, 0, 4); err != nil {
		return fail(err)
	}
	return d, nil
}

// blasWorkspaceBytes is the size of cuBLAS's workspace (NVIDIA recommends 32 MiB on Hopper).
const blasWorkspaceBytes = 32 << 20

// describe fills d.info and the compiler settings.
func (d *Device) describe() error {
	i := &d.info
	i.Ordinal = d.ordinal
	var err error
	if i.Name, err = d.dev.Name(); err != nil {
		return err
	}
	if i.Major, i.Minor, err = d.dev.ComputeCapability(); err != nil {
		return err
	}
	i.Arch = fmt.Sprintf("sm_%d%d", i.Major, i.Minor)
	if i.SMs, err = d.dev.Attribute(cubind.AttrMultiprocessorCount); err != nil {
		return err
	}
	if i.SharedOptin, err = d.dev.Attribute(cubind.AttrMaxSharedMemoryPerBlockOptin); err != nil {
		return err
	}
	if i.TotalMem, err = d.dev.TotalMem(); err != nil {
		return err
	}
	if i.DriverVersion, err = cubind.DriverVersion(); err != nil {
		return err
	}
	ma, mi, err := cubind.NVRTCVersion()
	if err != nil {
		return err
	}
	i.NVRTC = fmt.Sprintf("%d.%d", ma, mi)
	if archs, err := cubind.NVRTCSupportedArchs(); err == nil && len(archs) > 0 && !slices.Contains(archs, i.Major*10+i.Minor) {
		return fmt.Errorf("NVRTC %s cannot compile for %s (it supports %v)", i.NVRTC, i.Arch, archs)
	}
	i.KernelCacheDir = CacheDir()
	i.DriverLibrary = cubind.DriverLibrary()
	i.NVRTCLibrary, _ = cubind.NVRTCLibrary()
	i.CublasLibraries[0], i.CublasLibraries[1], _ = cubind.CublasLibrary()
	d.comp = compiler{arch: i.Arch, nvrtc: i.NVRTC, dir: i.KernelCacheDir}
	return nil
}

// Info describes the device.
func (d *Device) Info() DeviceInfo { return d.info }

// Allocator returns the device's memory pool.
func (d *Device) Allocator() *Allocator { return d.alloc }

// CompileStats lists how each kernel file loaded so far was obtained (compiled or cached).
func (d *Device) CompileStats() []CompileStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.compile)
}

// errClosed is returned by every method of a closed Device.
var errClosed = errors.New("cuda: device is closed")

// do runs f with the device locked, the goroutine on one OS thread and the device's
// context current on it.
func (d *Device) do(f func() error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return errClosed
	}
	return d.current(f)
}

// unlocked runs f with the device's context current on the goroutine's OS thread but the
// device not locked, for waits that must not hold up launches from other goroutines: f may
// only call the driver (events, queries), never Device methods. The Device must not be
// closed meanwhile.
func (d *Device) unlocked(f func() error) error {
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return errClosed
	}
	return d.current(f)
}

// current runs f on one OS thread with the device's context current on it.
func (d *Device) current(f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := d.ctx.SetCurrent(); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	return f()
}

// Close waits for queued work, frees the device's memory and modules and releases the
// context. Tensors of the device must not be used afterwards.
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var errs []error
	if err := d.ctx.SetCurrent(); err != nil {
		errs = append(errs, err)
	} else if err := d.stream.Synchronize(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, d.release())
	d.closed = true
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("cuda: close GPU %d: %w", d.ordinal, err)
	}
	return nil
}

// release frees what Open acquired; the context must be current.
func (d *Device) release() error {
	var errs []error
	for name, m := range d.modules {
		if err := m.Unload(); err != nil {
			errs = append(errs, fmt.Errorf("unload %s: %w", strings.ReplaceAll(name, "\x00", " "), err))
		}
	}
	d.modules, d.funcs = nil, nil
	errs = append(errs, releaseGemmTune(d))
	if d.blas != nil {
		errs = append(errs, d.blas.Destroy())
	}
	if d.errWord != 0 {
		errs = append(errs, cubind.MemFree(d.errWord))
		d.errWord = 0
	}
	if d.blasWork != nil {
		d.alloc.release(d.blasWork)
		d.blasWork = nil
	}
	errs = append(errs, d.alloc.Trim())
	if d.stream != 0 {
		errs = append(errs, d.stream.Destroy())
	}
	if d.side != 0 {
		errs = append(errs, d.side.Destroy())
	}
	if d.ctx != 0 {
		errs = append(errs, d.dev.PrimaryCtxRelease())
	}
	return errors.Join(errs...)
}

// function returns the kernel name of kernel file file (with extra source appended, see
// kernelSource), compiling and loading the module on first use. The device must be locked
// with its context current.
func (d *Device) function(file, extra, name string) (cubind.Function, error) {
	key := file + "\x00" + extra + "\x00" + name
	if f, ok := d.funcs[key]; ok {
		return f, nil
	}
	mkey := file + "\x00" + extra
	m, ok := d.modules[mkey]
	if !ok {
		cubin, st, err := d.comp.cubin(file, extra)
		if err != nil {
			return 0, err
		}
		if m, err = cubind.ModuleLoadData(cubin); err != nil {
			return 0, fmt.Errorf("cuda: load kernels %s: %w", st.File, err)
		}
		d.modules[mkey] = m
		d.compile = append(d.compile, st)
	}
	f, err := m.Function(name)
	if err != nil {
		return 0, fmt.Errorf("cuda: %s: %w", file, err)
	}
	d.funcs[key] = f
	return f, nil
}

// launch runs kernel name of file with a grid and block, dynamic shared memory and
// the arguments built by args on d.args. The device must be locked with its context current.
func (d *Device) launch(file, name string, grid, block cubind.Dim3, shared int, args func(a *cubind.Args)) error {
	return d.launchX(file, "", name, grid, block, shared, args)
}

// launchX is launch for a kernel of a template-only file, instantiated by extra.
func (d *Device) launchX(file, extra, name string, grid, block cubind.Dim3, shared int, args func(a *cubind.Args)) error {
	f, pdl, err := d.prepare(file, extra, name, shared, args)
	if err != nil {
		return err
	}
	launch := cubind.LaunchKernel
	if pdl {
		launch = cubind.LaunchKernelPDL
	}
	if err := launch(f, grid, block, shared, d.stream, &d.args); err != nil {
		return fmt.Errorf("cuda: kernel %s: %w", name, err)
	}
	return nil
}

// prepare readies kernel name for a launch with shared bytes of dynamic shared memory: it
// loads it, raises its shared memory limit when needed and builds its arguments on d.args.
// It reports whether the launch may use PDL: a kernel of pdlFiles, on a device that uses
// it, not right after a copy (see Device.copied).
func (d *Device) prepare(file, extra, name string, shared int, args func(a *cubind.Args)) (cubind.Function, bool, error) {
	f, err := d.function(file, extra, name)
	if err != nil {
		return 0, false, err
	}
	if shared > 48<<10 {
		if shared > d.info.SharedOptin {
			return 0, false, fmt.Errorf("cuda: kernel %s needs %d bytes of shared memory, the device allows %d", name, shared, d.info.SharedOptin)
		}
		if err := f.SetMaxDynamicSharedMemory(shared); err != nil {
			return 0, false, fmt.Errorf("cuda: kernel %s: %w", name, err)
		}
	}
	d.args.Reset()
	args(&d.args)
	pdl := d.pdl && pdlFiles[file] && !d.copied
	d.copied = false
	return f, pdl, nil
}

// sideStream returns the device's side stream, created on first use. The device must be
// locked with its context current.
func (d *Device) sideStream() (cubind.Stream, error) {
	if d.side == 0 {
		s, err := cubind.StreamCreate(cubind.StreamNonBlocking)
		if err != nil {
			return 0, fmt.Errorf("cuda: side stream: %w", err)
		}
		d.side = s
	}
	return d.side, nil
}

// copyHtoD, copyDtoD, memset8 and memset32 queue a write of device memory on the device's
// stream other than a kernel: the next kernel then launches without PDL (see copied). The
// device must be locked with its context current.
func (d *Device) copyHtoD(dst cubind.DevicePtr, src []byte) error {
	d.copied = true
	return cubind.MemcpyHtoDAsync(dst, src, d.stream)
}

func (d *Device) copyDtoD(dst, src cubind.DevicePtr, n uint64) error {
	d.copied = true
	return cubind.MemcpyDtoDAsync(dst, src, n, d.stream)
}

func (d *Device) memset8(dst cubind.DevicePtr, v uint8, n uint64) error {
	d.copied = true
	return cubind.MemsetD8Async(dst, v, n, d.stream)
}

func (d *Device) memset32(dst cubind.DevicePtr, v uint32, n uint64) error {
	d.copied = true
	return cubind.MemsetD32Async(dst, v, n, d.stream)
}

// Sync waits for all queued work and reports its errors, including ids out of range that
// an embedding met since the last Sync.
func (d *Device) Sync() error { return d.do(d.sync) }

func (d *Device) sync() error {
	var w [4]int32
	if err := cubind.MemcpyDtoHAsync(w[:], d.errWord, d.stream); err != nil {
		return fmt.Errorf("cuda: sync: %w", err)
	}
	if err := d.stream.Synchronize(); err != nil {
		return fmt.Errorf("cuda: sync: %w", err)
	}
	return d.wordError(w)
}

// wordError turns a copy of the error word into the error it reports (nil for none) and,
// for an error, clears the word on the stream so that the next run starts clean.
func (d *Device) wordError(w [4]int32) error {
	if w[0] == 0 {
		return nil
	}
	if err := d.memset32(d.errWord, 0, 4); err != nil {
		return fmt.Errorf("cuda: sync: %w", err)
	}
	if err := pagedError(w); err != nil {
		return err
	}
	return fmt.Errorf("cuda: embedding: id %d (at position %d) is out of range for an embedding table of %d rows", w[1], w[2], w[3])
}

// Tensor is a dense, row-major tensor in device memory. A tensor from Alloc or Upload owns
// its memory until Free; a view (View) shares its parent's.
type Tensor struct {
	DType tensor.DType
	Shape []int
	ptr   cubind.DevicePtr
	blk   *block
	dev   *Device
}

// Ptr is the address of the first element.
func (t *Tensor) Ptr() cubind.DevicePtr { return t.ptr }

// Numel is the number of elements.
func (t *Tensor) Numel() int { return tensor.Numel(t.Shape) }

// Bytes is the size of the elements in bytes.
func (t *Tensor) Bytes() int { return t.Numel() * t.DType.Size() }

func (t *Tensor) String() string { return fmt.Sprintf("%s%v@%#x", t.DType, t.Shape, uint64(t.ptr)) }

// View returns a tensor of another shape with the same number of elements over t's memory.
func (t *Tensor) View(shape ...int) (*Tensor, error) {
	if tensor.Numel(shape) != t.Numel() {
		return nil, fmt.Errorf("cuda: view %v of %s: element counts differ", shape, t)
	}
	return &Tensor{DType: t.DType, Shape: slices.Clone(shape), ptr: t.ptr, dev: t.dev}, nil
}

// checkDType accepts the dtypes the device stores.
func checkDType(dt tensor.DType) error {
	if dt.Size() == 0 {
		return fmt.Errorf("cuda: dtype %s has no device form", dt)
	}
	return nil
}

// Alloc returns an uninitialised tensor.
func (d *Device) Alloc(dt tensor.DType, shape ...int) (*Tensor, error) {
	var t *Tensor
	err := d.do(func() error {
		var err error
		t, err = d.allocTensor(dt, shape)
		return err
	})
	return t, err
}

func (d *Device) allocTensor(dt tensor.DType, shape []int) (*Tensor, error) {
	if err := checkDType(dt); err != nil {
		return nil, err
	}
	for _, n := range shape {
		if n < 0 {
			return nil, fmt.Errorf("cuda: negative dimension in shape %v", shape)
		}
	}
	if d.capturing {
		return nil, errors.New("cuda: cannot allocate device memory while capturing a CUDA graph")
	}
	b, err := d.alloc.alloc(uint64(tensor.Numel(shape) * dt.Size()))
	if err != nil {
		return nil, err
	}
	return &Tensor{DType: dt, Shape: slices.Clone(shape), ptr: b.ptr, blk: b, dev: d}, nil
}

// Free returns t's memory to the pool (no-op for views and nil). Work already queued that
// reads t stays correct: later work that reuses the memory is queued after it.
func (d *Device) Free(t *Tensor) {
	if t == nil || t.blk == nil {
		return
	}
	d.alloc.release(t.blk)
	t.blk, t.ptr = nil, 0
}

// Upload copies a host tensor to a new device tensor.
func (d *Device) Upload(h *tensor.Tensor) (*Tensor, error) {
	var t *Tensor
	err := d.do(func() error {
		var err error
		t, err = d.upload(h)
		return err
	})
	return t, err
}

func (d *Device) upload(h *tensor.Tensor) (*Tensor, error) {
	if err := h.Validate(); err != nil {
		return nil, fmt.Errorf("cuda: upload: %w", err)
	}
	t, err := d.allocTensor(h.DType, h.Shape)
	if err != nil {
		return nil, fmt.Errorf("cuda: upload %s%v: %w", h.DType, h.Shape, err)
	}
	if err := d.copyHtoD(t.ptr, tensor.Bytes(h)); err != nil {
		d.Free(t)
		return nil, fmt.Errorf("cuda: upload %s%v: %w", h.DType, h.Shape, err)
	}
	return t, nil
}

// Download waits for queued work and copies t to a new host tensor.
func (d *Device) Download(t *Tensor) (*tensor.Tensor, error) {
	var h *tensor.Tensor
	err := d.do(func() error {
		var err error
		h, err = d.download(t)
		return err
	})
	return h, err
}

func (d *Device) download(t *Tensor) (*tensor.Tensor, error) {
	if t == nil || (t.ptr == 0 && t.Numel() > 0) {
		return nil, errors.New("cuda: download of a freed or nil tensor")
	}
	h := tensor.New(t.DType, t.Shape...)
	if err := cubind.MemcpyDtoHAsync(tensor.Bytes(h), t.ptr, d.stream); err != nil {
		return nil, fmt.Errorf("cuda: download %s: %w", t, err)
	}
	if err := d.sync(); err != nil {
		return nil, err
	}
	return h, nil
}

// dtypeName is the suffix kernels use for a dtype.
func dtypeName(dt tensor.DType) string { return strings.ToLower(dt.String()) }

// captureGraph records what queue launches on the device's stream into a CUDA graph and
// instantiates it; nothing runs. Allocating meanwhile is an error (capturing). The device
// must be locked (inside do).
func (d *Device) captureGraph(queue func() error) (cubind.GraphExec, error) {
	if err := d.stream.BeginCapture(cubind.CaptureModeThreadLocal); err != nil {
		return 0, err
	}
	d.capturing = true
	err := queue()
	d.capturing = false
	g, endErr := d.stream.EndCapture()
	if err == nil {
		err = endErr
	}
	if err != nil {
		if g != 0 {
			g.Destroy()
		}
		return 0, err
	}
	defer g.Destroy()
	return g.Instantiate()
}
