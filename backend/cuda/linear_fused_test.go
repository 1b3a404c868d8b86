package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// linear_swiglu and linear_qkv_rope against linear followed by swiglu_packed or qkv_rope on
// the GPU (the same bits: the fused GEMV sums every output as the plain one does), and
// against the CPU backend's kernels of the fused ops.

// linearFusedCase is one product: x[B,S,K] (M = B*S rows), and the heads of the q|k|v weight
// (H, KV, D) or, with H = 0, a gate|up weight of 2I rows.
type linearFusedCase struct {
	B, S, K  int
	H, KV, D int
	I        int
	x        tensor.DType
	pos      tensor.DType
	scaling  float64
	wantGemv bool // the fused GEMV takes it (else linear into the workspace)
}

func (c linearFusedCase) String() string {
	if c.H == 0 {
		return fmt.Sprintf("swiglu %s M%d K%d I%d", c.x, c.B*c.S, c.K, c.I)
	}
	return fmt.Sprintf("qkv_rope %s B%d S%d K%d H%d KV%d D%d %s", c.x, c.B, c.S, c.K, c.H, c.KV, c.D, c.pos)
}

func (c linearFusedCase) op() string {
	if c.H == 0 {
		return "linear_swiglu"
	}
	return "linear_qkv_rope"
}

func (c linearFusedCase) attrs() graph.Attrs {
	if c.H == 0 {
		return nil
	}
	inv := make([]float64, c.D/2)
	for i := range inv {
		inv[i] = float64(float32(math.Pow(500000, -float64(2*i)/float64(c.D))))
	}
	return graph.Attrs{"heads": c.H, "kv_heads": c.KV, "inv_freq": inv, "scaling": c.scaling}
}

func linearFusedCases() []linearFusedCase {
	bf, f32, i32, i64 := tensor.BF16, tensor.F32, tensor.I32, tensor.I64
	return []linearFusedCase{
		{B: 1, S: 1, K: 4096, I: 7168, x: bf, wantGemv: true},                                    // Llama-3.1-8B gate_up per GPU at tp=2
		{B: 1, S: 1, K: 4096, I: 14336, x: bf, wantGemv: true},                                   // and at tp=1
		{B: 1, S: 2, K: 4096, I: 7168, x: bf, wantGemv: true},                                    // two tokens: 4 rows per warp
		{B: 1, S: 1, K: 264, I: 37, x: bf, wantGemv: true},                                       // odd I: a clamped last warp, a tail of K
		{B: 1, S: 1, K: 4096, I: 14336, x: f32, wantGemv: true},                                  // f32 x (N >= 16384)
		{B: 1, S: 1, K: 256, I: 300, x: f32},                                                     // f32 x, small: cuBLAS
		{B: 1, S: 3, K: 512, I: 200, x: bf},                                                      // M = 3: cuBLAS
		{B: 1, S: 1, K: 4096, H: 16, KV: 4, D: 128, x: bf, pos: i32, scaling: 1, wantGemv: true}, // qkv per GPU at tp=2
		{B: 1, S: 1, K: 4096, H: 32, KV: 8, D: 128, x: bf, pos: i64, scaling: 1, wantGemv: true}, // and at tp=1
		{B: 2, S: 1, K: 4096, H: 16, KV: 4, D: 128, x: bf, pos: i32, scaling: 1, wantGemv: true}, // two sequences
		{B: 1, S: 4, K: 4096, H: 3, KV: 1, D: 16, x: bf, pos: i32, scaling: 0.7, wantGemv: true}, // four tokens, scaled
		{B: 1, S: 1, K: 40, H: 2, KV: 2, D: 6, x: bf, pos: i64, scaling: 1, wantGemv: true},      // odd half: one pair per warp
		{B: 1, S: 5, K: 256, H: 4, KV: 2, D: 8, x: bf, pos: i32, scaling: 1},                     // M = 5: cuBLAS
		{B: 1, S: 1, K: 256, H: 4, KV: 2, D: 8, x: f32, pos: i32, scaling: 1},                    // f32 x: cuBLAS
	}
}

