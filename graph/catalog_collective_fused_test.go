package graph

import (
	"strings"
	"testing"

	"github.com/loom-ml/loom/tensor"
)

// TestFusedCollectivesDeclared holds every fused op to the rule of CheckFusedCollectives: its
// decomposition contains a collective exactly when it is declared Collective.
func TestFusedCollectivesDeclared(t *testing.T) {
	graphs := roundTripGraphs(t)
	seen := map[string]bool{}
	for _, g := range graphs {
		for _, n := range g.Nodes {
			spec := n.Spec()
			if spec == nil || spec.Decompose == nil || seen[n.Op] {
				continue
			}
			seen[n.Op] = true
			has, err := decompositionHasCollective(spec, n)
			if err != nil {
				t.Errorf("%s: %v", n.Op, err)
				continue
			}
			if has != spec.Collective {
				t.Errorf("%s: decomposition has a collective: %v, declared Collective: %v", n.Op, has, spec.Collective)
			}
		}
	}
	for _, op := range []string{"all_reduce_add_rmsnorm", "linear_all_reduce", "rmsnorm", "sdpa"} {
		if !seen[op] {
			t.Errorf("no round-trip graph uses %s", op)
		}
	}
}

func TestCheckFusedCollectives(t *testing.T) {
	hiding := &OpSpec{Name: "hides_all_reduce", Inputs: []string{"x"}, Infer: func(n *Node) ([]Type, error) { return one(inType(n, 0)), nil },
		Decompose: func(b *Builder, n *Node) ([]*Value, error) {
			return []*Value{b.Op("all_reduce", Attrs{"group": "tp", "group_size": 2}, n.Inputs[0])}, b.Err()
		}}
	b := NewBuilder("g")
	x := b.Input("x", tensor.F32, Shape{symB, D(8)})
	w := b.Param("w", tensor.F32, Dims(8))
	b.Output(b.Op("rmsnorm", Attrs{"eps": 1e-5}, x, w))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	rms := g.Nodes[1]
	if has, err := decompositionHasCollective(hiding, rms); err != nil || !has {
		t.Errorf("a decomposition into all_reduce: has=%v err=%v, want true", has, err)
	}
	if has, err := decompositionHasCollective(hiding, &Node{Op: hiding.Name, Inputs: []*Value{x}, Attrs: Attrs{}}); err == nil {
		t.Errorf("unregistered op: has=%v, want an error", has) // NewNode refuses it; no panic
	}
	if err := CheckFusedCollectives(g); err != nil {
		t.Fatalf("a plain rmsnorm: %v", err)
	}
	// Pretend rmsnorm hid a collective: Verify must say so.
	prev, _ := hidesCollective.Load("rmsnorm")
	hidesCollective.Store("rmsnorm", true)
	defer func() {
		if prev == nil {
			hidesCollective.Delete("rmsnorm")
		} else {
			hidesCollective.Store("rmsnorm", prev)
		}
	}()
	err = Verify(g)
	if err == nil || !strings.Contains(err.Error(), "fused op rmsnorm hides a collective") {
		t.Errorf("Verify = %v, want the hidden collective reported", err)
	}
}

func TestCollectiveRanks(t *testing.T) {
	graphs := roundTripGraphs(t)
	for name, want := range map[string]int{"collective": 2, "fused": 1, "llama_block": 1} {
		if got := CollectiveRanks(graphs[name]); got != want {
			t.Errorf("%s: CollectiveRanks = %d, want %d", name, got, want)
		}
	}
}
