package pattern_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform/pattern"
)

var (
	symB = graph.Sym("B")
	symS = graph.Sym("S")
	hid  = graph.Shape{symB, symS, graph.D(8)}
)

// siluPattern is mul(x, sigmoid(x)), which silu(x) computes in one op.
func siluPattern() (*pattern.Pattern, *graph.Value) {
	p := pattern.New("silu")
	x := p.Any("x", tensor.F32, hid)
	b := p.Builder()
	p.Root(b.Mul(x, b.Unary("sigmoid", x)))
	return p, x
}

// rmsnormPattern is graph.DecomposeRMSNorm with its casts optional (cleanup_noop removes them
// when x is already f32) and eps captured.
func rmsnormPattern() (p *pattern.Pattern, x, w, eps *graph.Value) {
	p = pattern.New("rmsnorm")
	x = p.Any("x", tensor.F32, hid)
	w = p.Any("w", tensor.F32, graph.Dims(8))
	eps = p.Const("eps", tensor.F32)
	b := p.Builder()
	x32 := b.Cast(x, tensor.F32)
	p.Optional(x32)
	variance := b.Reduce("mean", b.Pow(x32, b.Scalar(tensor.F32, 2)), true, -1)
	y := b.Mul(x32, b.Unary("rsqrt", b.Add(variance, eps)))
	back := b.Cast(y, tensor.F32)
	p.Optional(back)
	p.IgnoreAttrs(back, "dtype")
	p.Root(b.Mul(w, back))
	p.Where(func(m *pattern.Match) bool {
		e, ok := m.Scalar(eps)
		return ok && e > 0 && e < 1e-2
	})
	return p, x, w, eps
}

