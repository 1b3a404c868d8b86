package transform

import (
	"context"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform/pattern"
)

// MatchEagerAttention replaces eager causal attention with one sdpa op.
var MatchEagerAttention = &Transform{
	Name:  "match_eager_attention",
	Stage: PatternMatcher,
	Doc: `Replaces eager attention, softmax(q·kᵀ·scale + mask)·v as the frontends write it, with
one sdpa op. q, k and v are [B,H,S,D]; kᵀ must be k transposed on its last two axes; scale is
an f32 scalar constant; the softmax runs over the last axis in f32 (its input cast to f32, if
any, and its output cast back to q's dtype, if any). The mask must be the causal mask of
graph.DecomposeCausalMask, with or without the sliding-window term, which gives sdpa its
positions and window; the mask is shared by every layer, so it is recognised where it is
computed and left in place (dead code removal takes it once the last layer is rewritten).
When k and v are repeated KV heads (a repeat_kv op, or its reshape/expand/reshape form) sdpa
reads the KV heads themselves and repeats them inside (grouped-query attention). Matches
counts the attention blocks replaced.`,
	After: []Dep{
		{MatchRepeatKV, "match_repeat_kv must see the KV head repetitions before match_eager_attention folds them into sdpa, which reads the KV heads themselves"},
	},
	Run: runMatchEagerAttention,
}

func init() { Register(MatchEagerAttention) }

// attentionPattern is the decomposition of the sdpa op with the KV heads as wildcards (already
// repeated) and the mask a wildcard checked on its own.
type attentionPattern struct {
	p                               *pattern.Pattern
	q, k, v, mask, scale            *graph.Value
	kt, scores, a32, probs, pc, out *graph.Value
}

func newAttentionPattern() *attentionPattern {
	a := &attentionPattern{p: pattern.New("eager_attention")}
	heads := graph.Shape{symB, graph.D(4), symS, graph.D(16)}
	a.q = a.p.Any("q", tensor.F32, heads)
	a.k = a.p.Any("k", tensor.F32, heads)
	a.v = a.p.Any("v", tensor.F32, heads)
	a.mask = a.p.Any("mask", tensor.F32, graph.Shape{symB, graph.D(1), symS, symS})
	a.scale = a.p.Const("scale", tensor.F32)
	b := a.p.Builder()
	a.kt = b.Transpose(a.k, 0, 1, 3, 2)
	a.scores = b.Add(b.Mul(b.Matmul(a.q, a.kt), a.scale), a.mask)
	a.a32 = b.Cast(a.scores, tensor.F32)
	a.p.Optional(a.a32)
	a.probs = b.Softmax(a.a32, -1)
	a.p.IgnoreAttrs(a.probs, "axis")
	a.pc = b.Cast(a.probs, tensor.F32)
	a.p.Optional(a.pc)
	a.p.IgnoreAttrs(a.pc, "dtype")
	a.out = b.Matmul(a.pc, a.v)
	a.p.Root(a.out)
	return a
}

// attention is one match made ready for replacement.
type attention struct {
	q, k, v *graph.Value // k and v with their KV heads, not repeated
	mask    *maskInfo
	scale   float64
}

// check holds a match to what sdpa computes and returns the sdpa inputs.
func (a *attentionPattern) check(g *graph.Graph, m *pattern.Match, masks *maskMatcher, rep *repeatKV) (*attention, bool) {
	q, k, v := m.Get(a.q), m.Get(a.k), m.Get(a.v)
	qs := q.Type.Shape
	if len(qs) != 4 || qs[1].IsSym() || !q.Type.DType.IsFloat() || !k.Type.Shape.Equal(qs) || !v.Type.Shape.Equal(qs) {
		return nil, false
	}
	scale, ok := scalarConst(m, a.scale, tensor.F32)
	if !ok {
		return nil, false
	}
	if !isAxis(m.Node(a.probs).Attrs.Int("axis"), 4, 3) || m.Get(a.a32).Type.DType != tensor.F32 {
		return nil, false
	}
	if !castTo(m, a.pc, q.Type.DType) || !m.Get(a.out).Type.Equal(q.Type) {
		return nil, false
	}
	mask := masks.match(m.Get(a.mask))
	if mask == nil {
		return nil, false
	}
	if ps := mask.positions.Type.Shape; ps[0] != qs[0] || ps[1] != qs[2] {
		return nil, false
	}
	kv, nk := unrepeat(g, k, rep)
	vv, nv := unrepeat(g, v, rep)
	if nk != nv || !kv.Type.Shape.Equal(vv.Type.Shape) {
		kv, vv = k, v
	}
	return &attention{q: q, k: kv, v: vv, mask: mask, scale: scale}, true
}

// unrepeat returns the KV heads that x repeats n times: the input of a repeat_kv op or of
// its primitive form, or x itself with n = 1.
func unrepeat(g *graph.Graph, x *graph.Value, rep *repeatKV) (*graph.Value, int) {
	p := x.Producer
	if p == nil {
		return x, 1
	}
	if p.Op == "repeat_kv" {
		return p.Inputs[0], p.Attrs.Int("n")
	}
	if m, ok := rep.p.Match(g, p); ok {
		n, _ := rep.factor(m)
		return m.Get(rep.x), n
	}
	return x, 1
}

func runMatchEagerAttention(_ context.Context, _ *Context, g *graph.Graph, _ any) (Info, error) {
	a := newAttentionPattern()
	masks, rep := newMaskMatcher(g), newRepeatKV()
	a.p.Where(func(m *pattern.Match) bool {
		_, ok := a.check(g, m, masks, rep)
		return ok
	})
	ms, err := a.p.FindAll(g)
	if err != nil {
		return Info{}, err
	}
	replaced := 0
	for _, m := range ms {
		at, ok := a.check(g, m, masks, rep) // again: an earlier replacement may have changed an input
		if !ok {
			continue
		}
		err := m.Replace(func(b *graph.Builder) ([]*graph.Value, error) {
			attrs := graph.Attrs{"scale": at.scale, "window": at.mask.window}
			return []*graph.Value{b.Op("sdpa", attrs, at.q, at.k, at.v, at.mask.positions)}, nil
		})
		if err != nil {
			return Info{}, err
		}
		replaced++
	}
	// The repeat_kv ops no longer read and, after the last layer, the shared mask are dead.
	return Info{Matches: replaced, Clean: replaced == 0, ValidShapes: true}, nil
}
