package graph

import (
	"fmt"
	"maps"
	"slices"
)

// Expansion is what Expand did to a graph.
type Expansion struct {
	// Graph is the expanded graph; the graph given when no node needed expanding.
	Graph *Graph
	// Ops counts, per op, the nodes replaced by their decompositions (fused ops met inside a
	// decomposition and expanded in turn included).
	Ops map[string]int
	// From maps every node that came out of a decomposition to the op of the node of the
	// original graph it is part of, for messages.
	From map[*Node]string
}

// Expanded lists the ops that were replaced by their decompositions, sorted.
func (x *Expansion) Expanded() []string { return slices.Sorted(maps.Keys(x.Ops)) }

// maxExpandDepth bounds the nesting of decompositions, so that a decomposition that holds
// its own op ends in an error.
const maxExpandDepth = 16

// Expand replaces every node of g whose op keep rejects and that declares a decomposition
// (OpSpec.Decompose: the fused ops) with that decomposition, and expands the nodes of the
// decomposition in turn, until every node's op is kept or declares none. A backend without
// a kernel for a fused op expands it into the primitives it has kernels for; nodes whose op
// it rejects and that declare no decomposition are copied unchanged, for the caller to
// report. param and const nodes are always copied.
//
// When no node needs expanding, Graph is g itself. Otherwise it is a new graph, verified,
// with g's name, inputs (names and types), and outputs in order; kept nodes are copied
// with their attributes, scope and output names, and the nodes of a decomposition carry the
// scope of the node they replace. g is not modified.
func Expand(g *Graph, keep func(op string) bool) (*Expansion, error) {
	x := &Expansion{Graph: g, Ops: map[string]int{}, From: map[*Node]string{}}
	if !slices.ContainsFunc(g.Nodes, func(n *Node) bool { return expands(n.Op, keep) }) {
		return x, nil
	}
	e := &expander{out: New(g.Name), keep: keep, x: x}
	vm := map[*Value]*Value{}
	for _, v := range g.Inputs {
		nv, err := e.out.AddInput(v.Name, Type{v.Type.DType, v.Type.Shape.Clone()})
		if err != nil {
			return nil, fmt.Errorf("expand %s: %w", g.Name, err)
		}
		vm[v] = nv
	}
	for _, n := range g.Nodes {
		ins, err := mapValues(n.Inputs, vm)
		if err != nil {
			return nil, fmt.Errorf("expand %s: node %s: %w", g.Name, n.Out(), err)
		}
		names := make([]string, len(n.Outputs))
		for i, o := range n.Outputs {
			names[i] = o.Name
		}
		outs, err := e.emit(n.Op, n.Attrs, ins, n.Scope, names, "", 0)
		if err != nil {
			return nil, fmt.Errorf("expand %s: node %s = %s: %w", g.Name, n.Out(), n.Op, err)
		}
		for i, o := range n.Outputs {
			if !outs[i].Type.Equal(o.Type) {
				return nil, fmt.Errorf("expand %s: node %s = %s: its expansion gives %s for output %d, the graph has %s", g.Name, n.Out(), n.Op, outs[i].Type, i, o.Type)
			}
			vm[o] = outs[i]
		}
	}
	outs, err := mapValues(g.Outputs, vm)
	if err != nil {
		return nil, fmt.Errorf("expand %s: outputs: %w", g.Name, err)
	}
	e.out.Outputs = outs
	if err := Verify(e.out); err != nil {
		return nil, fmt.Errorf("expand %s: %w", g.Name, err)
	}
	x.Graph = e.out
	return x, nil
}

// expands reports whether Expand replaces a node of op.
func expands(op string, keep func(string) bool) bool {
	if op == OpParam || op == OpConst || keep(op) {
		return false
	}
	spec, ok := Lookup(op)
	return ok && spec.Decompose != nil
}

type expander struct {
	out  *Graph
	keep func(string) bool
	x    *Expansion
}

// emit appends op over ins to the expanded graph, or its decomposition when Expand replaces
// it, and returns the values of its outputs. names hint the output names of a copied node;
// from is the op of the original node being expanded ("" at the top).
func (e *expander) emit(op string, attrs Attrs, ins []*Value, scope string, names []string, from string, depth int) ([]*Value, error) {
	if !expands(op, e.keep) {
		n, err := e.out.Append(op, attrs.Clone(), ins, scope, names...)
		if err != nil {
			return nil, err
		}
		if from != "" {
			e.x.From[n] = from
		}
		return n.Outputs, nil
	}
	if depth >= maxExpandDepth {
		return nil, fmt.Errorf("decompositions nested more than %d deep (at op %s)", maxExpandDepth, op)
	}
	if from == "" {
		from = op
	}
	e.x.Ops[op]++
	sub, res, err := decompose(op, attrs, ins, scope)
	if err != nil {
		return nil, err
	}
	vm := map[*Value]*Value{}
	for i, in := range sub.Inputs {
		vm[in] = ins[i]
	}
	for _, dn := range sub.Nodes {
		dins, err := mapValues(dn.Inputs, vm)
		if err != nil {
			return nil, fmt.Errorf("decomposition of %s: node %s: %w", op, dn.Out(), err)
		}
		outs, err := e.emit(dn.Op, dn.Attrs, dins, dn.Scope, nil, from, depth+1)
		if err != nil {
			return nil, err
		}
		for i, o := range dn.Outputs {
			vm[o] = outs[i]
		}
	}
	outs, err := mapValues(res, vm)
	if err != nil {
		return nil, fmt.Errorf("decomposition of %s: %w", op, err)
	}
	return outs, nil
}

// decompose builds op's decomposition over fresh inputs of the types of ins, in a graph of
// its own, and returns that graph (its inputs in the order of ins) and the values that
// stand for op's outputs.
func decompose(op string, attrs Attrs, ins []*Value, scope string) (sub *Graph, res []*Value, err error) {
	defer func() {
		if r := recover(); r != nil {
			sub, res, err = nil, nil, fmt.Errorf("decomposition of %s panicked: %v", op, r)
		}
	}()
	spec, _ := Lookup(op)
	b := NewBuilder(op + "_decomposition")
	b.SetScope(scope)
	sins := make([]*Value, len(ins))
	for i, in := range ins {
		sins[i] = b.Input(fmt.Sprintf("in%d", i), in.Type.DType, in.Type.Shape.Clone())
	}
	if err := b.Err(); err != nil {
		return nil, nil, err
	}
	m, err := b.Graph().NewNode(op, attrs, sins, scope) // not placed: only its decomposition is
	if err != nil {
		return nil, nil, err
	}
	res, err = spec.Decompose(b, m)
	if err == nil {
		err = b.Err()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("decomposition of %s: %w", op, err)
	}
	if len(res) != len(m.Outputs) {
		return nil, nil, fmt.Errorf("decomposition of %s gives %d values for %d outputs", op, len(res), len(m.Outputs))
	}
	for i, v := range res {
		if !v.Type.Equal(m.Outputs[i].Type) {
			return nil, nil, fmt.Errorf("decomposition of %s gives %s for output %d, the op %s", op, v.Type, i, m.Outputs[i].Type)
		}
	}
	return b.Graph(), res, nil
}

// mapValues maps each value through vm.
func mapValues(vs []*Value, vm map[*Value]*Value) ([]*Value, error) {
	out := make([]*Value, len(vs))
	for i, v := range vs {
		nv, ok := vm[v]
		if !ok {
			return nil, fmt.Errorf("value %s is used before it is defined", v)
		}
		out[i] = nv
	}
	return out, nil
}
