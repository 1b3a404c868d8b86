package cuda

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loom-ml/loom/backend/cpu"
	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/internal/gputest"
	"github.com/loom-ml/loom/tensor"
)

// The GPU tests compare every kernel with the backend/cpu kernel of the same op on random
// inputs, and report each comparison's largest errors in a table printed after the tests.
//
// Tolerances, |got - want| <= atol + rtol*|want| element by element:
//   - bit-exact ops (embedding, add, mul, cast and the copies): 0.
//   - f32 results of rmsnorm, add_rmsnorm, rope and swiglu: rtol 1e-5, atol 1e-6 (the
//     kernels round like the CPU's; sums of squares and exp differ in the last bits only).
//   - bf16 results of those: rtol 2^-7 (one bf16 ulp) and atol 1e-6.
//   - sdpa f32: rtol 1e-4, atol 2e-5; sdpa bf16: rtol 2^-7, atol 2^-7·max|v| (the GPU never
//     rounds probabilities to bf16, the decomposition does).
//   - linear: relative to m = Σ|x·w| of each output: f32 x f32 1e-5·m; bf16 x bf16, rounded
//     to bf16: 2^-7·|want| + 1e-5·m; f32 x with bf16 w (x rounded to bf16 on the GPU): 2^-8·m.

var (
	testDev    *Device
	testDevErr error

	resultsMu sync.Mutex
	results   []result
)

type result struct {
	op, name    string
	maxAbs, rel float64 // largest absolute error, and largest error relative to the max |want|
	n, bad      int
}

func TestMain(m *testing.M) {
	// Kernel cache in a fresh folder, so the run measures compilation.
	dir, err := os.MkdirTemp("", "loom-cuda-test-")
	if err == nil {
		os.Setenv(CacheDirEnv, dir)
	}
	if err := cubind.Available(); err != nil {
		testDevErr = err
	} else {
		testDev, testDevErr = Open(0)
	}
	if testDevErr != nil && gputest.Required() {
		fmt.Println(gputest.Env+"=1, but no GPU can be used:", testDevErr)
		os.Exit(1)
	}
	code := m.Run()
	if testDev != nil {
		printSummary()
		if err := testDev.Close(); err != nil {
			fmt.Println("close:", err)
			code = 1
		}
	}
	if dir != "" {
		os.RemoveAll(dir)
	}
	os.Exit(code)
}

func printSummary() {
	fmt.Println("== device:", testDev.Info())
	for _, st := range testDev.CompileStats() {
		fmt.Printf("== kernels %-16s cubin %7d bytes, %s in %v\n", st.File, st.CubinLen, map[bool]string{true: "cache hit", false: "compiled"}[st.Cached], st.Elapsed.Round(1e6))
	}
	as := testDev.Allocator().Stats()
	fmt.Printf("== allocator: %d requests, %d reused, %d driver allocations, peak %d bytes\n", as.Allocs, as.Reused, as.DriverMem, as.Peak)
	resultsMu.Lock()
	defer resultsMu.Unlock()
	sort.SliceStable(results, func(i, j int) bool { return results[i].op < results[j].op })
	worst := map[string]result{}
	var ops []string
	for _, r := range results {
		w, ok := worst[r.op]
		if !ok {
			ops = append(ops, r.op)
		}
		if !ok || r.maxAbs > w.maxAbs {
			worst[r.op] = r
		}
	}
	fmt.Println("== max errors per op (worst case; all cases below):")
	for _, op := range ops {
		w := worst[op]
		fmt.Printf("==   %-12s max abs %.3g (%.3g of max |want|) in %s\n", op, w.maxAbs, w.rel, w.name)
	}
	for _, r := range results {
		status := "ok"
		if r.bad > 0 {
			status = fmt.Sprintf("FAIL %d/%d", r.bad, r.n)
		}
		fmt.Printf("==   %-12s %-58s n=%-8d max abs %-10.3g rel %-10.3g %s\n", r.op, r.name, r.n, r.maxAbs, r.rel, status)
	}
}