// build runs f on a fresh builder with input x of type dt[B,S,8] and returns the graph.
func build(t *testing.T, dt tensor.DType, f func(b *graph.Builder, x *graph.Value)) *graph.Graph {
	t.Helper()
	b := graph.NewBuilder("g")
	x := b.Input("x", dt, hid)
	f(b, x)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestMatch(t *testing.T) {
	silu, _ := siluPattern()
	rms, _, _, _ := rmsnormPattern()
	tests := []struct {
		name  string
		p     *pattern.Pattern
		dt    tensor.DType
		graph func(b *graph.Builder, x *graph.Value)
		want  int
	}{
		{"silu", silu, tensor.F32, func(b *graph.Builder, x *graph.Value) {
			b.Output(b.Mul(x, b.Unary("sigmoid", x)))
		}, 1},
		{"silu inputs swapped (commutative)", silu, tensor.F32, func(b *graph.Builder, x *graph.Value) {
			b.Output(b.Mul(b.Unary("sigmoid", x), x))
		}, 1},
		{"silu of two different values", silu, tensor.F32, func(b *graph.Builder, x *graph.Value) {
			b.Output(b.Mul(x, b.Unary("sigmoid", b.Neg(x))))
		}, 0},
		{"silu with the sigmoid used elsewhere", silu, tensor.F32, func(b *graph.Builder, x *graph.Value) {
			s := b.Unary("sigmoid", x)
			b.Output(b.Mul(x, s), s)
		}, 0},
		{"silu with the sigmoid read by another node", silu, tensor.F32, func(b *graph.Builder, x *graph.Value) {
			s := b.Unary("sigmoid", x)
			b.Output(b.Add(b.Mul(x, s), b.Neg(s)))
		}, 0},
		{"silu root used twice is fine", silu, tensor.F32, func(b *graph.Builder, x *graph.Value) {
			y := b.Mul(x, b.Unary("sigmoid", x))
			b.Output(b.Add(y, y), y)
		}, 1},
		{"silu twice in a chain", silu, tensor.F32, func(b *graph.Builder, x *graph.Value) {
			y := b.Mul(x, b.Unary("sigmoid", x))
			b.Output(b.Mul(y, b.Unary("sigmoid", y)))
		}, 2},
		{"silu, wrong op", silu, tensor.F32, func(b *graph.Builder, x *graph.Value) {
			b.Output(b.Mul(x, b.Unary("tanh", x)))
		}, 0},
		{"rmsnorm bf16 with casts", rms, tensor.BF16, func(b *graph.Builder, x *graph.Value) {
			w := b.Param("w", tensor.BF16, graph.Dims(8))
			b.Output(graph.DecomposeRMSNorm(b, x, w, 1e-6))
		}, 1},
		{"rmsnorm f32 with same-dtype casts", rms, tensor.F32, func(b *graph.Builder, x *graph.Value) {
			w := b.Param("w", tensor.F32, graph.Dims(8))
			b.Output(graph.DecomposeRMSNorm(b, x, w, 1e-6))
		}, 1},
		{"rmsnorm f32 without casts", rms, tensor.F32, func(b *graph.Builder, x *graph.Value) {
			w := b.Param("w", tensor.F32, graph.Dims(8))
			v := b.Reduce("mean", b.Pow(x, b.Scalar(tensor.F32, 2)), true, -1)
			b.Output(b.Mul(w, b.Mul(x, b.Unary("rsqrt", b.Add(v, b.Scalar(tensor.F32, 1e-5))))))
		}, 1},
		{"rmsnorm, two layers sharing eps", rms, tensor.F32, func(b *graph.Builder, x *graph.Value) {
			w := b.Param("w", tensor.F32, graph.Dims(8))
			eps := b.Scalar(tensor.F32, 1e-5)
			norm := func(x *graph.Value) *graph.Value {
				v := b.Reduce("mean", b.Pow(x, b.Scalar(tensor.F32, 2)), true, -1)
				return b.Mul(w, b.Mul(x, b.Unary("rsqrt", b.Add(v, eps))))
			}
			b.Output(norm(b.Neg(norm(x))))
		}, 2},
		{"rmsnorm, eps too large for the Where", rms, tensor.F32, func(b *graph.Builder, x *graph.Value) {
			w := b.Param("w", tensor.F32, graph.Dims(8))
			b.Output(graph.DecomposeRMSNorm(b, x, w, 0.5))
		}, 0},
		{"rmsnorm, mean without keepdim", rms, tensor.F32, func(b *graph.Builder, x *graph.Value) {
			w := b.Param("w", tensor.F32, graph.Dims(8))
			v := b.Reduce("mean", b.Pow(x, b.Scalar(tensor.F32, 2)), false, -1)
			v = b.Reshape(v, symB, symS, graph.D(1))
			b.Output(b.Mul(w, b.Mul(x, b.Unary("rsqrt", b.Add(v, b.Scalar(tensor.F32, 1e-5))))))
		}, 0},
		{"rmsnorm, cube instead of square (literal constant differs)", rms, tensor.F32, func(b *graph.Builder, x *graph.Value) {
			w := b.Param("w", tensor.F32, graph.Dims(8))
			v := b.Reduce("mean", b.Pow(x, b.Scalar(tensor.F32, 3)), true, -1)
			b.Output(b.Mul(w, b.Mul(x, b.Unary("rsqrt", b.Add(v, b.Scalar(tensor.F32, 1e-5))))))
		}, 0},
		{"rmsnorm, eps is not a constant", rms, tensor.F32, func(b *graph.Builder, x *graph.Value) {
			w := b.Param("w", tensor.F32, graph.Dims(8))
			v := b.Reduce("mean", b.Pow(x, b.Scalar(tensor.F32, 2)), true, -1)
			b.Output(b.Mul(w, b.Mul(x, b.Unary("rsqrt", b.Add(v, v)))))
		}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := build(t, tt.dt, tt.graph)
			ms, err := tt.p.FindAll(g)
			if err != nil {
				t.Fatal(err)
			}
			if len(ms) != tt.want {
				t.Fatalf("%d matches, want %d in\n%s", len(ms), tt.want, g)
			}
		})
	}
}

