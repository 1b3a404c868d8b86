package local

import (
	"context"
	"fmt"

	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/tensor"
)

// checkTensor validates a tensor argument; reduce says it must be of a reducible dtype.
func checkTensor(t *tensor.Tensor, reduce bool) error {
	if t == nil {
		return fmt.Errorf("nil tensor")
	}
	if t.DType.Size() == 0 {
		return fmt.Errorf("tensor of dtype %s", t.DType)
	}
	if err := t.Validate(); err != nil {
		return err
	}
	if reduce && !dist.Reducible(t.DType) {
		return fmt.Errorf("cannot reduce %s (want f32, bf16, f16 or i32)", t.DType)
	}
	return nil
}

func checkOp(op dist.ReduceOp) error {
	if op != dist.Sum && op != dist.Max {
		return fmt.Errorf("invalid reduce op %s", op)
	}
	return nil
}

// normAxis maps a possibly negative axis into [0, rank).
func normAxis(axis, rank int, what string) (int, error) {
	a := axis
	if a < 0 {
		a += rank
	}
	if a < 0 || a >= rank {
		return 0, fmt.Errorf("%s %d out of range for a tensor of rank %d", what, axis, rank)
	}
	return a, nil
}

// checkSplit reports an error unless axis a (named what) of t splits evenly over g's ranks.
func checkSplit(t *tensor.Tensor, a int, g dist.Group, what string) error {
	if n := len(g.Ranks); n > 0 && t.Shape[a]%n != 0 {
		return fmt.Errorf("%s %d of %v is not divisible by the group size %d", what, a, t.Shape, n)
	}
	return nil
}

// firstErr returns the first non-nil error.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// AllReduce reduces t over g in place with the configured strategy; see dist.Communicator.
func (c *Comm) AllReduce(ctx context.Context, g dist.Group, op dist.ReduceOp, t *tensor.Tensor) error {
	return c.AllReduceStrategy(ctx, g, op, dist.StrategyAuto, t)
}

// AllReduceStrategy is AllReduce with the algorithm given: dist.StrategyAuto (use the
// configured allreduce_strategy), dist.StrategyOneShot or dist.StrategyTwoShot. Every rank
// of the group must ask for the same strategy.
func (c *Comm) AllReduceStrategy(ctx context.Context, g dist.Group, op dist.ReduceOp, strategy string, t *tensor.Tensor) error {
	cl := call{kind: "all_reduce", t: t, op: op, strategy: strategy}
	strategy, err := localStrategy(strategy)
	cl.err = firstErr(err, checkOp(op), checkTensor(t, true))
	n, m := len(g.Ranks), 0
	if cl.err == nil {
		m = t.Numel()
		if strategy == dist.StrategyAuto {
			strategy = c.w.strategy
		}
		// Every rank resolves the same strategy: the group, the shape and the strategy
		// asked for are checked to agree before any data moves.
		strategy = dist.StrategyFor(m*t.DType.Size(), n, strategy)
	}
	var stage func(s *session, cl *call)
	if strategy == dist.StrategyOneShot && n > 1 && m > 0 {
		stage = func(s *session, cl *call) {
			cl.stage = s.gs.stage[s.idx][s.step%2].tensor(t.DType, m)
			tensor.CopyRange(cl.stage, 0, t, 0, m)
		}
	}
	s, err := c.enter(ctx, g, cl, stage)
	if err != nil {
		return err
	}
	defer s.leave()
	if n == 1 || m == 0 {
		return nil
	}
	if stage != nil {
		// oneshot: every rank folds every staged copy straight into its own tensor, which
		// nobody else reads. One synchronisation: the arrival.
		srcs := make([]*tensor.Tensor, n)
		for r := range s.calls {
			srcs[r] = s.calls[r].stage
		}
		red := newReducer(t.DType, op, srcs)
		red.reduce(t, 0, 0, m, false)
		red.release()
		return nil
	}
	// twoshot: rank i reduces chunk i into its own tensor, in place; meanwhile peers read
	// only their own chunk of it. Then it copies the other chunks from their owners, who
	// no longer write them. Three synchronisations, no copy beyond the result.
	srcs := s.tensors()
	red := newReducer(t.DType, op, srcs)
	lo, hi := chunk(m, n, s.idx)
	red.reduce(t, lo, lo, hi-lo, true)
	red.release()
	s.barrier(0)
	for r := range n {
		if r != s.idx {
			lo, hi := chunk(m, n, r)
			tensor.CopyRange(t, lo, srcs[r], lo, hi-lo)
		}
	}
	s.barrier(1) // nobody reads t any more
	return nil
}

