package transform

import (
	"context"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform/pattern"
)

// FuseAllReduceResidualRMSNorm joins a row-parallel all_reduce, the residual add of its
// result and the rmsnorm of the sum into one all_reduce_add_rmsnorm.
var FuseAllReduceResidualRMSNorm = &Transform{
	Name:  "fuse_allreduce_residual_rmsnorm",
	Stage: PostLoadFusion,
	Doc: `Joins an all_reduce (sum), the residual add of its result and the rmsnorm of the sum,
rmsnorm(all_reduce(x) + residual, w), into one all_reduce_add_rmsnorm whose two outputs
replace the norm and the sum (which the next residual add reads), so that a backend can fuse
the reduction with the add and the norm. The all_reduce's result must have no other reader,
x and residual one shape. It runs before fuse_add_rmsnorm, which would otherwise take the add
and the norm and leave the all_reduce alone. The fused op is a collective itself: no fused
region hides communication. Matches counts the triples joined.`,
	Run: runFuseAllReduceResidualRMSNorm,
}

func init() { Register(FuseAllReduceResidualRMSNorm) }

func runFuseAllReduceResidualRMSNorm(_ context.Context, _ *Context, g *graph.Graph, _ any) (Info, error) {
	p := pattern.New("all_reduce_add_rmsnorm")
	hidden := graph.Shape{symB, symS, graph.D(8)}
	x, res := p.Any("x", tensor.F32, hidden), p.Any("residual", tensor.F32, hidden)
	w := p.Any("w", tensor.F32, graph.Dims(8))
	b := p.Builder()
	r := b.Op("all_reduce", graph.Attrs{"group": "tp", "group_size": 2}, x)
	p.IgnoreAttrs(r, "group", "group_size", "op", "strategy")
	sum := b.Add(r, res)
	norm := b.Op("rmsnorm", graph.Attrs{"eps": 1e-6}, sum, w)
	p.IgnoreAttrs(norm, "eps")
	p.Root(norm)
	users := g.Users()
	p.Where(func(m *pattern.Match) bool {
		rv := m.Get(r)
		return m.Node(r).Attrs.String("op") == "sum" && len(users[rv]) == 1 && !g.IsOutput(rv) &&
			m.Get(x).Type.Shape.Equal(m.Get(res).Type.Shape) && m.Get(sum).Type.Shape.Equal(rv.Type.Shape)
	})
	// The sum is read by the next residual add too: a shared match, replaced value by value.
	ms, err := p.FindAllShared(g)
	if err != nil {
		return Info{}, err
	}
	for _, m := range ms {
		ar, eps := m.Node(r), m.Node(norm).Attrs.Float("eps")
		attrs := graph.Attrs{"group": ar.Attrs.String("group"), "group_size": ar.Attrs.Int("group_size"), "strategy": ar.Attrs.String("strategy"), "eps": eps}
		err := m.ReplaceValues([]*graph.Value{norm, sum}, func(b *graph.Builder) ([]*graph.Value, error) {
			return b.Apply("all_reduce_add_rmsnorm", attrs, m.Get(x), m.Get(res), m.Get(w)), nil
		})
		if err != nil {
			return Info{}, err
		}
	}
	return Info{Matches: len(ms), Clean: len(ms) == 0, ValidShapes: true}, nil
}