// inputs makes the case's host inputs: x, w and (qkv_rope) positions.
func (c linearFusedCase) inputs(rng *rand.Rand) []*tensor.Tensor {
	N := 2 * c.I
	if c.H > 0 {
		N = (c.H + 2*c.KV) * c.D
	}
	in := []*tensor.Tensor{
		randTensor(rng, c.x, []int{c.B, c.S, c.K}, -1, 1),
		randTensor(rng, tensor.BF16, []int{N, c.K}, -1/math.Sqrt(float64(c.K)), 1/math.Sqrt(float64(c.K))),
	}
	if c.H > 0 {
		in = append(in, randInts(rng, c.pos, []int{c.B, c.S}, 9000))
	}
	return in
}

// fused queues the case's fused op on d; apart queues linear into y, then the packed op.
// The device must be locked.
func (c linearFusedCase) fused(d *Device, outs, in []*Tensor, inv, ws *Tensor) error {
	if c.H == 0 {
		return linearSwiGLU(d, outs[0], in[0], in[1], ws)
	}
	return linearQKVRope(d, outs[0], outs[1], outs[2], in[0], in[1], in[2], inv, ws, c.H, c.KV, float32(c.scaling))
}

func (c linearFusedCase) apart(d *Device, outs, in []*Tensor, inv, y *Tensor) error {
	if err := linear(d, y, in[0], in[1]); err != nil {
		return err
	}
	if c.H == 0 {
		return swigluPacked(d, outs[0], y)
	}
	return qkvRope(d, outs[0], outs[1], outs[2], y, in[2], inv, c.H, c.KV, float32(c.scaling))
}

// invFreq uploads the case's inverse frequencies (a placeholder for swiglu).
func (c linearFusedCase) invFreq(t *testing.T, d *Device) *Tensor {
	t.Helper()
	attrs := c.attrs()
	if attrs == nil {
		attrs = graph.Attrs{"inv_freq": []float64{1}}
	}
	var inv *Tensor
	if err := d.do(func() error {
		st, err := uploadInvFreq(d, &graph.Node{Attrs: attrs})
		inv, _ = st.(*Tensor)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Free(inv) })
	return inv
}

func TestLinearFused(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(31, 37))
	for _, c := range linearFusedCases() {
		t.Run(c.String(), func(t *testing.T) {
			hin := c.inputs(rng)
			in := up(t, d, hin...)
			want := cpuOp(t, c.op(), c.attrs(), hin...)
			inv := c.invFreq(t, d)
			yShape := []int{c.B, c.S, hin[1].Shape[0]}
			y := like(t, d, tensor.New(c.x, yShape...))[0]
			_, taken := fusedGemvPlan(in[0], in[1], c.D/2)
			if taken != c.wantGemv {
				t.Errorf("fused GEMV takes it: %v, want %v", taken, c.wantGemv)
			}
			if !taken {
				outs := like(t, d, want...)
				if err := d.do(func() error { return c.fused(d, outs, in, inv, nil) }); err == nil || !strings.Contains(err.Error(), "workspace") {
					t.Errorf("no workspace for a product the GEMV does not take: %v, want an error naming the workspace", err)
				}
			}
			fused, apart := like(t, d, want...), like(t, d, want...)
			if err := d.do(func() error { return c.fused(d, fused, in, inv, y) }); err != nil {
				t.Fatal(err)
			}
			if err := d.do(func() error { return c.apart(d, apart, in, inv, y) }); err != nil {
				t.Fatal(err)
			}
			for i := range want {
				got, ref := down(t, d, fused[i]), down(t, d, apart[i])
				if !sameTensorBits(got, ref) {
					t.Errorf("output %d: fused and apart differ", i)
				}
				compare(t, c.op(), fmt.Sprintf("%s output %d", c, i), got, want[i], tolLinearFused)
			}
		})
	}
}