// requireGPU skips the test, or fails it with LOOM_REQUIRE_GPU=1, unless n GPUs can be used
// (see internal/gputest); GPU 0 must be the open test device.
func requireGPU(t testing.TB, n int) {
	t.Helper()
	found, err := 0, testDevErr
	if testDev != nil {
		found, err = cubind.DeviceCount()
	}
	gputest.Need(t, n, found, err)
}

// gpu returns the test device, or skips the test (fails it with LOOM_REQUIRE_GPU=1).
func gpu(t *testing.T) *Device {
	t.Helper()
	requireGPU(t, 1)
	return testDev
}

// randTensor returns a tensor of dtype dt with uniform values in [lo, hi), rounded to dt.
func randTensor(rng *rand.Rand, dt tensor.DType, shape []int, lo, hi float64) *tensor.Tensor {
	f := make([]float32, tensor.Numel(shape))
	for i := range f {
		f[i] = float32(lo + (hi-lo)*rng.Float64())
	}
	return tensor.FromF32(f, shape...).Cast(dt)
}

// randInts returns an integer tensor with values in [0, n).
func randInts(rng *rand.Rand, dt tensor.DType, shape []int, n int) *tensor.Tensor {
	t := tensor.New(dt, shape...)
	for i := range t.Numel() {
		v := rng.IntN(n)
		if dt == tensor.I64 {
			t.I64[i] = int64(v)
		} else {
			t.I32[i] = int32(v)
		}
	}
	return t
}

// opGraph is the graph of one op node: one graph input per tensor (x0, x1, ...), the node's
// outputs as the graph's outputs, and the feeds that bind the inputs to in.
func opGraph(t *testing.T, op string, attrs graph.Attrs, in ...*tensor.Tensor) (*graph.Graph, map[string]*tensor.Tensor) {
	t.Helper()
	b := graph.NewBuilder(op)
	vals := make([]*graph.Value, len(in))
	feeds := map[string]*tensor.Tensor{}
	for i, x := range in {
		name := fmt.Sprintf("x%d", i)
		vals[i] = b.Input(name, x.DType, graph.Dims(x.Shape...))
		feeds[name] = x
	}
	b.Output(b.Apply(op, attrs, vals...)...)
	g, err := b.Build()
	if err != nil {
		t.Fatalf("build %s: %v", op, err)
	}
	return g, feeds
}

// cpuOp runs op on the CPU backend: one graph input per tensor, the node's outputs as the
// graph's outputs.
func cpuOp(t *testing.T, op string, attrs graph.Attrs, in ...*tensor.Tensor) []*tensor.Tensor {
	t.Helper()
	g, feeds := opGraph(t, op, attrs, in...)
	p, err := cpu.Compile(context.Background(), g, nil)
	if err != nil {
		t.Fatalf("cpu compile %s: %v", op, err)
	}
	out, err := p.Run(context.Background(), feeds)
	if err != nil {
		t.Fatalf("cpu %s: %v", op, err)
	}
	return out
}

// up uploads host tensors.
func up(t *testing.T, d *Device, hs ...*tensor.Tensor) []*Tensor {
	t.Helper()
	out := make([]*Tensor, len(hs))
	for i, h := range hs {
		x, err := d.Upload(h)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = x
		t.Cleanup(func() { d.Free(x) })
	}
	return out
}

// like allocates device tensors shaped like the given host tensors.
func like(t *testing.T, d *Device, hs ...*tensor.Tensor) []*Tensor {
	t.Helper()
	out := make([]*Tensor, len(hs))
	for i, h := range hs {
		x, err := d.Alloc(h.DType, h.Shape...)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = x
		t.Cleanup(func() { d.Free(x) })
	}
	return out
}