func TestCaptures(t *testing.T) {
	p, x, w, eps := rmsnormPattern()
	g := build(t, tensor.BF16, func(b *graph.Builder, x *graph.Value) {
		b.SetScope("model.norm")
		w := b.Param("model.norm.weight", tensor.BF16, graph.Dims(8))
		b.Output(graph.DecomposeRMSNorm(b, x, w, 1e-6))
	})
	ms, err := p.FindAll(g)
	if err != nil || len(ms) != 1 {
		t.Fatalf("FindAll = %d matches, %v; want 1", len(ms), err)
	}
	m := ms[0]
	if got := m.Get(x); got != g.Input("x") {
		t.Errorf("x = %v, want the graph input", got)
	}
	if got := m.Value("w"); got == nil || got.Name != "model.norm.weight" || got != m.Get(w) {
		t.Errorf("w = %v, want %%model.norm.weight", got)
	}
	if e, ok := m.Scalar(eps); !ok || e != 1e-6 {
		t.Errorf("eps = %v, %v; want 1e-06", e, ok)
	}
	if m.Root != g.Outputs[0].Producer {
		t.Errorf("root = %v, want the output's node", m.Root)
	}
	// Matched: cast, pow, mean, add, rsqrt, mul, cast, mul and the two consts.
	if n := len(m.Nodes()); n != 10 {
		t.Errorf("%d matched nodes, want 10", n)
	}
	for _, n := range m.Inner() {
		if n == m.Root || len(n.Inputs) == 0 {
			t.Errorf("Inner holds %s", n)
		}
	}
	if m.Node(eps) == nil || m.Node(eps).Op != graph.OpConst {
		t.Errorf("Node(eps) = %v", m.Node(eps))
	}
}

