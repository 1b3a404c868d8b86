package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/tensor"
)

// Context parallelism at run time. With a cp axis in the mesh, every rank's graph runs on its
// share of the sequence (transforms shard_sequence and rewrite_cp_attention): RankGroup.Run
// cuts each prompt into the ranks' shares (dist.CPShare: chunks i and 2N-1-i of 2N), pads
// the shorter shares to the longest with token 0 at positions past the prompt (keys that no
// real query sees; their own outputs are dropped), runs every rank on its share, and puts
// the outputs of the cp group of rank 0 back in token order.
//
// That is the whole-sequence path (LoadOptions.WholeSequences: GreedyRecompute and the
// parity tools). The engine's graph on the paged KV cache runs cp through cp_cached_attention
// and the engine's per-cp-index blocks (cp_cache.go): prefill split the same way, decode on
// every rank's cached keys.

// cpSize is the size of the mesh's cp axis, 1 without one.
func cpSize(m dist.Mesh) int {
	if n, err := m.AxisSize(dist.CPAxis); err == nil {
		return n
	}
	return 1
}

// checkCP refuses what context parallelism cannot run yet: one process per rank, and
// devices other than the CPU and CUDA (whose backends have the attention_partial,
// paged_attention_partial, attention_merge, ring_shift and all_to_all kernels).
func checkCP(opts LoadOptions, device string) error {
	cp := cpSize(opts.Mesh)
	switch {
	case cp <= 1:
		return nil
	case device != "cpu" && device != "cuda":
		return fmt.Errorf("mesh %q: context parallelism (cp=%d) runs on the cpu and cuda devices only; the %s backend has no attention_partial/attention_merge/ring_shift kernels", opts.Mesh, cp, device)
	case opts.Process != nil:
		return fmt.Errorf("mesh %q: context parallelism (cp=%d) runs its ranks in one process only", opts.Mesh, cp)
	}
	return nil
}

// cpGroup is how a RankGroup's ranks split sequences: the cp index of every rank, and the
// ranks whose outputs make up the result (cp index c, every other coordinate 0).
type cpGroup struct {
	size    int
	index   []int // per rank
	readers []int // per cp index
}

func newCPGroup(m dist.Mesh) (*cpGroup, error) {
	size := cpSize(m)
	if size <= 1 {
		return nil, nil
	}
	cg := &cpGroup{size: size, index: make([]int, m.Size())}
	for r := range cg.index {
		grp, err := m.Group(r, dist.CPAxis)
		if err != nil {
			return nil, err
		}
		cg.index[r] = grp.Index
		if r == 0 {
			cg.readers = slices.Clone(grp.Ranks)
		}
	}
	return cg, nil
}

// split cuts input_ids and positions [B,S] into each cp index's padded share [B,T] and
// returns the inputs of every cp index with the shares.
func (cg *cpGroup) split(inputs map[string]*tensor.Tensor) (ins []map[string]*tensor.Tensor, shares [][]int, S int, err error) {
	ids, pos := inputs["input_ids"], inputs["positions"]
	if ids == nil || pos == nil || len(ids.Shape) != 2 || !slices.Equal(ids.Shape, pos.Shape) {
		return nil, nil, 0, errors.New("context parallelism: want input_ids and positions [B,S]")
	}
	for k := range inputs {
		if k != "input_ids" && k != "positions" {
			return nil, nil, 0, fmt.Errorf("context parallelism: input %q cannot be split by sequence (whole-sequence graphs take input_ids and positions only)", k)
		}
	}
	B := ids.Shape[0]
	S = ids.Shape[1]
	shares, T, err := dist.CPShares(S, cg.size)
	if err != nil {
		return nil, nil, 0, err
	}
	T = max(T, 1) // a rank with no token still runs (its collectives meet the others')
	idv, pv := ids.Int64s(), pos.Int64s()
	past := int64(0) // a position past every position of the batch
	for _, p := range pv {
		past = max(past, p+1)
	}
	ins = make([]map[string]*tensor.Tensor, cg.size)
	for c, share := range shares {
		id, ps := tensor.New(ids.DType, B, T), tensor.New(pos.DType, B, T)
		for b := range B {
			for j := range T {
				tok, p := int64(0), past
				if j < len(share) {
					tok, p = idv[b*S+share[j]], pv[b*S+share[j]]
				}
				setInt(id, b*T+j, tok)
				setInt(ps, b*T+j, p)
			}
		}
		ins[c] = map[string]*tensor.Tensor{"input_ids": id, "positions": ps}
	}
	return ins, shares, S, nil
}

