package cpu

import (
	"fmt"
	"math"
	"slices"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// topk: x[...,N] -> values[...,k] (x's dtype), indices[...,k] (i32): the k largest entries
// of each row, largest first, equal values lowest index first, NaN above every number. The
// values are copied, not recomputed, so they keep their bits in any float dtype.
func topk(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 1, 2); err != nil {
		return nil, err
	}
	x := in[0]
	k := n.Attrs.Int("k")
	if len(x.Shape) == 0 || !x.DType.IsFloat() {
		return nil, fmt.Errorf("topk needs a float input of rank >= 1, got %s%v", x.DType, x.Shape)
	}
	N := x.Shape[len(x.Shape)-1]
	if k < 1 || k > N {
		return nil, fmt.Errorf("topk: k = %d is not in [1, %d]", k, N)
	}
	shape := slices.Clone(x.Shape)
	shape[len(shape)-1] = k
	if err := checkShape(shape, out[0]); err != nil {
		return nil, err
	}
	if err := checkShape(shape, out[1]); err != nil {
		return nil, err
	}
	if out[0].DType != x.DType || out[1].DType != tensor.I32 {
		return nil, fmt.Errorf("topk of %s gives %s values and i32 indices, asked for %s and %s", x.DType, x.DType, out[0].DType, out[1].DType)
	}
	xs := x.Float32s() // exact for every float dtype
	rows := tensor.Numel(x.Shape) / max(N, 1)
	vals := make([]float32, rows*k)
	idx := tensor.New(tensor.I32, shape...)
	order := make([]int, N)
	for r := range rows {
		row := xs[r*N : (r+1)*N]
		for i := range order {
			order[i] = i
		}
		// A stable sort by "greater": ties keep index order.
		slices.SortStableFunc(order, func(a, b int) int {
			switch va, vb := row[a], row[b]; {
			case greater(va, vb):
				return -1
			case greater(vb, va):
				return 1
			}
			return 0
		})
		for j := range k {
			vals[r*k+j] = row[order[j]]
			idx.I32[r*k+j] = int32(order[j])
		}
	}
	return []*tensor.Tensor{fromF32(vals, out[0]), idx}, nil
}

// greater orders floats for topk: NaN above everything (NaNs equal among themselves).
func greater(a, b float32) bool {
	an, bn := math.IsNaN(float64(a)), math.IsNaN(float64(b))
	if an || bn {
		return an && !bn
	}
	return a > b
}

func init() { registerReference("topk", topk) }
