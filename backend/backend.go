// Package backend is the seam between the engine and the backends that compile and run
// graphs: the source of weights that executables load parameters from (Weights), the
// executable and its optional powers (exec.go), and the registry of backends by device name
// (registry.go), which backend/cpu and backend/cuda fill when they are imported.
package backend

import (
	"context"
	"fmt"
	"slices"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Weights supplies parameter data: it is graph.Weights (one interface, declared in graph so
// that transforms, on the floor of backend, read weights through the same one).
type Weights = graph.Weights

// LoadParam reads a param node's tensor from w and checks it against the node's type: the
// dtype and the (local, possibly sliced) shape must be exactly what the graph says.
func LoadParam(ctx context.Context, n *graph.Node, w Weights) (*tensor.Tensor, error) {
	ref, err := graph.ParamOf(n)
	if err != nil {
		return nil, err
	}
	if w == nil {
		return nil, fmt.Errorf("param %s: no weights given", ref)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("param %s: %w", ref, err)
	}
	t, err := w.Load(ctx, ref)
	if err != nil {
		return nil, fmt.Errorf("load param %s: %w", ref, err)
	}
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("load param %s: %w", ref, err)
	}
	want := n.Out().Type
	shape, err := want.Shape.Resolve(nil)
	if err != nil {
		return nil, fmt.Errorf("param %s: %w", ref, err)
	}
	if t.DType != want.DType || !slices.Equal(t.Shape, shape) {
		return nil, fmt.Errorf("load param %s: got %s%v, want %s", ref, t.DType, t.Shape, want)
	}
	return t, nil
}

// LoadParamInto reads a param node's tensor into dst, which has the node's dtype and shape:
// straight into dst's memory where w can (graph.WeightsInto), else through LoadParam and a
// copy. Errors name the param.
func LoadParamInto(ctx context.Context, n *graph.Node, w Weights, dst *tensor.Tensor) error {
	wi, ok := w.(graph.WeightsInto)
	if !ok {
		t, err := LoadParam(ctx, n, w)
		if err != nil {
			return err
		}
		tensor.CopyRange(dst, 0, t, 0, t.Numel())
		return nil
	}
	ref, err := graph.ParamOf(n)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("param %s: %w", ref, err)
	}
	if err := wi.LoadInto(ctx, ref, dst); err != nil {
		return fmt.Errorf("load param %s: %w", ref, err)
	}
	return nil
}