func TestConstraints(t *testing.T) {
	unary := func(configure func(p *pattern.Pattern, u *graph.Value)) *pattern.Pattern {
		p := pattern.New("unary")
		x := p.Any("x", tensor.F32, hid)
		b := p.Builder()
		u := b.Unary("exp", x)
		configure(p, u)
		p.Root(b.Mul(x, u))
		return p
	}
	sum := func(configure func(p *pattern.Pattern, s *graph.Value)) *pattern.Pattern {
		p := pattern.New("sum")
		x := p.Any("x", tensor.F32, hid)
		s := p.Builder().Reduce("sum", x, false, -1)
		configure(p, s)
		p.Root(s)
		return p
	}
	tests := []struct {
		name  string
		p     *pattern.Pattern
		graph func(b *graph.Builder, x *graph.Value)
		want  int
	}{
		{"OpIn allows listed ops", unary(func(p *pattern.Pattern, u *graph.Value) { p.OpIn(u, "exp", "silu", "tanh") }),
			func(b *graph.Builder, x *graph.Value) { b.Output(b.Mul(x, b.Unary("silu", x))) }, 1},
		{"OpIn refuses others", unary(func(p *pattern.Pattern, u *graph.Value) { p.OpIn(u, "silu") }),
			func(b *graph.Builder, x *graph.Value) { b.Output(b.Mul(x, b.Unary("tanh", x))) }, 0},
		{"OpIn with no ops: any unary op", unary(func(p *pattern.Pattern, u *graph.Value) { p.OpIn(u) }),
			func(b *graph.Builder, x *graph.Value) { b.Output(b.Mul(x, b.Unary("cos", x))) }, 1},
		{"OpIn with no ops: not a binary op", unary(func(p *pattern.Pattern, u *graph.Value) { p.OpIn(u) }),
			func(b *graph.Builder, x *graph.Value) { b.Output(b.Mul(x, b.Add(x, x))) }, 0},
		{"attributes must be equal", sum(func(*pattern.Pattern, *graph.Value) {}),
			func(b *graph.Builder, x *graph.Value) { b.Output(b.Reduce("sum", x, true, -1)) }, 0},
		{"IgnoreAttrs by name", sum(func(p *pattern.Pattern, s *graph.Value) { p.IgnoreAttrs(s, "keepdim") }),
			func(b *graph.Builder, x *graph.Value) { b.Output(b.Reduce("sum", x, true, -1)) }, 1},
		{"IgnoreAttrs by name leaves the others", sum(func(p *pattern.Pattern, s *graph.Value) { p.IgnoreAttrs(s, "keepdim") }),
			func(b *graph.Builder, x *graph.Value) { b.Output(b.Reduce("sum", x, true, 1)) }, 0},
		{"IgnoreAttrs all", sum(func(p *pattern.Pattern, s *graph.Value) { p.IgnoreAttrs(s) }),
			func(b *graph.Builder, x *graph.Value) { b.Output(b.Reduce("sum", x, true, 0, 1)) }, 1},
		{"Attr predicate accepts", sum(func(p *pattern.Pattern, s *graph.Value) {
			p.Attr(s, "axes", func(v any) bool { a, _ := v.([]int); return len(a) == 1 && (a[0] == -1 || a[0] == 2) })
		}), func(b *graph.Builder, x *graph.Value) { b.Output(b.Reduce("sum", x, false, 2)) }, 1},
		{"Attr predicate refuses", sum(func(p *pattern.Pattern, s *graph.Value) {
			p.Attr(s, "axes", func(v any) bool { a, _ := v.([]int); return len(a) == 1 && (a[0] == -1 || a[0] == 2) })
		}), func(b *graph.Builder, x *graph.Value) { b.Output(b.Reduce("sum", x, false, 1)) }, 0},
		{"Where on types", sum(func(p *pattern.Pattern, s *graph.Value) {
			p.Where(func(m *pattern.Match) bool { return m.Value("x").Type.DType == tensor.BF16 })
		}), func(b *graph.Builder, x *graph.Value) { b.Output(b.Reduce("sum", x, false, -1)) }, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.p.Err(); err != nil {
				t.Fatal(err)
			}
			g := build(t, tensor.F32, tt.graph)
			ms, err := tt.p.FindAll(g)
			if err != nil {
				t.Fatal(err)
			}
			if len(ms) != tt.want {
				t.Fatalf("%d matches, want %d in\n%s", len(ms), tt.want, g)
			}
		})
	}
}

func TestLiteralConstant(t *testing.T) {
	p := pattern.New("half")
	x := p.Any("x", tensor.F32, hid)
	b := p.Builder()
	p.Root(b.Mul(x, b.Scalar(tensor.F32, 0.5)))
	tests := []struct {
		name string
		c    func(b *graph.Builder) *graph.Value
		want bool
	}{
		{"same scalar", func(b *graph.Builder) *graph.Value { return b.Scalar(tensor.F32, 0.5) }, true},
		{"other dtype and shape, same values", func(b *graph.Builder) *graph.Value { return b.Const(tensor.BF16, graph.Dims(8), 0.5) }, true},
		{"all elements equal", func(b *graph.Builder) *graph.Value {
			return b.Const(tensor.F32, graph.Dims(8), 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5)
		}, true},
		{"different value", func(b *graph.Builder) *graph.Value { return b.Scalar(tensor.F32, 2) }, false},
		{"elements differ", func(b *graph.Builder) *graph.Value {
			return b.Const(tensor.F32, graph.Dims(8), 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 1)
		}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := build(t, tensor.F32, func(b *graph.Builder, x *graph.Value) { b.Output(b.Mul(tt.c(b), x)) })
			_, ok := p.Match(g, g.Outputs[0].Producer)
			if ok != tt.want {
				t.Fatalf("matched = %v, want %v in\n%s", ok, tt.want, g)
			}
		})
	}
}

