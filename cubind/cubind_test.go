package cubind

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/loom-ml/loom/internal/gputest"
)

// requireGPU skips the test, or fails it with LOOM_REQUIRE_GPU=1, unless n GPUs can be used
// (see internal/gputest).
func requireGPU(t testing.TB, n int) {
	t.Helper()
	found, err := 0, Available()
	if err == nil {
		found, err = DeviceCount()
	}
	gputest.Need(t, n, found, err)
}

// withGPU skips the test when no GPU is usable (fails it with LOOM_REQUIRE_GPU=1), else
// locks the goroutine to its thread and makes device 0's primary context current for the
// rest of the test.
func withGPU(t *testing.T) Device {
	t.Helper()
	requireGPU(t, 1)
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	d, err := GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, err := d.PrimaryCtxRetain()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.PrimaryCtxRelease() })
	if err := ctx.SetCurrent(); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestLoadErrorListsEveryPath(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(LibDirEnv, dir)
	bad := filepath.Join(dir, "libloomnothere.so.1")
	if err := os.WriteFile(bad, []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := openLibrary("libloomnothere", []string{"libloomnothere.so.1", "libloomnothere.so"}, true, []string{"/nonexistent-loom-dir"})
	var le *LoadError
	if !errors.As(err, &le) {
		t.Fatalf("got %v, want a *LoadError", err)
	}
	msg := err.Error()
	for _, want := range []string{
		bad + ": ", // found but not loadable: the loader's reason
		filepath.Join(dir, "libloomnothere.so") + ": not found", // from LOOM_CUDA_LIB_DIR
		"libloomnothere.so.1 (system loader search)",
		"/nonexistent-loom-dir/libloomnothere.so.1: not found",
		LibDirEnv,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("error lacks %q:\n%s", want, msg)
		}
	}
	if len(le.Tried) != 6 {
		t.Errorf("tried %d paths, want 6:\n%s", len(le.Tried), msg)
	}
}

func TestCompareVersions(t *testing.T) {
	if compareVersions("/usr/local/cuda-13.0", "/usr/local/cuda-12.8") <= 0 {
		t.Error("13.0 should sort after 12.8")
	}
	if compareVersions("/usr/local/cuda-12.10", "/usr/local/cuda-12.9") <= 0 {
		t.Error("12.10 should sort after 12.9")
	}
}

// Describe says why CUDA cannot be used, or names the driver, GPU 0 and each library that
// was opened, every field as the bindings report it (none left at a zero value because its
// query failed).
func TestDescribe(t *testing.T) {
	got := Describe()
	if err := Available(); err != nil {
		if want := "CUDA unavailable: " + err.Error(); got != want {
			t.Errorf("Describe() = %q, want %q", got, want)
		}
		requireGPU(t, 1)
		return
	}
	t.Log(got)
	dv, err := DriverVersion()
	if err != nil || dv < 11000 {
		t.Fatalf("DriverVersion() = %d, %v", dv, err)
	}
	d, err := GetDevice(0)
	if err != nil {
		t.Fatal(err)
	}
	name, err := d.Name()
	if err != nil || name == "" {
		t.Fatalf("Name() = %q, %v", name, err)
	}
	ma, mi, err := d.ComputeCapability()
	if err != nil || ma == 0 {
		t.Fatalf("ComputeCapability() = %d.%d, %v", ma, mi, err)
	}
	nm, nn, err := NVRTCVersion()
	if err != nil || nm == 0 {
		t.Fatalf("NVRTCVersion() = %d.%d, %v", nm, nn, err)
	}
	nv, err := NVRTCLibrary()
	if err != nil || nv == "" {
		t.Fatalf("NVRTCLibrary() = %q, %v", nv, err)
	}
	cb, lt, err := CublasLibrary()
	if err != nil || cb == "" {
		t.Fatalf("CublasLibrary() = %q, %q, %v", cb, lt, err)
	}
	if DriverLibrary() == "" {
		t.Error("DriverLibrary() is empty")
	}
	fields := []string{
		fmt.Sprintf("driver CUDA %d.%d (%s);", dv/1000, dv%1000/10, DriverLibrary()),
		fmt.Sprintf("; GPU 0 %s sm_%d%d;", name, ma, mi),
		fmt.Sprintf("; NVRTC %d.%d (%s);", nm, nn, nv),
		"; cuBLAS " + cb + ",",
	}
	if LtAvailable() == nil {
		v := CublasLtVersion()
		if lt == "" || v == 0 {
			t.Errorf("cuBLASLt is available, but its path is %q and its version %d", lt, v)
		}
		fields = append(fields, fmt.Sprintf(", cuBLASLt %s (version %d)", lt, v))
	}
	for _, f := range fields {
		if !strings.Contains(got, f) {
			t.Errorf("Describe() = %q lacks %q", got, f)
		}
	}
	if !strings.HasPrefix(got, "driver CUDA ") {
		t.Errorf("Describe() = %q, want it to start with the driver", got)
	}
}

