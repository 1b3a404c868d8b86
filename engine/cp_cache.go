package engine

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"sync"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/kvcache"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform"
)

// Context parallelism on the paged KV cache (the engine's graph after cp_cached_attention).
//
// Every cp index of the mesh keeps its own blocks: one kvcache.Allocator per cp index (the
// tp and dp ranks of one cp index share it, as tp ranks share the block tables without cp),
// and each sequence's tokens are spread over the cp indices. A token's keys and values live
// on the one cp index that computed it:
//
//   - the tokens of a prompt chunk (a step's tokens [from, from+n) of a sequence, n > 1) are
//     split by dist.CPShare over the chunk: cp index c takes chunks c and 2N-1-c of 2N, the
//     balanced split of whole-sequence cp;
//   - a single token (a decode step, or a one-token chunk) goes to the cp index that holds
//     the fewest of the sequence's tokens, ties to the lowest index. After a balanced prefill
//     this is round robin over the cp group; it keeps each rank's share of a sequence, and so
//     the work of every rank's attention at each decode step (the merge waits for the
//     slowest), within a token or two of the others, and the blocks used on each rank with
//     them.
//
// Each rank's step inputs are its own: its tokens of the step (padded to the longest rank's
// with tokens of no sequence: token_seq -1, slot -1), its block tables and slots, and
// kv_positions, the position of each token it caches per sequence. The attention of every
// query runs over every rank's keys (paged_attention_partial, then the queries travel and
// the partial results merge; see transform.CPCachedAttention), so the logits of a
// sequence's last token come from the rank that computed that token.

// blockAllocator is what the scheduler needs of the KV cache's blocks: kvcache.Allocator's
// methods on one cache, cpAlloc over the caches of a cp group.
type blockAllocator interface {
	Reserve(seq kvcache.SeqID, tokens int) error
	CanReserve(seq kvcache.SeqID, tokens int) bool
	Free(seq kvcache.SeqID) int
	BlocksFor(tokens int) int
	BlockSize() int
	NumBlocks() int
	Stats() kvcache.Stats
	// Capacity is the most tokens one sequence can ever hold.
	Capacity() int
}

// plainAlloc is the blockAllocator of one cache (every rank shares the block tables).
type plainAlloc struct{ *kvcache.Allocator }

func (a plainAlloc) Capacity() int { return a.NumBlocks() * a.BlockSize() }

// fitTokens is the most tokens in [lo, hi] that seq can hold now (lo when none more fit):
// reserving more tokens never takes fewer blocks on any cache, so a binary search finds it.
func fitTokens(a blockAllocator, seq kvcache.SeqID, lo, hi int) int {
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if a.CanReserve(seq, mid) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// cpAlloc hands out the blocks of a cp group's caches: one allocator per cp index, and per
// sequence where each of its tokens lives.
type cpAlloc struct {
	ranks []*kvcache.Allocator // per cp index

	mu   sync.Mutex
	seqs map[kvcache.SeqID]*cpSeq
}

// cpSeq is where a sequence's tokens live.
type cpSeq struct {
	owner []int     // per position: its cp index
	entry []int     // per position: its entry in the owner's cache order
	pos   [][]int32 // per cp index: the positions it caches, in cache order
}

func newCPAlloc(size, blocks, blockSize int) (*cpAlloc, error) {
	a := &cpAlloc{seqs: map[kvcache.SeqID]*cpSeq{}}
	for range size {
		r, err := kvcache.NewAllocator(blocks, blockSize)
		if err != nil {
			return nil, err
		}
		a.ranks = append(a.ranks, r)
	}
	return a, nil
}

// assign chooses the cp index of each of n new tokens of st from position from (see the
// comment at the top of this file).
func (a *cpAlloc) assign(st *cpSeq, from, n int) []int {
	owners := make([]int, n)
	if n == 1 {
		best := 0
		for c := range a.ranks {
			if len(st.pos[c]) < len(st.pos[best]) {
				best = c
			}
		}
		owners[0] = best
		return owners
	}
	for c := range a.ranks {
		share, _ := dist.CPShare(n, len(a.ranks), c) // n >= 0, 0 <= c < size: no error
		for _, off := range share {
			owners[off] = c
		}
	}
	return owners
}

// plan returns seq's state (new when unknown) and the cp indices of its tokens up to
// tokens, and whether every cp index has the blocks for them.
func (a *cpAlloc) plan(seq kvcache.SeqID, tokens int) (st *cpSeq, owners []int, ok bool) {
	st = a.seqs[seq]
	if st == nil {
		st = &cpSeq{pos: make([][]int32, len(a.ranks))}
	}
	have := len(st.owner)
	if tokens <= have {
		return st, nil, true
	}
	owners = a.assign(st, have, tokens-have)
	count := make([]int, len(a.ranks))
	for c := range a.ranks {
		count[c] = len(st.pos[c])
	}
	for _, c := range owners {
		count[c]++
	}
	for c, r := range a.ranks {
		if !r.CanReserve(seq, count[c]) {
			return st, owners, false
		}
	}
	return st, owners, true
}

func (a *cpAlloc) Reserve(seq kvcache.SeqID, tokens int) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	st, owners, ok := a.plan(seq, tokens)
	if !ok {
		return fmt.Errorf("%w: sequence %d: a cp rank has too few free blocks for its share of %d tokens", kvcache.ErrOutOfBlocks, seq, tokens)
	}
	for _, c := range owners {
		st.owner = append(st.owner, c)
		st.entry = append(st.entry, len(st.pos[c]))
		st.pos[c] = append(st.pos[c], int32(len(st.owner)-1))
	}
	for c, r := range a.ranks {
		if err := r.Reserve(seq, len(st.pos[c])); err != nil {
			return err // cannot happen: plan checked every rank under a.mu
		}
	}
	a.seqs[seq] = st
	return nil
}