// TestFusedGemvPlan checks the tilings of the fused GEMV (no GPU needed): an even number of
// rows per warp, as many loads in flight as linear's, rotation pairs within a head.
func TestFusedGemvPlan(t *testing.T) {
	bf := tensor.BF16
	for _, tc := range []struct {
		name   string
		x      tensor.DType
		xShape []int
		N, K   int
		half   int
		want   gemvConfig // {}: not on the GEMV
	}{
		{"gate_up tp=2", bf, []int{1, 1, 4096}, 14336, 4096, 0, gemvConfig{2, 4, 8}},
		{"gate_up tp=1", bf, []int{1, 1, 4096}, 28672, 4096, 0, gemvConfig{4, 2, 4}},
		{"small swiglu: one row per warp made two", bf, []int{1, 264}, 74, 264, 0, gemvConfig{2, 4, 8}},
		{"qkv tp=2", bf, []int{1, 1, 4096}, 3072, 4096, 64, gemvConfig{4, 4, 8}},
		{"qkv tp=1", bf, []int{1, 1, 4096}, 6144, 4096, 64, gemvConfig{4, 4, 8}},
		{"qkv, odd half: one pair per warp", bf, []int{1, 1, 40}, 36, 40, 3, gemvConfig{2, 4, 8}},
		{"qkv two tokens", bf, []int{1, 2, 4096}, 3072, 4096, 64, gemvConfig{2, 2, 8}},
		{"three tokens: cuBLAS", bf, []int{1, 3, 4096}, 3072, 4096, 64, gemvConfig{}},
		{"f32 x, small: cuBLAS", tensor.F32, []int{1, 256}, 600, 256, 0, gemvConfig{}},
	} {
		x := &Tensor{DType: tc.x, Shape: tc.xShape, ptr: 1 << 20}
		w := &Tensor{DType: bf, Shape: []int{tc.N, tc.K}, ptr: 1 << 30}
		p, ok := fusedGemvPlan(x, w, tc.half)
		if got := map[bool]gemvConfig{true: p.cfg}[ok]; got != tc.want {
			t.Errorf("%s: tiling %+v (on the GEMV: %v), want %+v", tc.name, p.cfg, ok, tc.want)
		}
	}
}

// tolLinearFused bounds the fused ops against the CPU's: the GPU's linear rounds f32 x to
// bf16, and its bf16 projections may round one ulp away from the CPU's (another summation
// order), which the rotation can double. The bits are pinned by the comparison with the ops
// run apart, each of which is tested against the CPU on its own.
var tolLinearFused = tol{atol: 1e-3, rtol: 3.0 / 128}

// sameTensorBits reports whether a and b hold the same dtype, shape and bits.
func sameTensorBits(a, b *tensor.Tensor) bool {
	if a.DType != b.DType || fmt.Sprint(a.Shape) != fmt.Sprint(b.Shape) {
		return false
	}
	for i := range a.Numel() {
		switch a.DType {
		case tensor.F32:
			if math.Float32bits(a.F32[i]) != math.Float32bits(b.F32[i]) {
				return false
			}
		default:
			if a.Half[i] != b.Half[i] {
				return false
			}
		}
	}
	return true
}

