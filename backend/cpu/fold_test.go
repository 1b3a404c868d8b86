package cpu

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Constant folding at compile time.

// fusedQKVGraph: x f32[S,4] @ concat(wq bf16[3,4], wk bf16[2,4])^T, the form fuse_gemms
// gives a fused projection; with alsoWQ, wq is also used on its own by a linear node.
func fusedQKVGraph(t *testing.T, alsoWQ bool) *graph.Graph {
	b := graph.NewBuilder("qkv")
	x := b.Input("x", tensor.F32, graph.Shape{graph.Sym("S"), graph.D(4)})
	wq := b.Param("wq", tensor.BF16, graph.Dims(3, 4))
	wk := b.Param("wk", tensor.BF16, graph.Dims(2, 4))
	w := b.Named("wqk", "concat", graph.Attrs{"axis": 0}, wq, wk)
	b.Output(b.Linear(x, w))
	if alsoWQ {
		b.Output(b.Linear(x, wq))
	}
	return mustBuild(t, b)
}

func TestFoldConcatOfParams(t *testing.T) {
	rng := rand.New(rand.NewPCG(111, 112))
	w := MapWeights{
		"wq": randTensor(rng, tensor.BF16, []int{3, 4}, -1, 1),
		"wk": randTensor(rng, tensor.BF16, []int{2, 4}, -1, 1),
	}
	x := randTensor(rng, tensor.F32, []int{3, 4}, -1, 1)
	// The same computation with the weights as graph inputs, so nothing folds.
	b := graph.NewBuilder("unfolded")
	xv := b.Input("x", tensor.F32, graph.Shape{graph.Sym("S"), graph.D(4)})
	wq := b.Input("wq", tensor.BF16, graph.Dims(3, 4))
	wk := b.Input("wk", tensor.BF16, graph.Dims(2, 4))
	b.Output(b.Linear(xv, b.Concat(0, wq, wk)), b.Linear(xv, wq))
	unfolded := mustCompile(t, mustBuild(t, b), nil)
	want, err := unfolded.Run(context.Background(), map[string]*tensor.Tensor{"x": x, "wq": w["wq"], "wk": w["wk"]})
	if err != nil {
		t.Fatal(err)
	}
	if unfolded.folded != 0 {
		t.Errorf("folded %d nodes of a graph whose weights are inputs", unfolded.folded)
	}

	for _, alsoWQ := range []bool{false, true} {
		p := mustCompile(t, fusedQKVGraph(t, alsoWQ), w)
		if p.folded != 1 {
			t.Errorf("alsoWQ=%v: folded %d nodes, want 1 (the concat)", alsoWQ, p.folded)
		}
		for _, st := range p.steps {
			if st.node.Op != "linear" {
				t.Errorf("alsoWQ=%v: step %s left to run", alsoWQ, st.node)
			}
		}
		// The concat is held once, as bf16; wk (and wq, unless a linear reads it) is dropped.
		held := map[string]*tensor.Tensor{}
		for s, tt := range p.fixed {
			if tt != nil {
				held[p.values[s].Name] = tt
			}
		}
		cat := held["wqk"]
		if cat == nil || cat.DType != tensor.BF16 || !slices.Equal(cat.Shape, []int{5, 4}) {
			t.Fatalf("alsoWQ=%v: folded concat is %v, want bf16[5 4]", alsoWQ, cat)
		}
		if !slices.Equal(cat.Half, append(slices.Clone(w["wq"].Half), w["wk"].Half...)) {
			t.Errorf("alsoWQ=%v: folded concat holds the wrong values", alsoWQ)
		}
		if _, ok := held["wk"]; ok {
			t.Errorf("alsoWQ=%v: wk is still held after folding", alsoWQ)
		}
		if _, ok := held["wq"]; ok != alsoWQ {
			t.Errorf("alsoWQ=%v: wq held = %v", alsoWQ, ok)
		}
		wantBytes := 5 * 4 * 2
		if alsoWQ {
			wantBytes += 3 * 4 * 2
		}
		if got := p.WeightBytes(); got != wantBytes {
			t.Errorf("alsoWQ=%v: WeightBytes = %d, want %d", alsoWQ, got, wantBytes)
		}
		got, err := p.Run(context.Background(), map[string]*tensor.Tensor{"x": x})
		if err != nil {
			t.Fatal(err)
		}
		for i := range got {
			if !slices.Equal(got[i].F32, want[i].F32) {
				t.Errorf("alsoWQ=%v: output %d = %v, unfolded %v", alsoWQ, i, got[i], want[i])
			}
		}
	}
}

