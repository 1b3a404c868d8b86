package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/tensor"
)

// TestGemmTuneSettings checks the environment switch, the alignment of the key and the
// result check of the candidates (no GPU needed).
func TestGemmTuneSettings(t *testing.T) {
	for v, off := range map[string]bool{"0": true, "off": true, "false": true, "1": false, " on ": false, "": !gemmTuneDefault, "x": !gemmTuneDefault} {
		if got := gemmTuneDisabled(v); got != off {
			t.Errorf("%s=%q: off %v, want %v", GemmTuneEnv, v, got, off)
		}
	}
	for _, tc := range []struct {
		ps   []cubind.DevicePtr
		want uint32
	}{
		{[]cubind.DevicePtr{1 << 20, 1 << 30}, 256}, {[]cubind.DevicePtr{1<<20 + 2, 1 << 30}, 2},
		{[]cubind.DevicePtr{1<<20 + 16, 1<<30 + 64, 1<<21 + 128}, 16}, {nil, 256},
	} {
		if got := ptrAlign(tc.ps...); got != tc.want {
			t.Errorf("ptrAlign(%#x) = %d, want %d", tc.ps, got, tc.want)
		}
	}
	ref := []float32{1, -2, 3, 0, 1e-3, 1000}
	nan := float32(math.NaN())
	for _, tc := range []struct {
		name string
		got  []float32
		ok   bool
	}{
		{"same", []float32{1, -2, 3, 0, 1e-3, 1000}, true},
		{"a bf16 step apart", []float32{1.0078125, -2, 3.015625, 0, 1e-3, 1004}, true},
		{"small sum-order error", []float32{1, -2, 3, 0.5, 1e-3, 1000}, true},
		{"NaN (not written)", []float32{1, -2, nan, 0, 1e-3, 1000}, false},
		{"wrong value", []float32{1, -2, 3, 0, 1e-3, 900}, false},
		{"zero instead of 3", []float32{1, -2, 0, 0, 1e-3, 1000}, true}, // within rms/16 (rms 408)
		{"short", []float32{1}, false},
	} {
		if bad := gemmMismatch(tc.got, ref); (bad == "") != tc.ok {
			t.Errorf("%s: mismatch %q, want ok %v", tc.name, bad, tc.ok)
		}
	}
	if bad := gemmMismatch([]float32{1, 2, 0}, []float32{1, 2, 3}); bad == "" {
		t.Error("a missing element of a small result passes")
	}
}