func down(t *testing.T, d *Device, x *Tensor) *tensor.Tensor {
	t.Helper()
	h, err := d.Download(x)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// tol is an elementwise tolerance; scale, when set, gives a per-element magnitude that
// rtol multiplies instead of |want|.
type tol struct {
	atol, rtol float64
	scale      []float64
}

var (
	exact  = tol{}
	tolF32 = tol{atol: 1e-6, rtol: 1e-5}
	tolBF  = tol{atol: 1e-6, rtol: 1.0 / 128}
)

// tolFor is tolF32 or tolBF by the result's dtype.
func tolFor(dt tensor.DType) tol {
	if dt == tensor.BF16 {
		return tolBF
	}
	return tolF32
}

// compare checks got against want elementwise and records the errors.
func compare(t *testing.T, op, name string, got, want *tensor.Tensor, tl tol) {
	t.Helper()
	if got.DType != want.DType || !slices.Equal(got.Shape, want.Shape) {
		t.Errorf("%s %s: got %s%v, want %s%v", op, name, got.DType, got.Shape, want.DType, want.Shape)
		return
	}
	r := result{op: op, name: name, n: want.Numel()}
	maxWant := 0.0
	var msgs []string
	for i := range want.Numel() {
		g, w := got.At(i), want.At(i)
		if math.IsNaN(w) || math.IsNaN(g) {
			if math.IsNaN(w) != math.IsNaN(g) {
				r.bad++
				if len(msgs) < 5 {
					msgs = append(msgs, fmt.Sprintf("element %d = %v, want %v", i, g, w))
				}
			}
			continue
		}
		maxWant = max(maxWant, math.Abs(w))
		e := math.Abs(g - w)
		r.maxAbs = max(r.maxAbs, e)
		mag := math.Abs(w)
		if tl.scale != nil {
			mag = tl.scale[i]
		}
		if e > tl.atol+tl.rtol*mag {
			r.bad++
			if len(msgs) < 5 {
				msgs = append(msgs, fmt.Sprintf("element %d = %v, want %v (error %.3g, allowed %.3g)", i, g, w, e, tl.atol+tl.rtol*mag))
			}
		}
	}
	if maxWant > 0 {
		r.rel = r.maxAbs / maxWant
	}
	resultsMu.Lock()
	results = append(results, r)
	resultsMu.Unlock()
	if r.bad > 0 {
		t.Errorf("%s %s: %d of %d elements out of tolerance:\n  %s", op, name, r.bad, r.n, strings.Join(msgs, "\n  "))
	}
}

// coldWeights returns bytes of bf16 weights on d (random values repeated): more than L2
// holds, for timings that rotate through copies so that every weight comes from HBM.
func coldWeights(t *testing.T, d *Device, rng *rand.Rand, bytes int) *Tensor {
	t.Helper()
	buf, err := d.Alloc(tensor.BF16, bytes/2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Free(buf) })
	const chunk = 32 << 20
	seed := up(t, d, randTensor(rng, tensor.BF16, []int{chunk / 2}, -1, 1))[0]
	if err := d.do(func() error {
		for off := 0; off+chunk <= bytes; off += chunk {
			if err := cubind.MemcpyDtoDAsync(buf.ptr+cubind.DevicePtr(off), seed.ptr, chunk, d.stream); err != nil {
				return err
			}
		}
		return d.sync()
	}); err != nil {
		t.Fatal(err)
	}
	return buf
}

// zeroed allocates a zero-filled tensor on d for the test.
func zeroed(t *testing.T, d *Device, dt tensor.DType, shape ...int) *Tensor {
	t.Helper()
	x := like(t, d, tensor.New(dt, shape...))[0]
	if err := d.do(func() error { return cubind.MemsetD8Async(x.ptr, 0, uint64(x.Bytes()), d.stream) }); err != nil {
		t.Fatal(err)
	}
	return x
}

// wallTime calls f warm times, then n times, and returns the wall time of one of the n
// calls, the queued work included (the device is synchronised before and after).
func wallTime(d *Device, warm, n int, f func() error) (time.Duration, error) {
	for range warm {
		if err := f(); err != nil {
			return 0, err
		}
	}
	if err := d.Sync(); err != nil {
		return 0, err
	}
	start := time.Now()
	for range n {
		if err := f(); err != nil {
			return 0, err
		}
	}
	if err := d.Sync(); err != nil {
		return 0, err
	}
	return time.Since(start) / time.Duration(n), nil
}

// errCapture marks a capturedCallTime error of the capture itself (such as a call that
// allocates), as opposed to one of the replays.
var errCapture = errors.New("capture")

