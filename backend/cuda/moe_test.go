package cuda

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model"
	"github.com/loom-ml/loom/tensor"
)

// moeInstances are the instantiations of kernels/moe.cu that the backend appends: x, the
// experts and the router in the dtypes the tests and the models use.
var moeInstances = []string{
	"MOE_KERNELS(BF16, bf16, BF16, bf16, BF16, bf16)\nMOE_MMA_KERNELS()",
	"MOE_KERNELS(F32, f32, BF16, bf16, BF16, bf16)",
	"MOE_KERNELS(F32, f32, F32, f32, F32, f32)",
	"MOE_KERNELS(BF16, bf16, F32, f32, BF16, bf16)",
}

// moe.cu compiles with NVRTC in every form the backend instantiates (no GPU needed).
func TestMoEKernelsCompile(t *testing.T) {
	arch := nvrtcArch(t)
	for _, inst := range moeInstances {
		compileOnly(t, "moe.cu", inst, arch)
	}
}

// moeCase is one random moe problem: T tokens of H, E router experts of which L local from
// off, I the experts' intermediate size.
type moeCase struct {
	T, H, I, E, L, off, k int
	normalize             bool
	wd, act               tensor.DType
}

func (c moeCase) String() string {
	return fmt.Sprintf("%s T%d H%d I%d E%d L%d@%d k%d norm=%v wd=%s", c.act, c.T, c.H, c.I, c.E, c.L, c.off, c.k, c.normalize, c.wd)
}

func (c moeCase) attrs() graph.Attrs {
	return graph.Attrs{"top_k": c.k, "normalize": c.normalize, "weight_dtype": c.wd, "expert_offset": c.off}
}

// moeInputs makes x, router, gate, up and down. x and the router hold multiples of 1/8 in
// [-1, 1]: their products and sums are exact in f32 whatever the order, so the router
// logits, and from them the routing, are the same bits on the GPU as on the CPU (a routing
// difference would show as an error of the size of the outputs).
func moeInputs(rng *rand.Rand, c moeCase) []*tensor.Tensor {
	eighths := func(shape ...int) *tensor.Tensor {
		f := make([]float32, tensor.Numel(shape))
		for i := range f {
			f[i] = float32(rng.IntN(17)-8) / 8
		}
		return tensor.FromF32(f, shape...)
	}
	x := eighths(c.T, c.H).Cast(c.act)
	router := eighths(c.E, c.H).Cast(tensor.BF16)
	s := 1 / math.Sqrt(float64(c.H))
	gate := randTensor(rng, tensor.BF16, []int{c.L, c.I, c.H}, -2*s, 2*s)
	up := randTensor(rng, tensor.BF16, []int{c.L, c.I, c.H}, -2*s, 2*s)
	down := randTensor(rng, tensor.BF16, []int{c.L, c.H, c.I}, -2*s, 2*s)
	return []*tensor.Tensor{x, router, gate, up, down}
}

// moeScale is, per output element, the magnitude its error is measured against: Σ over the
// token's chosen local experts of |weight| · Σ_i |h_i · down[c,i]|, computed in float64 with
// a float64 routing (it only has to be the right size).
func moeScale(c moeCase, in []*tensor.Tensor) []float64 {
	x, router, gate, up, down := in[0].Float32s(), in[1].Float32s(), in[2].Float32s(), in[3].Float32s(), in[4].Float32s()
	out := make([]float64, c.T*c.H)
	for t := range c.T {
		xr := x[t*c.H : (t+1)*c.H]
		p := make([]float64, c.E)
		mx := math.Inf(-1)
		for e := range c.E {
			for i, v := range xr {
				p[e] += float64(v) * float64(router[e*c.H+i])
			}
			mx = max(mx, p[e])
		}
		sum := 0.0
		for e := range p {
			p[e] = math.Exp(p[e] - mx)
			sum += p[e]
		}
		chosen := make([]bool, c.E)
		var ids []int
		var ws []float64
		for range c.k {
			b := -1
			for e := range p {
				if !chosen[e] && (b < 0 || p[e] > p[b]) {
					b = e
				}
			}
			chosen[b] = true
			ids, ws = append(ids, b), append(ws, p[b]/sum)
		}
		if c.normalize {
			s := 0.0
			for _, w := range ws {
				s += w
			}
			for j := range ws {
				ws[j] /= s
			}
		}
		for j, e := range ids {
			l := e - c.off
			if l < 0 || l >= c.L {
				continue
			}
			h := make([]float64, c.I)
			for i := range c.I {
				g, u := 0.0, 0.0
				for q, v := range xr {
					g += float64(v) * float64(gate[(l*c.I+i)*c.H+q])
					u += float64(v) * float64(up[(l*c.I+i)*c.H+q])
				}
				h[i] = g / (1 + math.Exp(-g)) * u
			}
			for d := range c.H {
				m := 0.0
				for i, v := range h {
					m += math.Abs(v * float64(down[(l*c.H+d)*c.I+i]))
				}
				out[t*c.H+d] += math.Abs(ws[j]) * m
			}
		}
	}
	return out
}

