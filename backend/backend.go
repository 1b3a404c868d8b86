// Package backend holds what every backend shares: the source of weights that executables
// load parameters from.
package backend

import (
	"context"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Weights supplies parameter data. A checkpoint implements it; tests may use a map.
type Weights interface {
	// Load reads the tensor (or the slice of it) that ref names. The result has ref.DType and
	// ref.LocalShape(); anything else is an error that names the tensor.
	Load(ctx context.Context, ref graph.ParamRef) (*tensor.Tensor, error)
}
