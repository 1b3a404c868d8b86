package cuda

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// runOp runs op as a one-node program on d (through Compile, as a decomposition would run
// it) and returns its outputs.
func runOp(t *testing.T, d *Device, op string, attrs graph.Attrs, in ...*tensor.Tensor) []*tensor.Tensor {
	t.Helper()
	g, feeds := opGraph(t, op, attrs, in...)
	p, err := Compile(context.Background(), d, g, nil, nil)
	if err != nil {
		t.Fatalf("compile %s: %v", op, err)
	}
	defer p.Close()
	out, err := p.Run(context.Background(), feeds)
	if err != nil {
		t.Fatalf("run %s: %v", op, err)
	}
	return out
}

// randAny returns a random tensor of any dtype: floats in [lo, hi), integers in [lo, hi),
// bools half true.
func randAny(rng *rand.Rand, dt tensor.DType, shape []int, lo, hi float64) *tensor.Tensor {
	if dt.IsFloat() {
		return randTensor(rng, dt, shape, lo, hi)
	}
	f := make([]float64, tensor.Numel(shape))
	for i := range f {
		if dt == tensor.Bool {
			f[i] = float64(rng.IntN(2))
		} else {
			f[i] = float64(int(lo) + rng.IntN(int(hi-lo)))
		}
	}
	t := tensor.New(dt, shape...)
	for i, v := range f {
		switch dt {
		case tensor.I32:
			t.I32[i] = int32(v)
		case tensor.I64:
			t.I64[i] = int64(v)
		case tensor.Bool:
			t.Bool[i] = v != 0
		}
	}
	return t
}

// primTol is the tolerance of a primitive against the CPU: exact, but for the math
// functions (double precision on both sides, which may round differently in the last bit)
// one f32 ulp, or one bf16 ulp for a bf16 result.
func primTol(op string, dt tensor.DType) tol {
	switch op {
	case "exp", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh", "sigmoid", "silu", "pow", "softmax":
		if dt == tensor.BF16 {
			return tolBF
		}
		return tol{atol: 1e-30, rtol: 1.2e-7}
	}
	return exact
}

var broadcastShapes = [][2][]int{
	{{5, 7}, {5, 7}}, {{3, 1, 5}, {4, 1}}, {{2, 3, 4}, {4}}, {{}, {2, 3}}, {{1}, {3}}, {{2, 1, 3, 1, 5}, {1, 4, 1, 6, 1}}, {{300, 257}, {300, 257}},
}

