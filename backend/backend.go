// Package backend holds what every backend shares: the source of weights that executables
// load parameters from.
package backend

import (
	"context"
	"fmt"
	"slices"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Weights supplies parameter data. A checkpoint implements it; tests may use a map.
type Weights interface {
	// Load reads the tensor (or the slice of it) that ref names. The result has ref.DType and
	// ref.LocalShape(); anything else is an error that names the tensor.
	Load(ctx context.Context, ref graph.ParamRef) (*tensor.Tensor, error)
}

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
