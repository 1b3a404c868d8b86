package transform

import (
	"context"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform/pattern"
)

// MatchRMSNorm replaces Hugging Face's RMSNorm, written in primitives, with one rmsnorm op.
var MatchRMSNorm = &Transform{
	Name:  "match_rmsnorm_pattern",
	Stage: PatternMatcher,
	Doc: `Replaces RMSNorm in primitives (graph.DecomposeRMSNorm) with one rmsnorm op:
w * cast(x32 * rsqrt(mean(x32^2, last axis) + eps), x.dtype) with x32 = cast(x, f32). The
casts are optional (cleanup_noop removes them when x is f32, and then x must be f32), eps must
be an f32 scalar constant added before rsqrt, the final cast must go back to x's dtype and w
must be a vector over x's last axis. Any rank of x matches: the hidden states [B,S,hidden]
as well as Qwen3's per-head q/k norms on [B,S,heads,head_dim]. Matches counts the norms
replaced.`,
	Run: runMatchRMSNorm,
}

func init() { Register(MatchRMSNorm) }

// rmsnormPattern is graph.DecomposeRMSNorm with the casts optional and eps captured.
type rmsnormPattern struct {
	p                         *pattern.Pattern
	x, w, eps, x32, mean, out *graph.Value
	back                      *graph.Value
}

func newRMSNormPattern() *rmsnormPattern {
	r := &rmsnormPattern{p: pattern.New("rmsnorm")}
	r.x = r.p.Any("x", tensor.F32, graph.Shape{symB, symS, graph.D(8)})
	r.w = r.p.Any("w", tensor.F32, graph.Dims(8))
	r.eps = r.p.Const("eps", tensor.F32)
	b := r.p.Builder()
	r.x32 = b.Cast(r.x, tensor.F32)
	r.p.Optional(r.x32)
	r.mean = b.Reduce("mean", b.Pow(r.x32, b.Scalar(tensor.F32, 2)), true, -1)
	r.p.IgnoreAttrs(r.mean, "axes")
	y := b.Mul(r.x32, b.Unary("rsqrt", b.Add(r.mean, r.eps)))
	r.back = b.Cast(y, tensor.F32)
	r.p.Optional(r.back)
	r.p.IgnoreAttrs(r.back, "dtype")
	r.out = b.Mul(r.w, r.back)
	r.p.Root(r.out)
	r.p.Where(r.check)
	return r
}

// check holds a candidate to what the rmsnorm op computes.
func (r *rmsnormPattern) check(m *pattern.Match) bool {
	x, w, out := m.Get(r.x), m.Get(r.w), m.Get(r.out)
	xs := x.Type.Shape
	if len(xs) == 0 || !x.Type.DType.IsFloat() || !w.Type.DType.IsFloat() || !shapeIs(w.Type.Shape, xs[len(xs)-1]) {
		return false
	}
	if eps, ok := scalarConst(m, r.eps, tensor.F32); !ok || eps < 0 {
		return false
	}
	if !isLastAxisOnly(m.Node(r.mean).Attrs.Ints("axes"), len(xs)) {
		return false
	}
	// Without the first cast x is already f32; without the last one the f32 result is x's dtype.
	if m.Node(r.x32) == nil && x.Type.DType != tensor.F32 {
		return false
	}
	if !castTo(m, r.back, x.Type.DType) || m.Node(r.back) == nil && x.Type.DType != tensor.F32 {
		return false
	}
	dt, err := graph.Promote(w.Type.DType, x.Type.DType)
	return err == nil && out.Type.Equal(graph.Type{DType: dt, Shape: xs})
}

func runMatchRMSNorm(_ context.Context, _ *Context, g *graph.Graph, _ any) (Info, error) {
	r := newRMSNormPattern()
	ms, err := r.p.FindAll(g)
	if err != nil {
		return Info{}, err
	}
	err = pattern.ReplaceAll(ms, func(m *pattern.Match, b *graph.Builder) ([]*graph.Value, error) {
		eps, _ := scalarConst(m, r.eps, tensor.F32)
		return []*graph.Value{b.Op("rmsnorm", graph.Attrs{"eps": eps}, m.Get(r.x), m.Get(r.w))}, nil
	})
	if err != nil {
		return Info{}, err
	}
	return Info{Matches: len(ms), Clean: true, ValidShapes: true}, nil
}