// TestGemmTuneTimings times linear with tuning off (cublasGemmEx) and on, on the products of
// a Llama-3.1-8B layer at M = 16, 64 and 256 rows, when LOOM_CUDA_TIMINGS=1: CUDA-graph
// replay of back-to-back calls over weight copies rotated beyond L2, as in TestGemvTimings.
// It logs µs per call and the weights' TB/s, and for M=64 the tuner's own measurements.
func TestGemmTuneTimings(t *testing.T) {
	d := gpu(t)
	if os.Getenv("LOOM_CUDA_TIMINGS") != "1" {
		t.Skip("set LOOM_CUDA_TIMINGS=1 to time the kernels")
	}
	defer tuneOn()()
	const pool = 1 << 31 // bytes of weight copies
	rng := rand.New(rand.NewPCG(33, 33))
	buf := coldWeights(t, d, rng, pool)
	// graphUs returns the µs per call of n calls captured into a graph and replayed.
	graphUs := func(n int, call func(i int) error) (float64, error) {
		var el time.Duration
		err := d.do(func() error {
			var err error
			el, err = capturedCallTime(d, n, 5, call)
			return err
		})
		return el.Seconds() * 1e6, err
	}
	for _, s := range []struct {
		name string
		K, N int
	}{{"qkv", 4096, 6144}, {"o_proj", 4096, 4096}, {"gate_up", 4096, 28672}, {"down", 14336, 4096}} {
		wbytes := 2 * s.N * s.K
		copies := min(pool/wbytes, 64)
		ws := make([]*Tensor, copies)
		for i := range ws {
			ws[i] = &Tensor{DType: tensor.BF16, Shape: []int{s.N, s.K}, ptr: buf.ptr + cubind.DevicePtr(i*wbytes), dev: d}
		}
		n := max(copies, 24)
		for _, M := range []int{64, 16, 256} {
			x := up(t, d, randTensor(rng, tensor.BF16, []int{M, s.K}, -1, 1))[0]
			out := like(t, d, tensor.New(tensor.BF16, M, s.N))[0]
			call := func(i int) error { return linear(d, out, x, ws[i%copies]) }
			gemmTuneOff = true
			def, err := graphUs(n, call)
			gemmTuneOff = false
			if err != nil {
				t.Fatalf("%s M=%d cublasGemmEx: %v", s.name, M, err)
			}
			if err := Linear(d, out, x, ws[0]); err != nil { // tunes the shape
				t.Fatalf("%s M=%d: %v", s.name, M, err)
			}
			tuned, err := graphUs(n, call)
			if err != nil {
				t.Fatalf("%s M=%d tuned: %v", s.name, M, err)
			}
			p := findPlan(d, M, s.N, s.K, cubind.R16BF)
			choice := "untuned"
			if p != nil {
				choice = fmt.Sprintf("%s, tuned in %.0f ms", p.name, p.took.Seconds()*1e3)
			}
			t.Logf("%-7s %5d -> %-5d M=%-3d cublasGemmEx %6.1f µs (%.2f TB/s)  tuned %6.1f µs (%.2f TB/s)  %.2fx  [%s]",
				s.name, s.K, s.N, M, def, float64(wbytes)/def/1e6, tuned, float64(wbytes)/tuned/1e6, def/tuned, choice)
			if p != nil && M == 64 {
				var b strings.Builder
				for _, c := range p.tried {
					switch {
					case c.first > 0 && math.IsInf(c.us, 0):
						fmt.Fprintf(&b, " %s:(%.0f)", c.name, c.first)
					case math.IsInf(c.us, 0):
						fmt.Fprintf(&b, " %s:dropped", c.name)
					case c.kind == gemmKindLt:
						fmt.Fprintf(&b, " %s:%.1f(w%.2f,ws%dK)", c.name, c.us, c.waves, c.ws>>10)
					default:
						fmt.Fprintf(&b, " %s:%.1f", c.name, c.us)
					}
				}
				t.Logf("  tuner medians µs, cold L2; (x): first round only, pruned; w: waves, ws: workspace:%s", b.String())
			}
			d.Free(x)
			d.Free(out)
		}
	}
}

// tuneOn turns GEMM tuning on (whatever GemmTuneEnv and gemmTuneDefault say) and returns
// the function that restores the setting.
func tuneOn() func() {
	was := gemmTuneOff
	gemmTuneOff = false
	return func() { gemmTuneOff = was }
}

// findPlan returns the tuned plan of shape M×K -> N with output type ct, if any.
func findPlan(d *Device, M, N, K int, ct cubind.DataType) *gemmPlan {
	if d.gemmTune == nil {
		return nil
	}
	for k, p := range d.gemmTune.plans {
		if k.M == M && k.N == N && k.K == K && k.c == ct {
			return p
		}
	}
	return nil
}