// moeTol is the tolerance of the fused kernels against the CPU: routing is bit-exact (the
// test's router products are exact), and the GPU rounds where the CPU rounds, but its f32
// dot products add in another order. With f32 activations that moves a result by a few f32
// ulps of the products' magnitude (1e-5 of the scale). With bf16 activations, a dot product
// that lands next to a bf16 rounding boundary can round the other way: one bf16 ulp (2^-8
// of the value) at each rounding of g, u, silu·u, y, y·weight and each add; four bf16 ulps
// of the scale (2^-6) bounds what gets through to the output.
func moeTol(act tensor.DType, scale []float64) tol {
	if act == tensor.BF16 {
		return tol{atol: 1e-30, rtol: 1.0 / 64, scale: scale}
	}
	return tol{atol: 1e-30, rtol: 1e-5, scale: scale}
}

// The fused kernels (GEMV and tensor-core paths) against backend/cpu's fastMoE on random
// problems: one token, a few, a decode batch, a prefill; top_k 1 to 8; renormalised or not;
// weights rounded to f32 or bf16; local experts at an offset (expert parallelism: tokens
// routed elsewhere give 0); experts without tokens; sizes that are not multiples of the
// tiles.
func TestMoEMatchesCPU(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(8, 17))
	var cases []moeCase
	for _, act := range []tensor.DType{tensor.BF16, tensor.F32} {
		cases = append(cases,
			moeCase{T: 1, H: 64, I: 96, E: 8, L: 8, k: 2, normalize: true, wd: tensor.F32, act: act},
			moeCase{T: 1, H: 256, I: 40, E: 64, L: 64, k: 8, normalize: true, wd: tensor.BF16, act: act},
			moeCase{T: 3, H: 64, I: 48, E: 8, L: 4, off: 2, k: 2, normalize: false, wd: tensor.BF16, act: act},
			moeCase{T: 64, H: 128, I: 96, E: 16, L: 16, k: 4, normalize: true, wd: tensor.BF16, act: act},
			moeCase{T: 64, H: 64, I: 48, E: 32, L: 8, off: 24, k: 8, normalize: false, wd: tensor.F32, act: act},
			moeCase{T: 300, H: 64, I: 96, E: 8, L: 8, k: 2, normalize: true, wd: tensor.F32, act: act},
			moeCase{T: 300, H: 96, I: 40, E: 16, L: 6, off: 5, k: 1, normalize: false, wd: tensor.BF16, act: act},
		)
	}
	type variant struct {
		path  string
		tiles moeTiles
	}
	variants := []variant{{"", moeBatchTiles}, {"mma", moeBatchTiles}, {"mmv", moeBatchTiles}}
	for _, tl := range moeBatchTilings {
		variants = append(variants, variant{"gemv", tl})
	}
	defer func(p string, tl moeTiles) { moePath, moeBatchTiles = p, tl }(moePath, moeBatchTiles)
	for _, c := range cases {
		in := moeInputs(rng, c)
		want := cpuOp(t, "moe", c.attrs(), in...)[0]
		scale := moeScale(c, in)
		for _, v := range variants {
			if (v.path == "mma" || v.path == "mmv") && c.act != tensor.BF16 {
				continue
			}
			moePath, moeBatchTiles = v.path, v.tiles
			got := runOp(t, d, "moe", c.attrs(), in...)[0]
			name := fmt.Sprintf("%v path=%q tiles %+v", c, v.path, v.tiles)
			compare(t, "moe", name, got, want, moeTol(c.act, scale))
			same, zeros := 0, 0
			for i := range want.Numel() {
				if got.At(i) == want.At(i) {
					same++
				}
				if scale[i] == 0 {
					zeros++
				}
			}
			t.Logf("%s: %d of %d elements bit-identical to the CPU's, %d outputs of tokens without a local expert", name, same, want.Numel(), zeros)
		}
	}
}

