package cpu

import (
	"context"
	"fmt"
	"slices"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// MapWeights is an in-memory backend.Weights keyed by checkpoint tensor name, for tests and
// small programs. Each tensor holds the full stored shape; Load cuts the slice a ParamRef asks
// for. Tensors are shared with the caller, not copied, except for slices.
type MapWeights map[string]*tensor.Tensor

var _ backend.Weights = MapWeights(nil)

// Load returns the tensor named ref.Key, or the part of it that ref selects. A missing key, a
// dtype or shape other than the reference declares, or a slice that does not fit is an error
// naming the key. A stacked ref reads its members (graph.LoadStack), each named by its own
// key in the map.
func (m MapWeights) Load(ctx context.Context, ref graph.ParamRef) (*tensor.Tensor, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("load %q: %w", ref.Key, err)
	}
	if ref.Stack != 0 {
		return graph.LoadStack(ctx, ref, m.Load)
	}
	t, ok := m[ref.Key]
	if !ok || t == nil {
		return nil, fmt.Errorf("weight %q not found", ref.Key)
	}
	if err := t.Validate(); err != nil {
		return nil, fmt.Errorf("weight %q: %w", ref.Key, err)
	}
	if t.DType != ref.DType || !slices.Equal(t.Shape, ref.Shape) {
		return nil, fmt.Errorf("weight %q is %s%v, the graph wants %s%v", ref.Key, t.DType, t.Shape, ref.DType, ref.Shape)
	}
	if ref.SliceDim < 0 {
		return t, nil
	}
	dim, count, index := ref.SliceDim, ref.SliceCount, ref.SliceIndex
	if dim >= len(t.Shape) || count < 1 || index < 0 || index >= count || t.Shape[dim]%count != 0 {
		return nil, fmt.Errorf("weight %q: slice %d of %d along dimension %d does not fit shape %v", ref.Key, index, count, dim, t.Shape)
	}
	part := t.Shape[dim] / count
	stride := tensor.Strides(t.Shape)
	shape := ref.LocalShape()
	return gather(t, shape, stride, index*part*stride[dim]), nil
}