// TestGemmTuneLinear checks tuned linear against cublasGemmEx (tuning off) and a float64
// host reference, and every candidate the tuner may pick (each algorithm cuBLASLt's
// heuristic proposes, and the gemv where it fits) against the reference, for M in {1, 3,
// 17, 64, 200}, odd and even N and K, bf16 x (bf16 result) and f32 x (bf16 product, f32
// result). Tolerance as in TestGemv: around want, |want|/128 for a bf16 result plus
// cublasAccum·Σ|x·w| (split-K kernels may add bf16-rounded partial sums); tuned against
// cublasGemmEx twice that.
func TestGemmTuneLinear(t *testing.T) {
	d := gpu(t)
	defer tuneOn()()
	rng := rand.New(rand.NewPCG(31, 31))
	kinds := map[gemmKind]int{}
	checked, untuned := 0, 0
	for _, M := range []int{1, 3, 17, 64, 200} {
		for _, nk := range [][2]int{{65, 777}, {300, 4096}, {1031, 520}} {
			for _, xdt := range []tensor.DType{tensor.BF16, tensor.F32} {
				c := gemvCase{M: M, N: nk[0], K: nk[1], xdt: xdt}
				xh, wh, x, w, mag := gemvInputs(t, d, rng, c)
				want := gemmRef(xh, wh, c)
				tl := gemvTol(want, mag, cublasAccum)
				outs := like(t, d, want, want)
				gemmTuneOff = true
				err := Linear(d, outs[0], x, w)
				gemmTuneOff = false
				if err != nil {
					t.Fatalf("%s: cublasGemmEx: %v", c, err)
				}
				if err := Linear(d, outs[1], x, w); err != nil {
					t.Fatalf("%s: tuned: %v", c, err)
				}
				def, got := down(t, d, outs[0]), down(t, d, outs[1])
				compare(t, "gemm-default", c.String(), def, want, tl)
				compare(t, "gemm-tuned", c.String(), got, want, tl)
				pair := make([]float64, len(mag))
				for i := range pair {
					pair[i] = 2 * cublasAccum * mag[i]
					if c.xdt == tensor.BF16 {
						pair[i] += math.Abs(def.At(i)) / 64
					}
				}
				compare(t, "gemm-tuned-vs-default", c.String(), got, def, tol{rtol: 1, scale: pair})
				ct := cubind.R16BF
				if xdt == tensor.F32 {
					ct = cubind.R32F
				}
				if p := findPlan(d, M, c.N, c.K, ct); p != nil {
					kinds[p.kind]++
				} else {
					untuned++ // the gemv took it before cuBLAS
				}
				checked += checkCandidates(t, d, c, xh, w, want, tl)
			}
		}
	}
	if len(gemmNoLt) > 0 {
		t.Logf("no cuBLASLt algorithm for %d cases: %s", len(gemmNoLt), strings.Join(gemmNoLt, "; "))
	}
	t.Logf("%d products: tuned choice cublasGemmEx %d, cuBLASLt %d, gemv %d, on the gemv before tuning %d; %d candidates checked against the host",
		kinds[gemmKindEx]+kinds[gemmKindLt]+kinds[gemmKindGemv]+untuned, kinds[gemmKindEx], kinds[gemmKindLt], kinds[gemmKindGemv], untuned, checked)
}

// gemmNoLt lists the cases of TestGemmTuneLinear for which cuBLASLt proposed nothing.
var gemmNoLt []string