// The moe step in CUDA graphs: the second run of a bucket is captured and later runs replay
// it; every run has new inputs and gives the CPU's result (the routing counter is reset by
// the kernel, the grouping recomputed on the device each time).
func TestMoEGraphReplay(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(3, 4))
	for _, c := range []moeCase{
		{T: 1, H: 64, I: 96, E: 16, L: 16, k: 4, normalize: true, wd: tensor.BF16, act: tensor.BF16},
		{T: 64, H: 64, I: 48, E: 8, L: 8, k: 2, normalize: false, wd: tensor.F32, act: tensor.BF16},
	} {
		in := moeInputs(rng, c)
		g, _ := opGraph(t, "moe", c.attrs(), in...)
		p, err := Compile(context.Background(), d, g, nil, &Options{Graphs: true})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(p.steps, func(s step) bool { return s.node.Op == "moe" }) {
			t.Fatalf("%v: moe did not get its kernel", c)
		}
		for run := range 4 {
			in := moeInputs(rng, c)
			_, feeds := opGraph(t, "moe", c.attrs(), in...)
			out, err := p.Run(context.Background(), feeds)
			if err != nil {
				t.Fatal(err)
			}
			want := cpuOp(t, "moe", c.attrs(), in...)[0]
			compare(t, "moe", fmt.Sprintf("%v graph run %d", c, run), out[0], want, moeTol(c.act, moeScale(c, in)))
		}
		p.Close()
	}
}

// A node the kernels do not take (f16 weights) runs as the decomposition, with the reason
// logged; a node they take keeps its kernel (no GPU needed).
func TestMoESupports(t *testing.T) {
	c := moeCase{T: 2, H: 64, I: 48, E: 8, L: 8, k: 2, wd: tensor.F32, act: tensor.BF16}
	rng := rand.New(rand.NewPCG(1, 2))
	in := moeInputs(rng, c)
	g, _ := opGraph(t, "moe", c.attrs(), in...)
	x, _, err := expandGraph(g)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(x.Nodes, func(n *graph.Node) bool { return n.Op == "moe" }) {
		t.Errorf("a bf16 moe was expanded")
	}
	in[2], in[3], in[4] = in[2].Cast(tensor.F16), in[3].Cast(tensor.F16), in[4].Cast(tensor.F16)
	g, _ = opGraph(t, "moe", c.attrs(), in...)
	if err := moeSupports(g.Nodes[len(g.Nodes)-1]); err == nil {
		t.Errorf("moeSupports takes f16 experts")
	}
	x, _, err = expandGraph(g)
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(x.Nodes, func(n *graph.Node) bool { return n.Op == "moe" }) {
		t.Errorf("an f16 moe kept its kernel")
	}
	if err := moeCheck(tensor.BF16, tensor.BF16, tensor.BF16, tensor.BF16, tensor.BF16, 64, 64, 64, 48, MoEAttrs{TopK: 33, WeightDType: tensor.F32}); err == nil {
		t.Errorf("moeCheck takes top_k 33")
	}
	if err := moeCheck(tensor.BF16, tensor.BF16, tensor.BF16, tensor.BF16, tensor.BF16, 8, 60, 8, 48, MoEAttrs{TopK: 2, WeightDType: tensor.F32}); err == nil {
		t.Errorf("moeCheck takes H = 60")
	}
}

