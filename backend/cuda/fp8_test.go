package cuda

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// The FP8 kernels (fp8.go, kernels/fp8.cu) against backend/cpu's dequantize_fp8 and
// linear_fp8 on random weights: every scheme (tensor, channel [N,1] and [N], blocks that
// divide the weight and blocks cut at its edges, blocks the 16-byte path takes and those it
// leaves to the exact kernel), both fp8 formats, f32, bf16 and f16 scales, shapes whose N and
// K are no multiples of 128 (and K no multiple of 16).
//
// Tolerances: dequantize_fp8 is exact (NaN bytes give NaN on both sides). linear_fp8, with
// m = Σ|x·w| over each output's products (w the real weights): f32 x 2e-5·m (the order of the
// f32 operations differs: the GEMV scales sums rather than weights, cuBLAS sums in its own
// order); bf16 x 2^-8·m + 2^-7·|want| (the GEMV does not round each scaled weight to bf16 as
// the decomposition does, at most 2^-9·m, and both results are rounded to bf16, one bf16
// step apart at most).

// fp8Scheme cases: the scheme, its block, and the scale's shape for a weight [n,k].
type fp8SchemeCase struct {
	scheme string
	block  []int
	sdt    tensor.DType
	shape  func(n, k int) []int
}

func (c fp8SchemeCase) String() string {
	s := c.scheme
	if c.block != nil {
		s += fmt.Sprintf("%v", c.block)
	}
	return fmt.Sprintf("%s %s%v", s, c.sdt, c.shape(0, 0))
}

func fp8SchemeCases() []fp8SchemeCase {
	blk := func(bn, bk int) func(n, k int) []int {
		return func(n, k int) []int { return []int{(n + bn - 1) / bn, (k + bk - 1) / bk} }
	}
	return []fp8SchemeCase{
		{"tensor", nil, tensor.F32, func(int, int) []int { return []int{1} }},
		{"tensor", nil, tensor.F16, func(int, int) []int { return []int{} }},
		{"channel", nil, tensor.F32, func(n, _ int) []int { return []int{n, 1} }},
		{"channel", nil, tensor.BF16, func(n, _ int) []int { return []int{n} }},
		{"block", []int{128, 128}, tensor.F32, blk(128, 128)},
		{"block", []int{16, 16}, tensor.F32, blk(16, 16)},
		{"block", []int{7, 32}, tensor.BF16, blk(7, 32)},
		{"block", []int{8, 8}, tensor.F32, blk(8, 8)},     // bk < 16: the exact kernel
		{"block", []int{16, 48}, tensor.F32, blk(16, 48)}, // bk no power of two: the exact kernel
	}
}

// fp8Shapes are weights [N,K]: K a multiple of 16 or not, N and K no multiples of 128, last
// blocks cut short; N past 2048 and 16384 and K of 8208 for the GEMV's other tilings and its
// main loop (one row of x: 2 rows per warp, 4 rows per warp, 8 loads in flight).
var fp8Shapes = [][2]int{{1, 16}, {37, 1000}, {129, 400}, {300, 2064}, {65, 777}, {40, 8208}, {2100, 48}, {16390, 32}}

// randFP8 returns random fp8 bytes of dtype dt; finite leaves out the NaN (and e5m2
// infinity) patterns, which the 16-byte GEMV reads as finite values.
func randFP8(rng *rand.Rand, dt tensor.DType, shape []int, finite bool) *tensor.Tensor {
	t := tensor.New(dt, shape...)
	for i := range t.U8 {
		for {
			b := uint8(rng.IntN(256))
			special := b&0x7f == 0x7f
			if dt == tensor.F8E5M2 {
				special = b&0x7c == 0x7c
			}
			if !finite || !special {
				t.U8[i] = b
				break
			}
		}
	}
	return t
}

// randScale returns scales log-uniform in [2^-12, 2^4), rounded to dt.
func randScale(rng *rand.Rand, dt tensor.DType, shape []int) *tensor.Tensor {
	f := make([]float32, tensor.Numel(shape))
	for i := range f {
		f[i] = float32(math.Exp2(-12 + 16*rng.Float64()))
	}
	return tensor.FromF32(f, shape...).Cast(dt)
}

