package pattern_test

import (
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/transform/pattern"
)

// TestScanner: a Scanner's Match and MatchShared give what the Pattern's give at every node
// of the graph (and at a node that is not in it, and at nil), plain refusing the shared
// sigmoid as Match does.
func TestScanner(t *testing.T) {
	p, x := siluPattern()
	g := mustParse(t, `graph g(x: f32[B,S,8]) {
  %s = sigmoid(%x) : f32[B,S,8]
  %y = mul(%x, %s) : f32[B,S,8]
  %z = add(%y, %s) : f32[B,S,8]
  %s2 = sigmoid(%z) : f32[B,S,8]
  %y2 = mul(%z, %s2) : f32[B,S,8]
  return %y2
}`)
	sc := pattern.NewScanner(g)
	stranger := &graph.Node{Op: "mul"}
	matched := 0
	for _, n := range append([]*graph.Node{nil, stranger}, g.Nodes...) {
		for _, shared := range []bool{false, true} {
			want, wok := p.Match(g, n)
			got, gok := sc.Match(p, n)
			if shared {
				want, wok = p.MatchShared(g, n)
				got, gok = sc.MatchShared(p, n)
			}
			if gok != wok {
				t.Fatalf("at %v (shared %v): Scanner matched %v, Pattern %v", n, shared, gok, wok)
			}
			if !gok {
				continue
			}
			matched++
			if got.Root != want.Root || got.Get(x) != want.Get(x) {
				t.Errorf("at %v (shared %v): Scanner's match (root %v, x %v) differs from the Pattern's (root %v, x %v)",
					n, shared, got.Root.Out(), got.Get(x), want.Root.Out(), want.Get(x))
			}
		}
	}
	if matched != 3 { // y shared only, y2 plain and shared
		t.Errorf("%d matches, want 3", matched)
	}
}