// The MoE fixtures with the fused kernel: f32 activations give Hugging Face's logits within
// parity.LogitTol and its greedy tokens (the kernel multiplies f32 activations exactly, as
// the CPU does); bf16 activations give the CPU's bf16 logits within a few bf16 ulps, and
// Hugging Face's within parity.BF16Bound with its greedy tokens (the CPU's bf16 logits are
// within 4 ulps of them: engine TestBF16HuggingFace).
func TestMoEFusedOnGPU(t *testing.T) {
	d := gpu(t)
	for _, name := range moeFixtures {
		t.Run(name, func(t *testing.T) {
			m, err := model.Open("../../testdata/" + name)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			for _, act := range []tensor.DType{tensor.F32, tensor.BF16} {
				g := optimizedGraph(t, m, act)
				x, _, err := expandGraph(g)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.ContainsFunc(x.Nodes, func(n *graph.Node) bool { return n.Op == "moe" }) {
					t.Fatalf("%s %s: the moe ops do not run on the fused kernel", name, act)
				}
				if act == tensor.F32 {
					checkHFParity(t, d, name, m, g)
				} else {
					checkAgainstCPU(t, d, name, act, m, g)
					checkBF16HuggingFace(t, d, name, m, g)
				}
			}
		})
	}
}

// The fused decode kernels (router and routing in one launch for up to 8 tokens; one
// token's down projection and combine in one) give the bits of the separate kernels: one
// token and a few, top_k from 1 to 8, expert counts that are not multiples of a block's
// warps, local experts at an offset (a token may choose none of them), f32 and bf16.
func TestMoEFusedDecodeBits(t *testing.T) {
	d := gpu(t)
	defer func(f bool) { moeFuseDecode = f }(moeFuseDecode)
	rng := rand.New(rand.NewPCG(9, 18))
	var cases []moeCase
	for _, act := range []tensor.DType{tensor.BF16, tensor.F32} {
		cases = append(cases,
			moeCase{T: 1, H: 2048, I: 768, E: 128, L: 128, k: 8, normalize: true, wd: tensor.BF16, act: act},
			moeCase{T: 1, H: 64, I: 96, E: 60, L: 60, k: 4, normalize: false, wd: tensor.BF16, act: act},
			moeCase{T: 1, H: 64, I: 48, E: 8, L: 4, off: 4, k: 1, normalize: true, wd: tensor.F32, act: act},
			moeCase{T: 1, H: 128, I: 40, E: 16, L: 8, off: 0, k: 6, normalize: false, wd: tensor.BF16, act: act},
			moeCase{T: 5, H: 256, I: 96, E: 60, L: 60, k: 4, normalize: false, wd: tensor.BF16, act: act},
			moeCase{T: 8, H: 64, I: 48, E: 32, L: 8, off: 24, k: 8, normalize: true, wd: tensor.F32, act: act},
		)
	}
	for _, c := range cases {
		in := moeInputs(rng, c)
		moeFuseDecode = false
		want := runOp(t, d, "moe", c.attrs(), in...)[0]
		moeFuseDecode = true
		got := runOp(t, d, "moe", c.attrs(), in...)[0]
		compare(t, "moe fused decode", c.String(), got, want, exact)
	}
}

