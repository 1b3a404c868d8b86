package cuda

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/loom-ml/loom/backend/cpu"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Test-only ops of the graph catalog, registered once per test binary. No backend has a
// kernel for any of them:
//
//   - cuda_test_fused(x[B,S,D], w[D], positions i32[B,S]) -> (y [B,S,D] of promote(w, x),
//     m f32[B,S]), a fused op whose decomposition holds most primitives (casts between
//     dtypes, mean, sub, sigmoid, tanh, gt, where, exp, neg, abs, silu, max, the RMSNorm
//     primitives) and the fused cuda_test_attend;
//   - cuda_test_attend(c f32[B,S,D], positions i32[B,S]) -> f32[B,S,D], softmax attention of
//     c over itself under a causal mask with a window of 3 (matmul, transpose, integer add,
//     le, gt, logical_and, where, softmax);
//   - cuda_test_nokernel(x) -> x's type, with no decomposition either;
//   - cuda_test_needs_nokernel(x) -> x's type, fused, decomposing into cuda_test_nokernel.
var registerTestOps = sync.OnceFunc(func() {
	graph.Register(&graph.OpSpec{
		Name: "cuda_test_attend", Doc: "Test only: causal softmax attention of c over itself.",
		Inputs: []string{"c", "positions"},
		Infer: func(n *graph.Node) ([]graph.Type, error) {
			c, pos := n.Inputs[0].Type, n.Inputs[1].Type
			if c.DType != tensor.F32 || len(c.Shape) != 3 || len(pos.Shape) != 2 || !pos.DType.IsInt() {
				return nil, fmt.Errorf("want c f32[B,S,D] and integer positions[B,S], got %s and %s", c, pos)
			}
			return []graph.Type{c}, nil
		},
		Decompose: func(b *graph.Builder, n *graph.Node) ([]*graph.Value, error) {
			c, pos := n.Inputs[0], n.Inputs[1]
			s := c.Type.Shape
			scores := b.Mul(b.Matmul(c, b.Transpose(c, 0, 2, 1)), b.Scalar(tensor.F32, 0.125))
			mask := b.Reshape(graph.DecomposeCausalMask(b, pos, 3), s[0], s[1], s[1])
			return []*graph.Value{b.Matmul(b.Softmax(b.Add(scores, mask), -1), c)}, b.Err()
		},
	})
	graph.Register(&graph.OpSpec{
		Name: "cuda_test_fused", Doc: "Test only: a fused op of many primitives and a nested fused op.",
		Inputs: []string{"x", "w", "positions"},
		Infer: func(n *graph.Node) ([]graph.Type, error) {
			x, w := n.Inputs[0].Type, n.Inputs[1].Type
			if len(x.Shape) != 3 || len(w.Shape) != 1 || w.Shape[0] != x.Shape[2] {
				return nil, fmt.Errorf("want x[B,S,D] and w[D], got %s and %s", x, w)
			}
			dt, err := graph.Promote(w.DType, x.DType)
			if err != nil {
				return nil, err
			}
			return []graph.Type{{DType: dt, Shape: x.Shape.Clone()}, {DType: tensor.F32, Shape: x.Shape[:2].Clone()}}, nil
		},
		Decompose: func(b *graph.Builder, n *graph.Node) ([]*graph.Value, error) {
			x, w, pos := n.Inputs[0], n.Inputs[1], n.Inputs[2]
			x32 := b.Cast(x, tensor.F32)
			c := b.Sub(x32, b.Reduce("mean", x32, true, -1))
			a := b.Op("cuda_test_attend", nil, c, pos)
			g := b.Mul(b.Unary("sigmoid", c), b.Unary("tanh", a))
			e := b.Where(b.Compare("gt", c, b.Scalar(tensor.F32, 0)), b.Unary("exp", b.Neg(b.Op("abs", nil, c))), b.Unary("silu", c))
			h := b.Add(g, e)
			y := graph.DecomposeRMSNorm(b, b.Cast(h, x.Type.DType), w, 1e-5)
			return []*graph.Value{y, b.Reduce("max", h, false, -1)}, b.Err()
		},
	})
	graph.Register(&graph.OpSpec{
		Name: "cuda_test_nokernel", Doc: "Test only: an op with no kernel and no decomposition.",
		Inputs: []string{"x"},
		Infer:  func(n *graph.Node) ([]graph.Type, error) { return []graph.Type{n.Inputs[0].Type}, nil },
	})
	graph.Register(&graph.OpSpec{
		Name: "cuda_test_needs_nokernel", Doc: "Test only: a fused op whose decomposition needs cuda_test_nokernel.",
		Inputs: []string{"x"},
		Infer:  func(n *graph.Node) ([]graph.Type, error) { return []graph.Type{n.Inputs[0].Type}, nil },
		Decompose: func(b *graph.Builder, n *graph.Node) ([]*graph.Value, error) {
			return []*graph.Value{b.Op("cuda_test_nokernel", nil, b.Neg(n.Inputs[0]))}, b.Err()
		},
	})
})

