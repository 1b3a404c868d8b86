package pattern_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform/pattern"
)

func mustParse(t *testing.T, text string) *graph.Graph {
	t.Helper()
	g, err := graph.Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// checkGraph verifies g and compares its text with want (parsed and printed, so that want
// may be written loosely).
func checkGraph(t *testing.T, g *graph.Graph, want string) {
	t.Helper()
	if err := graph.Verify(g); err != nil {
		t.Fatalf("%v\n%s", err, g)
	}
	if got, w := g.String(), mustParse(t, want).String(); got != w {
		t.Errorf("graph:\n%s\nwant:\n%s", got, w)
	}
}

// negPattern matches neg(x).
func negPattern() (*pattern.Pattern, *graph.Value) {
	p := pattern.New("neg")
	x := p.Any("x", tensor.F32, hid)
	p.Root(p.Builder().Neg(x))
	return p, x
}

func TestMatchShared(t *testing.T) {
	p, x := siluPattern()
	// The sigmoid is read outside the silu: a plain match refuses it, a shared one takes it.
	g := mustParse(t, `graph g(x: f32[B,S,8]) {
  %s = sigmoid(%x) : f32[B,S,8]
  %y = mul(%x, %s) : f32[B,S,8]
  %z = add(%y, %s) : f32[B,S,8]
  return %z
}`)
	root := g.Nodes[1]
	if _, ok := p.Match(g, root); ok {
		t.Error("Match took a sigmoid that is read elsewhere")
	}
	if ms, _ := p.FindAll(g); len(ms) != 0 {
		t.Errorf("FindAll: %d matches, want 0", len(ms))
	}
	m, ok := p.MatchShared(g, root)
	if !ok {
		t.Fatal("MatchShared: no match")
	}
	if m.Get(x) != g.Input("x") {
		t.Errorf("x = %v", m.Get(x))
	}
	ms, err := p.FindAllShared(g)
	if err != nil || len(ms) != 1 || ms[0].Root != root {
		t.Fatalf("FindAllShared = %d matches, %v; want 1 at %s", len(ms), err, root.Out())
	}
	// Replacing a shared match keeps what the rest of the graph still reads.
	err = ms[0].Replace(func(b *graph.Builder) ([]*graph.Value, error) {
		return []*graph.Value{b.Unary("silu", ms[0].Get(x))}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	checkGraph(t, g, `graph g(x: f32[B,S,8]) {
  %s = sigmoid(%x) : f32[B,S,8]
  %y = silu(%x) : f32[B,S,8]
  %z = add(%y, %s) : f32[B,S,8]
  return %z
}`)
	if _, ok := p.MatchShared(g, nil); ok {
		t.Error("MatchShared at a nil node matched")
	}
}

func TestReplaceJointly(t *testing.T) {
	tests := []struct {
		name, in, want string
		err            error // want errors.Is; nil: success
	}{
		{
			name: "placed at the first root",
			in: `graph g(x: f32[B,S,8], y: f32[B,S,8]) {
  %a = neg(%x) : f32[B,S,8] @l0
  %u = exp(%a) : f32[B,S,8] @l0
  %b = neg(%y) : f32[B,S,8] @l1
  %v = exp(%b) : f32[B,S,8] @l1
  return %u, %v
}`,
			want: `graph g(x: f32[B,S,8], y: f32[B,S,8]) {
  %0 = concat(%x, %y) {axis=-1} : f32[B,S,16] @l0
  %1 = neg(%0) : f32[B,S,16] @l0
  %a, %b = split(%1) {axis=-1, sizes=[8,8]} : f32[B,S,8], f32[B,S,8] @l0
  %u = exp(%a) : f32[B,S,8] @l0
  %v = exp(%b) : f32[B,S,8] @l1
  return %u, %v
}`,
		},
		{
			name: "placed after a value defined between the roots",
			in: `graph g(x: f32[B,S,8]) {
  %a = neg(%x) : f32[B,S,8] @l0
  %y = exp(%x) : f32[B,S,8] @l0
  %b = neg(%y) : f32[B,S,8] @l1
  %v = add(%a, %b) : f32[B,S,8] @l1
  return %v
}`,
			want: `graph g(x: f32[B,S,8]) {
  %y = exp(%x) : f32[B,S,8] @l0
  %0 = concat(%x, %y) {axis=-1} : f32[B,S,16] @l0
  %1 = neg(%0) : f32[B,S,16] @l0
  %a, %b = split(%1) {axis=-1, sizes=[8,8]} : f32[B,S,8], f32[B,S,8] @l0
  %v = add(%a, %b) : f32[B,S,8] @l1
  return %v
}`,
		},
		{
			name: "no place: the first root is read before the second input exists",
			in: `graph g(x: f32[B,S,8]) {
  %a = neg(%x) : f32[B,S,8] @l0
  %y = exp(%a) : f32[B,S,8] @l0
  %b = neg(%y) : f32[B,S,8] @l1
  return %b
}`,
			err: pattern.ErrNoPlace,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := mustParse(t, tt.in)
			p, x := negPattern()
			ms, err := p.FindAll(g)
			if err != nil || len(ms) != 2 {
				t.Fatalf("FindAll = %d matches, %v; want 2", len(ms), err)
			}
			before := g.String()
			err = pattern.ReplaceJointly(ms, func(b *graph.Builder) ([]*graph.Value, error) {
				both := b.Neg(b.Concat(-1, ms[0].Get(x), ms[1].Get(x)))
				return b.Split(both, -1, 8, 8), nil
			})
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("error %v, want %v", err, tt.err)
				}
				if g.String() != before {
					t.Errorf("the graph changed:\n%s", g)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			checkGraph(t, g, tt.want)
			if err := pattern.ReplaceJointly(ms, func(*graph.Builder) ([]*graph.Value, error) { return nil, nil }); err == nil {
				t.Error("replacing the matches again: no error")
			}
		})
	}
}

func TestReplaceJointlyHoistsSources(t *testing.T) {
	// The scale is declared after the first root: the replacement reads it, so it moves up.
	g := mustParse(t, `graph g(x: f32[B,S,8], y: f32[B,S,8]) {
  %a = neg(%x) : f32[B,S,8]
  %u = exp(%a) : f32[B,S,8]
  %w = param "w" : f32[8]
  %b = neg(%y) : f32[B,S,8]
  %v = mul(%b, %w) : f32[B,S,8]
  return %u, %v
}`)
	p, x := negPattern()
	ms, _ := p.FindAll(g)
	err := pattern.ReplaceJointly(ms, func(b *graph.Builder) ([]*graph.Value, error) {
		w := g.Nodes[2].Out()
		return []*graph.Value{b.Mul(b.Neg(ms[0].Get(x)), w), b.Mul(b.Neg(ms[1].Get(x)), w)}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	checkGraph(t, g, `graph g(x: f32[B,S,8], y: f32[B,S,8]) {
  %w = param "w" : f32[8]
  %0 = neg(%x) : f32[B,S,8]
  %a = mul(%0, %w) : f32[B,S,8]
  %2 = neg(%y) : f32[B,S,8]
  %b = mul(%2, %w) : f32[B,S,8]
  %u = exp(%a) : f32[B,S,8]
  %v = mul(%b, %w) : f32[B,S,8]
  return %u, %v
}`)
}

func TestReplaceJointlyErrors(t *testing.T) {
	text := `graph g(x: f32[B,S,8]) {
  %a = neg(%x) : f32[B,S,8]
  return %a
}`
	g, other := mustParse(t, text), mustParse(t, text)
	p, _ := negPattern()
	m, _ := p.Match(g, g.Nodes[0])
	mo, _ := p.Match(other, other.Nodes[0])
	keep := func(b *graph.Builder) ([]*graph.Value, error) { return []*graph.Value{g.Inputs[0]}, nil }
	tests := []struct {
		name  string
		ms    []*pattern.Match
		build pattern.BuildFunc
		want  string
	}{
		{"no matches", nil, keep, "at least one"},
		{"nil match", []*pattern.Match{m, nil}, keep, "nil match"},
		{"twice the same", []*pattern.Match{m, m}, keep, "twice"},
		{"two graphs", []*pattern.Match{m, mo}, keep, "different graphs"},
		{"wrong count", []*pattern.Match{m}, func(*graph.Builder) ([]*graph.Value, error) { return nil, nil }, "0 outputs for 1"},
		{"wrong type", []*pattern.Match{m}, func(b *graph.Builder) ([]*graph.Value, error) {
			return []*graph.Value{b.Cast(g.Inputs[0], tensor.BF16)}, nil
		}, "bf16"},
		{"build error", []*pattern.Match{m}, func(b *graph.Builder) ([]*graph.Value, error) {
			b.Neg(g.Inputs[0])
			return nil, errors.New("no way")
		}, "no way"},
		{"reads what it replaces", []*pattern.Match{m}, func(b *graph.Builder) ([]*graph.Value, error) {
			return []*graph.Value{b.Neg(g.Nodes[0].Out())}, nil
		}, "a value it replaces"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := g.String()
			err := pattern.ReplaceJointly(tt.ms, tt.build)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one containing %q", err, tt.want)
			}
			if g.String() != before {
				t.Errorf("the graph changed:\n%s", g)
			}
		})
	}
}

func TestReplaceValues(t *testing.T) {
	// add + rmsnorm, the sum also read by the next add: both values are replaced by the two
	// outputs of one add_rmsnorm.
	g := mustParse(t, `graph g(x: f32[B,S,8], r: f32[B,S,8]) {
  %s = add(%x, %r) : f32[B,S,8]
  %w = param "w" : f32[8]
  %n = rmsnorm(%s, %w) {eps=1e-06} : f32[B,S,8]
  %t = add(%s, %n) : f32[B,S,8]
  return %t
}`)
	p := pattern.New("add_rmsnorm")
	x, r := p.Any("x", tensor.F32, hid), p.Any("r", tensor.F32, hid)
	w := p.Any("w", tensor.F32, graph.Dims(8))
	b := p.Builder()
	sum := b.Add(x, r)
	norm := b.Op("rmsnorm", graph.Attrs{"eps": 1e-6}, sum, w)
	p.Root(norm)
	if ms, _ := p.FindAll(g); len(ms) != 0 {
		t.Fatalf("FindAll took the shared sum: %d matches", len(ms))
	}
	ms, err := p.FindAllShared(g)
	if err != nil || len(ms) != 1 {
		t.Fatalf("FindAllShared = %d matches, %v; want 1", len(ms), err)
	}
	m := ms[0]
	if err := m.ReplaceValues([]*graph.Value{x}, nil); err == nil || !strings.Contains(err.Error(), "not computed by a matched node") {
		t.Errorf("replacing a wildcard: error %v", err)
	}
	err = m.ReplaceValues([]*graph.Value{norm, sum}, func(b *graph.Builder) ([]*graph.Value, error) {
		return b.Apply("add_rmsnorm", graph.Attrs{"eps": 1e-6}, m.Get(x), m.Get(r), m.Get(w)), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	checkGraph(t, g, `graph g(x: f32[B,S,8], r: f32[B,S,8]) {
  %w = param "w" : f32[8]
  %n, %s = add_rmsnorm(%x, %r, %w) {eps=1e-06} : f32[B,S,8], f32[B,S,8]
  %t = add(%s, %n) : f32[B,S,8]
  return %t
}`)
	if err := m.ReplaceValues([]*graph.Value{norm}, nil); err == nil {
		t.Error("replacing values of a replaced match: no error")
	}
}

func TestRewrite(t *testing.T) {
	g := mustParse(t, `graph g(x: f32[B,S,8]) {
  %w1 = param "w1" : f32[4,8] @mlp
  %a = linear(%x, %w1) : f32[B,S,4] @mlp
  %w2 = param "w2" : f32[4,8] @mlp
  %b = linear(%x, %w2) : f32[B,S,4] @mlp
  %c = mul(%a, %b) : f32[B,S,4] @mlp
  return %c
}`)
	a, bv := g.Nodes[1].Out(), g.Nodes[3].Out()
	w1, w2 := g.Nodes[0].Out(), g.Nodes[2].Out()
	err := pattern.Rewrite(g, []*graph.Value{a, bv}, func(b *graph.Builder) ([]*graph.Value, error) {
		return b.Split(b.Linear(g.Inputs[0], b.Concat(0, w1, w2)), -1, 4, 4), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	checkGraph(t, g, `graph g(x: f32[B,S,8]) {
  %w1 = param "w1" : f32[4,8] @mlp
  %w2 = param "w2" : f32[4,8] @mlp
  %0 = concat(%w1, %w2) {axis=0} : f32[8,8] @mlp
  %1 = linear(%x, %0) : f32[B,S,8] @mlp
  %a, %b = split(%1) {axis=-1, sizes=[4,4]} : f32[B,S,4], f32[B,S,4] @mlp
  %c = mul(%a, %b) : f32[B,S,4] @mlp
  return %c
}`)
	if err := pattern.Rewrite(g, nil, nil); err == nil {
		t.Error("Rewrite of nothing: no error")
	}
	if err := pattern.Rewrite(g, []*graph.Value{g.Inputs[0]}, nil); err == nil {
		t.Error("Rewrite of a graph input: no error")
	}
}
