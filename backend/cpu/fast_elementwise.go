package cpu

import (
	"slices"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Fast kernels of add, sub and mul (see binaryArith, the reference): when both inputs are
// floats and each has the output's shape or is a row broadcast over its leading dimensions
// (its shape a suffix of the output's: a bias, a gate), the rows are split over the worker
// pool, widened to float32, combined in float32 and rounded to the output's dtype, as the
// reference does element by element; anything else (other broadcasts, integers) runs the
// reference kernel.

func init() {
	for _, op := range []string{"add", "sub", "mul"} {
		Register(op, fastBinary)
	}
}

// rowOf reports whether shape is a suffix of full (a row repeated over full's leading
// dimensions, or full itself) and returns its element count.
func rowOf(shape, full []int) (int, bool) {
	if len(shape) > len(full) || !slices.Equal(shape, full[len(full)-len(shape):]) {
		return 0, false
	}
	return tensor.Numel(shape), true
}

// fastBinary: a op b -> out, each input of out's shape or a row of it; else the reference.
func fastBinary(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if len(in) != 2 || len(out) != 1 || in[0].Validate() != nil || in[1].Validate() != nil ||
		!in[0].DType.IsFloat() || !in[1].DType.IsFloat() || !out[0].DType.IsFloat() {
		return binaryArith(n, in, out)
	}
	na, okA := rowOf(in[0].Shape, out[0].Shape)
	nb, okB := rowOf(in[1].Shape, out[0].Shape)
	size := tensor.Numel(out[0].Shape)
	if !okA || !okB || (na != size && nb != size) || na == 0 || nb == 0 {
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
	res := newOut(out[0])
	// Rows of the shorter input's length (the whole tensor in chunks when neither repeats).
	row := min(na, nb)
	if row == size {
		row = min(size, 2048)
	}
	rows := (size + row - 1) / row
	parallel(rows, grainFor(rows, 2*row, 1), func(lo, hi int) {
		buf := getF32(3 * row)
		defer putF32(buf)
		ab, bb, yb := (*buf)[:row], (*buf)[row:2*row], (*buf)[2*row:]
		var ar, br []float32
		if na < size {
			ar = rowF32(a, 0, na, ab)
		}
		if nb < size {
			br = rowF32(b, 0, nb, bb)
		}
		for r := lo; r < hi; r++ {
			off := r * row
			m := min(row, size-off)
			if na == size {
				ar = rowF32(a, off, m, ab)
			}
			if nb == size {
				br = rowF32(b, off, m, bb)
			}
			if res.DType == tensor.F32 {
				f(res.F32[off:off+m], ar, br)
				continue
			}
			f(yb[:m], ar, br)
			storeRow(res, off, yb[:m])
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