// testFusedGraph is a graph around cuda_test_fused: x act[B,S,16], positions i32[B,S] and
// a weight input w bf16[16]; outputs y, m and an add of y to itself (a kept node after the
// fused one).
func testFusedGraph(t *testing.T, act tensor.DType) *graph.Graph {
	t.Helper()
	registerTestOps()
	B, S := graph.Sym("B"), graph.Sym("S")
	b := graph.NewBuilder("test_fused")
	b.SetScope("model.layers.0")
	x := b.Input("x", act, graph.Shape{B, S, graph.D(16)})
	pos := b.Input("positions", tensor.I32, graph.Shape{B, S})
	w := b.Input("w", tensor.BF16, graph.Dims(16))
	outs := b.Apply("cuda_test_fused", nil, x, w, pos)
	b.Output(b.Add(outs[0], outs[0]), outs[1])
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// testFusedInputs are inputs of testFusedGraph: random x and w, positions counting from a
// random start per sequence.
func testFusedInputs(rng *rand.Rand, act tensor.DType, B, S int) map[string]*tensor.Tensor {
	pos := tensor.New(tensor.I32, B, S)
	for i := range B {
		start := rng.IntN(20)
		for j := range S {
			pos.I32[i*S+j] = int32(start + j)
		}
	}
	return map[string]*tensor.Tensor{
		"x":         randTensor(rng, act, []int{B, S, 16}, -2, 2),
		"positions": pos,
		"w":         randTensor(rng, tensor.BF16, []int{16}, 0.5, 1.5),
	}
}

func runOnCPU(t *testing.T, g *graph.Graph, in map[string]*tensor.Tensor) []*tensor.Tensor {
	t.Helper()
	p, err := cpu.Compile(context.Background(), g, nil)
	if err != nil {
		t.Fatal(err)
	}
	out, err := p.Run(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// The compile-time expansion (no GPU needed): a fused op without a CUDA kernel becomes its
// decomposition, recursively, in a verified graph without it whose every op has a CUDA
// kernel and which computes what the op computes (on the CPU backend, where the op runs
// its decomposition: bit for bit). The op is logged once.
func TestExpandFusedOpWithoutKernel(t *testing.T) {
	g := testFusedGraph(t, tensor.BF16)
	var logs bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&logs, nil)))
	defer slog.SetDefault(prev)
	_, loggedBefore := decomposedLogged.Load("cuda_test_fused")

	e, from, err := expandGraph(g)
	if err != nil {
		t.Fatal(err)
	}
	if e == g {
		t.Fatal("the graph was not expanded")
	}
	if err := graph.Verify(e); err != nil {
		t.Fatal(err)
	}
	if err := missingKernels(e, from); err != nil {
		t.Errorf("the expanded graph has ops without CUDA kernels: %v", err)
	}
	ops := map[string]int{}
	for _, n := range e.Nodes {
		ops[n.Op]++
		if n.Op == "cuda_test_fused" || n.Op == "cuda_test_attend" {
			t.Errorf("node %s = %s survived the expansion", n.Out(), n.Op)
		}
		if n.Scope != "model.layers.0" {
			t.Errorf("node %s = %s lost its scope: %q", n.Out(), n.Op, n.Scope)
		}
		if n.Op != "add" || from[n] != "" { // the graph's own add is the one node kept
			if from[n] != "cuda_test_fused" {
				t.Errorf("node %s = %s is from %q, want cuda_test_fused", n.Out(), n.Op, from[n])
			}
		}
	}
	for _, op := range []string{"matmul", "softmax", "mean", "max", "pow", "rsqrt", "le", "gt", "logical_and", "where", "sigmoid", "tanh", "exp", "silu", "abs", "neg", "cast"} {
		if ops[op] == 0 {
			t.Errorf("the expansion holds no %s node (ops: %v)", op, ops)
		}
	}
	// Expanding again is a no-op, and logs nothing new.
	if e2, _, err := expandGraph(e); err != nil || e2 != e {
		t.Errorf("expanding the expanded graph: %v", err)
	}
	if _, _, err := expandGraph(g); err != nil {
		t.Fatal(err)
	}
	n := strings.Count(logs.String(), "op=cuda_test_fused ")
	if n > 1 || (!loggedBefore && n != 1) {
		t.Errorf("cuda_test_fused logged %d times over two expansions:\n%s", n, logs.String())
	}
	if n == 1 && !strings.Contains(logs.String(), "runs as its decomposition") {
		t.Errorf("log: %s", logs.String())
	}

	for _, act := range []tensor.DType{tensor.BF16, tensor.F32} {
		g := testFusedGraph(t, act)
		e, _, err := expandGraph(g)
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(5, 8))
		for _, bs := range [][2]int{{2, 7}, {1, 1}, {3, 4}} {
			in := testFusedInputs(rng, act, bs[0], bs[1])
			want, got := runOnCPU(t, g, in), runOnCPU(t, e, in)
			for i := range want {
				if got[i].DType != want[i].DType || fmt.Sprint(got[i].Shape) != fmt.Sprint(want[i].Shape) {
					t.Fatalf("output %d: %s%v, want %s%v", i, got[i].DType, got[i].Shape, want[i].DType, want[i].Shape)
				}
				for j := range want[i].Numel() {
					if w, v := want[i].At(j), got[i].At(j); w != v && !(math.IsNaN(w) && math.IsNaN(v)) {
						t.Fatalf("%s B%d S%d output %d element %d: expanded %v, op %v", act, bs[0], bs[1], i, j, v, w)
					}
				}
			}
		}
	}
}