func TestDriverMemory(t *testing.T) {
	d := withGPU(t)
	if n, err := DeviceCount(); err != nil || n < 1 {
		t.Fatalf("DeviceCount = %d, %v", n, err)
	}
	name, err := d.Name()
	if err != nil || name == "" {
		t.Fatalf("Name = %q, %v", name, err)
	}
	ma, mi, err := d.ComputeCapability()
	if err != nil || ma < 5 {
		t.Fatalf("ComputeCapability = %d.%d, %v", ma, mi, err)
	}
	total, err := d.TotalMem()
	if err != nil || total == 0 {
		t.Fatalf("TotalMem = %d, %v", total, err)
	}
	sms, _ := d.Attribute(AttrMultiprocessorCount)
	optin, _ := d.Attribute(AttrMaxSharedMemoryPerBlockOptin)
	t.Logf("%s sm_%d%d, %d SMs, %.1f GiB, %d KiB shared per block (opt-in)", name, ma, mi, sms, float64(total)/(1<<30), optin/1024)

	s, err := StreamCreate(StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	const n = 1000
	a, err := MemAlloc(4 * n)
	if err != nil {
		t.Fatal(err)
	}
	defer MemFree(a)
	b, err := MemAlloc(4 * n)
	if err != nil {
		t.Fatal(err)
	}
	defer MemFree(b)
	src := make([]float32, n)
	for i := range src {
		src[i] = float32(i) * 0.5
	}
	if err := MemcpyHtoDAsync(a, src, s); err != nil {
		t.Fatal(err)
	}
	if err := MemcpyDtoDAsync(b, a, 4*n, s); err != nil {
		t.Fatal(err)
	}
	if err := MemsetD32Async(b, math.Float32bits(7), 10, s); err != nil {
		t.Fatal(err)
	}
	if err := MemsetD8Async(b+DevicePtr(4*(n-1)), 0, 4, s); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, n)
	if err := MemcpyDtoHAsync(got, b, s); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	for i, v := range got {
		want := src[i]
		switch {
		case i < 10:
			want = 7
		case i == n-1:
			want = 0
		}
		if v != want {
			t.Fatalf("element %d = %v, want %v", i, v, want)
		}
	}
	free, tot, err := MemGetInfo()
	if err != nil || free == 0 || tot < free {
		t.Errorf("MemGetInfo = %d, %d, %v", free, tot, err)
	}
}

func TestErrorsNameTheCall(t *testing.T) {
	withGPU(t)
	_, err := MemAlloc(1 << 50)
	if err == nil {
		t.Fatal("allocating 2^50 bytes succeeded")
	}
	if !strings.Contains(err.Error(), "cuMemAlloc_v2") || !strings.Contains(err.Error(), "CUDA_ERROR_") {
		t.Errorf("error %q should name cuMemAlloc_v2 and a CUDA_ERROR_ status", err)
	}
	if strings.Contains(err.Error(), "CUDA_ERROR_OUT_OF_MEMORY") != IsOutOfMemory(err) {
		t.Errorf("IsOutOfMemory(%q) = %v", err, IsOutOfMemory(err))
	}
	t.Logf("sample errors: %v", err)
	_, err = ModuleLoadData([]byte("this is neither a cubin nor PTX\x00"))
	if err == nil || !strings.Contains(err.Error(), "cuModuleLoadData") || !strings.Contains(err.Error(), "CUDA_ERROR_") {
		t.Errorf("loading a bad image: %v", err)
	}
	t.Logf("sample errors: %v", err)
}

const testKernels = `
struct Affine { float a; int pad; long long n; };
extern "C" __global__ void affine(float* y, const float* x, Affine p, float b) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < p.n) y[i] = p.a * x[i] + b;
}
extern "C" __global__ void incr(int* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 2;
}
`

// kernelOnStream compiles src, returns its kernel name and a new non-blocking stream,
// destroyed when the test ends.
func kernelOnStream(t *testing.T, d Device, src, name string) (Function, Stream) {
	t.Helper()
	f, err := compileTest(t, d, src).Function(name)
	if err != nil {
		t.Fatal(err)
	}
	s, err := StreamCreate(StreamNonBlocking)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Destroy() })
	return f, s
}

