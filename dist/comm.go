package dist

import (
	"context"
	"errors"
	"fmt"

	"github.com/loom-ml/loom/tensor"
)

// ReduceOp is the elementwise reduction of AllReduce and ReduceScatter.
type ReduceOp uint8

// The reductions. The zero ReduceOp is invalid, so that a forgotten op is an error.
const (
	Sum ReduceOp = iota + 1
	Max
)

// String gives the name used in graph attributes: "sum" or "max".
func (o ReduceOp) String() string {
	switch o {
	case Sum:
		return "sum"
	case Max:
		return "max"
	}
	return fmt.Sprintf("reduceop(%d)", uint8(o))
}

// ParseReduceOp reads "sum" or "max".
func ParseReduceOp(s string) (ReduceOp, error) {
	switch s {
	case "sum":
		return Sum, nil
	case "max":
		return Max, nil
	}
	return 0, fmt.Errorf("dist: unknown reduce op %q (want sum or max)", s)
}

// Reducible reports whether collectives reduce dtype dt: f32, bf16, f16 and i32.
func Reducible(dt tensor.DType) bool {
	switch dt {
	case tensor.F32, tensor.BF16, tensor.F16, tensor.I32:
		return true
	}
	return false
}

// Communicator runs collectives among the ranks of a world, seen from one rank. Every call
// names its group; the calling rank must be g.Ranks[g.Index]. Every rank of the group makes
// the same calls on that group in the same order, with tensors of the same dtype and shape
// (a mismatch is an error on every rank, never corrupt data). Calls on different groups are
// independent: disjoint groups run concurrently, and a rank may call on different groups
// from different goroutines, but not on one group from two goroutines at once.
//
// Calls block until the group's ranks have taken part, the context is done, or the backend
// gives up on a missing or failed peer; then they return an error (a *Error, for backends of
// this module) that names the collective, the group and the ranks at fault.
type Communicator interface {
	// Rank is this rank's index in the world, Size the number of ranks.
	Rank() int
	Size() int

	// AllReduce reduces t elementwise over the group and leaves the result, in place, in
	// every rank's t. The algorithm is the communicator's configured allreduce_strategy.
	AllReduce(ctx context.Context, g Group, op ReduceOp, t *tensor.Tensor) error

	// AllGather concatenates every rank's t along axis, in group order, into a new tensor
	// whose axis is g.Size() times longer.
	AllGather(ctx context.Context, g Group, t *tensor.Tensor, axis int) (*tensor.Tensor, error)

	// ReduceScatter reduces t elementwise over the group and returns this rank's piece: the
	// g.Index-th of g.Size() equal pieces along axis, which g.Size() must divide.
	ReduceScatter(ctx context.Context, g Group, op ReduceOp, t *tensor.Tensor, axis int) (*tensor.Tensor, error)

	// AllToAll cuts t into g.Size() equal pieces along splitAxis, sends piece j to the j-th
	// rank of the group, and returns the pieces received concatenated along concatAxis in
	// group order.
	AllToAll(ctx context.Context, g Group, t *tensor.Tensor, splitAxis, concatAxis int) (*tensor.Tensor, error)

	// Broadcast copies the t of the group's root into every other rank's t, in place. root
	// is a position in g.Ranks, not a global rank.
	Broadcast(ctx context.Context, g Group, t *tensor.Tensor, root int) error

	// Barrier returns once every rank of the group has called it.
	Barrier(ctx context.Context, g Group) error
}

// StrategyAllReducer is a Communicator whose all_reduce algorithm can be chosen per call
// (the strategy attribute of an all_reduce node). strategy is one of the Strategy constants;
// one the backend cannot run is an error.
type StrategyAllReducer interface {
	AllReduceStrategy(ctx context.Context, g Group, op ReduceOp, strategy string, t *tensor.Tensor) error
}

// AllReduceWith runs c.AllReduce with a strategy chosen by the caller: StrategyAuto (or "")
// leaves the choice to the communicator's configuration; another strategy needs a
// communicator that implements StrategyAllReducer.
func AllReduceWith(ctx context.Context, c Communicator, g Group, op ReduceOp, strategy string, t *tensor.Tensor) error {
	if strategy == "" || strategy == StrategyAuto {
		return c.AllReduce(ctx, g, op, t)
	}
	if _, err := ParseStrategy(strategy); err != nil {
		return err
	}
	s, ok := c.(StrategyAllReducer)
	if !ok {
		return fmt.Errorf("dist: all_reduce strategy %q: communicator %T chooses its own algorithm (use %q)", strategy, c, StrategyAuto)
	}
	return s.AllReduceStrategy(ctx, g, op, strategy, t)
}

// Causes of collective errors, for errors.Is.
var (
	// ErrTimeout: a peer did not arrive within the backend's timeout.
	ErrTimeout = errors.New("timed out")
	// ErrPeerFailed: a peer aborted, left the collective (its context ended), or made an
	// invalid call.
	ErrPeerFailed = errors.New("peer failed")
	// ErrMismatch: the ranks of a group made different calls in one step (collective,
	// dtype, shape, axis, op or root differ).
	ErrMismatch = errors.New("mismatched collective calls")
	// ErrAborted: this rank's communicator was aborted.
	ErrAborted = errors.New("communicator aborted")
	// ErrBroken: the group failed in an earlier call and can no longer be used; the error
	// also wraps that earlier cause.
	ErrBroken = errors.New("group broken by an earlier failure")
)

// Error reports a failed collective, from the point of view of the rank that returns it.
type Error struct {
	Collective string // "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast" or "barrier"
	Group      Group  // the group of the call
	Rank       int    // the rank that reports the error
	Step       uint64 // the call's sequence number among this rank's calls on the group, from 0
	Peers      []int  // the ranks at fault (missing, failed, mismatched); empty when it is this rank's own
	Err        error  // the cause; wraps one of the Err* values above, or a context error
}

func (e *Error) Error() string {
	return fmt.Sprintf("dist: %s over group %s (rank %d, call %d on the group): %v", e.Collective, e.Group, e.Rank, e.Step, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }
