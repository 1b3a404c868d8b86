package cpu

import (
	"fmt"
	"math"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Reductions and softmax.

// reduce: sum, mean, max of x[...] over the "axes" attribute (negative counts from the end)
// -> out[x's shape without those axes, or with them as 1 when keepdim]. Floats accumulate in
// float64 and round once to the output dtype; integers sum in int64 (mean in float64,
// truncated); bools count as 0 and 1. The max of an empty set is an error.
func reduce(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 1, 1); err != nil {
		return nil, err
	}
	x, o := in[0], out[0]
	axes := n.Attrs.Ints("axes")
	if len(axes) == 0 {
		return nil, fmt.Errorf("%s needs at least one axis", n.Op)
	}
	sel, err := normAxes(axes, len(x.Shape))
	if err != nil {
		return nil, err
	}
	keep := n.Attrs.Bool("keepdim")
	shape := []int{}
	kept := make([]int, len(x.Shape)) // x's shape with the reduced axes as 1
	count := 1
	for d, size := range x.Shape {
		kept[d] = size
		if sel[d] {
			kept[d] = 1
			count *= size
			if keep {
				shape = append(shape, 1)
			}
			continue
		}
		shape = append(shape, size)
	}
	if err := checkShape(shape, o); err != nil {
		return nil, err
	}
	// Strides that map each element of x to its output element.
	dst := tensor.Strides(kept)
	for d := range dst {
		if sel[d] {
			dst[d] = 0
		}
	}
	size := tensor.Numel(shape)
	zero := []int{0}
	switch {
	case n.Op == "max" && count == 0 && size > 0:
		return nil, fmt.Errorf("max over an empty axis (shape %v, axes %v)", x.Shape, axes)
	case n.Op == "mean" && count == 0 && size > 0 && !o.DType.IsFloat():
		return nil, fmt.Errorf("mean over an empty axis (shape %v, axes %v) has no %s value", x.Shape, axes, o.DType)
	}
	if x.DType.IsFloat() || n.Op == "mean" {
		xs := float64s(x)
		acc := make([]float64, size)
		switch n.Op {
		case "sum", "mean":
			walk(x.Shape, [][]int{dst}, zero, func(i int, off []int) { acc[off[0]] += xs[i] })
			if n.Op == "mean" {
				for i := range acc {
					acc[i] /= float64(count)
				}
			}
		case "max":
			for i := range acc {
				acc[i] = math.Inf(-1)
			}
			walk(x.Shape, [][]int{dst}, zero, func(i int, off []int) { acc[off[0]] = max(acc[off[0]], xs[i]) })
		default:
			return nil, fmt.Errorf("unknown reduction %s", n.Op)
		}
		return []*tensor.Tensor{fromF64(acc, o)}, nil
	}
	xs := int64s(x)
	acc := make([]int64, size)
	switch n.Op {
	case "sum":
		walk(x.Shape, [][]int{dst}, zero, func(i int, off []int) { acc[off[0]] += xs[i] })
	case "max":
		for i := range acc {
			acc[i] = math.MinInt64
		}
		walk(x.Shape, [][]int{dst}, zero, func(i int, off []int) { acc[off[0]] = max(acc[off[0]], xs[i]) })
	default:
		return nil, fmt.Errorf("unknown reduction %s", n.Op)
	}
	return []*tensor.Tensor{fromI64(acc, o)}, nil
}

// fromF64 stores float64 results in the dtype and shape of o: floats round (through
// float32), integers truncate toward zero, bool is v != 0.
func fromF64(data []float64, o Out) *tensor.Tensor {
	if o.DType.IsFloat() {
		f := make([]float32, len(data))
		for i, v := range data {
			f[i] = float32(v)
		}
		return fromF32(f, o)
	}
	if o.DType == tensor.Bool {
		b := make([]bool, len(data))
		for i, v := range data {
			b[i] = v != 0
		}
		return fromBool(b, o)
	}
	iv := make([]int64, len(data))
	for i, v := range data {
		iv[i] = int64(v)
	}
	return fromI64(iv, o)
}

// softmax: x[...] -> out[...], exp(x - max) / sum(exp(x - max)) along the "axis" attribute,
// computed in float64 and rounded to the output dtype.
func softmax(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 1, 1); err != nil {
		return nil, err
	}
	x, o := in[0], out[0]
	if err := checkShape(x.Shape, o); err != nil {
		return nil, err
	}
	if !o.DType.IsFloat() {
		return nil, fmt.Errorf("softmax needs a float output, got %s", o.DType)
	}
	ax, err := graph.NormAxis(n.Attrs.Int("axis"), len(x.Shape))
	if err != nil {
		return nil, err
	}
	outer, L, inner := tensor.Numel(x.Shape[:ax]), x.Shape[ax], tensor.Numel(x.Shape[ax+1:])
	xs := x.Float32s()
	res := make([]float32, len(xs))
	e := make([]float64, L)
	for a := range outer {
		for c := range inner {
			base := a*L*inner + c
			m := math.Inf(-1)
			for j := range L {
				m = max(m, float64(xs[base+j*inner]))
			}
			sum := 0.0
			for j := range L {
				e[j] = math.Exp(float64(xs[base+j*inner]) - m)
				sum += e[j]
			}
			for j := range L {
				res[base+j*inner] = float32(e[j] / sum)
			}
		}
	}
	return []*tensor.Tensor{fromF32(res, o)}, nil
}

func init() {
	for _, op := range []string{"sum", "mean", "max"} {
		registerReference(op, reduce)
	}
	registerReference("softmax", softmax)
}
