package dist

import (
	"context"
	"fmt"

	"github.com/loom-ml/loom/tensor"
)

// Collective describes one collective op of a graph (package graph's all_reduce,
// all_gather, reduce_scatter and all_to_all nodes) in plain values, so that a backend binds
// it to a mesh at compile time without this package importing graph. The fields carry the
// node's attributes of the same names.
type Collective struct {
	Op         string // "all_reduce", "all_gather", "reduce_scatter" or "all_to_all"
	Group      string // the mesh axis
	GroupSize  int    // the size the graph's shapes assume
	Reduce     string // all_reduce, reduce_scatter: "sum" or "max" ("" means sum)
	Strategy   string // all_reduce: a Strategy constant ("" means auto)
	Axis       int    // all_gather, reduce_scatter
	SplitAxis  int    // all_to_all
	ConcatAxis int    // all_to_all
}

// Bound is a Collective bound to one rank of a mesh.
type Bound struct {
	c      Collective
	g      Group
	op     ReduceOp
	world  int
	rank   int
	reduce bool
}

// Bind checks c against the mesh and resolves its group for rank: the axis must exist and
// have the size the graph was built for, and the attributes must be valid.
func (c Collective) Bind(m Mesh, rank int) (*Bound, error) {
	b := &Bound{c: c, world: m.Size(), rank: rank}
	switch c.Op {
	case "all_reduce", "reduce_scatter":
		b.reduce = true
	case "all_gather", "all_to_all":
	default:
		return nil, fmt.Errorf("dist: bind %q: not a collective op", c.Op)
	}
	size, err := m.AxisSize(c.Group)
	if err != nil {
		return nil, fmt.Errorf("dist: bind %s over %q: %w", c.Op, c.Group, err)
	}
	if size != c.GroupSize {
		return nil, fmt.Errorf("dist: bind %s over %q: the graph was built for group_size %d, mesh %q has %s=%d",
			c.Op, c.Group, c.GroupSize, m, c.Group, size)
	}
	if b.g, err = m.Group(rank, c.Group); err != nil {
		return nil, fmt.Errorf("dist: bind %s over %q: %w", c.Op, c.Group, err)
	}
	if b.reduce {
		reduce := c.Reduce
		if reduce == "" {
			reduce = "sum"
		}
		if b.op, err = ParseReduceOp(reduce); err != nil {
			return nil, fmt.Errorf("dist: bind %s: %w", c.Op, err)
		}
	}
	if c.Op == "all_reduce" {
		if _, err := ParseStrategy(c.Strategy); err != nil {
			return nil, fmt.Errorf("dist: bind %s: %w", c.Op, err)
		}
	}
	return b, nil
}

// Group is the group the collective runs over, seen from the bound rank.
func (b *Bound) Group() Group { return b.g }

// Run runs the collective on the bound rank's communicator and returns its result. An
// all_reduce reduces x in place and returns x itself: clone x first if it is still needed.
func (b *Bound) Run(ctx context.Context, c Communicator, x *tensor.Tensor) (*tensor.Tensor, error) {
	if c.Rank() != b.rank || c.Size() != b.world {
		return nil, fmt.Errorf("dist: %s bound for rank %d of %d runs on a communicator of rank %d of %d",
			b.c.Op, b.rank, b.world, c.Rank(), c.Size())
	}
	switch b.c.Op {
	case "all_reduce":
		if err := AllReduceWith(ctx, c, b.g, b.op, b.c.Strategy, x); err != nil {
			return nil, err
		}
		return x, nil
	case "all_gather":
		return c.AllGather(ctx, b.g, x, b.c.Axis)
	case "reduce_scatter":
		return c.ReduceScatter(ctx, b.g, b.op, x, b.c.Axis)
	default: // all_to_all; Bind admits nothing else
		return c.AllToAll(ctx, b.g, x, b.c.SplitAxis, b.c.ConcatAxis)
	}
}
