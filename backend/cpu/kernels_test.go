package cpu

import (
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/loom-ml/loom/tensor"
)

// withKernelSet runs f with s as linear's kernel set, then restores the set that was active.
func withKernelSet(s kernelSet, f func()) {
	prev := activeKernels
	useKernelSet(s)
	defer useKernelSet(prev)
	f()
}

// TestKernelSets runs the fast-kernel and MoE tests on every kernel set this build and CPU
// support (each against the reference kernels, within the tolerances of TestFastKernels), so
// that one test run covers them all, whichever set is the default.
func TestKernelSets(t *testing.T) {
	skipMissingSets(t)
	for _, s := range kernelSets {
		t.Run(s.name, func(t *testing.T) {
			withKernelSet(s, func() { runKernelTests(t) })
		})
	}
}

// runKernelTests runs the fast-kernel and MoE tests as subtests of t, under the kernel set
// in use.
func runKernelTests(t *testing.T) {
	t.Run("FastKernels", TestFastKernels)
	t.Run("FastKernelsDeterministic", TestFastKernelsDeterministic)
	t.Run("FastMoE", TestFastMoE)
	t.Run("MoEAllToAllKernels", TestMoEAllToAllKernels)
}

// skipMissingSets reports, as a skipped subtest each, the sets of this build that the CPU
// cannot run, naming the feature it lacks (kernelNotes: "<set> needs <features>").
func skipMissingSets(t *testing.T) {
	for _, note := range kernelNotes {
		if name, need, ok := strings.Cut(note, " needs "); ok {
			t.Run(name, func(t *testing.T) { t.Skipf("this CPU lacks %s", need) })
		}
	}
}

// linearInputs returns x f32[M,K] and w [N,K] of dtype dw with values in [-1, 1).
func linearInputs(rng *rand.Rand, M, N, K int, dw tensor.DType) (*tensor.Tensor, *tensor.Tensor) {
	return randTensor(rng, tensor.F32, []int{M, K}, -1, 1), randTensor(rng, dw, []int{N, K}, -1, 1)
}

// linearShapes are the shapes of the bit-level kernel tests: M below, at and above the
// four-row block, K below, at and off the multiples of 8 and 16, N off the group of four;
// then three that run the 4x2 kernels many times, three of one row of x (gemvBF16), two in
// gemmRange's cache blocks (cacheBlocks: rows of x in blocks of 24 and 4, weight rows in
// blocks of 36 and 4 for bf16, each with a shorter last block).
var linearShapes = [][3]int{{1, 1, 1}, {1, 5, 7}, {1, 4, 8}, {1, 9, 16}, {2, 7, 24}, {4, 6, 40}, {5, 13, 67}, {9, 11, 129}, {1, 64, 896}, {6, 33, 300},
	{16, 5, 64}, {19, 37, 203}, {18, 701, 1024}, {1, 13, 203}, {1, 37, 1000}, {1, 301, 96}, {61, 150, 896}, {9, 29, 4864}}

// TestPortableKernelsExact holds the portable set to its contract on amd64: linear gives the
// reference kernel's bits (one accumulator per output in k order, no fused multiply-add).
func TestPortableKernelsExact(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the Go compiler may fuse multiply-adds on " + runtime.GOARCH)
	}
	rng := rand.New(rand.NewPCG(81, 82))
	ref, _ := Reference("linear")
	withKernelSet(portableKernels, func() {
		for _, dw := range []tensor.DType{tensor.BF16, tensor.F32} {
			for _, sh := range linearShapes {
				x, w := linearInputs(rng, sh[0], sh[1], sh[2], dw)
				want := runLinear(t, ref, x, w)
				got := runLinear(t, fastLinear, x, w)
				if i := firstF32BitDiff(got, want); i >= 0 {
					t.Errorf("%s %v: element %d is %v, the reference kernel's %v", dw, sh, i, got[i], want[i])
				}
			}
		}
	})
}

