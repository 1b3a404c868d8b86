package engine

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/kvcache"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform"
)

// Rank is one rank's share of a deployment: the cached graph it runs (after
// insert_cached_attention) and the executable compiled from it. A model on one device is one
// rank; a sharded model has one per rank, each with its own KV heads, all run together at
// every step on the same step inputs.
type Rank struct {
	Graph *graph.Graph
	Exe   Executable
}

// Layout is what the engine reads from a cached graph: the KV cache it needs and the logits
// it returns.
type Layout struct {
	// Cache describes the cache inputs kv_cache.<layer>.k/.v, each [NB,BlockSize,KV,D].
	Cache kvcache.Spec
	// Vocab is the last dimension of the logits output: f32[1,S,Vocab], or f32[1,N,Vocab]
	// with LogitRows.
	Vocab int
	// LogitRows is set when the graph has the input logit_rows (gather_logits) and returns
	// the logits of each sequence's last token only.
	LogitRows bool
}

// CacheLayout reads the cache inputs and the logits output of a graph that went through
// insert_cached_attention. A graph without them (no attention was matched, or the
// transform is disabled) is an error that says so.
func CacheLayout(g *graph.Graph) (Layout, error) {
	var l Layout
	if g == nil {
		return l, errors.New("no graph")
	}
	for _, name := range []string{"input_ids", "positions", transform.SlotMappingInput, transform.TokenSeqInput, transform.BlockTablesInput} {
		if in := g.Input(name); in == nil || !in.Type.DType.IsInt() {
			return l, fmt.Errorf("graph %s has no integer input %s: it does not run on a paged KV cache "+
				"(the optimizer must find the attention (match_eager_attention) and run insert_cached_attention)", g.Name, name)
		}
	}
	for layer := 0; ; layer++ {
		kName, vName := transform.KVCacheInputs(layer)
		k, v := g.Input(kName), g.Input(vName)
		if k == nil && v == nil {
			break
		}
		if k == nil || v == nil || !k.Type.Equal(v.Type) || len(k.Type.Shape) != 4 {
			return l, fmt.Errorf("graph %s: cache inputs %s and %s must both be [NB,BS,KV,D] of one type", g.Name, kName, vName)
		}
		s := k.Type.Shape
		if s[1].IsSym() || s[2].IsSym() || s[3].IsSym() {
			return l, fmt.Errorf("graph %s: cache input %s is %s; block size, KV heads and head size must be constant", g.Name, kName, k.Type)
		}
		if layer == 0 {
			l.Cache.BlockSize = s[1].Size
		} else if s[1].Size != l.Cache.BlockSize {
			return l, fmt.Errorf("graph %s: cache input %s has block size %d, layer 0 has %d", g.Name, kName, s[1].Size, l.Cache.BlockSize)
		}
		l.Cache.Layers = append(l.Cache.Layers, kvcache.LayerSpec{K: kName, V: vName, KVHeads: s[2].Size, HeadDim: s[3].Size, DType: k.Type.DType})
	}
	if len(l.Cache.Layers) == 0 {
		return l, fmt.Errorf("graph %s has no kv_cache inputs", g.Name)
	}
	if err := l.Cache.Validate(); err != nil {
		return l, fmt.Errorf("graph %s: %w", g.Name, err)
	}
	if len(g.Outputs) == 0 {
		return l, fmt.Errorf("graph %s has no outputs", g.Name)
	}
	lt := g.Outputs[0].Type
	if len(lt.Shape) != 3 || lt.Shape[2].IsSym() || lt.DType != tensor.F32 {
		return l, fmt.Errorf("graph %s: the first output must be logits f32[B,S,vocab], got %s", g.Name, lt)
	}
	l.Vocab = lt.Shape[2].Size
	l.LogitRows = g.Input(transform.LogitRowsInput) != nil
	return l, nil
}

// stepSeq is one sequence's part of a step: tokens [from, from+n) of tokens.
type stepSeq struct {
	seq    kvcache.SeqID
	tokens []int // the whole sequence so far (prompt and generated)
	from   int
	n      int
	// fed marks a step launched ahead: its one token, at from = len(tokens), is not known
	// yet and comes from the previous step's ids on the device (input_ids holds 0).
	fed bool
}