// AllGather concatenates every rank's t along axis in group order; see dist.Communicator.
func (c *Comm) AllGather(ctx context.Context, g dist.Group, t *tensor.Tensor, axis int) (*tensor.Tensor, error) {
	cl := call{kind: "all_gather", t: t, a: axis}
	cl.err = checkTensor(t, false)
	if cl.err == nil {
		cl.a, cl.err = normAxis(axis, len(t.Shape), "axis")
	}
	s, err := c.enter(ctx, g, cl, nil)
	if err != nil {
		return nil, err
	}
	defer s.leave()
	n, ax := len(s.calls), cl.a
	shape := append([]int(nil), t.Shape...)
	shape[ax] *= n
	out := tensor.New(t.DType, shape...)
	outer := tensor.Numel(t.Shape[:ax])
	inner := tensor.Numel(t.Shape[ax:])
	for r, src := range s.tensors() {
		for o := range outer {
			tensor.CopyRange(out, (o*n+r)*inner, src, o*inner, inner)
		}
	}
	s.barrier(0)
	return out, nil
}

// ReduceScatter reduces t over g and returns this rank's piece along axis; see
// dist.Communicator.
func (c *Comm) ReduceScatter(ctx context.Context, g dist.Group, op dist.ReduceOp, t *tensor.Tensor, axis int) (*tensor.Tensor, error) {
	cl := call{kind: "reduce_scatter", t: t, op: op, a: axis}
	cl.err = firstErr(checkOp(op), checkTensor(t, true))
	if cl.err == nil {
		cl.a, cl.err = normAxis(axis, len(t.Shape), "axis")
	}
	if cl.err == nil {
		cl.err = checkSplit(t, cl.a, g, "axis")
	}
	s, err := c.enter(ctx, g, cl, nil)
	if err != nil {
		return nil, err
	}
	defer s.leave()
	n, ax := len(s.calls), cl.a
	shape := append([]int(nil), t.Shape...)
	shape[ax] /= n
	out := tensor.New(t.DType, shape...)
	outer := tensor.Numel(t.Shape[:ax])
	piece := tensor.Numel(shape[ax:])
	red := newReducer(t.DType, op, s.tensors())
	defer red.release()
	for o := range outer {
		red.reduce(out, o*piece, (o*n+s.idx)*piece, piece, false)
	}
	s.barrier(0)
	return out, nil
}

// AllToAll exchanges pieces of t among the group; see dist.Communicator.
func (c *Comm) AllToAll(ctx context.Context, g dist.Group, t *tensor.Tensor, splitAxis, concatAxis int) (*tensor.Tensor, error) {
	cl := call{kind: "all_to_all", t: t, a: splitAxis, b: concatAxis}
	cl.err = checkTensor(t, false)
	if cl.err == nil {
		cl.a, cl.err = normAxis(splitAxis, len(t.Shape), "split_axis")
	}
	if cl.err == nil {
		cl.b, cl.err = normAxis(concatAxis, len(t.Shape), "concat_axis")
	}
	if cl.err == nil {
		cl.err = checkSplit(t, cl.a, g, "split_axis")
	}
	s, err := c.enter(ctx, g, cl, nil)
	if err != nil {
		return nil, err
	}
	defer s.leave()
	n, sa, ca := len(s.calls), cl.a, cl.b
	piece := append([]int(nil), t.Shape...)
	piece[sa] /= n
	shape := append([]int(nil), piece...)
	shape[ca] *= n
	out := tensor.New(t.DType, shape...)
	srcStart := make([]int, len(piece))
	dstStart := make([]int, len(piece))
	srcStart[sa] = s.idx * piece[sa]
	for r, src := range s.tensors() {
		dstStart[ca] = r * piece[ca]
		copyBox(out, dstStart, src, srcStart, piece)
	}
	s.barrier(0)
	return out, nil
}

// Broadcast copies the root's t into every rank's t; see dist.Communicator.
func (c *Comm) Broadcast(ctx context.Context, g dist.Group, t *tensor.Tensor, root int) error {
	cl := call{kind: "broadcast", t: t, a: root}
	cl.err = checkTensor(t, false)
	if cl.err == nil && (root < 0 || root >= len(g.Ranks)) {
		cl.err = fmt.Errorf("root %d out of range for a group of %d", root, len(g.Ranks))
	}
	s, err := c.enter(ctx, g, cl, nil)
	if err != nil {
		return err
	}
	defer s.leave()
	if s.idx != root {
		tensor.CopyRange(t, 0, s.calls[root].t, 0, t.Numel())
	}
	s.barrier(0) // the root's t is read no more
	return nil
}

// Barrier returns once every rank of g has called it.
func (c *Comm) Barrier(ctx context.Context, g dist.Group) error {
	s, err := c.enter(ctx, g, call{kind: "barrier"}, nil)
	if err != nil {
		return err
	}
	s.leave()
	return nil
}

// tensors lists the ranks' tensors in group order.
func (s *session) tensors() []*tensor.Tensor {
	ts := make([]*tensor.Tensor, len(s.calls))
	for i := range s.calls {
		ts[i] = s.calls[i].t
	}
	return ts
}

// chunk is the range of elements [lo, hi) of m that rank i of n reduces in twoshot. Chunks
// start at multiples of 32 elements, so that no two ranks write one cache line.
func chunk(m, n, i int) (lo, hi int) {
	per := (m + n - 1) / n
	per = (per + 31) &^ 31
	lo = min(i*per, m)
	return lo, min(lo+per, m)
}
