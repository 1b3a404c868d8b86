package cuda

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/tensor"
)

// TestGemvPlan checks which products linear sends to the gemv kernel (no GPU needed).
func TestGemvPlan(t *testing.T) {
	bf, f32 := tensor.BF16, tensor.F32
	for _, tc := range []struct {
		name   string
		x, w   tensor.DType
		xShape []int
		N, K   int
		xOff   int  // bytes added to x's address
		wantM  int  // rows the kernel takes; 0: it cannot
		taken  bool // linear runs it on the gemv
	}{
		{"decode bf16", bf, bf, []int{1, 4096}, 4096, 4096, 0, 1, true},
		{"decode bf16 lm_head", bf, bf, []int{1, 1, 4096}, 128256, 4096, 0, 1, true},
		{"decode f32 x lm_head", f32, bf, []int{1, 1, 4096}, 128256, 4096, 0, 1, true},
		{"decode f32 x qkv", f32, bf, []int{1, 4096}, 6144, 4096, 0, 1, false},
		{"batch 2 qkv", bf, bf, []int{2, 4096}, 6144, 4096, 0, 2, true},
		{"batch 2 down", bf, bf, []int{1, 2, 14336}, 4096, 14336, 0, 2, true},
		{"batch 2 gate_up", bf, bf, []int{2, 4096}, 28672, 4096, 0, 2, false},
		{"batch 2 gate_up tp=2", bf, bf, []int{2, 4096}, 14336, 4096, 0, 2, true},
		{"batch 2 lm_head", bf, bf, []int{2, 4096}, 128256, 4096, 0, 2, true},
		{"batch 2 f32 x", f32, bf, []int{2, 4096}, 4096, 4096, 0, 2, false},
		{"batch 3", bf, bf, []int{3, 4096}, 4096, 4096, 0, 3, false},
		{"batch 4", bf, bf, []int{4, 4096}, 4096, 4096, 0, 4, true},
		{"batch 4 down tp=2", bf, bf, []int{4, 7168}, 4096, 7168, 0, 4, true},
		{"batch 4 down", bf, bf, []int{4, 14336}, 4096, 14336, 0, 4, false},
		{"batch 4 o_proj tp=2", bf, bf, []int{4, 2048}, 4096, 2048, 0, 4, false},
		{"batch 4 qkv", bf, bf, []int{4, 4096}, 6144, 4096, 0, 4, false},
		{"batch 8", bf, bf, []int{2, 4, 14336}, 4096, 14336, 0, 8, false},
		{"K 8", bf, bf, []int{1, 8}, 1, 8, 0, 1, true},
		{"batch 9", bf, bf, []int{9, 4096}, 4096, 4096, 0, 0, false},
		{"f32 weight", f32, f32, []int{1, 4096}, 4096, 4096, 0, 0, false},
		{"bf16 x f32 weight", bf, f32, []int{1, 4096}, 4096, 4096, 0, 0, false},
		{"odd K", bf, bf, []int{1, 777}, 65, 777, 0, 0, false},
		{"K 4 mod 8", f32, bf, []int{1, 4100}, 64, 4100, 0, 0, false},
		{"unaligned x", bf, bf, []int{1, 64}, 8, 64, 2, 0, false},
		{"x 8 bytes off", f32, bf, []int{1, 64}, 8, 64, 8, 0, false},
	} {
		x := &Tensor{DType: tc.x, Shape: tc.xShape, ptr: 1<<20 + cubind.DevicePtr(tc.xOff)}
		w := &Tensor{DType: tc.w, Shape: []int{tc.N, tc.K}, ptr: 1 << 30}
		p, ok := gemvFits(x, w)
		if ok != (tc.wantM > 0) || (ok && (p.M != tc.wantM || p.N != tc.N || p.K != tc.K || p.cfg != gemvTilingFor(p.M, p.N))) {
			t.Errorf("%s: fits %+v, %v; want M %d (0: does not fit)", tc.name, p, ok, tc.wantM)
		}
		if _, taken := planGemv(x, w); taken != tc.taken {
			t.Errorf("%s: linear takes the gemv: %v", tc.name, taken)
		}
	}
	gemvOff = true
	defer func() { gemvOff = false }()
	x := &Tensor{DType: tensor.BF16, Shape: []int{1, 64}, ptr: 1 << 20}
	if _, ok := planGemv(x, &Tensor{DType: tensor.BF16, Shape: []int{8, 64}, ptr: 1 << 30}); ok {
		t.Error("gemvOff: the plan still takes the gemv")
	}
}