// Every primitive kernel gives the CPU backend's results (the reference kernels).
func TestPrimitiveKernels(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(41, 2))
	floats := []tensor.DType{tensor.F32, tensor.BF16}
	ints := []tensor.DType{tensor.I32, tensor.I64}
	check := func(op string, attrs graph.Attrs, in ...*tensor.Tensor) {
		t.Helper()
		want := cpuOp(t, op, attrs, in...)
		got := runOp(t, d, op, attrs, in...)
		name := ""
		for _, x := range in {
			name += fmt.Sprintf("%s%v ", x.DType, x.Shape)
		}
		for i := range want {
			compare(t, op, fmt.Sprintf("%s%v", name, attrs), got[i], want[i], primTol(op, want[i].DType))
		}
	}
	for op := range unaryCodes {
		lo, hi := -4.0, 4.0
		if op == "log" || op == "sqrt" || op == "rsqrt" {
			lo = 0.01
		}
		for _, dt := range floats {
			check(op, nil, randAny(rng, dt, []int{3, 129}, lo, hi))
		}
		if op == "neg" || op == "abs" {
			for _, dt := range ints {
				check(op, nil, randAny(rng, dt, []int{7, 5}, -100, 100))
			}
		}
	}
	for op := range binaryCodes {
		for _, sh := range broadcastShapes {
			for _, dt := range [][2]tensor.DType{{tensor.F32, tensor.F32}, {tensor.BF16, tensor.BF16}, {tensor.F32, tensor.BF16}, {tensor.I32, tensor.F32}} {
				lo := -3.0
				if op == "pow" {
					lo = 0.1
				}
				check(op, nil, randAny(rng, dt[0], sh[0], lo, 3), randAny(rng, dt[1], sh[1], lo, 3))
			}
			if op != "div" && op != "pow" {
				for _, dt := range [][2]tensor.DType{{tensor.I32, tensor.I32}, {tensor.I64, tensor.I32}} {
					check(op, nil, randAny(rng, dt[0], sh[0], -50, 50), randAny(rng, dt[1], sh[1], -50, 50))
				}
			}
		}
		check(op, nil, randAny(rng, tensor.F32, []int{4, 4}, -2, 2), randAny(rng, tensor.F32, []int{}, 2, 3))
	}
	for op := range compareCodes {
		for _, sh := range broadcastShapes[:4] {
			a := randAny(rng, tensor.I32, sh[0], -3, 3)
			check(op, nil, a, randAny(rng, tensor.I32, sh[1], -3, 3))
			check(op, nil, a.Cast(tensor.F32), randAny(rng, tensor.BF16, sh[1], -3, 3))
			check(op, nil, randAny(rng, tensor.Bool, sh[0], 0, 2), randAny(rng, tensor.Bool, sh[1], 0, 2))
		}
	}
	for op := range logicalCodes {
		for _, sh := range broadcastShapes[:4] {
			if op == "logical_not" {
				check(op, nil, randAny(rng, tensor.Bool, sh[1], 0, 2))
				continue
			}
			check(op, nil, randAny(rng, tensor.Bool, sh[0], 0, 2), randAny(rng, tensor.Bool, sh[1], 0, 2))
		}
	}
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16, tensor.I32} {
		check("where", nil, randAny(rng, tensor.Bool, []int{2, 1, 5}, 0, 2), randAny(rng, dt, []int{3, 1}, -9, 9), randAny(rng, dt, []int{5}, -9, 9))
	}
	check("where", nil, randAny(rng, tensor.Bool, []int{4, 4}, 0, 2), randAny(rng, tensor.F32, []int{}, 0, 1), randAny(rng, tensor.BF16, []int{}, -1, 0))
	all := []tensor.DType{tensor.F32, tensor.BF16, tensor.I32, tensor.I64, tensor.Bool}
	for _, from := range all {
		for _, to := range all {
			check("cast", graph.Attrs{"dtype": to}, randAny(rng, from, []int{6, 35}, -300, 300))
		}
	}
	for op := range reduceCodes {
		for _, dt := range []tensor.DType{tensor.F32, tensor.BF16, tensor.I32, tensor.I64} {
			x := randAny(rng, dt, []int{3, 4, 5, 6}, -20, 20)
			for _, axes := range [][]int{{-1}, {0}, {1, 3}, {0, 1, 2, 3}, {2}} {
				for _, keep := range []bool{false, true} {
					check(op, graph.Attrs{"axes": axes, "keepdim": keep}, x)
				}
			}
		}
	}
	for _, dt := range floats {
		x := randAny(rng, dt, []int{2, 3, 37}, -8, 8)
		for _, ax := range []int{-1, 0, 1} {
			check("softmax", graph.Attrs{"axis": ax}, x)
		}
	}
	for _, sh := range [][2][]int{{{5, 7}, {7, 3}}, {{2, 3, 4, 5}, {2, 3, 5, 6}}, {{2, 1, 4, 5}, {3, 5, 2}}, {{4, 1, 9}, {9, 1}}} {
		for _, dt := range [][2]tensor.DType{{tensor.F32, tensor.F32}, {tensor.BF16, tensor.BF16}, {tensor.F32, tensor.BF16}, {tensor.I32, tensor.I64}} {
			check("matmul", nil, randAny(rng, dt[0], sh[0], -3, 3), randAny(rng, dt[1], sh[1], -3, 3))
		}
	}
}

