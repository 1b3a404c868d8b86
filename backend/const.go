package backend

import (
	"fmt"
	"math"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Const builds a const node's tensor of dtype dt and shape (the node's output type, symbols
// resolved) from its "values" attribute: row-major, or one value for every element. Floats
// round through f32 to dt, integers must fit dt, bools are v != 0.
func Const(n *graph.Node, dt tensor.DType, shape []int) (*tensor.Tensor, error) {
	vals := n.Attrs.Floats("values")
	size := tensor.Numel(shape)
	if len(vals) != 1 && len(vals) != size {
		return nil, fmt.Errorf("const of shape %v has %d values", shape, len(vals))
	}
	at := func(i int) float64 {
		if len(vals) == 1 {
			return vals[0]
		}
		return vals[i]
	}
	t := tensor.New(dt, shape...)
	lo, hi := -math.Pow(2, 63), math.Pow(2, 63)
	if dt == tensor.I32 {
		lo, hi = math.MinInt32, math.MaxInt32+1
	}
	for i := range size {
		v := at(i)
		if dt.IsInt() && !(v >= lo && v < hi) {
			return nil, fmt.Errorf("const value %v does not fit %s", v, dt)
		}
		switch dt {
		case tensor.F32:
			t.F32[i] = float32(v)
		case tensor.BF16:
			t.Half[i] = tensor.F32ToBF16(float32(v))
		case tensor.F16:
			t.Half[i] = tensor.F32ToF16(float32(v))
		case tensor.I32:
			t.I32[i] = int32(v)
		case tensor.I64:
			t.I64[i] = int64(v)
		case tensor.Bool:
			t.Bool[i] = v != 0
		default:
			return nil, fmt.Errorf("const of dtype %s", dt)
		}
	}
	return t, nil
}