// TestFoldChains: chains of foldable nodes fold (intermediates are not kept), nodes with a
// symbolic shape do not, and a folded graph output is a copy.
func TestFoldChains(t *testing.T) {
	b := graph.NewBuilder("chain")
	x := b.Input("x", tensor.F32, graph.Shape{graph.Sym("N")})
	w := b.Param("w", tensor.F32, graph.Dims(3))
	neg := b.Named("neg", "neg", nil, w)
	scaled := b.Named("scaled", "mul", nil, neg, b.Scalar(tensor.F32, 2)) // -2w
	count := b.Named("count", "iota", graph.Attrs{"shape": graph.Shape{graph.Sym("N")}, "dtype": tensor.F32})
	b.Output(scaled, b.Add(b.Reshape(b.Reduce("sum", scaled, false, 0), graph.D(1)), b.Add(x, count)))
	p := mustCompile(t, mustBuild(t, b), MapWeights{"w": tensor.FromF32([]float32{1, 2, 3}, 3)})
	var steps []string
	for _, st := range p.steps {
		steps = append(steps, st.node.Op)
	}
	if want := []string{"iota", "add", "add"}; !slices.Equal(steps, want) {
		t.Errorf("steps %v, want %v", steps, want)
	}
	if p.folded != 4 { // neg, mul, sum, reshape
		t.Errorf("folded %d nodes, want 4", p.folded)
	}
	// Held: scaled (an output) and the reshaped sum; not w, neg, the scalar or the sum.
	if got, want := p.WeightBytes(), (3+1)*4; got != want {
		t.Errorf("WeightBytes = %d, want %d", got, want)
	}
	for range 2 {
		out, err := p.Run(context.Background(), map[string]*tensor.Tensor{"x": tensor.FromF32([]float32{10, 20}, 2)})
		if err != nil {
			t.Fatal(err)
		}
		checkTensor(t, "scaled", out[0], tensor.F32, []int{3}, []float64{-2, -4, -6})
		checkTensor(t, "sum", out[1], tensor.F32, []int{2}, []float64{-12 + 10, -12 + 20 + 1})
		out[0].F32[0] = 99 // must not reach the program
	}
}

