package transform

import (
	"context"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform/pattern"
)

// FuseAddRMSNorm joins a residual add and the rmsnorm of its sum into one add_rmsnorm.
var FuseAddRMSNorm = &Transform{
	Name:  "fuse_add_rmsnorm",
	Stage: PostLoadFusion,
	Doc: `Joins a residual add and the rmsnorm of its sum, rmsnorm(x + residual, w), into one
add_rmsnorm op whose two outputs replace both: the normalised value, and the sum that the
next residual add reads (the sum keeps all its other readers). x and residual must have one
shape (no broadcasting, which rules out bias adds). After the last layer the sum feeds only
the final norm; its add is joined all the same and the second output is left unread.
Matches counts the pairs joined.`,
	After: []Dep{
		{FuseAllReduceResidualRMSNorm, "fuse_allreduce_residual_rmsnorm gets first pick of the residual add and the norm after an all_reduce, which fuse_add_rmsnorm would otherwise take, leaving the all_reduce alone"},
	},
	Run: runFuseAddRMSNorm,
}

func init() { Register(FuseAddRMSNorm) }

func runFuseAddRMSNorm(_ context.Context, _ *Context, g *graph.Graph, _ any) (Info, error) {
	p := pattern.New("add_rmsnorm")
	hidden := graph.Shape{symB, symS, graph.D(8)}
	x, res := p.Any("x", tensor.F32, hidden), p.Any("residual", tensor.F32, hidden)
	w := p.Any("w", tensor.F32, graph.Dims(8))
	b := p.Builder()
	sum := b.Add(x, res)
	norm := b.Op("rmsnorm", graph.Attrs{"eps": 1e-6}, sum, w)
	p.IgnoreAttrs(norm, "eps")
	p.Root(norm)
	p.Where(func(m *pattern.Match) bool {
		return m.Get(x).Type.Shape.Equal(m.Get(res).Type.Shape) && m.Get(sum).Type.Shape.Equal(m.Get(x).Type.Shape)
	})
	// The sum is read by the next residual add too: a shared match, replaced value by value.
	ms, err := p.FindAllShared(g)
	if err != nil {
		return Info{}, err
	}
	for _, m := range ms {
		eps := m.Node(norm).Attrs.Float("eps")
		err := m.ReplaceValues([]*graph.Value{norm, sum}, func(b *graph.Builder) ([]*graph.Value, error) {
			return b.Apply("add_rmsnorm", graph.Attrs{"eps": eps}, m.Get(x), m.Get(res), m.Get(w)), nil
		})
		if err != nil {
			return Info{}, err
		}
	}
	return Info{Matches: len(ms), Clean: true, ValidShapes: true}, nil
}