func compileTest(t *testing.T, d Device, src string) Module {
	t.Helper()
	ma, mi, err := d.ComputeCapability()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	cubin, log, err := CompileCUBIN(src, "test.cu", []string{"--gpu-architecture=sm_" + string(rune('0'+ma)) + string(rune('0'+mi)), "-default-device"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("NVRTC: %d-byte cubin in %v; log %q", len(cubin), time.Since(start).Round(time.Millisecond), log)
	m, err := ModuleLoadData(cubin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Unload() })
	return m
}

func TestNVRTCAndLaunch(t *testing.T) {
	d := withGPU(t)
	ma, mi, err := NVRTCVersion()
	if err != nil {
		t.Fatal(err)
	}
	archs, _ := NVRTCSupportedArchs()
	t.Logf("NVRTC %d.%d, archs %v", ma, mi, archs)
	m := compileTest(t, d, testKernels)
	f, err := m.Function("affine")
	if err != nil {
		t.Fatal(err)
	}
	const n = 1000
	x, _ := MemAlloc(4 * n)
	y, _ := MemAlloc(4 * n)
	defer MemFree(x)
	defer MemFree(y)
	src := make([]float32, n)
	for i := range src {
		src[i] = float32(i)
	}
	if err := MemcpyHtoDAsync(x, src, 0); err != nil {
		t.Fatal(err)
	}
	// struct Affine { float a; int pad; long long n; } is 16 bytes.
	blob := make([]byte, 16)
	putU32(blob[0:], math.Float32bits(3))
	putU64(blob[8:], n)
	var args Args
	args.Ptr(y).Ptr(x).Struct(blob).F32(-1)
	if err := LaunchKernel(f, Dim3{(n + 127) / 128, 1, 1}, Dim3{128, 1, 1}, 0, 0, &args); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, n)
	if err := MemcpyDtoHAsync(got, y, 0); err != nil {
		t.Fatal(err)
	}
	if err := CtxSynchronize(); err != nil {
		t.Fatal(err)
	}
	for i, v := range got {
		if v != 3*float32(i)-1 {
			t.Fatalf("y[%d] = %v, want %v", i, v, 3*float32(i)-1)
		}
	}
	// A launch with an impossible block size fails with the call named.
	err = LaunchKernel(f, Dim3{1, 1, 1}, Dim3{4096, 1, 1}, 0, 0, &args)
	if err == nil || !strings.Contains(err.Error(), "cuLaunchKernel") {
		t.Errorf("launch with 4096 threads per block: %v", err)
	}
}

func TestNVRTCCompileError(t *testing.T) {
	d := withGPU(t)
	ma, mi, _ := d.ComputeCapability()
	_, _, err := CompileCUBIN(`extern "C" __global__ void broken(float* x) { x[0] = undefined_name; }`, "broken.cu",
		[]string{"--gpu-architecture=sm_" + string(rune('0'+ma)) + string(rune('0'+mi))})
	var ce *CompileError
	if !errors.As(err, &ce) {
		t.Fatalf("got %v, want a *CompileError", err)
	}
	if !strings.Contains(err.Error(), "NVRTC_ERROR_COMPILATION") || !strings.Contains(ce.Log, "undefined_name") {
		t.Errorf("compile error lacks the status or the log:\n%v", err)
	}
}

// CompilePTX gives the PTX of a kernel for a virtual architecture (NVRTC only, no GPU),
// and the log of a failed compilation.
func TestCompilePTX(t *testing.T) {
	_, err := NVRTCLibrary()
	gputest.Missing(t, "NVRTC", err)
	ptx, _, err := CompilePTX(`extern "C" __global__ void incr(float* x) { x[threadIdx.x] += 1.0f; }`, "incr.cu",
		[]string{"--gpu-architecture=compute_80"})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{".target sm_80", ".entry incr(", "ld.global.f32", "st.global.f32"} {
		if !strings.Contains(ptx, want) {
			t.Errorf("PTX lacks %q:\n%s", want, ptx)
		}
	}
	if strings.ContainsRune(ptx, 0) {
		t.Error("PTX holds a NUL byte")
	}
	_, _, err = CompilePTX(`extern "C" __global__ void broken(float* x) { x[0] = undefined_name; }`, "broken.cu",
		[]string{"--gpu-architecture=compute_80"})
	var ce *CompileError
	if !errors.As(err, &ce) || !strings.Contains(ce.Log, "undefined_name") {
		t.Errorf("got %v, want a *CompileError whose log names undefined_name", err)
	}
}

