package cpu

import (
	"context"
	"fmt"
	"slices"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// decomposed is the reference kernel of every op that declares a decomposition into
// primitives (the fused ops: rmsnorm, rope, sdpa, ...): it builds the decomposition for the
// concrete input types, compiles it with reference kernels only and runs it. It is slow (it
// builds a graph per call) and exactly as correct as the decomposition, which is the point:
// a fast fused kernel registered with Register is tested against it.
func decomposed(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, len(in), len(out)); err != nil {
		return nil, err
	}
	spec, ok := graph.Lookup(n.Op)
	if !ok || spec.Decompose == nil {
		return nil, fmt.Errorf("op %s has no decomposition", n.Op)
	}
	b := graph.NewBuilder(n.Op + "_decomposition")
	b.SetScope(n.Scope)
	vals := make([]*graph.Value, len(in))
	feeds := make(map[string]*tensor.Tensor, len(in))
	for i, t := range in {
		name := fmt.Sprintf("in%d", i)
		vals[i] = b.Input(name, t.DType, graph.Dims(t.Shape...))
		feeds[name] = t
	}
	if err := b.Err(); err != nil {
		return nil, err
	}
	// Re-create the node over concrete types: this checks the inputs (inference), so that
	// Decompose only ever sees a well-typed node.
	m, err := b.Graph().NewNode(n.Op, n.Attrs, vals, n.Scope)
	if err != nil {
		return nil, err
	}
	if len(m.Outputs) != len(out) {
		return nil, fmt.Errorf("%s has %d outputs, asked for %d", n.Op, len(m.Outputs), len(out))
	}
	for i, o := range m.Outputs {
		shape, err := o.Type.Shape.Resolve(nil)
		if err != nil {
			return nil, err
		}
		if o.Type.DType != out[i].DType || !slices.Equal(shape, out[i].Shape) {
			return nil, fmt.Errorf("output %d: inputs give %s, output is declared %s", i, o.Type, out[i])
		}
	}
	res, err := spec.Decompose(b, m)
	if err != nil {
		return nil, fmt.Errorf("decompose %s: %w", n.Op, err)
	}
	b.Output(res...)
	g, err := b.Build()
	if err != nil {
		return nil, fmt.Errorf("decompose %s: %w", n.Op, err)
	}
	p, err := compile(context.Background(), g, nil, Reference)
	if err != nil {
		return nil, fmt.Errorf("decompose %s: %w", n.Op, err)
	}
	ts, err := p.Run(context.Background(), feeds)
	if err != nil {
		return nil, fmt.Errorf("decompose %s: %w", n.Op, err)
	}
	for i, t := range ts {
		if slices.Contains(in, t) { // the decomposition passed an input through
			ts[i] = t.Clone()
		}
	}
	return ts, nil
}
