package transform

import (
	"context"
	"fmt"
	"slices"

	"github.com/loom-ml/loom/graph"
)

// Strategies of rewrite_cp_attention.
const (
	CPRing     = "ring"       // K/V blocks passed around the cp group, merged by log-sum-exp
	CPAllToAll = "all_to_all" // Ulysses: q/k/v exchanged from sequence-sharded to head-sharded
)

// RewriteCPAttentionConfig holds the options of rewrite_cp_attention.
type RewriteCPAttentionConfig struct {
	// Strategy is how attention reaches the other ranks' keys: ring or all_to_all. A plain
	// value, so that the choice stays with the deployment, not the backend.
	Strategy string `yaml:"cp_strategy"`
	// Mesh as shard_sequence's: empty takes the sharding plan's, else the caller's.
	Mesh string `yaml:"mesh"`
}

// RewriteCPAttention brings the other cp ranks' keys and values into each rank's attention.
var RewriteCPAttention = &Transform{
	Name:  "rewrite_cp_attention",
	Stage: Sharding,
	Doc: `Context parallelism, second half: each attention_partial that shard_sequence left over
the rank's own block of keys (queries and keys at the same positions) attends to the whole
sequence of the cp group. ring: the block of keys, values and their positions goes N-1 times
one step around the group (ring_shift), each block received gives another attention_partial
of the local queries, merged into the running result by log-sum-exp (attention_merge); the
causal mask by positions lets any order of blocks give the same softmax. all_to_all
(Ulysses): q, k and v [1,B,H,S,D] are exchanged (all_to_all over cp) from the rank's tokens of
every head to every rank's tokens of the rank's H/N heads, the positions gathered; one
attention_partial over the N blocks per query block computes full attention for the head
group, and the output goes back by the inverse exchange. KV heads that N does not divide are
repeated to the query heads first; query heads that N does not divide fall back to ring (a
note in the log). The collectives name the cp axis. Matches counts the attention rewritten.
With the paged KV cache on (insert_cached_attention enabled) it skips and hands cp_strategy
to cp_cached_attention, which rewrites the paged attention by the same choice.`,
	Config: RewriteCPAttentionConfig{Strategy: CPRing},
	After: []Dep{
		{ShardSequence, "shard_sequence turns each sdpa into the local attention_partial rewritten here"},
	},
	Run: Typed(runRewriteCPAttention),
}

func init() { Register(RewriteCPAttention) }

// cpStrategyKey carries rewrite_cp_attention's cp_strategy to cp_cached_attention when the
// paged KV cache is on.
var cpStrategyKey = NewKey[string]("rewrite_cp_attention's cp_strategy")

func runRewriteCPAttention(_ context.Context, c *Context, g *graph.Graph, cfg RewriteCPAttentionConfig) (Info, error) {
	if cfg.Strategy != CPRing && cfg.Strategy != CPAllToAll {
		return Info{}, fmt.Errorf("option cp_strategy: %q is not %s or %s", cfg.Strategy, CPRing, CPAllToAll)
	}
	_, cp, err := cpMesh(c, cfg.Mesh)
	if err != nil {
		return Info{}, err
	}
	if cp <= 1 {
		return Info{Skipped: true}, nil
	}
	if Enabled(c, InsertCachedAttention) {
		cpStrategyKey.Set(c, cfg.Strategy) // for cp_cached_attention
		return Info{Skipped: true}, nil
	}
	users := g.Users()
	matches := 0
	for _, n := range slices.Clone(g.Nodes) {
		if n.Op != "attention_partial" || n.Inputs[3] != n.Inputs[4] || n.Inputs[0].Type.Shape[0] != graph.D(1) || n.Inputs[1].Type.Shape[0] != graph.D(1) {
			continue
		}
		strategy := cfg.Strategy
		H := n.Inputs[0].Type.Shape[2].Size
		if strategy == CPAllToAll && H%cp != 0 {
			c.Log().Info("rewrite_cp_attention: query heads not divisible by cp, ring instead of all_to_all", "node", n.Out().Name, "heads", H, "cp", cp)
			strategy = CPRing
		}
		if err := cpAttention(g, n, cp, strategy, len(users[n.Outputs[1]]) > 0 || slices.Contains(g.Outputs, n.Outputs[1])); err != nil {
			return Info{}, fmt.Errorf("attention_partial %s: %w", n.Out(), err)
		}
		matches++
	}
	return Info{Matches: matches, Clean: true, ValidShapes: true}, nil
}