// TestFusedLayerMatchesPlain: a small Llama decoder layer written with fused ops and fused
// GEMMs (folded at compile time) and run with the fast kernels gives what the plain
// primitive layer gives with reference kernels only.
func TestFusedLayerMatchesPlain(t *testing.T) {
	rng := rand.New(rand.NewPCG(113, 114))
	d := layerDims{hidden: 64, heads: 6, kv: 2, headDim: 16, ffn: 96}
	w := layerWeights(rng, d)
	ctx := context.Background()
	for _, act := range []tensor.DType{tensor.F32, tensor.BF16} {
		plain, err := compile(ctx, plainLayer(t, d, act), w, Reference)
		if err != nil {
			t.Fatal(err)
		}
		fused := mustCompile(t, fusedLayer(t, d, act), w)
		if fused.folded != 2 {
			t.Errorf("%s: folded %d nodes, want the 2 weight concats", act, fused.folded)
		}
		if got, want := fused.WeightBytes(), plain.WeightBytes(); got > want {
			t.Errorf("%s: fused program holds %d bytes, the plain one %d", act, got, want)
		}
		const B, S = 2, 7
		in := map[string]*tensor.Tensor{
			"h":         randTensor(rng, act, []int{B, S, d.hidden}, -2, 2),
			"positions": positionsFrom(tensor.I32, S, 1, 5, 0),
		}
		want, err := plain.Run(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		got, err := fused.Run(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		// The fast kernels round like the decomposition; only linear may sum in another order
		// (the SIMD build), and a layer spreads such differences: compare with the output's
		// root mean square as the scale.
		g, r := values(got[0]), values(want[0])
		rms, worst := 0.0, 0.0
		for _, v := range r {
			rms += v * v
		}
		rms = math.Sqrt(rms / float64(len(r)))
		for i := range r {
			worst = max(worst, math.Abs(g[i]-r[i]))
		}
		tol := 1e-4
		if act != tensor.F32 {
			tol = 4 * ulp(act)
		}
		t.Logf("%s: largest difference %.3g, %.3g of the output's rms %.3g", act, worst, worst/rms, rms)
		if !(worst <= tol*rms) || !slices.Equal(got[0].Shape, want[0].Shape) || got[0].DType != act {
			t.Errorf("%s: fused layer differs from the plain one by up to %.3g (rms %.3g, tolerance %.3g of it)", act, worst, rms, tol)
		}
	}
}

// intoWeights is MapWeights that can read into a caller's tensor (graph.WeightsInto) and
// counts the calls of each kind.
type intoWeights struct {
	MapWeights
	loads, intos int
}

func (w *intoWeights) Load(ctx context.Context, ref graph.ParamRef) (*tensor.Tensor, error) {
	w.loads++
	return w.MapWeights.Load(ctx, ref)
}

func (w *intoWeights) LoadInto(ctx context.Context, ref graph.ParamRef, dst *tensor.Tensor) error {
	w.intos++
	t, err := w.MapWeights.Load(ctx, ref)
	if err != nil {
		return err
	}
	if t.DType != dst.DType || !slices.Equal(t.Shape, dst.Shape) {
		return fmt.Errorf("LoadInto %q: destination %s%v, weight %s%v", ref.Key, dst.DType, dst.Shape, t.DType, t.Shape)
	}
	tensor.CopyRange(dst, 0, t, 0, t.Numel())
	return nil
}

// TestConcatOfParamsReadInPlace: with weights that read into a caller's tensor, a concat of
// params nothing else reads is one tensor whose parts are read straight into their rows (no
// part loaded on its own, so no part is held beside the whole), equal to the concatenation;
// a param also read elsewhere leaves the concat to the fold.
func TestConcatOfParamsReadInPlace(t *testing.T) {
	rng := rand.New(rand.NewPCG(113, 114))
	m := MapWeights{
		"wq": randTensor(rng, tensor.BF16, []int{3, 4}, -1, 1),
		"wk": randTensor(rng, tensor.BF16, []int{2, 4}, -1, 1),
	}
	w := &intoWeights{MapWeights: m}
	p, err := Compile(context.Background(), fusedQKVGraph(t, false), w)
	if err != nil {
		t.Fatal(err)
	}
	if w.loads != 0 || w.intos != 2 {
		t.Errorf("Load called %d times and LoadInto %d, want 0 and 2", w.loads, w.intos)
	}
	if p.params != 2 || p.folded != 1 || p.paramBytes != 5*4*2 {
		t.Errorf("params %d, folded %d, param bytes %d; want 2, 1, 40", p.params, p.folded, p.paramBytes)
	}
	var held []*tensor.Tensor
	for _, f := range p.fixed {
		if f != nil {
			held = append(held, f)
		}
	}
	if len(held) != 1 || !slices.Equal(held[0].Shape, []int{5, 4}) {
		t.Fatalf("program holds %d tensors, want one bf16[5,4]", len(held))
	}
	if want := slices.Concat(m["wq"].Half, m["wk"].Half); !slices.Equal(held[0].Half, want) {
		t.Errorf("fused weight %v, want the concatenation %v", held[0].Half, want)
	}

	w = &intoWeights{MapWeights: m}
	if _, err := Compile(context.Background(), fusedQKVGraph(t, true), w); err != nil {
		t.Fatal(err)
	}
	if w.loads != 2 || w.intos != 0 {
		t.Errorf("wq also read alone: Load called %d times and LoadInto %d, want 2 and 0", w.loads, w.intos)
	}
}