func fp8Attrs(c fp8SchemeCase) graph.Attrs {
	block := c.block
	if block == nil {
		block = []int{}
	}
	return graph.Attrs{"scheme": c.scheme, "block": block}
}

// TestFP8Dequantize checks dequantize_fp8 against the CPU's reference kernel bit for bit,
// every byte pattern included.
func TestFP8Dequantize(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(80, 80))
	for _, wdt := range []tensor.DType{tensor.F8E4M3, tensor.F8E5M2} {
		for _, sc := range fp8SchemeCases() {
			for _, nk := range fp8Shapes {
				for _, odt := range []tensor.DType{tensor.F32, tensor.BF16, tensor.F16} {
					name := fmt.Sprintf("%s[%d,%d] %s -> %s", wdt, nk[0], nk[1], sc, odt)
					wh := randFP8(rng, wdt, []int{nk[0], nk[1]}, false)
					sh := randScale(rng, sc.sdt, sc.shape(nk[0], nk[1]))
					attrs := fp8Attrs(sc)
					attrs["dtype"] = odt
					want := cpuOp(t, "dequantize_fp8", attrs, wh, sh)[0]
					in := up(t, d, wh, sh)
					out := like(t, d, want)[0]
					if err := DequantizeFP8(d, out, in[0], in[1], sc.scheme, sc.block); err != nil {
						t.Fatalf("%s: %v", name, err)
					}
					compare(t, "dequantize_fp8", name, down(t, d, out), want, exact)
				}
			}
		}
	}
}

// TestLinearFP8 checks linear_fp8 against the CPU's kernel: the GEMV (fast and exact
// kernels) for 1, 3 and 8 rows of x, the dequantized weight and cuBLAS for 17.
func TestLinearFP8(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(81, 81))
	for _, wdt := range []tensor.DType{tensor.F8E4M3, tensor.F8E5M2} {
		for _, xdt := range []tensor.DType{tensor.BF16, tensor.F32} {
			for _, sc := range fp8SchemeCases() {
				for _, nk := range fp8Shapes {
					N, K := nk[0], nk[1]
					wh := randFP8(rng, wdt, []int{N, K}, true)
					sh := randScale(rng, sc.sdt, sc.shape(N, K))
					wreal := cpuOp(t, "dequantize_fp8", graph.Attrs{"scheme": sc.scheme, "block": fp8Attrs(sc)["block"], "dtype": tensor.F32}, wh, sh)[0]
					dev := up(t, d, wh, sh)
					for _, M := range []int{1, 3, 8, 17} {
						name := fmt.Sprintf("x %s[%d,%d] w %s[%d,%d] %s", xdt, M, K, wdt, N, K, sc)
						xh := randTensor(rng, xdt, []int{M, K}, -1, 1)
						attrs := fp8Attrs(sc)
						attrs["activation_scheme"] = "none"
						want := cpuOp(t, "linear_fp8", attrs, xh, wh, sh)[0]
						x := up(t, d, xh)[0]
						out := like(t, d, want)[0]
						var ws *Tensor
						if M > fp8GemvMaxM {
							ws = like(t, d, tensor.New(tensor.Bool, N*K*xdt.Size()))[0]
						}
						if err := LinearFP8(d, out, x, dev[0], dev[1], ws, sc.scheme, sc.block, "none"); err != nil {
							t.Fatalf("%s: %v", name, err)
						}
						path := "cublas"
						if M <= fp8GemvMaxM {
							path = map[bool]string{true: "exact", false: "fast"}[planFP8Gemv(x, dev[0], mustScheme(t, sc), M).generic]
						}
						compare(t, "linear_fp8", name+" "+path, down(t, d, out), want, fp8Tol(xh, wreal, want))
					}
				}
			}
		}
	}
}