// stepInputs builds the shared inputs of one step over the flattened tokens of seqs, each
// sequence's tokens contiguous and in the order given:
//
//	input_ids, positions  i32[1,S]  the tokens and their absolute positions
//	slot_mapping          i32[S]    the cache slot each token's k and v go to
//	token_seq             i32[S]    each token's row of block_tables
//	block_tables          i32[N,M]  each sequence's blocks, padded with -1 to a power of two
//	logit_rows            i32[N]    each sequence's last token (only when withRows is set)
//
// Every sequence must already own blocks for its tokens (kvcache.Allocator.Reserve).
func stepInputs(alloc *kvcache.Allocator, seqs []stepSeq, withRows bool) (map[string]*tensor.Tensor, error) {
	S := 0
	for _, s := range seqs {
		S += s.n
	}
	ids, pos := make([]int32, 0, S), make([]int32, 0, S)
	slots, owner := make([]int32, 0, S), make([]int32, 0, S)
	tables := make([][]int32, len(seqs))
	M := 1
	for i, s := range seqs {
		tables[i] = alloc.Blocks(s.seq)
		M = max(M, len(tables[i]))
		for p := s.from; p < s.from+s.n; p++ {
			slot, err := alloc.Slot(s.seq, p)
			if err != nil {
				return nil, err
			}
			id := int32(0)
			if !s.fed || p < len(s.tokens) {
				id = int32(s.tokens[p])
			}
			ids, pos = append(ids, id), append(pos, int32(p))
			slots, owner = append(slots, slot), append(owner, int32(i))
		}
	}
	// Pad the tables to a power of two blocks: steps then fall into few buckets of shapes,
	// which a backend that captures each bucket (CUDA graphs) replays instead of recapturing
	// whenever a sequence crosses a block boundary.
	M = 1 << bits.Len(uint(M-1))
	flat := make([]int32, 0, len(seqs)*M)
	for _, t := range tables {
		flat = append(flat, t...)
		for range M - len(t) {
			flat = append(flat, -1)
		}
	}
	in := map[string]*tensor.Tensor{
		"input_ids":                tensor.FromI32(ids, 1, S),
		"positions":                tensor.FromI32(pos, 1, S),
		transform.SlotMappingInput: tensor.FromI32(slots, S),
		transform.TokenSeqInput:    tensor.FromI32(owner, S),
		transform.BlockTablesInput: tensor.FromI32(flat, len(seqs), M),
	}
	if withRows {
		rows, end := make([]int32, len(seqs)), 0
		for i, s := range seqs {
			end += s.n
			rows[i] = int32(end - 1)
		}
		in[transform.LogitRowsInput] = tensor.FromI32(rows, len(seqs))
	}
	return in, nil
}

// rankSet runs the ranks of a deployment together, each with its own KV cache.
type rankSet struct {
	ranks  []Rank
	caches []*kvcache.Cache
}

// run runs one step on every rank, concurrently when there are several, and returns rank
// 0's logits f32[1,S,vocab]. shared holds the step inputs every rank gets; each rank adds
// its own caches. Only rank 0's outputs are read: the other ranks may return none (a rank
// in another process, see steps.Remote). When a rank fails, the others are cancelled, so
// that none waits for it in a collective. (Steps whose tokens the devices choose are
// launched and waited for instead: launch and wait in overlap.go.)
func (rs *rankSet) run(ctx context.Context, shared map[string]*tensor.Tensor) (*tensor.Tensor, error) {
	parent, cancel := ctx, context.CancelFunc(func() {})
	if len(rs.ranks) > 1 {
		ctx, cancel = context.WithCancel(ctx)
	}
	defer cancel()
	outs := make([][]*tensor.Tensor, len(rs.ranks))
	errs := make([]error, len(rs.ranks))
	eachRank(len(rs.ranks), func(r int) {
		in := rs.rankInputs(r, shared)
		if r > 0 {
			errs[r] = backend.RunDiscard(ctx, rs.ranks[r].Exe, in)
		} else {
			outs[r], errs[r] = rs.ranks[r].Exe.Run(ctx, in)
		}
		if errs[r] != nil && len(rs.ranks) > 1 {
			errs[r] = fmt.Errorf("rank %d: %w", r, errs[r])
			cancel()
		}
	})
	if err := rankErrors(parent, errs); err != nil {
		return nil, err
	}
	if len(outs[0]) == 0 || len(outs[0][0].Shape) != 3 || outs[0][0].DType != tensor.F32 {
		return nil, errors.New("the model returned no f32[1,S,vocab] logits")
	}
	return outs[0][0], nil
}

// eachRank runs f for ranks 0..n-1: in place on one rank, concurrently on several.
func eachRank(n int, f func(r int)) {
	if n == 1 {
		f(0)
		return
	}
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { f(r) })
	}
	wg.Wait()
}

// rankInputs is rank r's inputs of a step: the shared step inputs and the rank's caches.
func (rs *rankSet) rankInputs(r int, shared map[string]*tensor.Tensor) map[string]*tensor.Tensor {
	in := make(map[string]*tensor.Tensor, len(shared)+2*len(rs.caches[r].K))
	for k, v := range shared {
		in[k] = v
	}
	rs.caches[r].Bind(in)
	return in
}

// rankErrors joins the ranks' errors of one step. When a rank failed, those of the ranks
// cancelled because of it only add noise and are left out (unless parent itself ended).
func rankErrors(parent context.Context, errs []error) error {
	if failed := slices.IndexFunc(errs, func(err error) bool { return err != nil && !errors.Is(err, context.Canceled) }); failed >= 0 && parent.Err() == nil {
		errs = slices.DeleteFunc(slices.Clone(errs), func(err error) bool { return errors.Is(err, context.Canceled) })
	}
	return errors.Join(errs...)
}