// decomposeOpsForTest runs ops as their decompositions in Compile until the test ends.
func decomposeOpsForTest(t *testing.T, ops ...string) {
	prev := decomposeOps
	decomposeOps = map[string]bool{}
	for _, op := range ops {
		decomposeOps[op] = true
	}
	t.Cleanup(func() { decomposeOps = prev })
}

// Every fused op of the catalog expands into ops that have CUDA kernels (no GPU needed).
func TestFusedOpsExpandToKernels(t *testing.T) {
	fused := []string{"rmsnorm", "add_rmsnorm", "rope", "repeat_kv", "sdpa", "swiglu", "qkv_rope", "swiglu_packed", "linear_swiglu", "linear_qkv_rope"}
	decomposeOpsForTest(t, fused...)
	seen := map[string]bool{}
	for _, name := range fixtures[:3] {
		for _, act := range []tensor.DType{tensor.F32, tensor.BF16} {
			m, _, fused := fixtureGraphs(t, name, act)
			for _, g := range []*graph.Graph{fused, optimizedGraph(t, m, act)} {
				for _, n := range g.Nodes {
					seen[n.Op] = true
				}
				e, from, err := expandGraph(g)
				if err != nil {
					t.Fatal(err)
				}
				if err := missingKernels(e, from); err != nil {
					t.Errorf("%s %s: %v", name, act, err)
				}
				for _, n := range e.Nodes {
					if decomposeOps[n.Op] {
						t.Errorf("%s %s: %s survived", name, act, n.Op)
					}
				}
			}
		}
	}
	for _, op := range fused {
		if !seen[op] && op != "repeat_kv" && op != "qkv_rope" && op != "swiglu_packed" {
			t.Errorf("no test graph holds %s", op)
		}
	}
}