// gemvCase is one product of the gemv tests: x[M,K] (dtype xdt) times w bf16[N,K]ᵀ.
type gemvCase struct {
	M, N, K int
	xdt     tensor.DType
}

func (c gemvCase) String() string {
	return fmt.Sprintf("x %s[%d,%d] w bf16[%d,%d]", c.xdt, c.M, c.K, c.N, c.K)
}

// gemvCases covers M = 1..8, both x dtypes, odd N, K a multiple of the kernel's tile (32*4
// chunks of 8) or not, and K that is no multiple of 8 (cuBLAS's).
func gemvCases() []gemvCase {
	var cs []gemvCase
	for M := 1; M <= gemvMaxM; M++ {
		for _, xdt := range []tensor.DType{tensor.BF16, tensor.F32} {
			for _, nk := range [][2]int{{1, 8}, {7, 24}, {129, 256}, {37, 1000}, {300, 4096}, {33, 2056}, {5, 5000}, {65, 777}} {
				cs = append(cs, gemvCase{M: M, N: nk[0], K: nk[1], xdt: xdt})
			}
		}
	}
	return cs
}

// gemvInputs uploads random x and w of case c and returns them with their host copies and
// m = Σ|x·w| per output element.
func gemvInputs(t *testing.T, d *Device, rng *rand.Rand, c gemvCase) (xh, wh *tensor.Tensor, x, w *Tensor, mag []float64) {
	t.Helper()
	xh = randTensor(rng, c.xdt, []int{c.M, c.K}, -1, 1)
	wh = randTensor(rng, tensor.BF16, []int{c.N, c.K}, -1, 1)
	dev := up(t, d, xh, wh)
	xs, ws := xh.Float32s(), wh.Float32s()
	mag = make([]float64, c.M*c.N)
	for m := range c.M {
		for n := range c.N {
			s := 0.0
			for k := range c.K {
				s += math.Abs(float64(xs[m*c.K+k]) * float64(ws[n*c.K+k]))
			}
			mag[m*c.N+n] = s
		}
	}
	return xh, wh, dev[0], dev[1], mag
}

// gemvTol allows, around want with m = Σ|x·w|: accum·m for the f32 sums, plus for a bf16
// result 2^-7·|want| (both sides rounded to bf16 may sit one bf16 step apart).
func gemvTol(want *tensor.Tensor, mag []float64, accum float64) tol {
	allowed := make([]float64, len(mag))
	for i, m := range mag {
		allowed[i] = accum * m
		if want.DType == tensor.BF16 {
			allowed[i] += math.Abs(want.At(i)) / 128
		}
	}
	return tol{rtol: 1, scale: allowed}
}

// cublasAccum is the accumulation error cuBLAS shows in bf16 results: for a few rows its
// split-K kernels add partial sums rounded to bf16 (measured: errors up to 6e-5·m at K 4096,
// M 2..8, which the f32 sums of the gemv do not have).
const cublasAccum = 1.0 / 4096

// gemvTestTilings are the tilings TestGemv runs: gemvTilingFor's (the zero value) and others
// with more rows per warp, fewer loads in flight and 1 to 4 warps per block.
var gemvTestTilings = []gemvConfig{{}, {4, 2, 4}, {3, 1, 3}, {2, 8, 1}}

// gemvRun runs case c's product on the gemv kernel with tiling tl (zero: gemvTilingFor's),
// whether or not linear would take it.
func gemvRun(t *testing.T, d *Device, out, x, w *Tensor, tl gemvConfig) gemvConfig {
	t.Helper()
	p, ok := gemvFits(x, w)
	if !ok {
		t.Fatalf("gemv does not fit x %v w %v", x, w)
	}
	if tl != (gemvConfig{}) {
		p.cfg = tl
	}
	if err := d.do(func() error { return launchGemv(d, out, x, w, p) }); err != nil {
		t.Fatal(err)
	}
	return p.cfg
}

// gemmRef is the host reference of out = x·wᵀ: x rounded to bf16 (as linear does for f32
// x), exact products and sums in float64, rounded to x's dtype.
func gemmRef(xh, wh *tensor.Tensor, c gemvCase) *tensor.Tensor {
	xs, ws := xh.Cast(tensor.BF16).Float32s(), wh.Float32s()
	ref := make([]float32, c.M*c.N)
	for m := range c.M {
		for n := range c.N {
			s := 0.0
			for k := range c.K {
				s += float64(xs[m*c.K+k]) * float64(ws[n*c.K+k])
			}
			ref[m*c.N+n] = float32(s)
		}
	}
	return tensor.FromF32(ref, c.M, c.N).Cast(c.xdt)
}

