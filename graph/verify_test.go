package graph

import (
	"strings"
	"testing"

	"github.com/loom-ml/loom/tensor"
)

func f32(dims ...int) Type { return Type{tensor.F32, Dims(dims...)} }

// node builds a node by hand, with outputs that point back to it.
func node(op string, attrs Attrs, inputs []*Value, outs ...*Value) *Node {
	n := &Node{Op: op, Attrs: attrs, Inputs: inputs}
	for i, o := range outs {
		o.Producer, o.Index = n, i
		n.Outputs = append(n.Outputs, o)
	}
	return n
}

func TestVerifyRejects(t *testing.T) {
	tests := []struct {
		name  string
		build func() *Graph
		want  []string
	}{
		{
			name: "use before definition",
			build: func() *Graph {
				x := &Value{Name: "x", Type: f32(2)}
				a, b := &Value{Name: "a", Type: f32(2)}, &Value{Name: "b", Type: f32(2)}
				n1 := node("neg", Attrs{}, []*Value{b}, a)
				n2 := node("neg", Attrs{}, []*Value{x}, b)
				return &Graph{Name: "g", Inputs: []*Value{x}, Nodes: []*Node{n1, n2}, Outputs: []*Value{a}}
			},
			want: []string{"node 0 (%a = neg)", "input 0 (%b) is used before it is defined"},
		},
		{
			name: "value defined twice",
			build: func() *Graph {
				x := &Value{Name: "x", Type: f32(2)}
				a1, a2 := &Value{Name: "a", Type: f32(2)}, &Value{Name: "a", Type: f32(2)}
				n1 := node("neg", Attrs{}, []*Value{x}, a1)
				n2 := node("neg", Attrs{}, []*Value{a1}, a2)
				return &Graph{Name: "g", Inputs: []*Value{x}, Nodes: []*Node{n1, n2}, Outputs: []*Value{a2}}
			},
			want: []string{"node 1 (%a = neg)", "value %a defined twice"},
		},
		{
			name: "input shadowed by a node",
			build: func() *Graph {
				x := &Value{Name: "x", Type: f32(2)}
				x2 := &Value{Name: "x", Type: f32(2)}
				return &Graph{Name: "g", Inputs: []*Value{x}, Nodes: []*Node{node("neg", Attrs{}, []*Value{x}, x2)}, Outputs: []*Value{x2}}
			},
			want: []string{"node 0 (%x = neg)", "value %x defined twice"},
		},
		{
			name: "unknown op",
			build: func() *Graph {
				x, y := &Value{Name: "x", Type: f32(2)}, &Value{Name: "y", Type: f32(2)}
				return &Graph{Name: "g", Inputs: []*Value{x}, Nodes: []*Node{node("frobnicate", Attrs{}, []*Value{x}, y)}, Outputs: []*Value{y}}
			},
			want: []string{"node 0 (%y = frobnicate)", `unknown op "frobnicate"`},
		},
		{
			name: "wrong attribute type",
			build: func() *Graph {
				x, y := &Value{Name: "x", Type: f32(2)}, &Value{Name: "y", Type: f32(2)}
				return &Graph{Name: "g", Inputs: []*Value{x}, Nodes: []*Node{node("softmax", Attrs{"axis": "last"}, []*Value{x}, y)}, Outputs: []*Value{y}}
			},
			want: []string{"node 0 (%y = softmax)", "softmax attribute axis: want int, got string"},
		},
		{
			name: "missing required attribute",
			build: func() *Graph {
				x, y := &Value{Name: "x", Type: f32(2, 3)}, &Value{Name: "y", Type: f32(3, 2)}
				return &Graph{Name: "g", Inputs: []*Value{x}, Nodes: []*Node{node("transpose", Attrs{}, []*Value{x}, y)}, Outputs: []*Value{y}}
			},
			want: []string{"node 0 (%y = transpose)", "missing required attribute perm"},
		},
		{
			name: "missing defaulted attribute",
			build: func() *Graph {
				x, y := &Value{Name: "x", Type: f32(2)}, &Value{Name: "y", Type: f32(2)}
				return &Graph{Name: "g", Inputs: []*Value{x}, Nodes: []*Node{node("softmax", nil, []*Value{x}, y)}, Outputs: []*Value{y}}
			},
			want: []string{"node 0 (%y = softmax)", "attributes [axis] are missing"},
		},
		{
			name: "unknown attribute",
			build: func() *Graph {
				x, y := &Value{Name: "x", Type: f32(2)}, &Value{Name: "y", Type: f32(2)}
				return &Graph{Name: "g", Inputs: []*Value{x}, Nodes: []*Node{node("neg", Attrs{"alpha": 1.0}, []*Value{x}, y)}, Outputs: []*Value{y}}
			},
			want: []string{"node 0 (%y = neg)", `neg has no attribute "alpha"`},
		},
		{
			name: "bad dtype attribute",
			build: func() *Graph {
				x, y := &Value{Name: "x", Type: f32(2)}, &Value{Name: "y", Type: f32(2)}
				return &Graph{Name: "g", Inputs: []*Value{x}, Nodes: []*Node{node("cast", Attrs{"dtype": tensor.DType(42)}, []*Value{x}, y)}, Outputs: []*Value{y}}
			},
			want: []string{"node 0 (%y = cast)", "attribute dtype: unknown dtype dtype(42)"},
		},
		{
			name: "recorded type disagrees with inference",
			build: func() *Graph {
				x, y := &Value{Name: "x", Type: f32(2)}, &Value{Name: "y", Type: f32(3)}
				return &Graph{Name: "g", Inputs: []*Value{x}, Nodes: []*Node{node("add", Attrs{}, []*Value{x, x}, y)}, Outputs: []*Value{y}}
			},
			want: []string{"node 0 (%y = add)", "output %y is recorded as f32[3] but inference gives f32[2]"},
		},
		{
			name: "inference fails",
			build: func() *Graph {
				x, z, y := &Value{Name: "x", Type: f32(2)}, &Value{Name: "z", Type: f32(3)}, &Value{Name: "y", Type: f32(3)}
				return &Graph{Name: "g", Inputs: []*Value{x, z}, Nodes: []*Node{node("add", Attrs{}, []*Value{x, z}, y)}, Outputs: []*Value{y}}
			},
			want: []string{"node 0 (%y = add)", "add(f32[2], f32[3])", "do not broadcast"},
		},
		{
			name: "wrong number of outputs",
			build: func() *Graph {
				x, y, z := &Value{Name: "x", Type: f32(2)}, &Value{Name: "y", Type: f32(2)}, &Value{Name: "z", Type: f32(2)}
				return &Graph{Name: "g", Inputs: []*Value{x}, Nodes: []*Node{node("neg", Attrs{}, []*Value{x}, y, z)}, Outputs: []*Value{y}}
			},
			want: []string{"node 0 (%y = neg)", "has 2 outputs, inference gives 1"},
		},
		{
			name: "wrong number of inputs",
			build: func() *Graph {
				x, y := &Value{Name: "x", Type: f32(2)}, &Value{Name: "y", Type: f32(2)}
				return &Graph{Name: "g", Inputs: []*Value{x}, Nodes: []*Node{node("add", Attrs{}, []*Value{x}, y)}, Outputs: []*Value{y}}
			},
			want: []string{"node 0 (%y = add)", "add takes 2 inputs ([a b]), got 1"},
		},
		{
			name: "output not in the graph",
			build: func() *Graph {
				x, stray := &Value{Name: "x", Type: f32(2)}, &Value{Name: "stray", Type: f32(2)}
				return &Graph{Name: "g", Inputs: []*Value{x}, Outputs: []*Value{x, stray}}
			},
			want: []string{"output 1 (%stray) is not defined in the graph"},
		},
		{
			name: "no outputs",
			build: func() *Graph {
				return &Graph{Name: "g", Inputs: []*Value{{Name: "x", Type: f32(2)}}}
			},
			want: []string{"graph g has no outputs"},
		},
		{
			name: "output does not point back",
			build: func() *Graph {
				x, y := &Value{Name: "x", Type: f32(2)}, &Value{Name: "y", Type: f32(2)}
				n := &Node{Op: "neg", Attrs: Attrs{}, Inputs: []*Value{x}, Outputs: []*Value{y}}
				return &Graph{Name: "g", Inputs: []*Value{x}, Nodes: []*Node{n}, Outputs: []*Value{y}}
			},
			want: []string{"node 0 (%y = neg)", "output 0 (%y) does not point back to its node"},
		},
		{
			name: "invalid names and types",
			build: func() *Graph {
				x := &Value{Name: "x y", Type: Type{tensor.Invalid, Dims(2)}}
				z := &Value{Name: "z", Type: Type{tensor.F32, Shape{Sym("a b"), D(-1)}}}
				return &Graph{Name: "g", Inputs: []*Value{x, z}, Outputs: []*Value{x}}
			},
			want: []string{`input %x y: invalid value name "x y"`, "input %x y: value %x y has a bad type invalid[2]: invalid dtype",
				`input %z: value %z has a bad type f32[a b,-1]: dimension 0: bad symbol "a b"`},
		},
		{
			name: "nil parts do not panic",
			build: func() *Graph {
				x, y := &Value{Name: "x", Type: f32(2)}, &Value{Name: "y", Type: f32(2)}
				return &Graph{Name: "g", Inputs: []*Value{x, nil}, Nodes: []*Node{nil,
					node("add", Attrs{}, []*Value{x, nil}, y), {Op: "neg", Attrs: Attrs{}, Inputs: []*Value{x}, Outputs: []*Value{nil}}},
					Outputs: []*Value{nil}}
			},
			want: []string{"input 1 is nil", "node 0 is nil", "node 1 (%y = add): input 1 is nil", "node 2 (neg): output 0 is nil",
				"output 0 (%<nil>) is not defined"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := tt.build()
			err := Verify(g)
			if err == nil {
				t.Fatalf("Verify accepted\n%s", g)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
			_ = g.String() // printing a broken graph must not panic either
			_ = ReinferTypes(g)
			_ = Equal(g, g.Clone())
		})
	}
	if err := Verify(nil); err == nil {
		t.Error("Verify(nil) succeeded")
	}
}

func TestVerifyAcceptsBuilt(t *testing.T) {
	for name, g := range roundTripGraphs(t) {
		if err := Verify(g); err != nil {
			t.Errorf("%s: %v", name, err)
		}
		if err := Verify(g.Clone()); err != nil {
			t.Errorf("%s clone: %v", name, err)
		}
	}
}

func TestReinferTypes(t *testing.T) {
	g, err := buildLlamaBlock()
	if err != nil {
		t.Fatal(err)
	}
	want := g.String()
	for _, n := range g.Nodes {
		for _, o := range n.Outputs {
			o.Type = Type{}
		}
	}
	if err := ReinferTypes(g); err != nil {
		t.Fatal(err)
	}
	if got := g.String(); got != want {
		t.Errorf("after ReinferTypes:\n%s\nwant\n%s", got, want)
	}
	bad := &Graph{Name: "g", Nodes: []*Node{{Op: "add", Inputs: []*Value{{Name: "x", Type: f32(2)}}, Outputs: []*Value{{Name: "y"}}}}}
	if err := ReinferTypes(bad); err == nil || !strings.Contains(err.Error(), "add takes 2 inputs") {
		t.Errorf("ReinferTypes with a missing input: %v", err)
	}
}

func TestBuilderNames(t *testing.T) {
	b := NewBuilder("g")
	x := b.Input("x", tensor.F32, Dims(2))
	bad := b.Named("not a name", "neg", nil, x)
	dup := b.Named("x", "neg", nil, x)
	b.Output(bad, dup)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	if bad.Name != "0" || dup.Name != "1" {
		t.Errorf("names %q and %q, want 0 and 1", bad.Name, dup.Name)
	}
	if err := g.InsertBefore(nil); err == nil {
		t.Error("InsertBefore(nil) succeeded")
	}
}