func mustScheme(t *testing.T, sc fp8SchemeCase) fp8Scheme {
	t.Helper()
	s, err := newFP8Scheme(sc.scheme, sc.block)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fp8Tol is the tolerance of linear_fp8's result want for x[M,K] and real weights w[N,K]
// (see the top of this file).
func fp8Tol(x, w, want *tensor.Tensor) tol {
	K := x.Shape[1]
	M, N := x.Shape[0], w.Shape[0]
	xs, ws := x.Float32s(), w.Float32s()
	allowed := make([]float64, M*N)
	for m := range M {
		for n := range N {
			s := 0.0
			for k := range K {
				s += math.Abs(float64(xs[m*K+k]) * float64(ws[n*K+k]))
			}
			if x.DType == tensor.BF16 {
				allowed[m*N+n] = s/256 + math.Abs(want.At(m*N+n))/128
			} else {
				allowed[m*N+n] = 2e-5 * s
			}
		}
	}
	return tol{rtol: 1, scale: allowed}
}

// TestFP8GemvPlan checks which products take the 16-byte GEMV (no GPU needed).
func TestFP8GemvPlan(t *testing.T) {
	for _, tc := range []struct {
		name    string
		K       int
		off     cubind.DevicePtr
		scheme  string
		block   []int
		generic bool
	}{
		{"channel", 4096, 0, "channel", nil, false},
		{"tensor", 4096, 0, "tensor", nil, false},
		{"block 128", 4096, 0, "block", []int{128, 128}, false},
		{"block 16 wide", 64, 0, "block", []int{1, 16}, false},
		{"block 8 wide", 64, 0, "block", []int{8, 8}, true},
		{"block 48 wide", 96, 0, "block", []int{16, 48}, true},
		{"K 8 mod 16", 1000, 0, "channel", nil, true},
		{"unaligned x", 64, 4, "channel", nil, true},
	} {
		s, err := newFP8Scheme(tc.scheme, tc.block)
		if err != nil {
			t.Fatal(err)
		}
		x := &Tensor{DType: tensor.BF16, Shape: []int{1, tc.K}, ptr: 1<<20 + tc.off}
		w := &Tensor{DType: tensor.F8E4M3, Shape: []int{4096, tc.K}, ptr: 1 << 30}
		p := planFP8Gemv(x, w, s, 1)
		if p.generic != tc.generic {
			t.Errorf("%s: generic %v, want %v", tc.name, p.generic, tc.generic)
		}
		if !p.generic && (p.cfg.rows < 2 || (s.kind == 2 && 1<<p.bkshift != s.bk)) {
			t.Errorf("%s: plan %+v", tc.name, p)
		}
	}
	if _, err := newFP8Scheme("row", nil); err == nil || !strings.Contains(err.Error(), `unknown fp8 scheme "row"`) {
		t.Errorf("scheme row: %v", err)
	}
}

// TestFP8KernelsCompile compiles the FP8 kernels in the forms the backend launches with
// NVRTC, GPU or not, and checks that the GEMVs keep everything in registers.
func TestFP8KernelsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("compiling takes seconds; skipped with -short")
	}
	arch := nvrtcArch(t)
	var extra strings.Builder
	for _, c := range []gemvConfig{{2, 4, 8}, {4, 4, 4}, {4, 2, 4}} {
		for _, m := range []int{1, 2, 8} {
			fmt.Fprintf(&extra, "FP8_GEMV(c_m%d_r%d_u%d, %d, %d, %d, BF16, true, F32, false)\n", m, c.rows, c.unroll, m, c.rows, c.unroll)
			fmt.Fprintf(&extra, "FP8_GEMV(b_m%d_r%d_u%d, %d, %d, %d, BF16, true, F32, true)\n", m, c.rows, c.unroll, m, c.rows, c.unroll)
		}
	}
	extra.WriteString("FP8_GEMV(f32_e5m2, 1, 2, 4, F32, false, BF16, false)\nFP8_GEMV_GENERIC(g8, 8, F32, false, Half16)\n")
	extra.WriteString("DEQUANT_FP8(dq_f16, true, Half16, BF16)\nDEQUANT_FP8(dq_f32, false, F32, F32)\n")
	extra.WriteString("FP8_QUANT_ROWS(qr_f32, F32, false)\nFP8_QUANT_ROWS(qr_bf16_g, BF16, true)\n")
	usage := ptxasUsage(t, "fp8.cu", extra.String(), arch)
	checkNoSpills(t, usage)
	for _, name := range slices.Sorted(maps.Keys(usage)) {
		if _, regs, ok := strings.Cut(usage[name], "Used "); ok {
			regs, _, _ = strings.Cut(regs, "\n")
			t.Logf("%s: %s", name, regs)
		}
	}
}