// rotateHalf is Hugging Face's rotate_half: concat(-x2, x1) of the two halves of x; it uses
// both outputs of one split node.
func TestMultiOutputNode(t *testing.T) {
	p := pattern.New("rotate_half")
	x := p.Any("x", tensor.F32, hid)
	b := p.Builder()
	h := b.Split(x, -1, 4, 4)
	p.Root(b.Concat(-1, b.Neg(h[1]), h[0]))

	good := build(t, tensor.F32, func(b *graph.Builder, x *graph.Value) {
		h := b.Split(x, -1, 4, 4)
		b.Output(b.Concat(-1, b.Neg(h[1]), h[0]))
	})
	if ms, _ := p.FindAll(good); len(ms) != 1 {
		t.Errorf("rotate_half: %d matches, want 1", len(ms))
	}
	swapped := build(t, tensor.F32, func(b *graph.Builder, x *graph.Value) {
		h := b.Split(x, -1, 4, 4)
		b.Output(b.Concat(-1, b.Neg(h[0]), h[1]))
	})
	if ms, _ := p.FindAll(swapped); len(ms) != 0 {
		t.Errorf("halves swapped: %d matches, want 0", len(ms))
	}
	twoSplits := build(t, tensor.F32, func(b *graph.Builder, x *graph.Value) {
		h1 := b.Split(x, -1, 4, 4)
		h2 := b.Split(x, -1, 4, 4)
		b.Output(b.Concat(-1, b.Neg(h1[1]), h2[0]))
	})
	if ms, _ := p.FindAll(twoSplits); len(ms) != 0 {
		t.Errorf("halves of two splits: %d matches, want 0", len(ms))
	}
}

// chainedSilus writes two silu patterns, the second reading the first's root, which is also
// a graph output.
func chainedSilus(b *graph.Builder, in *graph.Value) {
	b.SetScope("model.layers.0.mlp")
	y := b.Named("act", "mul", nil, in, b.Unary("sigmoid", in))
	b.SetScope("model.layers.1.mlp")
	z := b.Named("act2", "mul", nil, b.Unary("sigmoid", y), y)
	b.SetScope("")
	b.Output(b.Neg(z), y)
}

func TestReplace(t *testing.T) {
	p, x := siluPattern()
	g := build(t, tensor.F32, chainedSilus)
	ms, err := p.FindAll(g)
	if err != nil || len(ms) != 2 {
		t.Fatalf("FindAll = %d matches, %v; want 2", len(ms), err)
	}
	for _, m := range ms {
		err := m.Replace(func(b *graph.Builder) ([]*graph.Value, error) {
			return []*graph.Value{b.Unary("silu", m.Get(x))}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := graph.Verify(g); err != nil {
		t.Fatal(err)
	}
	want := `graph g(x: f32[B,S,8]) {
  %act = silu(%x) : f32[B,S,8] @model.layers.0.mlp
  %act2 = silu(%act) : f32[B,S,8] @model.layers.1.mlp
  %2 = neg(%act2) : f32[B,S,8]
  return %2, %act
}
`
	if got := g.String(); got != want {
		t.Errorf("after replacement:\n%s\nwant:\n%s", got, want)
	}
	if err := ms[0].Replace(func(b *graph.Builder) ([]*graph.Value, error) { return nil, nil }); err == nil {
		t.Error("replacing a match twice: no error")
	}
}

func TestReplaceErrorsLeaveGraph(t *testing.T) {
	p, x := siluPattern()
	tests := []struct {
		name  string
		build func(m *pattern.Match) func(b *graph.Builder) ([]*graph.Value, error)
		want  string
	}{
		{"build fails", func(m *pattern.Match) func(b *graph.Builder) ([]*graph.Value, error) {
			return func(b *graph.Builder) ([]*graph.Value, error) {
				b.Unary("exp", m.Get(x))
				return nil, errors.New("no kernel")
			}
		}, "no kernel"},
		{"builder error", func(m *pattern.Match) func(b *graph.Builder) ([]*graph.Value, error) {
			return func(b *graph.Builder) ([]*graph.Value, error) {
				return []*graph.Value{b.Op("no_such_op", nil, m.Get(x))}, nil
			}
		}, "no_such_op"},
		{"wrong type", func(m *pattern.Match) func(b *graph.Builder) ([]*graph.Value, error) {
			return func(b *graph.Builder) ([]*graph.Value, error) {
				return []*graph.Value{b.Cast(b.Unary("silu", m.Get(x)), tensor.BF16)}, nil
			}
		}, "bf16"},
		{"wrong count", func(m *pattern.Match) func(b *graph.Builder) ([]*graph.Value, error) {
			return func(b *graph.Builder) ([]*graph.Value, error) { return nil, nil }
		}, "0 outputs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := build(t, tensor.F32, func(b *graph.Builder, in *graph.Value) {
				b.Output(b.Mul(in, b.Unary("sigmoid", in)))
			})
			before := g.String()
			m, ok := p.Match(g, g.Outputs[0].Producer)
			if !ok {
				t.Fatal("no match")
			}
			err := m.Replace(tt.build(m))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
			if after := g.String(); after != before {
				t.Errorf("graph changed:\n%s\nwas:\n%s", after, before)
			}
			if err := graph.Verify(g); err != nil {
				t.Error(err)
			}
		})
	}
}

