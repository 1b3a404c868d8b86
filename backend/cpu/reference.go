package cpu

import (
	"context"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/graph"
)

// CompileReference is Compile with the reference kernels only (fused ops run their
// decomposition): the baseline that fast kernels and the optimizer are measured against.
func CompileReference(ctx context.Context, g *graph.Graph, w backend.Weights) (*Program, error) {
	return compile(ctx, g, w, Reference)
}
