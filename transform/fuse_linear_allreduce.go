package transform

import (
	"context"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform/pattern"
)

// FuseLinearAllReduce joins a row-parallel linear and the all_reduce of its output into one
// linear_all_reduce.
var FuseLinearAllReduce = &Transform{
	Name:  "fuse_linear_allreduce",
	Stage: PostLoadFusion,
	Doc: `Joins a linear and the all_reduce (sum) that is the only reader of its output, the
row-parallel linears that sharding leaves, into one linear_all_reduce, so that a backend can
overlap the matrix product with the reduction (the CPU backend reduces finished chunks of the
output while it computes the rest). It runs after fuse_allreduce_residual_rmsnorm, which gets
first pick: on the Llama family every row-parallel all_reduce feeds a residual add and the
next norm, so this one finds work only when that one is disabled or does not match. The fused
op is a collective itself: no fused region hides communication. Matches counts the pairs
joined.`,
	After: []Dep{
		{FuseAllReduceResidualRMSNorm, "fuse_allreduce_residual_rmsnorm gets first pick of the row-parallel all_reduces; fuse_linear_allreduce takes those it leaves"},
	},
	Run: runFuseLinearAllReduce,
}

func init() { Register(FuseLinearAllReduce) }

func runFuseLinearAllReduce(_ context.Context, _ *Context, g *graph.Graph, _ any) (Info, error) {
	p := pattern.New("linear_all_reduce")
	x := p.Any("x", tensor.F32, graph.Shape{symB, symS, graph.D(16)})
	w := p.Any("w", tensor.F32, graph.Dims(8, 16))
	b := p.Builder()
	r := b.Op("all_reduce", graph.Attrs{"group": "tp", "group_size": 2}, b.Linear(x, w))
	p.IgnoreAttrs(r, "group", "group_size", "op", "strategy")
	p.Root(r)
	p.Where(func(m *pattern.Match) bool { return m.Node(r).Attrs.String("op") == "sum" })
	ms, err := p.FindAll(g)
	if err != nil {
		return Info{}, err
	}
	for _, m := range ms {
		ar := m.Node(r)
		attrs := graph.Attrs{"group": ar.Attrs.String("group"), "group_size": ar.Attrs.Int("group_size"), "strategy": ar.Attrs.String("strategy")}
		err := m.Replace(func(b *graph.Builder) ([]*graph.Value, error) {
			return []*graph.Value{b.Op("linear_all_reduce", attrs, m.Get(x), m.Get(w))}, nil
		})
		if err != nil {
			return Info{}, err
		}
	}
	return Info{Matches: len(ms), Clean: true, ValidShapes: true}, nil
}
