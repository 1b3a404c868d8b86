package transform

import (
	"context"
	"slices"

	"github.com/loom-ml/loom/graph"
)

// FuseAttentionTranspose has paged_attention write its output token-major.
var FuseAttentionTranspose = &Transform{
	Name:  "fuse_attention_transpose",
	Stage: CacheInit,
	Doc: `Replaces transpose(paged_attention(...)){perm=[0,2,1,3]}, the attention output going
back from heads [1,H,S,D] to tokens [1,S,H,D] before the output projection, by one
paged_attention{token_major=1} that writes [1,S,H,D] directly: one copy of the attention
output less per layer. The attention output must have no other reader and be no graph
output. After insert_cached_attention (it needs paged_attention); matches counts the
transposes removed, one per layer.`,
	After: []Dep{
		{InsertCachedAttention, "insert_cached_attention makes the paged_attention ops whose transposes fuse_attention_transpose removes"},
	},
	Run: runFuseAttentionTranspose,
}

func init() { Register(FuseAttentionTranspose) }

func runFuseAttentionTranspose(_ context.Context, _ *Context, g *graph.Graph, _ any) (Info, error) {
	matches := 0
	users := g.Users()
	dead := map[*graph.Node]bool{}
	for _, n := range slices.Clone(g.Nodes) {
		if n.Op != "transpose" || !slices.Equal(n.Attrs.Ints("perm"), []int{0, 2, 1, 3}) {
			continue
		}
		att := n.Inputs[0].Producer
		if att == nil || att.Op != "paged_attention" || att.Attrs.Int("token_major") != 0 ||
			len(users[att.Outputs[0]]) != 1 || g.IsOutput(att.Outputs[0]) {
			continue
		}
		attrs := att.Attrs.Clone()
		attrs["token_major"] = 1
		fused, err := g.NewNode("paged_attention", attrs, att.Inputs, att.Scope)
		if err != nil {
			return Info{}, err
		}
		if err := g.InsertBefore(att, fused); err != nil {
			return Info{}, err
		}
		g.ReplaceUses(n.Outputs[0], fused.Outputs[0])
		dead[att], dead[n] = true, true
		matches++
	}
	g.RemoveNodes(dead)
	return Info{Matches: matches, Clean: true, ValidShapes: true}, nil
}