// TestLinearFusedTimings times the fused ops against linear then the packed op on the
// Llama-3.1-8B decode shapes, per GPU at tp=1 and tp=2, in CUDA graphs of 100 calls with the
// weights rotated beyond L2.
func TestLinearFusedTimings(t *testing.T) {
	d := gpu(t)
	if os.Getenv("LOOM_CUDA_TIMINGS") != "1" {
		t.Skip("set LOOM_CUDA_TIMINGS=1 to time the kernels")
	}
	rng := rand.New(rand.NewPCG(41, 43))
	const pool = 1 << 30
	buf := coldWeights(t, d, rng, pool)
	for _, c := range linearFusedCases() {
		if !c.wantGemv || c.K != 4096 || c.x != tensor.BF16 || c.B*c.S != 1 {
			continue
		}
		hin := c.inputs(rng)
		in := up(t, d, hin...)
		want := cpuOp(t, c.op(), c.attrs(), hin...)
		inv := c.invFreq(t, d)
		y := like(t, d, tensor.New(c.x, c.B, c.S, hin[1].Shape[0]))[0]
		outs := like(t, d, want...)
		copies := pool / in[1].Bytes()
		wAt := func(i int) []*Tensor {
			w := *in[1]
			w.ptr = buf.ptr + cubind.DevicePtr(i%copies*in[1].Bytes())
			return []*Tensor{in[0], &w, in[len(in)-1]}
		}
		// fusedTime is the µs per call of the fused op with tiling tl ({}: the plan's).
		fusedTime := func(tl gemvConfig) (float64, error) {
			if tl != (gemvConfig{}) {
				gemvTiling = func(int, int) gemvConfig { return tl }
				defer func() { gemvTiling = nil }()
			}
			var us float64
			err := d.do(func() error {
				el, err := capturedCallTime(d, 100, 5, func(i int) error { return c.fused(d, outs, wAt(i), inv, y) })
				us = el.Seconds() * 1e6
				return err
			})
			return us, err
		}
		fused, err := fusedTime(gemvConfig{})
		if err != nil {
			t.Fatal(err)
		}
		var apart float64
		err = d.do(func() error {
			el, err := capturedCallTime(d, 100, 5, func(i int) error { return c.apart(d, outs, wAt(i), inv, y) })
			apart = el.Seconds() * 1e6
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		p, _ := fusedGemvPlan(in[0], in[1], c.D/2)
		if os.Getenv("LOOM_GEMV_SWEEP") == "1" {
			for _, tl := range []gemvConfig{{2, 4, 8}, {2, 8, 8}, {2, 4, 4}, {2, 8, 4}, {4, 2, 8}, {4, 4, 4}, {4, 2, 4}, {4, 4, 8}} {
				us, err := fusedTime(tl)
				if err != nil {
					t.Fatal(err)
				}
				fmt.Printf("%-50s tiling %+v: %6.2f µs\n", c, tl, us)
			}
		}
		fmt.Printf("%-50s plan %+v ", c, p.cfg)
		fmt.Printf("fused %6.2f µs  linear + packed op %6.2f µs\n", fused, apart)
	}
}

// TestLinearFusedKernelsCompile compiles the fused GEMV kernels of the decode shapes (and
// the plain one beside them) with NVRTC, GPU or not, and checks that they keep everything in
// registers.
func TestLinearFusedKernelsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("compiling takes seconds; skipped with -short")
	}
	arch := nvrtcArch(t)
	var extra strings.Builder
	for _, c := range []gemvConfig{{1, 8, 8}, {2, 4, 8}, {4, 4, 4}, {4, 2, 4}} {
		for _, m := range []int{1, 2, 8} {
			fmt.Fprintf(&extra, "GEMV(g_m%d_r%d_u%d, %d, %d, %d, BF16)\n", m, c.rows, c.unroll, m, c.rows, c.unroll)
			if c.rows%2 == 0 {
				fmt.Fprintf(&extra, "GEMV_SWIGLU(s_m%d_r%d_u%d, %d, %d, %d, BF16)\n", m, c.rows, c.unroll, m, c.rows, c.unroll)
				fmt.Fprintf(&extra, "GEMV_QKV_ROPE(q_m%d_r%d_u%d, %d, %d, %d, BF16, int)\n", m, c.rows, c.unroll, m, c.rows, c.unroll)
			}
		}
	}
	extra.WriteString("GEMV_SWIGLU(s_f32, 1, 4, 2, F32)\nGEMV_QKV_ROPE(q_i64, 1, 2, 4, BF16, i64)\n")
	checkNoSpills(t, ptxasUsage(t, "gemv.cu", extra.String(), arch))
}