// cpAttention replaces the local attention_partial n (q [1,B,H,S,D], k, v [1,B,KV,S,D],
// positions [1,B,S]) by attention over every block of the cp group of size cp; needLSE
// keeps its log-sum-exp output right too.
func cpAttention(g *graph.Graph, n *graph.Node, cp int, strategy string, needLSE bool) error {
	b := graph.BuilderFor(g)
	b.SetScope(n.Scope)
	start := len(g.Nodes)
	var o, lse *graph.Value
	if strategy == CPRing {
		o, lse = ringAttention(b, n, cp)
	} else {
		o, lse = ulyssesAttention(b, n, cp, needLSE)
	}
	if err := b.Err(); err != nil {
		return err
	}
	if !o.Type.Equal(n.Outputs[0].Type) || lse != nil && !lse.Type.Equal(n.Outputs[1].Type) {
		return fmt.Errorf("the rewrite gives %s, the op %s (internal error)", o.Type, n.Outputs[0].Type)
	}
	added := slices.Clone(g.Nodes[start:])
	g.Nodes = g.Nodes[:start]
	if err := g.InsertBefore(n, added...); err != nil {
		return err
	}
	g.ReplaceUses(n.Outputs[0], o)
	if lse != nil {
		g.ReplaceUses(n.Outputs[1], lse)
	}
	g.RemoveNodes(map[*graph.Node]bool{n: true})
	return nil
}

// ringAttention: the local block, then cp-1 blocks received around the ring, each merged.
func ringAttention(b *graph.Builder, n *graph.Node, cp int) (o, lse *graph.Value) {
	q, k, v, pos := n.Inputs[0], n.Inputs[1], n.Inputs[2], n.Inputs[3]
	ring := graph.Attrs{"group": CPAxis, "group_size": cp}
	part := b.Apply("attention_partial", n.Attrs, q, k, v, pos, pos)
	o, lse = part[0], part[1]
	kb, vb, pb := k, v, pos
	for range cp - 1 {
		kb, vb, pb = b.Op("ring_shift", ring, kb), b.Op("ring_shift", ring, vb), b.Op("ring_shift", ring, pb)
		p := b.Apply("attention_partial", n.Attrs, q, kb, vb, pos, pb)
		m := b.Apply("attention_merge", nil, o, lse, p[0], p[1])
		o, lse = m[0], m[1]
	}
	return o, lse
}

// ulyssesAttention: q, k, v from the rank's tokens of all heads to every rank's tokens of
// the rank's head group, attention over the N blocks, and back.
func ulyssesAttention(b *graph.Builder, n *graph.Node, cp int, needLSE bool) (o, lse *graph.Value) {
	q, k, v, pos := n.Inputs[0], n.Inputs[1], n.Inputs[2], n.Inputs[3]
	qs, ks := q.Type.Shape, k.Type.Shape // [1,B,H,S,D], [1,B,KV,S,D]
	B, S, D := qs[1], qs[3], qs[4]
	H, KV := qs[2].Size, ks[2].Size
	if KV%cp != 0 { // repeat the KV heads to the query heads, which cp divides
		rep := func(x *graph.Value) *graph.Value {
			x = b.Reshape(x, B, graph.D(KV), S, D)
			return b.Reshape(b.Op("repeat_kv", graph.Attrs{"n": H / KV}, x), graph.D(1), B, graph.D(H), S, D)
		}
		k, v, KV = rep(k), rep(v), H
	}
	a2a := graph.Attrs{"group": CPAxis, "group_size": cp, "split_axis": 1, "concat_axis": 1}
	// x [1,B,heads,S,D] -> [N,B,heads/N,S,D]: block j holds rank j's tokens of this rank's heads.
	toHeads := func(x *graph.Value, heads int) *graph.Value {
		x = b.Reshape(x, B, graph.D(cp), graph.D(heads/cp), S, D)
		return b.Transpose(b.Op("all_to_all", a2a, x), 1, 0, 2, 3, 4)
	}
	qa, ka, va := toHeads(q, H), toHeads(k, KV), toHeads(v, KV)
	pa := b.Op("all_gather", graph.Attrs{"group": CPAxis, "group_size": cp, "axis": 0}, pos) // [N,B,S]
	part := b.Apply("attention_partial", n.Attrs, qa, ka, va, pa, pa)
	// [N,B,H/N,S,...] (block = rank's tokens) -> back to [1,B,H,S,...] of this rank's tokens.
	back := func(x *graph.Value, tail ...graph.Dim) *graph.Value {
		x = b.Op("all_to_all", a2a, b.Transpose(x, append([]int{1, 0}, seq(2, len(x.Type.Shape))...)...))
		return b.Reshape(x, append(graph.Shape{graph.D(1), B, graph.D(H), S}, tail...)...)
	}
	o = back(part[0], D)
	if needLSE {
		lse = back(part[1])
	}
	return o, lse
}

// seq is lo, lo+1, ..., hi-1.
func seq(lo, hi int) []int {
	out := make([]int, 0, hi-lo)
	for i := lo; i < hi; i++ {
		out = append(out, i)
	}
	return out
}