func TestPatternErrors(t *testing.T) {
	tests := []struct {
		name  string
		build func(p *pattern.Pattern)
		want  string
	}{
		{"no root", func(p *pattern.Pattern) { p.Any("x", tensor.F32, hid) }, "no root"},
		{"root is a wildcard", func(p *pattern.Pattern) { p.Root(p.Any("x", tensor.F32, hid)) }, "wildcard"},
		{"root is a captured constant", func(p *pattern.Pattern) { p.Root(p.Const("c", tensor.F32)) }, "captured constant"},
		{"duplicate capture", func(p *pattern.Pattern) {
			x := p.Any("x", tensor.F32, hid)
			p.Const("x", tensor.F32)
			p.Root(p.Builder().Neg(x))
		}, "used twice"},
		{"builder error", func(p *pattern.Pattern) {
			x := p.Any("x", tensor.F32, hid)
			p.Root(p.Builder().Matmul(x, x))
		}, "matmul"},
		{"unknown op in OpIn", func(p *pattern.Pattern) {
			x := p.Any("x", tensor.F32, hid)
			n := p.Builder().Neg(x)
			p.OpIn(n, "nope")
			p.Root(n)
		}, "nope"},
		{"optional with two inputs", func(p *pattern.Pattern) {
			x := p.Any("x", tensor.F32, hid)
			s := p.Builder().Add(x, x)
			p.Optional(s)
			p.Root(p.Builder().Neg(s))
		}, "Optional"},
		{"value of another graph", func(p *pattern.Pattern) {
			other := graph.NewBuilder("other")
			v := other.Neg(other.Input("y", tensor.F32, hid))
			p.Root(v)
		}, "another graph"},
		{"nil Where", func(p *pattern.Pattern) {
			p.Root(p.Builder().Neg(p.Any("x", tensor.F32, hid)))
			p.Where(nil)
		}, "nil"},
	}
	g := build(t, tensor.F32, func(b *graph.Builder, x *graph.Value) { b.Output(b.Neg(x)) })
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := pattern.New("bad")
			tt.build(p)
			err := p.Err()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Err() = %v, want one containing %q", err, tt.want)
			}
			if _, ferr := p.FindAll(g); ferr == nil {
				t.Error("FindAll on a broken pattern: no error")
			}
			if _, ok := p.Match(g, g.Nodes[0]); ok {
				t.Error("a broken pattern matched")
			}
		})
	}
}

func TestString(t *testing.T) {
	p, _ := siluPattern()
	s := p.String()
	for _, want := range []string{"graph pattern_silu(x: f32[B,S,8])", "sigmoid(%x)", "mul(%x, %0)", "return %1"} {
		if !strings.Contains(s, want) {
			t.Errorf("String() = %s\nwant it to contain %q", s, want)
		}
	}
}