// capturedCallTime captures n calls of call(i) into a CUDA graph and returns the device time
// of one call over reps replays (replayTime). The device must be locked (inside do).
func capturedCallTime(d *Device, n, reps int, call func(i int) error) (time.Duration, error) {
	exe, err := d.captureGraph(func() error {
		for i := range n {
			if err := call(i); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errCapture, err)
	}
	defer exe.Destroy()
	el, err := replayTime(d, exe, reps)
	return el / time.Duration(n), err
}

// replayTime launches exe once to warm up, then reps times between two events, and returns
// the time of one replay. The device must be locked (inside do).
func replayTime(d *Device, exe cubind.GraphExec, reps int) (time.Duration, error) {
	start, err := cubind.EventCreate(cubind.EventDefault)
	if err != nil {
		return 0, err
	}
	defer start.Destroy()
	end, err := cubind.EventCreate(cubind.EventDefault)
	if err != nil {
		return 0, err
	}
	defer end.Destroy()
	if err := exe.Launch(d.stream); err != nil {
		return 0, err
	}
	if err := start.Record(d.stream); err != nil {
		return 0, err
	}
	for range reps {
		if err := exe.Launch(d.stream); err != nil {
			return 0, err
		}
	}
	if err := end.Record(d.stream); err != nil {
		return 0, err
	}
	if err := end.Synchronize(); err != nil {
		return 0, err
	}
	el, err := cubind.Elapsed(start, end)
	return el / time.Duration(reps), err
}

// nvrtcArch is the architecture the compile-only tests build for: the GPU's when one is
// present, else sm_90 when NVRTC knows it, else sm_80. It skips the test without NVRTC
// (fails it with LOOM_REQUIRE_GPU=1).
func nvrtcArch(t *testing.T) string {
	t.Helper()
	_, err := cubind.NVRTCLibrary()
	gputest.Missing(t, "NVRTC", err)
	if testDev != nil {
		return testDev.info.Arch
	}
	if archs, _ := cubind.NVRTCSupportedArchs(); slices.Contains(archs, 90) {
		return "sm_90"
	}
	return "sm_80"
}

// compileOnly compiles kernel file with extra appended for arch with NVRTC, as the device
// would, and returns the cubin (nil after reporting an error).
func compileOnly(t *testing.T, file, extra, arch string) []byte {
	t.Helper()
	src, err := kernelSource(file, extra)
	if err != nil {
		t.Error(err)
		return nil
	}
	cubin, log, err := cubind.CompileCUBIN(src, file, append([]string{"--gpu-architecture=" + arch}, kernelOptions(file)...))
	if err != nil {
		t.Errorf("%s %s: %v\n%s", file, extra, err, log)
		return nil
	}
	return cubin
}

// ptxasUsage compiles file with the extra instantiations for arch, with ptxas's verbose
// report, and returns each kernel's part of the report (stack frame, spills, registers) by
// name.
func ptxasUsage(t *testing.T, file, extra, arch string) map[string]string {
	t.Helper()
	src, err := kernelSource(file, extra)
	if err != nil {
		t.Fatal(err)
	}
	_, log, err := cubind.CompileCUBIN(src, file, append([]string{"--gpu-architecture=" + arch, "--ptxas-options=-v"}, kernelOptions(file)...))
	if err != nil {
		t.Fatalf("%v\n%s", err, log)
	}
	usage := map[string]string{}
	for _, k := range strings.Split(log, "Compiling entry function '")[1:] {
		name, info, _ := strings.Cut(k, "'")
		usage[name] = info
	}
	if len(usage) == 0 {
		t.Fatalf("%s: no kernel in the ptxas report:\n%s", file, log)
	}
	return usage
}

// checkNoSpills fails t for every kernel of usage (ptxasUsage) that uses local memory: a
// stack frame or spills, whose latency lands on the critical path of every call.
func checkNoSpills(t *testing.T, usage map[string]string) {
	t.Helper()
	for _, name := range slices.Sorted(maps.Keys(usage)) {
		if info := usage[name]; !strings.Contains(info, " 0 bytes stack frame, 0 bytes spill stores") {
			t.Errorf("%s uses local memory:%s", name, info)
		}
	}
}