func (a *cpAlloc) CanReserve(seq kvcache.SeqID, tokens int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, _, ok := a.plan(seq, tokens)
	return ok
}

func (a *cpAlloc) Free(seq kvcache.SeqID) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, r := range a.ranks {
		n += r.Free(seq)
	}
	delete(a.seqs, seq)
	return n
}

// BlocksFor is the blocks over every cp index that a prompt of tokens takes.
func (a *cpAlloc) BlocksFor(tokens int) int {
	n := 0
	for c, r := range a.ranks {
		share, _ := dist.CPShare(max(tokens, 0), len(a.ranks), c)
		n += r.BlocksFor(len(share))
	}
	return n
}

func (a *cpAlloc) BlockSize() int { return a.ranks[0].BlockSize() }

// NumBlocks is the blocks of every cp index together.
func (a *cpAlloc) NumBlocks() int { return len(a.ranks) * a.ranks[0].NumBlocks() }

// Capacity leaves each cp index two tokens for the imbalance of the split (CPShare's shares
// differ by up to two tokens; single tokens go where fewest are).
func (a *cpAlloc) Capacity() int {
	return len(a.ranks) * max(a.ranks[0].NumBlocks()*a.BlockSize()-2, 0)
}

// Stats sums the cp indices' allocators (Peak: the sum of their peaks).
func (a *cpAlloc) Stats() kvcache.Stats {
	var st kvcache.Stats
	for _, r := range a.ranks {
		s := r.Stats()
		st.Blocks, st.Used, st.Free, st.Peak = st.Blocks+s.Blocks, st.Used+s.Used, st.Free+s.Free, st.Peak+s.Peak
	}
	a.mu.Lock()
	st.Sequences = len(a.seqs)
	a.mu.Unlock()
	return st
}

// cpStep is one step's inputs per cp index, and where each sequence's logits come from.
type cpStep struct {
	inputs []map[string]*tensor.Tensor // per cp index
	owner  []int                       // per plan entry: the cp index of its last token
	row    []int                       // per plan entry: that token's row of the owner's output
}

