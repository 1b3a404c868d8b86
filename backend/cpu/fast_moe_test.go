package cpu

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// exactLinear reports whether this build's linear kernels are the portable Go ones on amd64
// (no fused multiply-add, no AVX kernels), under which fastMoE gives the bits of the moe
// op's decomposition (see fastMoE).
func exactLinear() bool {
	same := func(a, b any) bool { return reflect.ValueOf(a).Pointer() == reflect.ValueOf(b).Pointer() }
	return runtime.GOARCH == "amd64" && same(groupBF16, gemmGroupBF16) && same(groupF32, gemmGroupF32)
}

type moeCase struct {
	name          string
	act, w, wd    tensor.DType
	tokens        []int // x's leading dims
	E, L, I, H, k int
	offset        int
	normalize     bool
	zeroRouter    bool // every probability equal: ties everywhere
}

func (c moeCase) inputs(rng *rand.Rand) []*tensor.Tensor {
	x := randTensor(rng, c.act, append(append([]int(nil), c.tokens...), c.H), -2, 2)
	router := randTensor(rng, c.w, []int{c.E, c.H}, -1, 1)
	if c.zeroRouter {
		router = tensor.New(c.w, c.E, c.H)
	}
	return []*tensor.Tensor{x, router,
		randTensor(rng, c.w, []int{c.L, c.I, c.H}, -0.5, 0.5),
		randTensor(rng, c.w, []int{c.L, c.I, c.H}, -0.5, 0.5),
		randTensor(rng, c.w, []int{c.L, c.H, c.I}, -0.5, 0.5)}
}

func (c moeCase) attrs() graph.Attrs {
	return graph.Attrs{"top_k": c.k, "normalize": c.normalize, "weight_dtype": c.wd, "expert_offset": c.offset}
}

var moeCases = []moeCase{
	{name: "mixtral f32", act: tensor.F32, w: tensor.BF16, wd: tensor.F32, tokens: []int{2, 5}, E: 4, L: 4, I: 6, H: 8, k: 2, normalize: true},
	{name: "mixtral bf16", act: tensor.BF16, w: tensor.BF16, wd: tensor.F32, tokens: []int{1, 9}, E: 4, L: 4, I: 6, H: 8, k: 2, normalize: true},
	{name: "qwen bf16", act: tensor.BF16, w: tensor.BF16, wd: tensor.BF16, tokens: []int{3, 4}, E: 8, L: 8, I: 12, H: 16, k: 2},
	{name: "qwen3 f32 normalized", act: tensor.F32, w: tensor.BF16, wd: tensor.F32, tokens: []int{2, 7}, E: 8, L: 8, I: 5, H: 12, k: 3, normalize: true},
	{name: "f16 x f32 weights top-1", act: tensor.F16, w: tensor.F32, wd: tensor.F16, tokens: []int{6}, E: 3, L: 3, I: 4, H: 8, k: 1},
	{name: "every expert", act: tensor.F32, w: tensor.F16, wd: tensor.F32, tokens: []int{2, 3}, E: 4, L: 4, I: 3, H: 5, k: 4, normalize: true},
	{name: "ep local experts 2..3 of 4", act: tensor.F32, w: tensor.BF16, wd: tensor.F32, tokens: []int{2, 6}, E: 4, L: 2, I: 6, H: 8, k: 2, offset: 2, normalize: true},
	{name: "ep local expert 1 of 4, top-3", act: tensor.BF16, w: tensor.BF16, wd: tensor.BF16, tokens: []int{1, 11}, E: 4, L: 1, I: 6, H: 8, k: 3, offset: 1},
	{name: "ties", act: tensor.F32, w: tensor.BF16, wd: tensor.F32, tokens: []int{2, 3}, E: 6, L: 6, I: 4, H: 8, k: 2, zeroRouter: true},
	{name: "no tokens", act: tensor.F32, w: tensor.BF16, wd: tensor.F32, tokens: []int{0, 3}, E: 4, L: 4, I: 4, H: 8, k: 2},
	{name: "many tokens", act: tensor.F32, w: tensor.BF16, wd: tensor.F32, tokens: []int{1, 67}, E: 8, L: 8, I: 40, H: 64, k: 2, normalize: true},
}

// The fast moe kernel against its reference, the decomposition run with reference kernels:
// bit for bit where the linear kernel is the portable one on amd64, else within the
// rounding of the experts' sums.
func TestFastMoE(t *testing.T) {
	rng := rand.New(rand.NewPCG(201, 202))
	exact := exactLinear()
	ref, _ := Reference("moe")
	for _, c := range moeCases {
		t.Run(c.name, func(t *testing.T) {
			in := c.inputs(rng)
			n, outs := nodeFor(t, "moe", c.attrs(), in)
			want, err := runKernel(ref, n, in, outs)
			if err != nil {
				t.Fatal(err)
			}
			got, err := runKernel(fastMoE, n, in, outs)
			if err != nil {
				t.Fatal(err)
			}
			scale := 1.0
			for i := range want[0].Numel() {
				scale = max(scale, math.Abs(want[0].At(i)))
			}
			tol := 0.0
			if !exact {
				tol = (1e-5 + 4*linearRelErr() + 4*ulp(c.act)) * scale // linearRelErr: where the kernel set rounds x to bf16
			}
			worst, bad := 0.0, 0
			for i := range want[0].Numel() {
				g, r := got[0].At(i), want[0].At(i)
				d := math.Abs(g - r)
				worst = max(worst, d)
				if d > tol || math.IsNaN(d) {
					if bad++; bad <= 5 {
						t.Errorf("element %d (index %v): fast %v, decomposition %v", i, unflatten(i, outs[0].Shape), g, r)
					}
				}
			}
			t.Logf("largest difference %.3g (exact build: %v)", worst, exact)
		})
	}
}