// TestKernelSetsAgree holds every vector set to a scalar model of its arithmetic. avx512:
// lanes16Linear (kernels_avx512_test.go), bit for bit. avx2 (and avx512bf16's f32 weights),
// as kernels_amd64.go describes it: each output is an eight-lane
// fused multiply-add accumulator over the first K&^7 elements, lanes added pairwise, then
// the tail in order; computed here in scalar Go (math.FMA), so every set must give exactly
// these bits, whatever the blocking, the batch or the split. avx512bf16's bf16 weights:
// bf16LinearModel (kernels_bf16_test.go), VDPBF16PS as Intel defines it, bit for bit on
// Intel CPUs; elsewhere (AMD does not document its rounding steps) within 1e-6 of the sum
// of absolute products of the model, TestKernelSetsRowwise holding it deterministic.
func TestKernelSetsAgree(t *testing.T) {
	rng := rand.New(rand.NewPCG(83, 84))
	intel := cpuVendor() == "GenuineIntel"
	skipMissingSets(t)
	for _, s := range kernelSets {
		if s.name == "portable" {
			continue
		}
		t.Run(s.name, func(t *testing.T) {
			withKernelSet(s, func() {
				for _, dw := range []tensor.DType{tensor.BF16, tensor.F32} {
					for _, sh := range linearShapes {
						M, N, K := sh[0], sh[1], sh[2]
						x, w := linearInputs(rng, M, N, K, dw)
						got := runLinear(t, fastLinear, x, w)
						if s.name == "avx512" {
							want := lanes16Linear(x, w, M, N, K)
							if i := firstF32BitDiff(got, want); i >= 0 {
								t.Errorf("%s %v: element %d is %v, the 16-lane model's %v", dw, sh, i, got[i], want[i])
							}
							continue
						}
						if s.bf16 == nil || dw != tensor.BF16 {
							want := lanesLinear(x, w, M, N, K)
							if i := firstF32BitDiff(got, want); i >= 0 {
								t.Errorf("%s %v: element %d is %v, the eight-lane model's %v", dw, sh, i, got[i], want[i])
							}
							continue
						}
						want := bf16LinearModel(x, w, M, N, K)
						if intel {
							if i := firstF32BitDiff(got, want); i >= 0 {
								dpEvenFirst = true
								alt := bf16LinearModel(x, w, M, N, K)
								dpEvenFirst = false
								t.Errorf("%s %v: element %d is %v, the VDPBF16PS model's %v (adding the even product first: %v, first difference %d)",
									dw, sh, i, got[i], want[i], alt[i], firstF32BitDiff(got, alt))
							}
							continue
						}
						sums := absProducts(t, "linear", x, w)
						for i := range got {
							if d := math.Abs(float64(got[i] - want[i])); !(d <= 1e-6*sums[i]) {
								t.Errorf("%s %v: element %d is %v, the VDPBF16PS model's %v (not Intel: tolerance %.3g)", dw, sh, i, got[i], want[i], 1e-6*sums[i])
								break
							}
						}
					}
				}
			})
		})
	}
}

// lanesLinear is the vector sets' arithmetic in scalar Go (see TestKernelSetsAgree).
func lanesLinear(x, w *tensor.Tensor, M, N, K int) []float32 {
	wf := make([]float32, N*K)
	widen(wf, w, 0)
	res := make([]float32, M*N)
	kv := K &^ 7
	for m := range M {
		xr := x.F32[m*K : (m+1)*K]
		for j := range N {
			wr := wf[j*K : (j+1)*K]
			var a [8]float32
			for k := 0; k < kv; k++ {
				a[k%8] = float32(math.FMA(float64(xr[k]), float64(wr[k]), float64(a[k%8])))
			}
			var tail float32
			for k := kv; k < K; k++ {
				tail += xr[k] * wr[k]
			}
			res[m*N+j] = simdHsum(&a) + tail
		}
	}
	return res
}

