package transform

import (
	"context"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform/pattern"
)

// FuseLinearQKVRoPE joins a fused q/k/v linear and the qkv_rope that reads it into one
// linear_qkv_rope.
var FuseLinearQKVRoPE = &Transform{
	Name:  "fuse_linear_qkv_rope",
	Stage: PostLoadFusion,
	Doc: `Joins a linear and the qkv_rope that is the only reader of its output (the fused
q|k|v projection that fuse_gemms and fuse_qkv_rope leave) into one linear_qkv_rope with
qkv_rope's attributes, so that a backend can lay out and rotate q and k in its GEMM's
epilogue instead of writing the packed projections out and launching a kernel to read them
back (the CUDA decode GEMV does; other paths run the two steps). Runs after fuse_qkv_rope.
Matches counts the pairs joined, one per layer.`,
	After: []Dep{
		{FuseQKVRoPE, "fuse_qkv_rope makes the qkv_rope that fuse_linear_qkv_rope joins with its linear"},
	},
	Run: runFuseLinearQKVRoPE,
}

func init() { Register(FuseLinearQKVRoPE) }

func runFuseLinearQKVRoPE(_ context.Context, _ *Context, g *graph.Graph, _ any) (Info, error) {
	p := pattern.New("linear_qkv_rope")
	// Example types: H=2, KV=1, D=8.
	x := p.Any("x", tensor.F32, graph.Shape{symB, symS, graph.D(16)})
	w := p.Any("w", tensor.F32, graph.Dims(32, 16))
	pos := p.Any("positions", tensor.I32, graph.Shape{symB, symS})
	b := p.Builder()
	attrs := graph.Attrs{"heads": 2, "kv_heads": 1, "inv_freq": []float64{1, 0.1, 0.01, 0.001}}
	outs := b.Apply("qkv_rope", attrs, b.Linear(x, w), pos)
	p.IgnoreAttrs(outs[0], "heads", "kv_heads", "inv_freq", "scaling")
	p.Root(outs[0])
	ms, err := p.FindAll(g)
	if err != nil {
		return Info{}, err
	}
	for _, m := range ms {
		attrs := m.Node(outs[0]).Attrs
		err := m.Replace(func(b *graph.Builder) ([]*graph.Value, error) {
			return b.Apply("linear_qkv_rope", attrs, m.Get(x), m.Get(w), m.Get(pos)), nil
		})
		if err != nil {
			return Info{}, err
		}
	}
	return Info{Matches: len(ms), Clean: true, ValidShapes: true}, nil
}