// stepInputs builds every cp index's inputs of a step over seqs (see stepInputs for the
// layout): its own tokens of every sequence, in plan order, padded to the longest cp
// index's with tokens of no sequence; its block tables; kv_positions i32[N, M*BS], the
// positions it caches of each sequence in cache order (-1 past them); logit_rows of its
// own last tokens (0 for the others, whose rows are not read).
func (a *cpAlloc) stepInputs(seqs []stepSeq, withRows bool) (*cpStep, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	N, size, BS := len(seqs), len(a.ranks), a.ranks[0].BlockSize()
	type rankStep struct{ ids, pos, slots, owner []int32 }
	rs := make([]rankStep, size)
	step := &cpStep{owner: make([]int, N), row: make([]int, N)}
	local := make([]int, N) // the row of each sequence's last token among its owner's tokens
	states := make([]*cpSeq, N)
	for i, s := range seqs {
		st := a.seqs[s.seq]
		if st == nil || len(st.owner) < s.from+s.n {
			return nil, fmt.Errorf("context parallelism: sequence %d has no blocks for positions %d..%d", s.seq, s.from, s.from+s.n-1)
		}
		states[i] = st
		for p := s.from; p < s.from+s.n; p++ {
			c, j := st.owner[p], st.entry[p]
			blocks := a.ranks[c].Blocks(s.seq)
			if j/BS >= len(blocks) {
				return nil, fmt.Errorf("context parallelism: sequence %d: cp rank %d has %d blocks, no slot for its entry %d", s.seq, c, len(blocks), j)
			}
			id := int32(0)
			if !s.fed || p < len(s.tokens) {
				id = int32(s.tokens[p])
			}
			r := &rs[c]
			if p == s.from+s.n-1 {
				step.owner[i], local[i], step.row[i] = c, len(r.ids), len(r.ids)
				if withRows {
					step.row[i] = i // gather_logits: row i is sequence i's
				}
			}
			r.ids, r.pos = append(r.ids, id), append(r.pos, int32(p))
			r.slots, r.owner = append(r.slots, blocks[j/BS]*int32(BS)+int32(j%BS)), append(r.owner, int32(i))
		}
	}
	T := 1 // a rank with no token still runs: its collectives meet the others'
	for _, r := range rs {
		T = max(T, len(r.ids))
	}
	for c := range rs {
		r := &rs[c]
		for len(r.ids) < T {
			r.ids, r.pos, r.slots, r.owner = append(r.ids, 0), append(r.pos, 0), append(r.slots, -1), append(r.owner, -1)
		}
		tables := make([][]int32, N)
		M := 1
		for i, s := range seqs {
			tables[i] = a.ranks[c].Blocks(s.seq)
			M = max(M, len(tables[i]))
		}
		M = 1 << bits.Len(uint(M-1)) // a power of two, as stepInputs
		flat := make([]int32, 0, N*M)
		kvp := make([]int32, 0, N*M*BS)
		for i, t := range tables {
			flat = append(flat, t...)
			for range M - len(t) {
				flat = append(flat, -1)
			}
			// Entries past this step's tokens (none but a launched-ahead token's) are
			// left out: their slots hold nothing yet.
			end := seqs[i].from + seqs[i].n
			for _, p := range states[i].pos[c] {
				if int(p) >= end {
					p = -1
				}
				kvp = append(kvp, p)
			}
			for range M*BS - len(states[i].pos[c]) {
				kvp = append(kvp, -1)
			}
		}
		in := map[string]*tensor.Tensor{
			"input_ids":                  tensor.FromI32(r.ids, 1, T),
			"positions":                  tensor.FromI32(r.pos, 1, T),
			transform.SlotMappingInput:   tensor.FromI32(r.slots, T),
			transform.TokenSeqInput:      tensor.FromI32(r.owner, T),
			transform.BlockTablesInput:   tensor.FromI32(flat, N, M),
			transform.CPKVPositionsInput: tensor.FromI32(kvp, N, M*BS),
		}
		if withRows {
			rows := make([]int32, N)
			for i := range seqs {
				if step.owner[i] == c {
					rows[i] = int32(local[i])
				}
			}
			in[transform.LogitRowsInput] = tensor.FromI32(rows, N)
		}
		step.inputs = append(step.inputs, in)
	}
	return step, nil
}

// runCP runs one step on every rank, each on its cp index's inputs and its own caches, and
// returns the logits of every cp index (its reader's, the rank with every other
// coordinate 0), as rankSet.run returns rank 0's.
func (rs *rankSet) runCP(ctx context.Context, cg *cpGroup, ins []map[string]*tensor.Tensor) ([]*tensor.Tensor, error) {
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reader := make(map[int]int, len(cg.readers)) // rank -> cp index it is read for
	for c, r := range cg.readers {
		reader[r] = c
	}
	logits := make([]*tensor.Tensor, cg.size)
	errs := make([]error, len(rs.ranks))
	eachRank(len(rs.ranks), func(r int) {
		in := rs.rankInputs(r, ins[cg.index[r]])
		if c, ok := reader[r]; ok {
			var outs []*tensor.Tensor
			if outs, errs[r] = rs.ranks[r].Exe.Run(ctx, in); errs[r] == nil {
				if len(outs) == 0 || len(outs[0].Shape) != 3 || outs[0].DType != tensor.F32 {
					errs[r] = errors.New("the model returned no f32[1,S,vocab] logits")
				} else {
					logits[c] = outs[0]
				}
			}
		} else {
			errs[r] = backend.RunDiscard(ctx, rs.ranks[r].Exe, in)
		}
		if errs[r] != nil {
			errs[r] = fmt.Errorf("rank %d: %w", r, errs[r])
			cancel()
		}
	})
	if err := rankErrors(parent, errs); err != nil {
		return nil, err
	}
	return logits, nil
}

// runCPStep is runStep with context parallelism: each cp index's inputs, and each
// sequence's logits row from the cp index that computed its last token.
func (e *Engine) runCPStep(plan []stepSeq) ([][]float32, error) {
	step, err := e.cpa.stepInputs(plan, e.layout.LogitRows)
	if err != nil {
		return nil, err
	}
	outs, err := e.ranks.runCP(e.loopCtx, e.cp, step.inputs)
	if err != nil {
		if e.loopCtx.Err() != nil {
			return nil, ErrClosed
		}
		return nil, err
	}
	V := e.layout.Vocab
	rows := make([][]float32, len(plan))
	for i := range plan {
		out := outs[step.owner[i]]
		if out.Shape[0] != 1 || out.Shape[2] != V || step.row[i] >= out.Shape[1] {
			return nil, fmt.Errorf("cp rank %d's logits are %v, no row %d of vocabulary %d", step.owner[i], out.Shape, step.row[i], V)
		}
		rows[i] = out.F32[step.row[i]*V : (step.row[i]+1)*V]
	}
	return rows, nil
}