// setInt stores v at flat index i of an integer tensor.
func setInt(t *tensor.Tensor, i int, v int64) {
	if t.DType == tensor.I64 {
		t.I64[i] = v
	} else {
		t.I32[i] = int32(v)
	}
}

// join puts the outputs of the cp readers, each [B,T,...], back into [B,S,...] in token
// order; outputs of another rank are returned as rank 0 gave them.
func (cg *cpGroup) join(outs [][]*tensor.Tensor, shares [][]int, S int) ([]*tensor.Tensor, error) {
	first := outs[cg.readers[0]]
	res := make([]*tensor.Tensor, len(first))
	for i, o := range first {
		if len(o.Shape) < 2 {
			res[i] = o
			continue
		}
		B, T := o.Shape[0], o.Shape[1]
		row := tensor.Numel(o.Shape[2:])
		shape := slices.Clone(o.Shape)
		shape[1] = S
		out := tensor.New(o.DType, shape...)
		for c, share := range shares {
			src := outs[cg.readers[c]]
			if len(src) <= i || !slices.Equal(src[i].Shape, o.Shape) {
				return nil, fmt.Errorf("context parallelism: rank %d's output %d does not match rank 0's %v", cg.readers[c], i, o.Shape)
			}
			for b := range B {
				for j, p := range share {
					if err := copyRows(out, (b*S+p)*row, src[i], (b*T+j)*row, row); err != nil {
						return nil, err
					}
				}
			}
		}
		res[i] = out
	}
	return res, nil
}

// copyRows copies n elements of src at so into dst at do (same dtype).
func copyRows(dst *tensor.Tensor, do int, src *tensor.Tensor, so, n int) error {
	switch src.DType {
	case tensor.F32:
		copy(dst.F32[do:do+n], src.F32[so:so+n])
	case tensor.BF16, tensor.F16:
		copy(dst.Half[do:do+n], src.Half[so:so+n])
	case tensor.I32:
		copy(dst.I32[do:do+n], src.I32[so:so+n])
	case tensor.I64:
		copy(dst.I64[do:do+n], src.I64[so:so+n])
	default:
		return fmt.Errorf("context parallelism: cannot join outputs of dtype %s", src.DType)
	}
	return nil
}

// runCP is RankGroup.Run on a mesh with a cp axis: each rank runs its cp index's share.
func (rg *RankGroup) runCP(ctx context.Context, cg *cpGroup, inputs map[string]*tensor.Tensor) ([]*tensor.Tensor, error) {
	if len(rg.Ranks) != len(cg.index) {
		return nil, fmt.Errorf("context parallelism: %d ranks for a mesh of %d", len(rg.Ranks), len(cg.index))
	}
	ins, shares, S, err := cg.split(inputs)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	outs := make([][]*tensor.Tensor, len(rg.Ranks))
	errs := make([]error, len(rg.Ranks))
	eachRank(len(rg.Ranks), func(r int) {
		if outs[r], errs[r] = rg.Ranks[r].Run(ctx, ins[cg.index[r]]); errs[r] != nil {
			errs[r] = fmt.Errorf("rank %d: %w", r, errs[r])
			cancel()
		}
	})
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return cg.join(outs, shares, S)
}
