package graph

import (
	"fmt"
	"sync"
)

// Fused collective ops: a collective joined with the computation next to it, so that a
// backend can overlap or fuse the communication with it. Unlike the other fused ops they are
// collectives themselves (OpSpec.Collective): a backend binds them to a communicator like
// all_reduce, and the rule that no fused region hides a collective (CheckFusedCollectives)
// holds because they declare what they contain.

func init() {
	Register(&OpSpec{
		Name: "all_reduce_add_rmsnorm", Doc: "all_reduce(x) over a group, then add_rmsnorm: sum = all_reduce(x) + residual; returns (rmsnorm(sum, w), sum). x, residual [...,D], w[D]. The row-parallel output, the residual add and the next norm in one op.",
		Inputs: []string{"x", "residual", "w"},
		Attrs: append(groupAttrs(),
			AttrSpec{Name: "strategy", Type: AttrString, Default: "auto", Doc: "the all_reduce strategy: auto, nccl, oneshot or twoshot"},
			AttrSpec{Name: "eps", Type: AttrFloat},
		),
		Collective: true,
		Infer: func(n *Node) ([]Type, error) {
			if err := checkFusedAllReduce(n, inType(n, 0)); err != nil {
				return nil, err
			}
			spec, _ := Lookup("add_rmsnorm")
			return spec.Infer(n)
		},
		Decompose: func(b *Builder, n *Node) ([]*Value, error) {
			r := b.Op("all_reduce", fusedAllReduceAttrs(n), n.Inputs[0])
			outs := b.Apply("add_rmsnorm", Attrs{"eps": n.Attrs.Float("eps")}, r, n.Inputs[1], n.Inputs[2])
			return outs[:2], b.Err()
		},
	})
	Register(&OpSpec{
		Name: "linear_all_reduce", Doc: "all_reduce(linear(x, w)) over a group (sum): a row-parallel linear and its reduction in one op, so that a backend can reduce finished parts of the output while it computes the rest. x[...,K], w[N,K] -> [...,N].",
		Inputs: []string{"x", "w"},
		Attrs: append(groupAttrs(),
			AttrSpec{Name: "strategy", Type: AttrString, Default: "auto", Doc: "the all_reduce strategy: auto, nccl, oneshot or twoshot"},
		),
		Collective: true,
		Infer: func(n *Node) ([]Type, error) {
			spec, _ := Lookup("linear")
			types, err := spec.Infer(n)
			if err != nil {
				return nil, err
			}
			if err := checkFusedAllReduce(n, types[0]); err != nil {
				return nil, err
			}
			return types, nil
		},
		Decompose: func(b *Builder, n *Node) ([]*Value, error) {
			y := b.Linear(n.Inputs[0], n.Inputs[1])
			return []*Value{b.Op("all_reduce", fusedAllReduceAttrs(n), y)}, b.Err()
		},
	})
}

// checkFusedAllReduce validates the all_reduce part of a fused collective that reduces a
// value of type t.
func checkFusedAllReduce(n *Node, t Type) error {
	if _, err := checkGroup(n); err != nil {
		return err
	}
	if err := oneOf(n.Op, "strategy", n.Attrs.String("strategy"), collectiveStrategies); err != nil {
		return err
	}
	return checkReducible(n, t.DType)
}

// fusedAllReduceAttrs are the attributes of the all_reduce inside a fused collective.
func fusedAllReduceAttrs(n *Node) Attrs {
	return Attrs{"group": n.Attrs.String("group"), "group_size": n.Attrs.Int("group_size"), "strategy": n.Attrs.String("strategy")}
}

// CollectiveRanks is the number of ranks a graph needs: the largest group_size over its
// collective ops, 1 when it has none.
func CollectiveRanks(g *Graph) int {
	ranks := 1
	for _, n := range g.Nodes {
		if n == nil {
			continue
		}
		if spec, ok := Lookup(n.Op); ok && spec.Collective {
			ranks = max(ranks, n.Attrs.Int("group_size"))
		}
	}
	return ranks
}

// hidesCollective caches, per fused op, whether its decomposition contains a collective.
var hidesCollective sync.Map // op name -> bool

// CheckFusedCollectives enforces that no fused region hides a collective: a fused op (one
// that declares a decomposition) whose decomposition contains a collective must itself be
// declared Collective, so that backends bind it to a communicator and schedulers see the
// communication. The decomposition of each fused op is examined once per process (on the
// first node of that op met), which keeps the check cheap enough for every Verify.
func CheckFusedCollectives(g *Graph) error {
	for i, n := range g.Nodes {
		if n == nil {
			continue
		}
		spec, ok := Lookup(n.Op)
		if !ok || spec.Decompose == nil || spec.Collective {
			continue
		}
		hides, ok := hidesCollective.Load(n.Op)
		if !ok {
			h, err := decompositionHasCollective(spec, n)
			if err != nil {
				continue // a malformed node; Verify reports it on its own
			}
			hidesCollective.Store(n.Op, h)
			hides = h
		}
		if hides.(bool) {
			return fmt.Errorf("node %d (%s): fused op %s hides a collective in its decomposition but is not declared Collective", i, n.Out(), n.Op)
		}
	}
	return nil
}

// decompositionHasCollective decomposes a copy of n over fresh inputs of its input types and
// reports whether any node of the result is a collective.
func decompositionHasCollective(spec *OpSpec, n *Node) (has bool, err error) {
	defer func() {
		if r := recover(); r != nil {
			has, err = false, fmt.Errorf("decomposition of %s panicked: %v", n.Op, r)
		}
	}()
	b := NewBuilder(n.Op + "_check")
	ins := make([]*Value, len(n.Inputs))
	for i, in := range n.Inputs {
		if in == nil {
			return false, fmt.Errorf("input %d is nil", i)
		}
		ins[i] = b.Input(fmt.Sprintf("in%d", i), in.Type.DType, in.Type.Shape.Clone())
	}
	if err := b.Err(); err != nil {
		return false, err
	}
	m, err := b.Graph().NewNode(n.Op, n.Attrs, ins, n.Scope)
	if err != nil {
		return false, err
	}
	if _, err := spec.Decompose(b, m); err != nil {
		return false, err
	}
	for _, d := range b.Graph().Nodes {
		if s, ok := Lookup(d.Op); ok && s.Collective {
			return true, nil
		}
	}
	return false, nil
}