func TestEventsAndGraphs(t *testing.T) {
	d := withGPU(t)
	f, s := kernelOnStream(t, d, testKernels, "incr")
	const n = 1 << 20
	x, _ := MemAlloc(4 * n)
	defer MemFree(x)
	if err := MemsetD32Async(x, 0, n, s); err != nil {
		t.Fatal(err)
	}
	start, _ := EventCreate(EventDefault)
	end, _ := EventCreate(EventDefault)
	defer start.Destroy()
	defer end.Destroy()
	var args Args
	args.Ptr(x).I32(n)
	if err := start.Record(s); err != nil {
		t.Fatal(err)
	}
	if err := LaunchKernel(f, Dim3{n / 256, 1, 1}, Dim3{256, 1, 1}, 0, s, &args); err != nil {
		t.Fatal(err)
	}
	if err := end.Record(s); err != nil {
		t.Fatal(err)
	}
	if err := end.Synchronize(); err != nil {
		t.Fatal(err)
	}
	el, err := Elapsed(start, end)
	if err != nil || el <= 0 {
		t.Errorf("Elapsed = %v, %v", el, err)
	}
	t.Logf("incr over %d ints: %v", n, el)

	// Capture two launches into a graph and replay it three times: +2 +2 per replay.
	exe := captureOn(t, s, func() error {
		for range 2 {
			if err := LaunchKernel(f, Dim3{n / 256, 1, 1}, Dim3{256, 1, 1}, 0, s, &args); err != nil {
				return err
			}
		}
		return nil
	})
	defer exe.Destroy()
	for i, v := range launchThenRead(t, s, exe, 3, x, n) {
		if v != 2+3*4 {
			t.Fatalf("x[%d] = %d after one launch and 3 graph replays, want 14", i, v)
		}
	}
}

func bf16(f float32) uint16 {
	u := math.Float32bits(f)
	u += 0x7fff + (u>>16)&1
	return uint16(u >> 16)
}

func f32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

func TestGemmEx(t *testing.T) {
	withGPU(t)
	blas, err := NewBLAS()
	if err != nil {
		t.Fatal(err)
	}
	defer blas.Destroy()
	v, err := blas.Version()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cuBLAS version %d, cuBLASLt %d", v, CublasLtVersion())
	rng := rand.New(rand.NewPCG(1, 2))
	// Row-major y[M,N] = x[M,K] @ w[N,K]^T, as the column-major product yᵀ = w·xᵀ.
	const M, N, K = 5, 7, 33
	x, w := make([]uint16, M*K), make([]uint16, N*K)
	for i := range x {
		x[i] = bf16(rng.Float32()*2 - 1)
	}
	for i := range w {
		w[i] = bf16(rng.Float32()*2 - 1)
	}
	dx, _ := MemAlloc(2 * M * K)
	dw, _ := MemAlloc(2 * N * K)
	dy, _ := MemAlloc(4 * M * N)
	defer MemFree(dx)
	defer MemFree(dw)
	defer MemFree(dy)
	MemcpyHtoDAsync(dx, x, 0)
	MemcpyHtoDAsync(dw, w, 0)
	err = blas.GemmEx(OpT, OpN, N, M, K, 1, Matrix{dw, R16BF, K}, Matrix{dx, R16BF, K}, 0, Matrix{dy, R32F, N}, Compute32F)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]float32, M*N)
	if err := MemcpyDtoHAsync(got, dy, 0); err != nil {
		t.Fatal(err)
	}
	maxErr := 0.0
	for m := range M {
		for n := range N {
			var want float64
			for k := range K {
				want += float64(f32(x[m*K+k])) * float64(f32(w[n*K+k]))
			}
			e := math.Abs(float64(got[m*N+n]) - want)
			maxErr = max(maxErr, e)
			if !(e <= 1e-4) {
				t.Errorf("y[%d,%d] = %v, want %v", m, n, got[m*N+n], want)
			}
		}
	}
	t.Logf("bf16 GEMM %dx%dx%d with f32 output: max abs error %.3g", M, N, K, maxErr)
	// Bad arguments are reported with the status name.
	err = blas.GemmEx(OpT, OpN, N, M, K, 1, Matrix{dw, R16BF, 1}, Matrix{dx, R16BF, K}, 0, Matrix{dy, R32F, N}, Compute32F)
	if err == nil || !strings.Contains(err.Error(), "cublasGemmEx") || !strings.Contains(err.Error(), "CUBLAS_STATUS_INVALID_VALUE") {
		t.Errorf("GemmEx with lda < k: %v", err)
	}
}

func putU32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

func putU64(b []byte, v uint64) {
	putU32(b, uint32(v))
	putU32(b[4:], uint32(v>>32))
}

