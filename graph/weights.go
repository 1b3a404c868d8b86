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

// WeightsInto is a Weights that can also read a param straight into a tensor the caller
// allocated: a backend that builds one tensor out of several params (a fused GEMM's
// concatenated weight, say) reads each part into its place, so the parts are never held
// beside the whole.
type WeightsInto interface {
	Weights
	// LoadInto reads what Load would return into dst, which must have ref.DType and
	// ref.LocalShape() (its data may be a view into a larger tensor); anything else is an
	// error that names the tensor.
	LoadInto(ctx context.Context, ref ParamRef, dst *tensor.Tensor) error
}