// TestGemv checks the gemv kernel against a float64 reference on the host: x rounded to bf16
// (as linear does for f32 x), exact products and sums, rounded to the output dtype;
// tolerance gemvTol with 2e-5·m (f32 sums). Cases with K not a multiple of 8 do not fit the
// kernel: they check that linear runs them on cuBLAS (tolerance with cublasAccum).
func TestGemv(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(21, 21))
	for _, c := range gemvCases() {
		xh, wh, x, w, mag := gemvInputs(t, d, rng, c)
		want := gemmRef(xh, wh, c)
		out := like(t, d, want)[0]
		if _, fits := gemvFits(x, w); fits != (c.K%8 == 0) {
			t.Fatalf("%s: gemv fits: %v", c, fits)
		}
		if c.K%8 != 0 {
			if err := Linear(d, out, x, w); err != nil {
				t.Fatalf("%s: %v", c, err)
			}
			compare(t, "gemv-fallback", c.String(), down(t, d, out), want, gemvTol(want, mag, cublasAccum))
			continue
		}
		for _, tl := range gemvTestTilings {
			cfg := gemvRun(t, d, out, x, w, tl)
			compare(t, "gemv", fmt.Sprintf("%s %v", c, cfg), down(t, d, out), want, gemvTol(want, mag, 2e-5))
		}
	}
}

// TestGemvCublas compares the gemv kernel with linear on cuBLAS (gemvOff), which also rounds
// f32 x to bf16 and sums in f32: tolerance gemvTol around the cuBLAS result with cublasAccum
// for a bf16 result (cuBLAS's split-K sums in bf16), 2e-5·m for an f32 one. It also checks
// that linear with the gemv on gives the gemv's result when it takes it.
func TestGemvCublas(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(22, 22))
	for _, c := range gemvCases() {
		if c.K%8 != 0 {
			continue
		}
		_, _, x, w, mag := gemvInputs(t, d, rng, c)
		outs := like(t, d, tensor.New(c.xdt, c.M, c.N), tensor.New(c.xdt, c.M, c.N), tensor.New(c.xdt, c.M, c.N))
		gemvRun(t, d, outs[0], x, w, gemvConfig{})
		gemvOff = true
		err := Linear(d, outs[1], x, w)
		gemvOff = false
		if err != nil {
			t.Fatalf("%s: cuBLAS: %v", c, err)
		}
		got, want := down(t, d, outs[0]), down(t, d, outs[1])
		accum := 2e-5
		if c.xdt == tensor.BF16 {
			accum = cublasAccum
		}
		compare(t, "gemv-cublas", c.String(), got, want, gemvTol(want, mag, accum))
		if _, taken := planGemv(x, w); taken {
			if err := Linear(d, outs[2], x, w); err != nil {
				t.Fatal(err)
			}
			compare(t, "gemv-linear", c.String(), down(t, d, outs[2]), got, exact)
		}
	}
}