// TestMoETimings times graph op moe on Qwen3-30B-A3B's layer shape (H 2048, 128 experts of
// I 768, top 8, bf16) for decode batches and small prefills, each path and the grouped
// GEMV's tilings, when LOOM_CUDA_TIMINGS=1: graph-replayed calls rotating through 16 inputs
// (so that each call routes to other experts), the time of the launches up to the router,
// routing, gate/up, down and combine, and the experts' bytes read over the whole time
// (expected distinct experts E·(1-(1-k/E)^T), 9.4 MB each).
func TestMoETimings(t *testing.T) {
	d := gpu(t)
	if os.Getenv("LOOM_CUDA_TIMINGS") != "1" {
		t.Skip("set LOOM_CUDA_TIMINGS=1 to time the kernels")
	}
	defer func(p string, s int, tl moeTiles) { moePath, moeSteps, moeBatchTiles = p, s, tl }(moePath, moeSteps, moeBatchTiles)
	const H, I, E, k, nx = 2048, 768, 128, 8, 16
	rng := rand.New(rand.NewPCG(5, 5))
	s := 1 / math.Sqrt(H)
	w := up(t, d, randTensor(rng, tensor.BF16, []int{E, H}, -1, 1),
		randTensor(rng, tensor.BF16, []int{E, I, H}, -2*s, 2*s), randTensor(rng, tensor.BF16, []int{E, I, H}, -2*s, 2*s),
		randTensor(rng, tensor.BF16, []int{E, H, I}, -2*s, 2*s))
	counter := zeroed(t, d, tensor.I32, 1)
	a := MoEAttrs{TopK: k, Normalize: true, WeightDType: tensor.BF16}
	type variant struct {
		path  string
		tiles moeTiles
	}
	var variants []variant
	for _, tl := range moeBatchTilings {
		variants = append(variants, variant{"gemv", tl})
	}
	variants = append(variants, variant{"mma", moeBatchTiles}, variant{"mmv", moeBatchTiles})
	for _, T := range []int{1, 2, 8, 32, 64, 128, 256} {
		xs := make([]*Tensor, nx)
		for i := range xs {
			xs[i] = up(t, d, randTensor(rng, tensor.BF16, []int{T, H}, -1, 1))[0]
		}
		out := zeroed(t, d, tensor.BF16, T, H)
		ws := zeroed(t, d, tensor.I32, int(moeLayoutFor(T, H, E, E, I, k, 2).total)/4+1)
		experts := E * (1 - math.Pow(1-float64(k)/E, float64(T)))
		for vi, v := range variants {
			if T == 1 && vi > 0 && vi < len(variants)-2 {
				continue // one token runs moeTokenTiles
			}
			moePath, moeBatchTiles = v.path, v.tiles
			line := fmt.Sprintf("T=%d %s %+v:", T, v.path, v.tiles)
			var prev, full float64
			for steps := 1; steps <= 5; steps++ {
				moeSteps = steps
				call := func(i int) error { return moe(d, out, xs[i%nx], w[0], w[1], w[2], w[3], ws, counter, a) }
				var el time.Duration
				err := d.do(func() error {
					if err := call(0); err != nil {
						return err
					}
					var err error
					el, err = capturedCallTime(d, 4*nx, 5, call)
					return err
				})
				if err != nil {
					t.Fatal(err)
				}
				full = el.Seconds() * 1e6
				line += fmt.Sprintf(" +%s %.1f", []string{"router", "route", "gate_up", "down", "combine"}[steps-1], full-prev)
				prev = full
			}
			t.Logf("%s = %.1f µs; experts %.0f (%.0f MB): %.0f GB/s", line, full, experts, experts*3*I*H*2/1e6, experts*3*I*H*2/full/1e3)
		}
	}
}

// LOOM_CUDA_MOE_TILES picks one of the instantiated tilings; anything else keeps the default.
func TestMoETilesFromEnv(t *testing.T) {
	def := moeTiles{2, 2, 2, 2}
	for _, c := range []struct {
		env  string
		want moeTiles
	}{
		{"", def},
		{"4,1,4,1", moeTiles{4, 1, 4, 1}},
		{"1,2,2,2", moeTiles{1, 2, 2, 2}},
		{"4,1,8,1", def}, // not instantiated: 8 rows of 8 tokens do not fit a warp's lanes
		{"2,2", def},
		{"a,b,c,d", def},
	} {
		got := moeTilesFromEnv(def, func(string) string { return c.env })
		if got != c.want {
			t.Errorf("LOOM_CUDA_MOE_TILES=%q: %+v, want %+v", c.env, got, c.want)
		}
	}
}