// The C layouts cuLaunchKernelEx reads: CUlaunchConfig is 56 bytes with the stream at 32,
// the attributes at 40 and their count at 48; CUlaunchAttribute is 72 bytes with the value
// at 8.
func TestLaunchConfigLayout(t *testing.T) {
	var c launchConfig
	var a launchAttribute
	for _, tc := range []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof(CUlaunchConfig)", unsafe.Sizeof(c), 56},
		{"offsetof(hStream)", unsafe.Offsetof(c.stream), 32},
		{"offsetof(attrs)", unsafe.Offsetof(c.attrs), 40},
		{"offsetof(numAttrs)", unsafe.Offsetof(c.numAttrs), 48},
		{"sizeof(CUlaunchAttribute)", unsafe.Sizeof(a), 72},
		{"offsetof(value)", unsafe.Offsetof(a.value), 8},
	} {
		if tc.got != tc.want {
			t.Errorf("%s = %d, want %d", tc.name, tc.got, tc.want)
		}
	}
}

const pdlKernel = `
extern "C" __global__ void pdl_incr(int* x, int n) {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;");
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1;
}
`

// A chain of programmatic dependent launches, each reading what the one before wrote,
// eagerly and captured in a CUDA graph, counts exactly: each kernel's wait orders it after
// the previous kernel although it may start early.
func TestLaunchKernelPDL(t *testing.T) {
	d := withGPU(t)
	if ma, _, _ := d.ComputeCapability(); ma < 9 {
		t.Skipf("programmatic dependent launch needs compute capability 9.0, the GPU has %d.x", ma)
	}
	if !HasPDL() {
		t.Fatal("the driver has no cuLaunchKernelEx")
	}
	f, s := kernelOnStream(t, d, pdlKernel, "pdl_incr")
	const n, chain = 1 << 22, 50
	x, _ := MemAlloc(4 * n)
	defer MemFree(x)
	if err := MemsetD32Async(x, 0, n, s); err != nil {
		t.Fatal(err)
	}
	var args Args
	args.Ptr(x).I32(n)
	launchChain := func() error {
		for range chain {
			if err := LaunchKernelPDL(f, Dim3{n / 256, 1, 1}, Dim3{256, 1, 1}, 0, s, &args); err != nil {
				return err
			}
		}
		return nil
	}
	if err := launchChain(); err != nil {
		t.Fatal(err)
	}
	exe := captureOn(t, s, launchChain)
	defer exe.Destroy()
	for i, v := range launchThenRead(t, s, exe, 3, x, n) {
		if v != 4*chain {
			t.Fatalf("x[%d] = %d after 4 chains of %d increments, want %d", i, v, chain, 4*chain)
		}
	}
	// What PDL saves per kernel: a graph of 200 one-block kernels, with and without.
	for _, pdl := range []bool{false, true} {
		launch := LaunchKernel
		if pdl {
			launch = LaunchKernelPDL
		}
		var small Args
		small.Ptr(x).I32(32)
		exe := captureOn(t, s, func() error {
			for range 200 {
				if err := launch(f, Dim3{1, 1, 1}, Dim3{32, 1, 1}, 0, s, &small); err != nil {
					return err
				}
			}
			return nil
		})
		exe.Launch(s)
		s.Synchronize()
		start := time.Now()
		for range 10 {
			exe.Launch(s)
		}
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
		t.Logf("graph of 200 one-block kernels, PDL %v: %.2f µs per kernel", pdl, float64(time.Since(start).Microseconds())/2000)
		exe.Destroy()
	}
}

// captureOn records what queue launches on s into a graph, instantiated; the test fails
// on an error. The caller destroys the result.
func captureOn(t *testing.T, s Stream, queue func() error) GraphExec {
	t.Helper()
	if err := s.BeginCapture(CaptureModeThreadLocal); err != nil {
		t.Fatal(err)
	}
	err := queue()
	g, endErr := s.EndCapture()
	if err != nil || endErr != nil {
		if g != 0 {
			g.Destroy()
		}
		t.Fatal(err, endErr)
	}
	defer g.Destroy()
	exe, err := g.Instantiate()
	if err != nil {
		t.Fatal(err)
	}
	return exe
}

// launchThenRead replays exe times times on s and returns the n int32 at x.
func launchThenRead(t *testing.T, s Stream, exe GraphExec, times int, x DevicePtr, n int) []int32 {
	t.Helper()
	for range times {
		if err := exe.Launch(s); err != nil {
			t.Fatal(err)
		}
	}
	got := make([]int32, n)
	if err := MemcpyDtoHAsync(got, x, s); err != nil {
		t.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	return got
}
