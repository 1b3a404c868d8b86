package transform

import (
	"context"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform/pattern"
)

// FuseLinearSwiGLU joins a fused gate/up linear and the swiglu_packed that reads it into one
// linear_swiglu.
var FuseLinearSwiGLU = &Transform{
	Name:  "fuse_linear_swiglu",
	Stage: PostLoadFusion,
	Doc: `Joins a linear and the swiglu_packed that is the only reader of its output (the fused
gate|up projection that fuse_gemms and fuse_split_swiglu leave) into one linear_swiglu, so
that a backend can apply the activation in its GEMM's epilogue instead of writing the packed
projections out and launching a kernel to read them back (the CUDA decode GEMV does; other
paths run the two steps). Runs after fuse_split_swiglu. Matches counts the pairs joined, one
per layer.`,
	After: []Dep{
		{FuseSplitSwiGLU, "fuse_split_swiglu makes the swiglu_packed that fuse_linear_swiglu joins with its linear"},
	},
	Run: runFuseLinearSwiGLU,
}

func init() { Register(FuseLinearSwiGLU) }

func runFuseLinearSwiGLU(_ context.Context, _ *Context, g *graph.Graph, _ any) (Info, error) {
	p := pattern.New("linear_swiglu")
	x := p.Any("x", tensor.F32, graph.Shape{symB, symS, graph.D(16)})
	w := p.Any("w", tensor.F32, graph.Dims(8, 16))
	b := p.Builder()
	h := b.Op("swiglu_packed", nil, b.Linear(x, w))
	p.Root(h)
	ms, err := p.FindAll(g)
	if err != nil {
		return Info{}, err
	}
	for _, m := range ms {
		err := m.Replace(func(b *graph.Builder) ([]*graph.Value, error) {
			return []*graph.Value{b.Op("linear_swiglu", nil, m.Get(x), m.Get(w))}, nil
		})
		if err != nil {
			return Info{}, err
		}
	}
	return Info{Matches: len(ms), Clean: true, ValidShapes: true}, nil
}
