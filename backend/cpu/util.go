package cpu

import (
	"fmt"
	"runtime"
	"slices"
	"sync"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// checkArgs verifies the number of inputs (exactly nIn, or at least -nIn when nIn < 0) and
// outputs, and that every input tensor is well formed.
func checkArgs(n *graph.Node, in []*tensor.Tensor, out []Out, nIn, nOut int) error {
	if n == nil {
		return fmt.Errorf("kernel called without a node")
	}
	if nIn >= 0 && len(in) != nIn {
		return fmt.Errorf("%s takes %d inputs, got %d", n.Op, nIn, len(in))
	}
	if nIn < 0 && len(in) < -nIn {
		return fmt.Errorf("%s takes at least %d inputs, got %d", n.Op, -nIn, len(in))
	}
	if len(out) != nOut {
		return fmt.Errorf("%s has %d outputs, asked for %d", n.Op, nOut, len(out))
	}
	for i, t := range in {
		if err := t.Validate(); err != nil {
			return fmt.Errorf("input %d: %w", i, err)
		}
	}
	for i, o := range out {
		for _, d := range o.Shape {
			if d < 0 {
				return fmt.Errorf("output %d: negative dimension in %v", i, o.Shape)
			}
		}
		if o.DType.Size() == 0 {
			return fmt.Errorf("output %d: invalid dtype %s", i, o.DType)
		}
	}
	return nil
}

// checkShape reports an error unless got equals the shape the output was declared with.
func checkShape(got []int, o Out) error {
	if !slices.Equal(got, o.Shape) {
		return fmt.Errorf("inputs give shape %v, output is declared %v", got, o.Shape)
	}
	return nil
}

// broadcastShapes combines concrete shapes with NumPy rules (aligned at the right, equal or 1).
func broadcastShapes(shapes ...[]int) ([]int, error) {
	rank := 0
	for _, s := range shapes {
		rank = max(rank, len(s))
	}
	out := make([]int, rank)
	for i := range out {
		out[i] = 1
	}
	for _, s := range shapes {
		off := rank - len(s)
		for i, d := range s {
			switch cur := out[off+i]; {
			case d == cur, d == 1:
			case cur == 1:
				out[off+i] = d
			default:
				return nil, fmt.Errorf("shapes %v do not broadcast", shapes)
			}
		}
	}
	return out, nil
}

// broadcastStrides returns strides that read a tensor of shape in as if it had been broadcast
// to shape out: aligned at the right, stride 0 along dimensions that in lacks or has as 1.
func broadcastStrides(in, out []int) ([]int, error) {
	if len(in) > len(out) {
		return nil, fmt.Errorf("cannot broadcast %v to %v", in, out)
	}
	src := tensor.Strides(in)
	st := make([]int, len(out))
	off := len(out) - len(in)
	for i, d := range in {
		switch {
		case d == out[off+i]:
			st[off+i] = src[i]
		case d == 1:
			st[off+i] = 0
		default:
			return nil, fmt.Errorf("cannot broadcast %v to %v", in, out)
		}
	}
	return st, nil
}

// walk visits every element of shape in row-major order, calling f with the element's flat
// index and, for each operand k, the offset base[k] + sum(index[d] * strides[k][d]).
func walk(shape []int, strides [][]int, base []int, f func(i int, off []int)) {
	n := tensor.Numel(shape)
	if n == 0 {
		return
	}
	idx := make([]int, len(shape))
	off := slices.Clone(base)
	for i := 0; i < n; i++ {
		f(i, off)
		for d := len(shape) - 1; d >= 0; d-- {
			idx[d]++
			for k := range off {
				off[k] += strides[k][d]
			}
			if idx[d] < shape[d] {
				break
			}
			for k := range off {
				off[k] -= strides[k][d] * shape[d]
			}
			idx[d] = 0
		}
	}
}

func gatherT[T any](dst, src []T, shape, stride []int, base int) {
	if contiguousRows(shape, stride) {
		eachRow(shape, stride, base, func(i, off, n int) { copy(dst[i:i+n], src[off:off+n]) })
		return
	}
	walk(shape, [][]int{stride}, []int{base}, func(i int, off []int) { dst[i] = src[off[0]] })
}

// gather returns a new tensor of src's dtype and the given shape whose element i is the
// element of src at base + sum(index[d] * stride[d]). Transpose, slice, split and expand are
// all gathers with the right strides.
func gather(src *tensor.Tensor, shape, stride []int, base int) *tensor.Tensor {
	return gatherIn(nil, src, shape, stride, base)
}

// gatherIn is gather with the result's storage from a (nil: the Go heap).
func gatherIn(a *arena, src *tensor.Tensor, shape, stride []int, base int) *tensor.Tensor {
	out := newShaped(a, src.DType, shape, true)
	switch src.DType {
	case tensor.F32:
		gatherT(out.F32, src.F32, shape, stride, base)
	case tensor.BF16, tensor.F16:
		gatherT(out.Half, src.Half, shape, stride, base)
	case tensor.I32:
		gatherT(out.I32, src.I32, shape, stride, base)
	case tensor.I64:
		gatherT(out.I64, src.I64, shape, stride, base)
	case tensor.Bool:
		gatherT(out.Bool, src.Bool, shape, stride, base)
	case tensor.F8E4M3, tensor.F8E5M2:
		gatherT(out.U8, src.U8, shape, stride, base)
	}
	return out
}

func scatterT[T any](dst, src []T, shape, stride []int, base int) {
	if contiguousRows(shape, stride) {
		eachRow(shape, stride, base, func(i, off, n int) { copy(dst[off:off+n], src[i:i+n]) })
		return
	}
	walk(shape, [][]int{stride}, []int{base}, func(i int, off []int) { dst[off[0]] = src[i] })
}

// scatter writes every element i of src (row-major over src's shape) to dst at
// base + sum(index[d] * stride[d]). dst and src have the same dtype.
func scatter(dst, src *tensor.Tensor, stride []int, base int) {
	switch src.DType {
	case tensor.F32:
		scatterT(dst.F32, src.F32, src.Shape, stride, base)
	case tensor.BF16, tensor.F16:
		scatterT(dst.Half, src.Half, src.Shape, stride, base)
	case tensor.I32:
		scatterT(dst.I32, src.I32, src.Shape, stride, base)
	case tensor.I64:
		scatterT(dst.I64, src.I64, src.Shape, stride, base)
	case tensor.Bool:
		scatterT(dst.Bool, src.Bool, src.Shape, stride, base)
	case tensor.F8E4M3, tensor.F8E5M2:
		scatterT(dst.U8, src.U8, src.Shape, stride, base)
	}
}

// float64s returns the elements widened to float64 (bools as 0 and 1).
func float64s(t *tensor.Tensor) []float64 {
	out := make([]float64, t.Numel())
	switch t.DType {
	case tensor.I64:
		for i, v := range t.I64 {
			out[i] = float64(v)
		}
	default:
		for i, v := range t.Float32s() {
			out[i] = float64(v)
		}
	}
	return out
}

// int64s returns the elements as int64 (bools as 0 and 1); the storage itself for i64.
func int64s(t *tensor.Tensor) []int64 { return t.Int64s() }

// bools returns the storage of a bool tensor, or an error naming what was given instead.
func bools(t *tensor.Tensor, what string) ([]bool, error) {
	if t.DType != tensor.Bool {
		return nil, fmt.Errorf("%s must be bool, got %s", what, t.DType)
	}
	return t.Bool, nil
}

// fromF32 stores float32 results (data, not copied for f32) in the dtype and shape of o.
func fromF32(data []float32, o Out) *tensor.Tensor {
	return tensor.FromF32(data, o.Shape...).Cast(o.DType)
}

// fromI64 stores int64 results in the dtype and shape of o: i32 keeps the low 32 bits (two's
// complement wrap, as int32 arithmetic would give), bool is v != 0, floats convert.
func fromI64(data []int64, o Out) *tensor.Tensor {
	switch o.DType {
	case tensor.I64:
		return &tensor.Tensor{DType: tensor.I64, Shape: slices.Clone(o.Shape), I64: data}
	case tensor.I32:
		t := tensor.New(tensor.I32, o.Shape...)
		for i, v := range data {
			t.I32[i] = int32(v)
		}
		return t
	case tensor.Bool:
		t := tensor.New(tensor.Bool, o.Shape...)
		for i, v := range data {
			t.Bool[i] = v != 0
		}
		return t
	}
	f := make([]float32, len(data))
	for i, v := range data {
		f[i] = float32(v)
	}
	return fromF32(f, o)
}

// fromBool stores bool results in the dtype and shape of o.
func fromBool(data []bool, o Out) *tensor.Tensor {
	return (&tensor.Tensor{DType: tensor.Bool, Shape: slices.Clone(o.Shape), Bool: data}).Cast(o.DType)
}

// parallelFor splits [0, n) into at most runtime.GOMAXPROCS(0) contiguous chunks of at least
// minChunk items and runs f on each chunk in its own goroutine, returning when all are done.
func parallelFor(n, minChunk int, f func(lo, hi int)) {
	if n <= 0 {
		return
	}
	workers := min(runtime.GOMAXPROCS(0), (n+minChunk-1)/max(minChunk, 1))
	if workers <= 1 {
		f(0, n)
		return
	}
	chunk := (n + workers - 1) / workers
	var wg sync.WaitGroup
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		wg.Go(func() { f(lo, hi) })
	}
	wg.Wait()
}

// normAxes normalizes possibly negative axes against rank and rejects repeats.
func normAxes(axes []int, rank int) ([]bool, error) {
	sel := make([]bool, rank)
	for _, a := range axes {
		ax, err := graph.NormAxis(a, rank)
		if err != nil {
			return nil, err
		}
		if sel[ax] {
			return nil, fmt.Errorf("axis %d repeated in %v", a, axes)
		}
		sel[ax] = true
	}
	return sel, nil
}