// TestFP8GemvTimings times the FP8 GEMV for one row of x on the Llama-3.1-8B decode shapes
// (channel scales, bf16 x) with the plan's tiling and others, beside the bf16 GEMV on the
// same shapes, when LOOM_CUDA_TIMINGS=1: graph-replayed calls rotating through 1 GiB of
// weight copies, so that every weight comes from HBM.
func TestFP8GemvTimings(t *testing.T) {
	d := gpu(t)
	if os.Getenv("LOOM_CUDA_TIMINGS") != "1" {
		t.Skip("set LOOM_CUDA_TIMINGS=1 to time the kernels")
	}
	const pool = 1 << 30
	rng := rand.New(rand.NewPCG(82, 82))
	buf := coldWeights(t, d, rng, pool)
	scale := up(t, d, randScale(rng, tensor.F32, []int{28672, 1}))[0]
	s := fp8Scheme{kind: 1, bn: 1, bk: 1}
	timeCalls := func(n int, call func(i int) error) float64 {
		var el time.Duration
		err := d.do(func() error {
			if err := call(0); err != nil { // compiles the kernel before the capture
				return err
			}
			var err error
			el, err = capturedCallTime(d, n, 3, call)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return el.Seconds() * 1e6
	}
	for _, nk := range [][2]int{{4096, 4096}, {1024, 4096}, {6144, 4096}, {14336, 4096}, {28672, 4096}, {4096, 14336}} {
		N, K := nk[0], nk[1]
		x := up(t, d, randTensor(rng, tensor.BF16, []int{1, K}, -1, 1))[0]
		out := zeroed(t, d, tensor.BF16, 1, N)
		sc := &Tensor{DType: tensor.F32, Shape: []int{N, 1}, ptr: scale.ptr, dev: d}
		weight := func(dt tensor.DType, i int) *Tensor {
			size := N * K * dt.Size()
			return &Tensor{DType: dt, Shape: []int{N, K}, ptr: buf.ptr + cubind.DevicePtr(i%(pool/size)*size), dev: d}
		}
		gp, _ := gemvFits(x, weight(tensor.BF16, 0))
		bf := timeCalls(2*pool/(2*N*K), func(i int) error { return launchGemv(d, out, x, weight(tensor.BF16, i), gp) })
		line := fmt.Sprintf("[%d,%d] bf16 gemv %.1f µs (%.0f GB/s); fp8", N, K, bf, 2*float64(N*K)/bf/1e3)
		for _, tl := range []gemvConfig{{}, {1, 8, 8}, {1, 8, 4}, {2, 4, 8}, {2, 8, 8}, {4, 2, 4}, {4, 4, 4}} {
			p := planFP8Gemv(x, weight(tensor.F8E4M3, 0), s, 1)
			if tl != (gemvConfig{}) {
				p.cfg = tl
			}
			us := timeCalls(2*pool/(N*K), func(i int) error { return launchFP8Gemv(d, out, x, weight(tensor.F8E4M3, i), sc, s, 1, p) })
			mark := ""
			if tl == (gemvConfig{}) {
				mark = "plan "
			}
			line += fmt.Sprintf(" %s%v %.1f µs (%.0f GB/s);", mark, p.cfg, us, float64(N*K)/us/1e3)
		}
		t.Log(line)
	}
}
