package transform

import (
	"context"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform/pattern"
)

// FuseSplitSwiGLU replaces the split of a fused gate/up projection and the swiglu of its two
// halves with one swiglu_packed op.
var FuseSplitSwiGLU = &Transform{
	Name:  "fuse_split_swiglu",
	Stage: PostLoadFusion,
	Doc: `Replaces swiglu(gate, up) of the two halves of one split, split(x){axis=-1,
sizes=[I,I]} with gate the first and up the second, by one swiglu_packed(x) that reads the
packed gate|up projection of a fused linear (fuse_gemms) in place. The halves must have no
other reader and be no graph output. Matches counts the activations replaced, one per
layer.`,
	After: []Dep{
		{FuseGEMMs, "fuse_gemms makes the split of the fused gate/up linear that fuse_split_swiglu replaces"},
	},
	Run: runFuseSplitSwiGLU,
}

func init() { Register(FuseSplitSwiGLU) }

func runFuseSplitSwiGLU(_ context.Context, _ *Context, g *graph.Graph, _ any) (Info, error) {
	p := pattern.New("swiglu_packed")
	x := p.Any("x", tensor.F32, graph.Shape{symB, symS, graph.D(32)})
	b := p.Builder()
	parts := b.Split(x, -1, 16, 16)
	out := b.Op("swiglu", nil, parts[0], parts[1])
	p.IgnoreAttrs(parts[0]) // axis and sizes: checked below
	p.Root(out)
	p.Where(func(m *pattern.Match) bool {
		xt, split := m.Get(x).Type, m.Node(parts[0])
		r := len(xt.Shape)
		if r == 0 || !xt.DType.IsFloat() || !isAxis(split.Attrs.Int("axis"), r, r-1) {
			return false
		}
		sizes := split.Attrs.Ints("sizes")
		if len(sizes) != 2 || sizes[0] != sizes[1] {
			return false
		}
		want := xt.Shape.Clone()
		want[r-1] = graph.D(sizes[0])
		return m.Get(out).Type.Equal(graph.Type{DType: xt.DType, Shape: want})
	})
	ms, err := p.FindAll(g)
	if err != nil {
		return Info{}, err
	}
	for _, m := range ms {
		err := m.Replace(func(b *graph.Builder) ([]*graph.Value, error) {
			return []*graph.Value{b.Op("swiglu_packed", nil, m.Get(x))}, nil
		})
		if err != nil {
			return Info{}, err
		}
	}
	return Info{Matches: len(ms), Clean: true, ValidShapes: true}, nil
}
