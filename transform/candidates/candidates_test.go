package candidates

import (
	"fmt"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// twoLayers builds layers that each compute linear → silu → mul → linear, the last layer
// with an extra neg so its chain differs.
func twoLayers(t *testing.T, layers int) *graph.Graph {
	t.Helper()
	b := graph.NewBuilder("t")
	h := b.Input("x", tensor.F32, graph.Shape{graph.Sym("S"), graph.D(8)})
	for l := range layers {
		b.SetScope(fmt.Sprintf("model.layers.%d.mlp", l))
		w1 := b.Param(fmt.Sprintf("w1.%d", l), tensor.BF16, graph.Dims(8, 8))
		w2 := b.Param(fmt.Sprintf("w2.%d", l), tensor.BF16, graph.Dims(8, 8))
		g := b.Linear(h, w1)
		y := b.Mul(b.Unary("silu", g), g)
		if l == layers-1 {
			y = b.Neg(y)
		}
		h = b.Add(h, b.Linear(y, w2))
	}
	b.Output(h)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestFind(t *testing.T) {
	cs := Find(twoLayers(t, 3))
	var sb strings.Builder
	if err := Write(&sb, cs); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + sb.String())
	if len(cs) == 0 {
		t.Fatal("no candidates")
	}
	c := cs[0]
	if c.Chain != "[linear] → silu → mul → [linear]" || c.Count != 2 || c.Ops != 2 {
		t.Errorf("top candidate = %+v, want the silu → mul chain of layers 0 and 1", c)
	}
	if fmt.Sprint(c.Layers) != "[0 1]" {
		t.Errorf("layers = %v, want [0 1]", c.Layers)
	}
	for _, c := range cs {
		if strings.Contains(c.Chain, "neg") {
			t.Errorf("the chain of the last layer occurs once and must not be listed: %+v", c)
		}
	}
	if !strings.Contains(sb.String(), "0-1") {
		t.Errorf("layers should print as a range:\n%s", sb.String())
	}
}

func TestFindNothing(t *testing.T) {
	cs := Find(twoLayers(t, 1))
	for _, c := range cs {
		if c.Count < 2 {
			t.Errorf("candidate %+v occurs once", c)
		}
	}
	var sb strings.Builder
	if err := Write(&sb, nil); err != nil || !strings.Contains(sb.String(), "no repeated") {
		t.Errorf("empty report = %q, %v", sb.String(), err)
	}
}