// TestGemvTimings times linear on the gemv kernel and on cuBLAS on the decode shapes of a
// Llama-3.1-8B layer and its LM head when LOOM_CUDA_TIMINGS=1. The weights rotate through
// more than 1 GiB of copies so that L2 (50 MB) never holds them. Each timing replays a CUDA
// graph of back-to-back calls (as a captured decode step runs them) between two events;
// "eager" times the same calls launched one by one. The gemv runs whether or not linear
// would take it (a * marks the products linear gives it); LOOM_GEMV_SWEEP=1 also times
// other tilings.
func TestGemvTimings(t *testing.T) {
	d := gpu(t)
	if os.Getenv("LOOM_CUDA_TIMINGS") != "1" {
		t.Skip("set LOOM_CUDA_TIMINGS=1 to time the kernels")
	}
	const pool = 9 << 28 // bytes of weight copies: 2.25 GiB, two copies of the LM head
	rng := rand.New(rand.NewPCG(23, 23))
	buf := coldWeights(t, d, rng, pool)
	start, err := cubind.EventCreate(cubind.EventDefault)
	if err != nil {
		t.Fatal(err)
	}
	defer start.Destroy()
	end, err := cubind.EventCreate(cubind.EventDefault)
	if err != nil {
		t.Fatal(err)
	}
	defer end.Destroy()
	// timeCalls returns the µs per call of n calls, graph-replayed (0 when capture fails) and
	// eager.
	timeCalls := func(n int, call func(i int) error) (graph, eager float64, err error) {
		err = d.do(func() error {
			for i := range min(n, 4) {
				if err := call(i); err != nil {
					return err
				}
			}
			if err := start.Record(d.stream); err != nil {
				return err
			}
			for i := range n {
				if err := call(i); err != nil {
					return err
				}
			}
			if err := end.Record(d.stream); err != nil {
				return err
			}
			if err := end.Synchronize(); err != nil {
				return err
			}
			el, err := cubind.Elapsed(start, end)
			if err != nil {
				return err
			}
			eager = el.Seconds() * 1e6 / float64(n)
			el, err = capturedCallTime(d, n, 3, call)
			if errors.Is(err, errCapture) {
				t.Logf("%v", err)
				return nil
			}
			graph = el.Seconds() * 1e6
			return err
		})
		return graph, eager, err
	}
	tilings := []gemvConfig{{}} // {} is gemvTilingFor's
	if os.Getenv("LOOM_GEMV_SWEEP") == "1" {
		tilings = append(tilings, gemvConfig{1, 4, 8}, gemvConfig{1, 8, 8}, gemvConfig{2, 4, 8}, gemvConfig{4, 2, 4}, gemvConfig{4, 4, 4})
	}
	t.Logf("%-22s %-3s %-4s %-18s %15s %21s %8s", "K -> N", "M", "x", "kernel", "graph µs (TB/s)", "eager µs (TB/s)", "speedup")
	for _, s := range []struct {
		name string
		K, N int
	}{
		{"qkv", 4096, 6144}, {"o_proj", 4096, 4096}, {"gate_up", 4096, 28672}, {"down", 14336, 4096}, {"lm_head", 4096, 128256},
		// per GPU at tp=2
		{"qkv/2", 4096, 3072}, {"o_proj/2", 2048, 4096}, {"gate_up/2", 4096, 14336}, {"down/2", 7168, 4096}, {"lm_head/2", 4096, 64128},
		{"floor", 128, 16}, // launch and latency: 4 KB of weights
	} {
		wbytes := 2 * s.N * s.K
		copies := min(pool/wbytes, 256)
		ws := make([]*Tensor, copies)
		for i := range ws {
			ws[i] = &Tensor{DType: tensor.BF16, Shape: []int{s.N, s.K}, ptr: buf.ptr + cubind.DevicePtr(i*wbytes), dev: d}
		}
		n := max(copies, 20)
		for _, M := range []int{1, 2, 4, 8} {
			for _, xdt := range []tensor.DType{tensor.BF16, tensor.F32} {
				if xdt == tensor.F32 && M != 1 {
					continue
				}
				x := up(t, d, randTensor(rng, xdt, []int{M, s.K}, -1, 1))[0]
				out := like(t, d, tensor.New(xdt, M, s.N))[0]
				line := func(what string, g, e float64) string {
					return fmt.Sprintf("%-8s %5d -> %-6d %-3d %-4s %-18s %8.1f (%4.2f) %10.1f (%4.2f)", s.name, s.K, s.N, M, xdt, what,
						g, float64(wbytes)/g/1e6, e, float64(wbytes)/e/1e6)
				}
				gemvOff = true
				cg, ce, err := timeCalls(n, func(i int) error { return linear(d, out, x, ws[i%copies]) })
				gemvOff = false
				if err != nil {
					t.Fatalf("%s M=%d cuBLAS: %v", s.name, M, err)
				}
				t.Log(line("cuBLAS", cg, ce))
				p, ok := gemvFits(x, ws[0])
				if !ok {
					t.Fatalf("%s M=%d: gemv does not fit", s.name, M)
				}
				_, taken := planGemv(x, ws[0])
				for i, c := range tilings {
					if i > 0 && xdt != tensor.BF16 {
						continue
					}
					if c != (gemvConfig{}) {
						p.cfg = c
					}
					what := fmt.Sprintf("gemv %v", p.cfg)
					if i == 0 && taken {
						what += " *"
					}
					g, e, err := timeCalls(n, func(i int) error { return launchGemv(d, out, x, ws[i%copies], p) })
					if err != nil {
						t.Fatalf("%s M=%d %s: %v", s.name, M, what, err)
					}
					t.Logf("%s %7.2fx", line(what, g, e), cg/g)
				}
				d.Free(x)
				d.Free(out)
			}
		}
	}
}