// Expert-parallel ranks: the local outputs of disjoint expert ranges add up to the whole
// block's output, exactly with top-2 (each sum has two nonzero terms).
func TestFastMoEExpertRanges(t *testing.T) {
	rng := rand.New(rand.NewPCG(203, 204))
	c := moeCase{act: tensor.F32, w: tensor.BF16, wd: tensor.F32, tokens: []int{3, 5}, E: 8, L: 8, I: 6, H: 8, k: 2, normalize: true}
	in := c.inputs(rng)
	n, outs := nodeFor(t, "moe", c.attrs(), in)
	whole, err := runKernel(fastMoE, n, in, outs)
	if err != nil {
		t.Fatal(err)
	}
	for _, ranks := range []int{2, 4, 8} {
		sum := make([]float32, whole[0].Numel())
		L := c.E / ranks
		for r := range ranks {
			part := func(w *tensor.Tensor) *tensor.Tensor {
				size := w.Numel() / c.E
				v := tensor.New(w.DType, append([]int{L}, w.Shape[1:]...)...)
				tensor.CopyRange(v, 0, w, r*L*size, L*size)
				return v
			}
			rc := c
			rc.L, rc.offset = L, r*L
			rin := []*tensor.Tensor{in[0], in[1], part(in[2]), part(in[3]), part(in[4])}
			rn, routs := nodeFor(t, "moe", rc.attrs(), rin)
			got, err := runKernel(fastMoE, rn, rin, routs)
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range got[0].F32 {
				sum[i] += v
			}
		}
		for i, v := range sum {
			if v != whole[0].F32[i] {
				t.Fatalf("%d ranks: element %d sums to %v, the whole block gives %v", ranks, i, v, whole[0].F32[i])
			}
		}
	}
}

// The moe op runs through a compiled program with stacked params read from MapWeights.
func TestMoEProgramStackedWeights(t *testing.T) {
	rng := rand.New(rand.NewPCG(205, 206))
	const E, I, H = 4, 6, 8
	w := MapWeights{"router": randTensor(rng, tensor.BF16, []int{E, H}, -1, 1)}
	b := graph.NewBuilder("moe")
	x := b.Input("x", tensor.F32, graph.Shape{graph.Sym("S"), graph.D(H)})
	stack := func(proj string, rows, cols int) *graph.Value {
		for e := range E {
			w[fmt.Sprintf("experts.%d.%s", e, proj)] = randTensor(rng, tensor.BF16, []int{rows, cols}, -0.5, 0.5)
		}
		return b.Named(proj, graph.OpParam, graph.Attrs{"key": "experts.*." + proj, "dtype": tensor.BF16, "shape": graph.Dims(E, rows, cols), "stack": E})
	}
	gate, up, down := stack("gate", I, H), stack("up", I, H), stack("down", H, I)
	b.Output(b.MoE(x, b.Param("router", tensor.BF16, graph.Dims(E, H)), gate, up, down, graph.MoERouting{TopK: 2, WeightDType: tensor.F32}, 0))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	p, err := Compile(context.Background(), g, w)
	if err != nil {
		t.Fatal(err)
	}
	xs := randTensor(rng, tensor.F32, []int{5, H}, -1, 1)
	got, err := p.Run(context.Background(), map[string]*tensor.Tensor{"x": xs})
	if err != nil {
		t.Fatal(err)
	}
	// The same block from per-expert params, as the frontend writes it.
	b = graph.NewBuilder("dense")
	x = b.Input("x", tensor.F32, graph.Shape{graph.Sym("S"), graph.D(H)})
	var ex []graph.MoEExpert
	for e := range E {
		p := func(proj string, rows, cols int) *graph.Value {
			return b.Param(fmt.Sprintf("experts.%d.%s", e, proj), tensor.BF16, graph.Dims(rows, cols))
		}
		ex = append(ex, graph.MoEExpert{Gate: p("gate", I, H), Up: p("up", I, H), Down: p("down", H, I)})
	}
	b.Output(graph.DecomposeMoE(b, x, b.Param("router", tensor.BF16, graph.Dims(E, H)), ex, graph.MoERouting{TopK: 2, WeightDType: tensor.F32}))
	dg, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	dp, err := Compile(context.Background(), dg, w)
	if err != nil {
		t.Fatal(err)
	}
	want, err := dp.Run(context.Background(), map[string]*tensor.Tensor{"x": xs})
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range want[0].F32 {
		if d := math.Abs(float64(got[0].F32[i] - v)); !(d <= 1e-5) || (exactLinear() && d != 0) {
			t.Fatalf("element %d: moe %v, the frontend's block %v", i, got[0].F32[i], v)
		}
	}
	// A missing expert fails the compile naming it.
	delete(w, "experts.2.up")
	if _, err := Compile(context.Background(), g, w); err == nil || !strings.Contains(err.Error(), `weight "experts.2.up" not found`) {
		t.Errorf("missing expert: %v", err)
	}
}
