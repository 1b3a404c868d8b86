package transform

import (
	"context"
	"fmt"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// The graph inputs insert_cached_attention adds. After it the graph runs on the flattened
// tokens of a step (B = 1, S = the step's tokens, each sequence's tokens contiguous,
// positions their absolute positions) and reads the per-sequence layout from these inputs;
// see the paged_attention op for their meaning.
const (
	// SlotMappingInput is i32[S]: the cache slot each token's k and v are written to.
	SlotMappingInput = "slot_mapping"
	// TokenSeqInput is i32[S]: each token's sequence, a row of block_tables.
	TokenSeqInput = "token_seq"
	// BlockTablesInput is i32[N,M]: each sequence's cache blocks in position order.
	BlockTablesInput = "block_tables"
)

// KVCacheInputs returns the names of layer's cache inputs, K and V, each [NB,BS,KV,D]:
// "kv_cache.<layer>.k" and "kv_cache.<layer>.v". Layers count the attention ops in graph
// order from 0.
func KVCacheInputs(layer int) (k, v string) {
	return fmt.Sprintf("kv_cache.%d.k", layer), fmt.Sprintf("kv_cache.%d.v", layer)
}

// Symbols of the dimensions the cache inputs add.
const (
	symBlocks    = "NB" // blocks in the cache
	symSequences = "N"  // sequences in the step
	symMaxBlocks = "M"  // blocks of the longest block table in the step
)

// CachedAttentionConfig holds the options of insert_cached_attention.
type CachedAttentionConfig struct {
	// BlockSize is the number of token slots per cache block.
	BlockSize int `yaml:"block_size"`
	// DType is the caches' dtype (f32, bf16, f16); empty means the dtype of the attention's
	// keys and values, which keeps cached decoding equal to recomputation.
	DType string `yaml:"dtype"`
}

// InsertCachedAttention replaces attention over the whole sequence with attention over a
// paged KV cache.
var InsertCachedAttention = &Transform{
	Name:  "insert_cached_attention",
	Stage: CacheInit,
	Doc: `Replaces every sdpa(q, k, v, positions) with paged_attention over a paged KV cache, so
the graph runs on the flattened new tokens of every sequence in a step instead of whole
sequences. It adds the graph inputs slot_mapping i32[S], token_seq i32[S] and
block_tables i32[N,M] once, and per attention op, numbered in graph order from 0, the caches
kv_cache.<layer>.k and kv_cache.<layer>.v [NB,block_size,KV,D] (dtype: the option, else the
keys' dtype); scale and window carry over. Matches counts the attention ops replaced.`,
	Config: CachedAttentionConfig{BlockSize: 16},
	Run:    Typed(runInsertCachedAttention),
}

func init() { Register(InsertCachedAttention) }

func runInsertCachedAttention(_ context.Context, _ *Context, g *graph.Graph, cfg CachedAttentionConfig) (Info, error) {
	if cfg.BlockSize < 1 {
		return Info{}, fmt.Errorf("block_size must be >= 1, got %d", cfg.BlockSize)
	}
	cacheDT := tensor.Invalid
	if cfg.DType != "" {
		dt, err := tensor.ParseDType(cfg.DType)
		if err != nil || !dt.IsFloat() {
			return Info{}, fmt.Errorf("dtype must be f32, bf16 or f16, got %q", cfg.DType)
		}
		cacheDT = dt
	}
	var attn []*graph.Node
	for _, n := range g.Nodes {
		if n.Op == "sdpa" {
			attn = append(attn, n)
		}
	}
	if len(attn) == 0 {
		return Info{Clean: true, ValidShapes: true}, nil
	}
	if err := checkCacheNames(g, len(attn)); err != nil {
		return Info{}, err
	}
	// Every attention op must see the same tokens: the step's S.
	tokens := attn[0].Inputs[0].Type.Shape
	if len(tokens) != 4 {
		return Info{}, fmt.Errorf("%s: q must be [B,H,S,D], got %s", attn[0], tokens)
	}
	S := tokens[2]
	for _, n := range attn {
		q := n.Inputs[0].Type.Shape
		if len(q) != 4 || q[2] != S {
			return Info{}, fmt.Errorf("%s: q %s does not have the token dimension %s of the first attention", n, q, S)
		}
		if b := q[0]; !b.IsSym() && b.Size != 1 {
			return Info{}, fmt.Errorf("%s: the batch dimension of q %s must be symbolic or 1: cached attention runs the flattened tokens as one row", n, q)
		}
	}
	i32 := func(shape ...graph.Dim) graph.Type { return graph.Type{DType: tensor.I32, Shape: shape} }
	slots, err := g.AddInput(SlotMappingInput, i32(S))
	if err != nil {
		return Info{}, err
	}
	seqs, err := g.AddInput(TokenSeqInput, i32(S))
	if err != nil {
		return Info{}, err
	}
	tables, err := g.AddInput(BlockTablesInput, i32(graph.Sym(symSequences), graph.Sym(symMaxBlocks)))
	if err != nil {
		return Info{}, err
	}
	spec, ok := graph.Lookup("paged_attention")
	if !ok {
		return Info{}, fmt.Errorf("the op catalog has no paged_attention")
	}
	for layer, n := range attn {
		k := n.Inputs[1].Type
		dt := cacheDT
		if dt == tensor.Invalid {
			dt = k.DType
		}
		shape := graph.Shape{graph.Sym(symBlocks), graph.D(cfg.BlockSize), k.Shape[1], k.Shape[3]}
		kName, vName := KVCacheInputs(layer)
		kc, err := g.AddInput(kName, graph.Type{DType: dt, Shape: shape})
		if err != nil {
			return Info{}, err
		}
		vc, err := g.AddInput(vName, graph.Type{DType: dt, Shape: shape.Clone()})
		if err != nil {
			return Info{}, err
		}
		// Rewrite the node in place: its output keeps its name, type, scope and users.
		attrs, err := spec.NormalizeAttrs(graph.Attrs{"scale": n.Attrs.Float("scale"), "window": n.Attrs.Int("window")})
		if err != nil {
			return Info{}, fmt.Errorf("%s: %w", n, err)
		}
		n.Op, n.Attrs = spec.Name, attrs
		n.Inputs = append(n.Inputs[:4:4], kc, vc, slots, seqs, tables)
		types, err := spec.Infer(n)
		if err != nil {
			return Info{}, fmt.Errorf("%s: %w", n, err)
		}
		if len(types) != 1 || !types[0].Equal(n.Out().Type) {
			return Info{}, fmt.Errorf("%s: paged_attention gives %v, sdpa gave %s", n, types, n.Out().Type)
		}
	}
	return Info{Matches: len(attn), Clean: true, ValidShapes: true}, nil
}

// checkCacheNames makes sure the inputs and symbols the transform adds are not in use.
func checkCacheNames(g *graph.Graph, layers int) error {
	names := []string{SlotMappingInput, TokenSeqInput, BlockTablesInput}
	for l := range layers {
		k, v := KVCacheInputs(l)
		names = append(names, k, v)
	}
	used := map[string]bool{}
	for _, v := range g.Inputs {
		used[v.Name] = true
	}
	for _, n := range g.Nodes {
		for _, o := range n.Outputs {
			used[o.Name] = true
		}
	}
	for _, name := range names {
		if used[name] {
			return fmt.Errorf("the graph already has a value named %s (was the cache inserted twice?)", name)
		}
	}
	for _, v := range g.Inputs {
		for _, d := range v.Type.Shape {
			if d.Sym == symBlocks || d.Sym == symSequences || d.Sym == symMaxBlocks {
				return fmt.Errorf("input %s uses the symbol %s, which the cache inputs need", v.Name, d.Sym)
			}
		}
	}
	return nil
}
