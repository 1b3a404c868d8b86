package graph

import (
	"context"

	"github.com/loom-ml/loom/tensor"
)

// Weights supplies the data of param nodes: backends load parameters through it when they
// compile a graph, and transforms that need weight values read them through it. A checkpoint
// (model.Checkpoint) implements it; tests may use a map (backend/cpu.MapWeights). It is the
// one weight-source interface of Loom: backend.Weights is another name for it.
type Weights interface {
	// Load reads the tensor (or the slice of it) that ref names. The result has ref.DType and
	// ref.LocalShape(); anything else is an error that names the tensor.
	Load(ctx context.Context, ref ParamRef) (*tensor.Tensor, error)
}
