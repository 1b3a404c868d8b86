package transform

import (
	"context"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/transform/pattern"
)

// MatchRepeatKV replaces Hugging Face's repeat_kv, written as reshape/expand/reshape, with one
// repeat_kv op.
var MatchRepeatKV = &Transform{
	Name:  "match_repeat_kv",
	Stage: PatternMatcher,
	Doc: `Replaces the head repetition of grouped-query attention (graph.DecomposeRepeatKV):
x[B,KV,S,D] reshaped to [B,KV,1,S,D], expanded to [B,KV,n,S,D] and reshaped to
[B,KV*n,S,D], with one repeat_kv {n} op. KV must be a constant; every shape is checked.
Multi-head attention (n = 1) has no repetition to match. Matches counts the repetitions
replaced (two per GQA layer: keys and values).`,
	Run: runMatchRepeatKV,
}

func init() { Register(MatchRepeatKV) }

func runMatchRepeatKV(_ context.Context, _ *Context, g *graph.Graph, _ any) (Info, error) {
	r := newRepeatKV()
	ms, err := r.p.FindAll(g)
	if err != nil {
		return Info{}, err
	}
	err = pattern.ReplaceAll(ms, func(m *pattern.Match, b *graph.Builder) ([]*graph.Value, error) {
		n, _ := r.factor(m)
		return []*graph.Value{b.Op("repeat_kv", graph.Attrs{"n": n}, m.Get(r.x))}, nil
	})
	if err != nil {
		return Info{}, err
	}
	return Info{Matches: len(ms), Clean: true, ValidShapes: true}, nil
}
