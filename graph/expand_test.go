package graph

import (
	"strings"
	"testing"

	"github.com/loom-ml/loom/tensor"
)

// keepAllBut keeps every op except those named.
func keepAllBut(ops ...string) func(string) bool {
	return func(op string) bool {
		for _, o := range ops {
			if o == op {
				return false
			}
		}
		return true
	}
}

func TestExpandNothingToDo(t *testing.T) {
	b := NewBuilder("g")
	x := b.Input("x", tensor.F32, Shape{Sym("B"), D(8)})
	w := b.Input("w", tensor.F32, Dims(8))
	b.Output(b.Op("rmsnorm", Attrs{"eps": 1e-6}, x, w))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	x2, err := Expand(g, keepAllBut())
	if err != nil {
		t.Fatal(err)
	}
	if x2.Graph != g || len(x2.Ops) != 0 {
		t.Errorf("a graph whose ops are all kept was rebuilt (%v)", x2.Ops)
	}
	// An op that is not kept but has no decomposition stays, for the caller to report.
	x2, err = Expand(g, keepAllBut("add"))
	if err != nil || x2.Graph != g {
		t.Errorf("expanding for an op the graph lacks: %v", err)
	}
}

func TestExpandRecursive(t *testing.T) {
	b := NewBuilder("g")
	b.SetScope("model.layers.0.mlp")
	x := b.Input("x", tensor.BF16, Shape{Sym("B"), Sym("S"), D(16)})
	w := b.Param("w", tensor.BF16, Dims(2*24, 16))
	nw := b.Param("nw", tensor.BF16, Dims(16))
	h := b.Apply("add_rmsnorm", Attrs{"eps": 1e-5}, x, x, nw)
	y := b.Named("mlp_out", "linear_swiglu", nil, h[0], w)
	b.Output(y, h[1])
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	before := g.String()
	x2, err := Expand(g, keepAllBut("linear_swiglu", "swiglu_packed", "swiglu"))
	if err != nil {
		t.Fatal(err)
	}
	if g.String() != before {
		t.Error("Expand modified its input graph")
	}
	e := x2.Graph
	if e == g {
		t.Fatal("nothing was expanded")
	}
	if err := Verify(e); err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"linear_swiglu": 1, "swiglu_packed": 1, "swiglu": 1}
	for op, n := range want {
		if x2.Ops[op] != n {
			t.Errorf("expanded %d %s nodes, want %d (all: %v)", x2.Ops[op], op, n, x2.Ops)
		}
	}
	if got := strings.Join(x2.Expanded(), ","); got != "linear_swiglu,swiglu,swiglu_packed" {
		t.Errorf("Expanded() = %s", got)
	}
	ops := map[string]int{}
	for _, n := range e.Nodes {
		ops[n.Op]++
		if n.Scope != "model.layers.0.mlp" {
			t.Errorf("node %s = %s has scope %q", n.Out(), n.Op, n.Scope)
		}
		if n.Op == "linear" || n.Op == "split" || n.Op == "silu" || n.Op == "mul" {
			if x2.From[n] != "linear_swiglu" {
				t.Errorf("node %s = %s comes from %q, want linear_swiglu", n.Out(), n.Op, x2.From[n])
			}
		} else if _, ok := x2.From[n]; ok {
			t.Errorf("kept node %s = %s is marked as from a decomposition", n.Out(), n.Op)
		}
	}
	for _, op := range []string{"linear_swiglu", "swiglu_packed", "swiglu"} {
		if ops[op] != 0 {
			t.Errorf("%s is left in the expanded graph", op)
		}
	}
	for op, n := range map[string]int{"add_rmsnorm": 1, "linear": 1, "split": 1, "silu": 1, "mul": 1, "param": 2} {
		if ops[op] != n {
			t.Errorf("%d %s nodes, want %d (all: %v)", ops[op], op, n, ops)
		}
	}
	if len(e.Inputs) != 1 || e.Inputs[0].Name != "x" || !e.Inputs[0].Type.Equal(g.Inputs[0].Type) {
		t.Errorf("inputs %v", e.Inputs)
	}
	if len(e.Outputs) != 2 || !e.Outputs[0].Type.Equal(y.Type) || e.Outputs[1].Name != h[1].Name {
		t.Errorf("outputs %v, want the types and kept names of %v", e.Outputs, g.Outputs)
	}
}

// A decomposition that holds its own op ends in an error, not in an endless expansion.
func TestExpandEndlessDecomposition(t *testing.T) {
	// Registered for this test only: the catalog tests want every op in their graphs.
	Register(&OpSpec{
		Name: "test_expand_loop", Doc: "Test only: decomposes into itself.", Inputs: []string{"x"},
		Infer: func(n *Node) ([]Type, error) { return one(inType(n, 0)), nil },
		Decompose: func(b *Builder, n *Node) ([]*Value, error) {
			return []*Value{b.Op("test_expand_loop", nil, n.Inputs[0])}, b.Err()
		},
	})
	t.Cleanup(func() { delete(registry, "test_expand_loop") })
	b := NewBuilder("g")
	x := b.Input("x", tensor.F32, Dims(4))
	b.Output(b.Op("test_expand_loop", nil, x))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Expand(g, keepAllBut("test_expand_loop")); err == nil || !strings.Contains(err.Error(), "nested more than") {
		t.Errorf("got %v, want an error about the nesting", err)
	}
}