// runLinear runs a linear kernel on x, w and returns the f32 output.
func runLinear(t testing.TB, k Kernel, x, w *tensor.Tensor) []float32 {
	t.Helper()
	n, outs := nodeFor(t, "linear", nil, []*tensor.Tensor{x, w})
	res, err := runKernel(k, n, []*tensor.Tensor{x, w}, outs)
	if err != nil {
		t.Fatal(err)
	}
	return res[0].F32
}

// firstF32BitDiff returns the first index where a and b hold other float32 bits, or -1.
func firstF32BitDiff(a, b []float32) int {
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// TestKernelSetForced checks LOOM_CPU_KERNELS: a listed set runs when named; an unknown name
// leaves the default (the first listed) and is reported.
func TestKernelSetForced(t *testing.T) {
	prev, prevNote := activeKernels, forcedNote
	defer func() { useKernelSet(prev); forcedNote = prevNote }()
	for _, s := range kernelSets {
		t.Setenv(kernelEnv, s.name)
		forcedNote = ""
		selectKernels()
		if activeKernels.name != s.name || forcedNote != "" {
			t.Errorf("%s=%s: set %q (note %q)", kernelEnv, s.name, activeKernels.name, forcedNote)
		}
	}
	t.Setenv(kernelEnv, "no-such-set")
	forcedNote = ""
	selectKernels()
	if activeKernels.name != kernelSets[0].name || forcedNote == "" {
		t.Errorf("%s=no-such-set: set %q (note %q), want the default %q and a note", kernelEnv, activeKernels.name, forcedNote, kernelSets[0].name)
	}
	if kernelSets[len(kernelSets)-1].name != "portable" {
		t.Errorf("sets %v: the portable set should come last", kernelSetNames())
	}
}

// TestKernelSetsDetected holds the list of sets to the CPU (as /proc/cpuinfo reports its
// features), unless the purego tag is set: with AVX-512F and AVX-512BW the avx512 set is there
// and the default; with those and AVX512_BF16 the avx512bf16 set is there, never the
// default; with AVX2 and FMA the avx2 set is there, and the default if avx512 is not.
func TestKernelSetsDetected(t *testing.T) {
	flags := cpuinfoFlags(t)
	if runtime.GOARCH != "amd64" || flags == nil {
		t.Skipf("sets %v", kernelSetNames())
	}
	names := kernelSetNames()
	avx512 := flags["avx512f"] && flags["avx512bw"] && !purego
	bf16 := avx512 && flags["avx512_bf16"]
	if has := slices.Contains(names, "avx512bf16"); has != bf16 {
		t.Errorf("sets %v: avx512bf16 listed %v, the CPU has AVX-512F, AVX-512BW and AVX512_BF16 %v (purego %v)", names, has, bf16, purego)
	}
	if slices.Index(names, "avx512bf16") == 0 {
		t.Errorf("sets %v: avx512bf16 is the default; it must be chosen with %s only", names, kernelEnv)
	}
	if has := slices.Contains(names, "avx512"); has != avx512 {
		t.Errorf("sets %v: avx512 listed %v, the CPU has AVX-512F and AVX-512BW %v (purego %v)", names, has, avx512, purego)
	}
	if avx512 && names[0] != "avx512" {
		t.Errorf("sets %v on a CPU with AVX-512F and AVX-512BW: want avx512 first", names)
	}
	if flags["avx2"] && flags["fma"] && !purego {
		if i := slices.Index(names, "avx2"); i < 0 || !avx512 && i != 0 {
			t.Errorf("sets %v on a CPU with AVX2 and FMA: want avx2 listed, first unless avx512 is", names)
		}
	} else if slices.Contains(names, "avx2") {
		t.Errorf("sets %v: avx2 listed on a CPU without AVX2 and FMA (or in a purego build)", names)
	}
	t.Logf("sets %v, default %s", names, kernelSets[0].name)
}

func kernelSetNames() []string {
	var names []string
	for _, s := range kernelSets {
		names = append(names, s.name)
	}
	return names
}

// BenchmarkLinearPrefill runs linear on Qwen2.5-0.5B's shapes for a 128-token prompt (bf16
// weights) on every kernel set ("speedup" over the first listed, the default); the bytes are
// the weight bytes.
func BenchmarkLinearPrefill(b *testing.B) {
	rng := rand.New(rand.NewPCG(87, 88))
	for _, sh := range []struct {
		name string
		N, K int
	}{{"qkv", 1152, 896}, {"o", 896, 896}, {"gate_up", 9728, 896}, {"down", 896, 4864}} {
		b.Run(sh.name, func(b *testing.B) {
			x := randF32(rng, 128, sh.K)
			w := randBF16(rng, sh.N, sh.K)
			f := kernelFn(b, fastLinear, "linear", nil, x, w)
			var names []string
			var fns []func() error
			for _, s := range kernelSets {
				names = append(names, s.name)
				fns = append(fns, func() error {
					var err error
					withKernelSet(s, func() { err = f() })
					return err
				})
			}
			benchVariants(b, int64(sh.N*sh.K*2), names, fns)
		})
	}
}

// BenchmarkLinearKernelSets runs linear on Qwen2.5-0.5B's decode shapes (one token, bf16
// weights) on every kernel set, next to a read of the same number of bytes from memory
// (readBytes: the bandwidth floor); "x-floor" is each variant's time over the read's.
func BenchmarkLinearKernelSets(b *testing.B) {
	rng := rand.New(rand.NewPCG(85, 86))
	for _, sh := range []struct {
		name string
		N, K int
	}{{"qkv", 1152, 896}, {"gate_up", 9728, 896}, {"down", 896, 4864}, {"lm_head", 151936, 896}} {
		b.Run(sh.name, func(b *testing.B) {
			x := randF32(rng, 1, sh.K)
			w := randBF16(rng, sh.N, sh.K)
			bytes := int64(sh.N * sh.K * 2)
			names := []string{"read"}
			fns := []func() error{func() error { readBytes(w.Half); return nil }}
			for _, s := range kernelSets {
				names = append(names, s.name)
				f := kernelFn(b, fastLinear, "linear", nil, x, w)
				fns = append(fns, func() error {
					var err error
					withKernelSet(s, func() { err = f() })
					return err
				})
			}
			benchVariants(b, bytes, names, fns)
		})
	}
}

// readBytes reads every element of h over the worker pool (see readHalf), as fast as the
// CPU can: the memory-read floor of a kernel that reads h once.
func readBytes(h []uint16) {
	parallel(len(h), max(len(h)/(4*runtime.GOMAXPROCS(0)), 1<<16), func(lo, hi int) {
		readHalf(h[lo:hi])
	})
}

// cpuinfoFlags returns the flags of the first processor in /proc/cpuinfo, or nil where
// there is no such file.
func cpuinfoFlags(t *testing.T) map[string]bool {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Logf("no /proc/cpuinfo (%v): CPU features as archsimd detects them", err)
		return nil
	}
	for line := range strings.Lines(string(data)) {
		key, val, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(key) != "flags" {
			continue
		}
		flags := map[string]bool{}
		for _, f := range strings.Fields(val) {
			flags[f] = true
		}
		return flags
	}
	t.Log("/proc/cpuinfo has no flags line: CPU features as archsimd detects them")
	return nil
}

// unsafeHalves views a []uint64 as the []uint16 of its bytes.
func unsafeHalves(u []uint64) []uint16 {
	return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(u))), 4*len(u))
}

// simdHsum adds the eight lanes of an accumulator pairwise, as the vector kernels do.
func simdHsum(a *[8]float32) float32 {
	return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}