// checkCandidates runs every candidate of case c (x bf16 on the device, the f32 x rounded
// first) against want and returns how many it checked.
func checkCandidates(t *testing.T, d *Device, c gemvCase, xh *tensor.Tensor, w *Tensor, want *tensor.Tensor, tl tol) int {
	t.Helper()
	xb := up(t, d, xh.Cast(tensor.BF16))[0]
	out := like(t, d, want)[0]
	ct := cubind.R16BF
	if c.xdt == tensor.F32 {
		ct = cubind.R32F
	}
	key := gemmKey{M: c.M, N: c.N, K: c.K, a: cubind.R16BF, c: ct, align: ptrAlign(out.ptr, xb.ptr, w.ptr)}
	var cands []gemmCandidate
	var prob *gemmProblem
	if err := d.do(func() error {
		tuner(d)
		p, algos, err := gemmLtAlgos(d, key)
		if err != nil {
			gemmNoLt = append(gemmNoLt, c.String())
		}
		prob = p
		for i, r := range algos {
			cands = append(cands, gemmCandidate{kind: gemmKindLt, name: fmt.Sprintf("lt%d", i), algo: r.Algo})
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	defer prob.destroy()
	if ct == cubind.R16BF && c.M <= gemvMaxM {
		if p, ok := gemvFits(xb, w); ok {
			cands = append(cands, gemmCandidate{kind: gemmKindGemv, name: "gemv", gemv: p})
		}
	}
	for i := range cands {
		cand := &cands[i]
		err := d.do(func() error {
			if err := cubind.MemsetD8Async(out.ptr, 0xff, uint64(out.Bytes()), d.stream); err != nil {
				return err
			}
			return runGemm(d, cand, prob, key, out, xb, w)
		})
		if err != nil {
			t.Errorf("%s %s: %v", c, cand.name, err)
			continue
		}
		compare(t, "gemm-candidate", fmt.Sprintf("%s %s", c, cand.name), down(t, d, out), want, tl)
	}
	return len(cands)
}

// captureLinear captures f (queuing work on the device's stream, with the device locked)
// into a CUDA graph as a Program does, replays it once and waits.
func captureLinear(t *testing.T, d *Device, f func() error) {
	t.Helper()
	err := d.do(func() error {
		exe, err := d.captureGraph(f)
		if err != nil {
			return err
		}
		defer exe.Destroy()
		if err := exe.Launch(d.stream); err != nil {
			return err
		}
		return d.sync()
	})
	if err != nil {
		t.Fatalf("capture: %v", err)
	}
}

// TestGemmTuneGraph checks that a tuned product captured into a CUDA graph and replayed
// gives the result of the eager call bit for bit (the plan forced onto a cuBLASLt
// algorithm, bf16 and f32 results), and that a shape first met while capturing runs
// untuned on cublasGemmEx and is tuned at its next eager call.
func TestGemmTuneGraph(t *testing.T) {
	d := gpu(t)
	defer tuneOn()()
	gemmTunePick = func(cands []gemmCandidate) int {
		for i, c := range cands {
			if c.kind == gemmKindLt && !math.IsInf(c.us, 0) {
				return i
			}
		}
		return -1
	}
	defer func() { gemmTunePick = nil }()
	rng := rand.New(rand.NewPCG(32, 32))
	const M, N, K = 64, 1000, 2048
	xh := randTensor(rng, tensor.BF16, []int{M, K}, -1, 1)
	wh := randTensor(rng, tensor.BF16, []int{N, K}, -1, 1)
	dev := up(t, d, xh, wh)
	x, w := dev[0], dev[1]
	for _, ct := range []cubind.DataType{cubind.R16BF, cubind.R32F} {
		dt := tensor.BF16
		if ct == cubind.R32F {
			dt = tensor.F32
		}
		outs := like(t, d, tensor.New(dt, M, N), tensor.New(dt, M, N))
		run := func(out *Tensor) func() error {
			return func() error { return gemmTuned(d, out, x, w, M, N, K, ct) }
		}
		if err := d.do(run(outs[0])); err != nil {
			t.Fatal(err)
		}
		p := findPlan(d, M, N, K, ct)
		if p == nil || p.kind != gemmKindLt {
			t.Fatalf("%v out: plan %+v, want a cuBLASLt algorithm", dt, p)
		}
		if err := d.do(func() error {
			return cubind.MemsetD8Async(outs[1].ptr, 0xff, uint64(outs[1].Bytes()), d.stream)
		}); err != nil {
			t.Fatal(err)
		}
		captureLinear(t, d, run(outs[1]))
		compare(t, "gemm-graph", fmt.Sprintf("%s out via %s", dt, p.name), down(t, d, outs[1]), down(t, d, outs[0]), exact)
	}
	// A shape first met while capturing: cublasGemmEx, no plan, then tuned eagerly.
	const M2 = 65
	xh2 := randTensor(rng, tensor.BF16, []int{M2, K}, -1, 1)
	x2 := up(t, d, xh2)[0]
	outs := like(t, d, tensor.New(tensor.BF16, M2, N), tensor.New(tensor.BF16, M2, N), tensor.New(tensor.BF16, M2, N))
	captureLinear(t, d, func() error { return linear(d, outs[0], x2, w) })
	if p := findPlan(d, M2, N, K, cubind.R16BF); p != nil {
		t.Fatalf("a shape met while capturing was tuned: %+v", p)
	}
	gemmTuneOff = true
	err := Linear(d, outs[1], x2, w)
	gemmTuneOff = false
	if err != nil {
		t.Fatal(err)
	}
	compare(t, "gemm-graph", "untuned while capturing", down(t, d, outs[0]), down(t, d, outs[1]), exact)
	if err := Linear(d, outs[2], x2, w); err != nil {
		t.Fatal(err)
	}
	if findPlan(d, M2, N, K, cubind.R16BF) == nil {
		t.Error("the eager call after the capture did not tune the shape")
	}
}
