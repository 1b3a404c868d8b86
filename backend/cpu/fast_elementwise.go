package cpu

import (
	"slices"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Fast kernels of add, sub and mul (see binaryArith, the reference): when both inputs are
// floats of the output's shape (no broadcast: a residual add, a gate), the elements are
// split over the worker pool in chunks, each widened to float32, combined in float32 and
// rounded to the output's dtype, as the reference does element by element; anything else
// (broadcasts, integers) runs the reference kernel.

const elementwiseChunk = 2048

func init() {
	for _, op := range []string{"add", "sub", "mul"} {
		Register(op, fastBinary)
	}
}

// fastBinary: a[...] op b[...] -> out[...], all of one shape, or the reference's broadcast.
func fastBinary(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if len(in) != 2 || len(out) != 1 || !in[0].DType.IsFloat() || !in[1].DType.IsFloat() ||
		!out[0].DType.IsFloat() || !slices.Equal(in[0].Shape, out[0].Shape) ||
		!slices.Equal(in[1].Shape, out[0].Shape) || in[0].Validate() != nil || in[1].Validate() != nil {
		return binaryArith(n, in, out)
	}
	var f func(dst, a, b []float32)
	switch n.Op {
	case "add":
		f = addF32
	case "sub":
		f = subF32
	case "mul":
		f = mulF32
	default:
		return binaryArith(n, in, out)
	}
	a, b := in[0], in[1]
	res := tensor.New(out[0].DType, out[0].Shape...)
	size := res.Numel()
	parallel(size, grainFor(size, 2, elementwiseChunk), func(lo, hi int) {
		buf := getF32(3 * elementwiseChunk)
		defer putF32(buf)
		ab, bb, yb := (*buf)[:elementwiseChunk], (*buf)[elementwiseChunk:2*elementwiseChunk], (*buf)[2*elementwiseChunk:]
		for c := lo; c < hi; c += elementwiseChunk {
			m := min(elementwiseChunk, hi-c)
			if res.DType == tensor.F32 {
				f(res.F32[c:c+m], rowF32(a, c, m, ab), rowF32(b, c, m, bb))
				continue
			}
			f(yb[:m], rowF32(a, c, m, ab), rowF32(b, c, m, bb))
			storeRow(res, c, yb[:m])
		}
	})
	return []*tensor.Tensor{res}, nil
}

func addF32(dst, a, b []float32) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = a[i] + b[i]
	}
}

func subF32(dst, a, b []float32) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = a[i] - b[i]
	}
}

func mulF32(dst, a, b []float32) {
	a, b = a[:len(dst)], b[:len(dst)]
	for i := range dst {
		dst[i] = a[i] * b[i]
	}
}
