package transform

import (
	"context"
	"fmt"
	"slices"

	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/graph"
)

// CPAxis is the mesh axis of context parallelism (--mesh cp=2, tp=2,cp=2): its ranks
// split every prompt's tokens (dist.CPShare).
const CPAxis = dist.CPAxis

// ShardSequenceConfig holds the options of shard_sequence.
type ShardSequenceConfig struct {
	// Mesh is the device mesh, such as "cp=2" or "tp=2,cp=2". Empty: the sharding plan's,
	// else the caller's.
	Mesh string `yaml:"mesh"`
}

// ShardSequence makes a rank's graph run on its share of the sequence.
var ShardSequence = &Transform{
	Name:  "shard_sequence",
	Stage: Sharding,
	Doc: `Context parallelism, first half: with a cp axis in the mesh, each rank's graph runs on
its own share of every prompt's tokens (dist.CPShare: chunks i and 2N-1-i of 2N, for causal
balance), which the runtime hands it as input_ids and positions [B,S] (S the rank's share,
padded to the longest share with positions past the prompt, which no real query sees). Every
op but attention is token-parallel and stays as it is; each sdpa becomes attention_partial of
its queries over the rank's own block of keys, placed by their positions ([1,B,H,S,D] blocks),
whose f32 output is cast back. On one rank with every token this computes what sdpa computes;
rewrite_cp_attention then brings in the other ranks' blocks. A graph whose attention was not
matched (a softmax over the sequence remains) is an error: it would attend to the rank's
tokens only. Skipped without a cp axis of more than one rank. Matches counts the sdpa ops
rewritten.`,
	Config: ShardSequenceConfig{},
	After: []Dep{
		{ShardingExecutor, "sequence sharding applies to each rank's graph after tensor-parallel sharding (local head counts)"},
		{MatchEagerAttention, "the attention must be one sdpa op to be rewritten over blocks of keys"},
	},
	Run: Typed(runShardSequence),
}

func init() { Register(ShardSequence) }

// cpMesh resolves the mesh of the context-parallel transforms: the option, else the
// sharding plan's, else the caller's. It returns the mesh and its cp size (1 without).
func cpMesh(c *Context, option string) (dist.Mesh, int, error) {
	if option == "" {
		if plan, ok := ShardingPlanOf(c); ok && len(plan.Mesh.Axes()) > 0 {
			return plan.Mesh, axisSize(plan.Mesh, CPAxis), nil
		}
	}
	mesh, err := resolveMesh(c, option)
	if err != nil {
		return dist.Mesh{}, 0, err
	}
	return mesh, axisSize(mesh, CPAxis), nil
}

func runShardSequence(_ context.Context, c *Context, g *graph.Graph, cfg ShardSequenceConfig) (Info, error) {
	_, cp, err := cpMesh(c, cfg.Mesh)
	if err != nil {
		return Info{}, err
	}
	if cp <= 1 {
		return Info{Skipped: true}, nil
	}
	for _, n := range g.Nodes {
		switch {
		case n.Op == "paged_attention":
			return Info{}, fmt.Errorf("%s: context parallelism runs whole-sequence graphs; a graph on the paged KV cache is not split by sequence", n.Out())
		case n.Op == "softmax" && len(n.Inputs[0].Type.Shape) > 0 && n.Inputs[0].Type.Shape[len(n.Inputs[0].Type.Shape)-1].IsSym():
			return Info{}, fmt.Errorf("%s: a softmax over the sequence (unmatched attention?) would see the rank's tokens only; cp=%d needs every attention as sdpa (match_eager_attention)", n.Out(), cp)
		}
	}
	if Enabled(c, InsertCachedAttention) {
		// The paged KV cache: insert_cached_attention turns each sdpa into paged_attention
		// and cp_cached_attention splits that over the cp ranks' caches.
		c.Log().Info("shard_sequence: the paged KV cache is on; cp_cached_attention splits the attention after insert_cached_attention", "cp", cp)
		return Info{Skipped: true}, nil
	}
	matches := 0
	for _, n := range slices.Clone(g.Nodes) {
		if n.Op != "sdpa" {
			continue
		}
		if err := sdpaAsPartial(g, n); err != nil {
			return Info{}, fmt.Errorf("sdpa %s: %w", n.Out(), err)
		}
		matches++
	}
	return Info{Matches: matches, Clean: true, ValidShapes: true}, nil
}

// block views x [d0,d1,...] as one block [1,d0,d1,...].
func block(b *graph.Builder, x *graph.Value) *graph.Value {
	return b.Reshape(x, append(graph.Shape{graph.D(1)}, x.Type.Shape...)...)
}

// sdpaAsPartial replaces sdpa node n (q [B,H,S,D], k, v [B,KV,S,D], positions [B,S]) by
// attention_partial over one block of queries and one of keys, both at those positions.
func sdpaAsPartial(g *graph.Graph, n *graph.Node) error {
	q, k, v, pos := n.Inputs[0], n.Inputs[1], n.Inputs[2], n.Inputs[3]
	b := graph.BuilderFor(g)
	b.SetScope(n.Scope)
	start := len(g.Nodes)
	p := block(b, pos)
	part := b.Apply("attention_partial", graph.Attrs{"scale": n.Attrs.Float("scale"), "window": n.Attrs.Int("window")},
		block(b, q), block(b, k), block(b, v), p, p)
	if err := b.Err(); err != nil {
		return err
	}
	out := b.Reshape(part[0], q.Type.Shape...)
	if out.Type.DType != n.Out().Type.DType {
		out = b.Cast(out, n.Out().Type.DType)
	}
	if err := b.Err(); err != nil {
		return err
	}
	if !out.Type.Equal(n.Out().Type) {
		return fmt.Errorf("the rewrite gives %s, sdpa %s (internal error)", out.Type, n.Out().Type)
	}
	added := slices.Clone(g.Nodes[start:])
	g.Nodes = g.Nodes[:start]
	if err := g.InsertBefore(n, added...); err != nil {
		return err
	}
	g.ReplaceUses(n.Out(), out)
	g.RemoveNodes(map[*graph.Node]bool{n: true})
	return nil
}
