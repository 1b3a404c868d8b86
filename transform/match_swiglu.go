package transform

import (
	"context"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform/pattern"
)

// MatchSwiGLU replaces silu(gate) * up with one swiglu op.
var MatchSwiGLU = &Transform{
	Name:  "match_swiglu_pattern",
	Stage: PatternMatcher,
	Doc: `Replaces the SwiGLU activation of an MLP, silu(gate) * up, with one swiglu op. gate
and up must be float tensors of one shape (no broadcasting). Matches counts the activations
replaced.`,
	Run: runMatchSwiGLU,
}

func init() { Register(MatchSwiGLU) }

func runMatchSwiGLU(_ context.Context, _ *Context, g *graph.Graph, _ any) (Info, error) {
	p := pattern.New("swiglu")
	shape := graph.Shape{symB, symS, graph.D(16)}
	gate, up := p.Any("gate", tensor.F32, shape), p.Any("up", tensor.F32, shape)
	b := p.Builder()
	out := b.Mul(b.Unary("silu", gate), up)
	p.Root(out)
	p.Where(func(m *pattern.Match) bool {
		gt, ut, ot := m.Get(gate).Type, m.Get(up).Type, m.Get(out).Type
		dt, err := graph.Promote(gt.DType, ut.DType)
		return err == nil && gt.DType.IsFloat() && ut.DType.IsFloat() && gt.Shape.Equal(ut.Shape) &&
			ot.Equal(graph.Type{DType: dt, Shape: gt.Shape})
	})
	ms, err := p.FindAll(g)
	if err != nil {
		return Info{}, err
	}
	err = pattern.ReplaceAll(ms, func(m *pattern.Match, b *graph.Builder) ([]*graph.Value, error) {
		return []*graph.Value{b.Op("swiglu", nil, m.Get(gate), m.Get(up))}, nil
	})
	if err != nil {
		return Info{}, err
	}
	return Info{Matches: len(ms), Clean: true, ValidShapes: true}, nil
}
