package engine

import (
	"context"
	"fmt"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/kvcache"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform"
)

// Executable runs a compiled graph with inputs input_ids i32[B,S] and positions i32[B,S]
// and returns the logits f32[B,S,vocab] first among its outputs: backend.Executable, whose
// optional powers (launching steps ahead, keeping the KV caches on the device, ...) the
// engine uses where every rank has them. A graph on the paged KV cache (after
// insert_cached_attention) also takes slot_mapping, token_seq, block_tables and the
// kv_cache.<layer>.k/.v tensors, and runs with B = 1; see CacheLayout and stepInputs.
type Executable = backend.Executable

// GreedyResult is the outcome of greedy decoding.
type GreedyResult struct {
	NewIDs []int
	// PromptLogits are the full-vocabulary logits at the last prompt position.
	PromptLogits []float32
}

// GreedyRecompute decodes maxNew tokens greedily by running the whole sequence again at
// every step (no KV cache is kept between steps). Ties go to the lowest token id, as
// torch.argmax does. It is the reference the Engine is tested against.
func GreedyRecompute(ctx context.Context, exe Executable, prompt []int, maxNew int) (*GreedyResult, error) {
	if len(prompt) == 0 {
		return nil, fmt.Errorf("empty prompt")
	}
	seq := append([]int(nil), prompt...)
	res := &GreedyResult{}
	for {
		logits, err := lastLogits(ctx, exe, seq)
		if err != nil {
			return nil, fmt.Errorf("step %d: %w", len(res.NewIDs), err)
		}
		if res.PromptLogits == nil {
			res.PromptLogits = logits
		}
		if len(res.NewIDs) >= maxNew {
			return res, nil
		}
		next := sample.Argmax(logits)
		res.NewIDs = append(res.NewIDs, next)
		if len(res.NewIDs) == maxNew {
			return res, nil
		}
		seq = append(seq, next)
	}
}

// lastLogits runs seq as one batch row and returns the logits of its last position. A
// graph on the paged KV cache (one whose executable has a Graph method that shows the cache
// inputs) runs the sequence as one prefill over a fresh cache, which is a recomputation too.
func lastLogits(ctx context.Context, exe Executable, seq []int) ([]float32, error) {
	ids := make([]int32, len(seq))
	pos := make([]int32, len(seq))
	for i, id := range seq {
		ids[i], pos[i] = int32(id), int32(i)
	}
	in := map[string]*tensor.Tensor{
		"input_ids": tensor.FromI32(ids, 1, len(seq)),
		"positions": tensor.FromI32(pos, 1, len(seq)),
	}
	if gr, ok := exe.(interface{ Graph() *graph.Graph }); ok && gr.Graph().Input(transform.SlotMappingInput) != nil {
		var err error
		if in, err = recomputeInputs(gr.Graph(), seq); err != nil {
			return nil, err
		}
	}
	outs, err := exe.Run(ctx, in)
	if err != nil {
		return nil, err
	}
	if len(outs) == 0 || len(outs[0].Shape) != 3 {
		return nil, fmt.Errorf("model returned no [B,S,vocab] logits")
	}
	// The last row: position len(seq)-1 of [1,S,vocab], or the one row of [1,1,vocab] that
	// gather_logits leaves.
	vocab, rows := outs[0].Shape[2], outs[0].Shape[1]
	all := outs[0].Float32s()
	return append([]float32(nil), all[(rows-1)*vocab:rows*vocab]...), nil
}

// recomputeInputs are the inputs of a graph on the paged KV cache that run seq as one
// sequence from position 0 over a new cache just large enough.
func recomputeInputs(g *graph.Graph, seq []int) (map[string]*tensor.Tensor, error) {
	layout, err := CacheLayout(g)
	if err != nil {
		return nil, err
	}
	blocks := (len(seq) + layout.Cache.BlockSize - 1) / layout.Cache.BlockSize
	alloc, err := kvcache.NewAllocator(blocks, layout.Cache.BlockSize)
	if err != nil {
		return nil, err
	}
	if err := alloc.Reserve(0, len(seq)); err != nil {
		return nil, err
	}
	cache, err := kvcache.NewCache(layout.Cache, blocks)
	if err != nil {
		return nil, err
	}
	in, err := stepInputs(alloc, []stepSeq{{seq: 0, tokens: seq, from: 0, n: len(seq)}}, layout.LogitRows)
	if err != nil {
		return nil, err
	}
	cache.Bind(in)
	return in, nil
}
