package transform

import (
	"context"
	"fmt"
	"slices"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// CPKVPositionsInput is the graph input cp_cached_attention adds: i32[N,L], per sequence of
// the step (a row of block_tables), the position of each token the rank caches, in the
// rank's cache order (entry j in block block_tables[seq, j/BS] at offset j%BS), -1 past them.
const CPKVPositionsInput = "kv_positions"

// symKVEntries is the symbol of kv_positions' second dimension.
const symKVEntries = "L"

// CPCachedAttentionConfig holds the options of cp_cached_attention.
type CPCachedAttentionConfig struct {
	// Strategy is ring or all_to_all; empty takes rewrite_cp_attention's cp_strategy (one
	// knob for both graphs), else ring.
	Strategy string `yaml:"cp_strategy"`
	// Mesh as shard_sequence's: empty takes the sharding plan's, else the caller's.
	Mesh string `yaml:"mesh"`
}

// CPCachedAttention splits paged attention over the cp ranks' own KV caches.
var CPCachedAttention = &Transform{
	Name:  "cp_cached_attention",
	Stage: CacheInit,
	Doc: `Context parallelism on the paged KV cache. Each cp rank runs on its own tokens of a step
(a prompt chunk's dist.CPShare, a decode token on one rank; the runtime pads the ranks to one
length with tokens of no sequence) and keeps their keys and values in its own cache blocks,
so the keys of a sequence are spread over the cp group; the rank's block_tables and slots are
its own, and the new input kv_positions i32[N,L] gives the position of each token it caches.
Every paged_attention becomes paged_attention_partial, which writes the rank's keys and
attends queries to them only (o and log-sum-exp), and the queries travel instead of the
cache ("pass-Q"): ring passes the rank's queries with their running (o, lse) around the cp
group (ring_shift), each rank merging its partial result in (attention_merge), and one last
shift brings the merged result home; all_to_all gathers every rank's queries (all_gather),
attends them all over the rank's keys and returns each block of partial results to its rank
(all_to_all), which merges the N blocks. Decode and prefill chunks alike run this way. The
collectives name the cp axis. Skipped without a cp axis of more than one rank and on
graphs without the paged cache (whole sequences: rewrite_cp_attention's); an error after
fuse_attention_transpose (token-major output). Matches counts the attention ops
rewritten.`,
	Config: CPCachedAttentionConfig{},
	After: []Dep{
		{InsertCachedAttention, "the paged_attention ops it splits over the cp ranks' caches come from insert_cached_attention"},
		{RewriteCPAttention, "rewrite_cp_attention hands on its cp_strategy when the cache is on"},
	},
	Run: Typed(runCPCachedAttention),
}

func init() { Register(CPCachedAttention) }

func runCPCachedAttention(_ context.Context, c *Context, g *graph.Graph, cfg CPCachedAttentionConfig) (Info, error) {
	_, cp, err := cpMesh(c, cfg.Mesh)
	if err != nil {
		return Info{}, err
	}
	if cp <= 1 || g.Input(SlotMappingInput) == nil {
		return Info{Skipped: true}, nil // no cp, or a whole-sequence graph (rewrite_cp_attention's)
	}
	strategy := cfg.Strategy
	if strategy == "" {
		if s, ok := cpStrategyKey.Get(c); ok {
			strategy = s
		} else {
			strategy = CPRing
		}
	}
	if strategy != CPRing && strategy != CPAllToAll {
		return Info{}, fmt.Errorf("option cp_strategy: %q is not %s or %s", strategy, CPRing, CPAllToAll)
	}
	var attn []*graph.Node
	for _, n := range g.Nodes {
		switch n.Op {
		case "paged_attention":
			if n.Attrs.Int("token_major") != 0 {
				return Info{}, fmt.Errorf("%s: a token-major paged_attention (fuse_attention_transpose ran first)", n.Out())
			}
			attn = append(attn, n)
		case "sdpa", "attention_partial":
			return Info{}, fmt.Errorf("%s: %s left beside the paged cache; cp over the cache needs every attention paged", n.Out(), n.Op)
		}
	}
	if len(attn) == 0 {
		return Info{Clean: true, ValidShapes: true}, nil
	}
	if g.Input(CPKVPositionsInput) != nil {
		return Info{}, fmt.Errorf("the graph already has an input %s (did the transform run twice?)", CPKVPositionsInput)
	}
	kvPos, err := g.AddInput(CPKVPositionsInput, graph.Type{DType: tensor.I32, Shape: graph.Shape{graph.Sym(symSequences), graph.Sym(symKVEntries)}})
	if err != nil {
		return Info{}, err
	}
	for _, n := range attn {
		if err := cpCachedAttention(g, n, kvPos, cp, strategy); err != nil {
			return Info{}, fmt.Errorf("paged_attention %s: %w", n.Out(), err)
		}
	}
	return Info{Matches: len(attn), Clean: true, ValidShapes: true}, nil
}

// cpCachedAttention replaces paged_attention n (q [B,H,S,D], k, v [B,KV,S,D], positions
// [B,S], caches, slot_mapping, token_seq [S], block_tables) by the cp form.
func cpCachedAttention(g *graph.Graph, n *graph.Node, kvPos *graph.Value, cp int, strategy string) error {
	q, k, v, pos := n.Inputs[0], n.Inputs[1], n.Inputs[2], n.Inputs[3]
	kc, vc, slots, seqs, tables := n.Inputs[4], n.Inputs[5], n.Inputs[6], n.Inputs[7], n.Inputs[8]
	b := graph.BuilderFor(g)
	b.SetScope(n.Scope)
	start := len(g.Nodes)
	attrs := graph.Attrs{"scale": n.Attrs.Float("scale"), "window": n.Attrs.Int("window")}
	qs := q.Type.Shape  // [B,H,S,D]
	qb := block(b, q)   // [1,B,H,S,D]
	pb := block(b, pos) // [1,B,S]
	sb := block(b, seqs)
	partial := func(q, qPos, qSeq *graph.Value) (o, lse *graph.Value) {
		p := b.Apply("paged_attention_partial", attrs, q, k, v, qPos, kc, vc, slots, qSeq, tables, kvPos)
		return p[0], p[1]
	}
	grp := graph.Attrs{"group": CPAxis, "group_size": cp}
	var o *graph.Value
	if strategy == CPRing {
		// The rank's queries start at home; after i shifts rank r holds the queries of rank
		// r-i with the result of ranks r-i..r-1 and merges its own in; after cp-1 shifts
		// every block has seen every rank, and one more shift of the result takes it home.
		var lse *graph.Value
		o, lse = partial(qb, pb, sb)
		cq, cp2, cs := qb, pb, sb
		for range cp - 1 {
			cq, cp2, cs = b.Op("ring_shift", grp, cq), b.Op("ring_shift", grp, cp2), b.Op("ring_shift", grp, cs)
			o, lse = b.Op("ring_shift", grp, o), b.Op("ring_shift", grp, lse)
			po, pl := partial(cq, cp2, cs)
			m := b.Apply("attention_merge", nil, o, lse, po, pl)
			o, lse = m[0], m[1]
		}
		o = b.Op("ring_shift", grp, o)
	} else {
		gather := graph.Attrs{"group": CPAxis, "group_size": cp, "axis": 0}
		po, pl := partial(b.Op("all_gather", gather, qb), b.Op("all_gather", gather, pb), b.Op("all_gather", gather, sb))
		a2a := graph.Attrs{"group": CPAxis, "group_size": cp, "split_axis": 0, "concat_axis": 0}
		po, pl = b.Op("all_to_all", a2a, po), b.Op("all_to_all", a2a, pl) // block c: rank c's keys, this rank's queries
		var lse *graph.Value
		o, lse = b.Slice(po, 0, 0, 1), b.Slice(pl, 0, 0, 1)
		for c := 1; c < cp; c++ {
			m := b.Apply("attention_merge", nil, o, lse, b.Slice(po, 0, c, c+1), b.Slice(pl, 0, c, c+1))
			o, lse = m[0], m[1]
		}
	}
	o = b.Reshape(o, qs...)
	if o.Type.DType != n.Out().Type.DType {
		o = b.Cast(o, n.Out().Type.DType)
	}
	if err := b.Err(); err != nil {
		return err
	}
	if !o.Type.Equal(n.Out().Type) {
		return fmt.Errorf("the rewrite gives %s, paged_attention %s (internal error)", o.Type, n.Out().Type)
	}
	added := slices.Clone(g.Nodes[start:])
	g.Nodes = g.Nodes[:start]
	if err := g.InsertBefore(n, added...); err != nil {
		return err
	}
	g.ReplaceUses(n.Out(), o)
	g.RemoveNodes(map[*graph.Node]bool{n: true})
	return nil
}