// iota, with a symbolic shape (so that it is not folded at compile time), gives the CPU's.
func TestPrimitiveIota(t *testing.T) {
	d := gpu(t)
	b := graph.NewBuilder("iota")
	x := b.Input("x", tensor.F32, graph.Shape{graph.Sym("N"), graph.D(3)})
	io := b.Iota(tensor.I64, graph.Shape{graph.Sym("N"), graph.D(4), graph.D(3)}, 1)
	b.Output(io, b.Add(x, b.Cast(b.Iota(tensor.I32, graph.Shape{graph.Sym("N"), graph.D(3)}, 0), tensor.F32)))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	in := map[string]*tensor.Tensor{"x": randTensor(rand.New(rand.NewPCG(1, 2)), tensor.F32, []int{5, 3}, -1, 1)}
	p, err := Compile(context.Background(), d, g, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	got, err := p.Run(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	want := runOnCPU(t, g, in)
	for i := range want {
		compare(t, "iota", fmt.Sprint(i), got[i], want[i], exact)
	}
}

// A fused op without a CUDA kernel (test-only, with a fused op nested in its decomposition)
// compiles, runs as its decomposition on the GPU, and gives the CPU's results (where it runs
// its decomposition with the reference kernels).
func TestDecomposedFusedOpMatchesCPU(t *testing.T) {
	d := gpu(t)
	for _, act := range []tensor.DType{tensor.F32, tensor.BF16} {
		g := testFusedGraph(t, act)
		for _, graphs := range []bool{false, true} {
			p, err := Compile(context.Background(), d, g, nil, &Options{Graphs: graphs})
			if err != nil {
				t.Fatal(err)
			}
			if slices.ContainsFunc(p.Graph().Nodes, func(n *graph.Node) bool { return n.Op == "cuda_test_fused" }) {
				t.Error("the program's graph holds the op it was to decompose")
			}
			rng := rand.New(rand.NewPCG(9, 9))
			for _, bs := range [][2]int{{2, 7}, {1, 1}, {3, 33}, {2, 7}, {2, 7}} {
				in := testFusedInputs(rng, act, bs[0], bs[1])
				want := runOnCPU(t, g, in)
				got, err := p.Run(context.Background(), in)
				if err != nil {
					t.Fatal(err)
				}
				name := fmt.Sprintf("%s B%d S%d graphs=%v", act, bs[0], bs[1], graphs)
				compare(t, "decomposed", name+" y", got[0], want[0], tolFor(want[0].DType))
				compare(t, "decomposed", name+" m", got[1], want[1], tolF32)
			}
			p.Close()
		}
	}
}

// The fixtures' graphs with every fused op run as its decomposition on the GPU give the
// CPU's logits, as the fused kernels do: every primitive the decompositions use, on real
// shapes.
func TestFusedOpsDecomposedOnGPU(t *testing.T) {
	d := gpu(t)
	decomposeOpsForTest(t, "rmsnorm", "add_rmsnorm", "rope", "repeat_kv", "sdpa", "swiglu", "qkv_rope", "swiglu_packed", "linear_swiglu", "linear_qkv_rope")
	for _, name := range fixtures[:3] {
		for _, act := range []tensor.DType{tensor.F32, tensor.BF16} {
			t.Run(name+"/"+act.String(), func(t *testing.T) {
				m, _, fused := fixtureGraphs(t, name, act)
				checkAgainstCPU(t, d, name, act, m, fused)
				checkAgainstCPU(t, d, name, act, m, optimizedGraph(t, m, act))
			})
		}
	}
}

// Every op of the frontends' plain fixture graphs (primitives only) has a CUDA kernel
// (checked without a GPU): with the primitive kernels a plain graph compiles on CUDA.
func TestPlainGraphOpsHaveKernels(t *testing.T) {
	for _, name := range fixtures {
		_, plain, _ := fixtureGraphs(t, name, tensor.F32)
		if err := missingKernels(plain, nil); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// The frontends' plain graphs (primitives only: the primitive kernels end to end) give the
// CPU's logits on the GPU.
func TestPlainGraphOnGPU(t *testing.T) {
	d := gpu(t)
	for _, name := range fixtures[:3] {
		for _, act := range []tensor.DType{tensor.F32, tensor.BF16} {
			t.Run(name+"/"+act.String(), func(t *testing.T) {
				m, plain, _ := fixtureGraphs(t, name, act)
				checkAgainstCPU(t, d, name, act, m, plain)
			})
		}
	}
}
