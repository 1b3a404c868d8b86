package pattern_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform/pattern"
)

// ReplaceAll gives the graph that Replace gives called on each match in turn: chained matches
// (one match's root feeding the next), roots that are graph outputs, a replacement that is an
// existing value, many layers.
func TestReplaceAllAsReplaceInTurn(t *testing.T) {
	silu, sx := siluPattern()
	neg, nx := negPattern()
	toSilu := func(m *pattern.Match, b *graph.Builder) ([]*graph.Value, error) {
		return []*graph.Value{b.Unary("silu", m.Get(sx))}, nil
	}
	cases := []struct {
		name  string
		p     *pattern.Pattern
		build func(m *pattern.Match, b *graph.Builder) ([]*graph.Value, error)
		graph func(b *graph.Builder, x *graph.Value)
		want  int
	}{
		{"chained", silu, toSilu, chainedSilus, 2},
		{"many layers", silu, toSilu, func(b *graph.Builder, in *graph.Value) {
			h := in
			for l := range 40 {
				b.SetScope(fmt.Sprintf("model.layers.%d.mlp", l))
				a := b.Mul(h, b.Unary("sigmoid", h))
				h = b.Add(h, b.Neg(a))
			}
			b.Output(h)
		}, 40},
		{"existing value", neg, func(m *pattern.Match, b *graph.Builder) ([]*graph.Value, error) {
			return []*graph.Value{m.Get(nx)}, nil // neg(v) -> v
		}, func(b *graph.Builder, in *graph.Value) {
			n1 := b.Neg(in)
			n2 := b.Neg(b.Unary("exp", n1))
			b.Output(b.Add(n1, n2), n2)
		}, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			inTurn, all := build(t, tensor.F32, c.graph), build(t, tensor.F32, c.graph)
			ms, err := c.p.FindAll(inTurn)
			if err != nil || len(ms) != c.want {
				t.Fatalf("FindAll = %d matches, %v; want %d", len(ms), err, c.want)
			}
			for _, m := range ms {
				if err := m.Replace(func(b *graph.Builder) ([]*graph.Value, error) { return c.build(m, b) }); err != nil {
					t.Fatal(err)
				}
			}
			ms, err = c.p.FindAll(all)
			if err != nil || len(ms) != c.want {
				t.Fatalf("FindAll = %d matches, %v; want %d", len(ms), err, c.want)
			}
			if err := pattern.ReplaceAll(ms, c.build); err != nil {
				t.Fatal(err)
			}
			checkGraph(t, all, inTurn.String())
			if err := pattern.ReplaceAll(ms[:1], c.build); err == nil {
				t.Error("replacing a match twice: no error")
			}
		})
	}
}

// A replacement that fails leaves the graph as it was, the ones built before it included.
func TestReplaceAllError(t *testing.T) {
	p, x := siluPattern()
	g := build(t, tensor.F32, func(b *graph.Builder, in *graph.Value) {
		y := b.Mul(in, b.Unary("sigmoid", in))
		b.Output(b.Mul(y, b.Unary("sigmoid", y)))
	})
	before := g.String()
	ms, err := p.FindAll(g)
	if err != nil || len(ms) != 2 {
		t.Fatalf("FindAll = %d matches, %v; want 2", len(ms), err)
	}
	boom := errors.New("boom")
	err = pattern.ReplaceAll(ms, func(m *pattern.Match, b *graph.Builder) ([]*graph.Value, error) {
		if m == ms[1] {
			return nil, boom
		}
		return []*graph.Value{b.Unary("silu", m.Get(x))}, nil
	})
	if !errors.Is(err, boom) {
		t.Fatalf("ReplaceAll = %v, want %v", err, boom)
	}
	if after := g.String(); after != before {
		t.Errorf("graph changed:\n%s\nwant:\n%s", after, before)
	}
	err = pattern.ReplaceAll(ms, func(m *pattern.Match, b *graph.Builder) ([]*graph.Value, error) {
		return []*graph.Value{b.Unary("exp", b.Cast(m.Get(x), tensor.BF16))}, nil
	})
	if err == nil {
		t.Error("a replacement of another type: no error")
	}
	if after := g.String(); after != before {
		t.Errorf("graph changed:\n%s\nwant:\n%s", after, before)
	}
}
