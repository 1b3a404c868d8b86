package cpu

import (
	"fmt"
	"slices"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Shape ops: they move or select elements without arithmetic, in any dtype. Each returns a
// new tensor, never a view of its input.

// sameDType checks that an output keeps its input's dtype, as every shape op does.
func sameDType(t *tensor.Tensor, o Out) error {
	if t.DType != o.DType {
		return fmt.Errorf("input is %s, output is declared %s", t.DType, o.DType)
	}
	return nil
}

// reshape: x[...] -> out[shape] with the same elements in row-major order.
func reshape(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 1, 1); err != nil {
		return nil, err
	}
	x, o := in[0], out[0]
	if err := sameDType(x, o); err != nil {
		return nil, err
	}
	if x.Numel() != tensor.Numel(o.Shape) {
		return nil, fmt.Errorf("cannot reshape %v (%d elements) to %v", x.Shape, x.Numel(), o.Shape)
	}
	r := newOutDirty(o)
	tensor.CopyRange(r, 0, x, 0, x.Numel()) // every element
	return []*tensor.Tensor{r}, nil
}

// transpose: x[d0,...,dk] -> out[d_perm[0],...,d_perm[k]]; output axis i is input axis
// perm[i].
func transpose(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 1, 1); err != nil {
		return nil, err
	}
	x, o := in[0], out[0]
	if err := sameDType(x, o); err != nil {
		return nil, err
	}
	perm := n.Attrs.Ints("perm")
	if len(perm) != len(x.Shape) {
		return nil, fmt.Errorf("perm %v has %d entries for rank %d", perm, len(perm), len(x.Shape))
	}
	src := tensor.Strides(x.Shape)
	shape, stride := make([]int, len(perm)), make([]int, len(perm))
	seen := make([]bool, len(perm))
	for i, p := range perm {
		if p < 0 || p >= len(perm) || seen[p] {
			return nil, fmt.Errorf("perm %v is not a permutation", perm)
		}
		seen[p] = true
		shape[i], stride[i] = x.Shape[p], src[p]
	}
	if err := checkShape(shape, o); err != nil {
		return nil, err
	}
	return []*tensor.Tensor{gatherIn(o.arena, x, shape, stride, 0)}, nil
}

// slice: x[...,D,...] -> out[...,ceil((end-start)/step),...], elements start, start+step, ...
// below end along the "axis" attribute.
func slice(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 1, 1); err != nil {
		return nil, err
	}
	x, o := in[0], out[0]
	if err := sameDType(x, o); err != nil {
		return nil, err
	}
	ax, err := graph.NormAxis(n.Attrs.Int("axis"), len(x.Shape))
	if err != nil {
		return nil, err
	}
	start, end, step := n.Attrs.Int("start"), n.Attrs.Int("end"), n.Attrs.Int("step")
	if step < 1 || start < 0 || end > x.Shape[ax] || start > end {
		return nil, fmt.Errorf("slice [%d:%d:%d] out of range for axis %d of size %d", start, end, step, ax, x.Shape[ax])
	}
	shape, stride := slices.Clone(x.Shape), tensor.Strides(x.Shape)
	shape[ax] = 0
	if end > start {
		shape[ax] = (end-start-1)/step + 1 // no overflow for a huge step
	}
	base := start * stride[ax]
	stride[ax] *= step
	if err := checkShape(shape, o); err != nil {
		return nil, err
	}
	return []*tensor.Tensor{gatherIn(o.arena, x, shape, stride, base)}, nil
}

// concat: x0[...,D0,...], x1[...,D1,...], ... -> out[...,D0+D1+...,...] along the "axis"
// attribute; the inputs share their dtype and every other dimension.
func concat(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, -1, 1); err != nil {
		return nil, err
	}
	o := out[0]
	first := in[0]
	ax, err := graph.NormAxis(n.Attrs.Int("axis"), len(first.Shape))
	if err != nil {
		return nil, err
	}
	shape := slices.Clone(first.Shape)
	shape[ax] = 0
	for i, t := range in {
		if t.DType != first.DType || len(t.Shape) != len(first.Shape) {
			return nil, fmt.Errorf("input %d is %s%v, input 0 is %s%v", i, t.DType, t.Shape, first.DType, first.Shape)
		}
		for d := range t.Shape {
			if d != ax && t.Shape[d] != first.Shape[d] {
				return nil, fmt.Errorf("input %d has shape %v, input 0 has %v", i, t.Shape, first.Shape)
			}
		}
		shape[ax] += t.Shape[ax]
	}
	if err := sameDType(first, o); err != nil {
		return nil, err
	}
	if err := checkShape(shape, o); err != nil {
		return nil, err
	}
	res := newShaped(o.arena, o.DType, shape, true)
	stride := tensor.Strides(shape)
	at := 0
	for _, t := range in {
		scatter(res, t, stride, at*stride[ax])
		at += t.Shape[ax]
	}
	return []*tensor.Tensor{res}, nil
}

// split: x[...,D,...] -> one output per entry of the "sizes" attribute, out_i[...,sizes[i],...],
// consecutive pieces along the "axis" attribute; the sizes add up to D.
func split(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	sizes := n.Attrs.Ints("sizes")
	if err := checkArgs(n, in, out, 1, len(sizes)); err != nil {
		return nil, err
	}
	x := in[0]
	ax, err := graph.NormAxis(n.Attrs.Int("axis"), len(x.Shape))
	if err != nil {
		return nil, err
	}
	total := 0
	for _, s := range sizes {
		if s < 0 {
			return nil, fmt.Errorf("negative split size in %v", sizes)
		}
		total += s
	}
	if total != x.Shape[ax] {
		return nil, fmt.Errorf("split sizes %v do not add up to axis %d of %v", sizes, ax, x.Shape)
	}
	stride := tensor.Strides(x.Shape)
	res := make([]*tensor.Tensor, len(sizes))
	at := 0
	for i, s := range sizes {
		if err := sameDType(x, out[i]); err != nil {
			return nil, fmt.Errorf("output %d: %w", i, err)
		}
		shape := slices.Clone(x.Shape)
		shape[ax] = s
		if err := checkShape(shape, out[i]); err != nil {
			return nil, fmt.Errorf("output %d: %w", i, err)
		}
		res[i] = gatherIn(out[i].arena, x, shape, stride, at*stride[ax])
		at += s
	}
	return res, nil
}

// expand: x[...] -> out[shape], broadcasting with NumPy rules (size-1 dimensions repeat,
// missing leading dimensions are added).
func expand(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 1, 1); err != nil {
		return nil, err
	}
	x, o := in[0], out[0]
	if err := sameDType(x, o); err != nil {
		return nil, err
	}
	stride, err := broadcastStrides(x.Shape, o.Shape)
	if err != nil {
		return nil, err
	}
	return []*tensor.Tensor{gatherIn(o.arena, x, o.Shape, stride, 0)}, nil
}

func init() {
	registerReference("reshape", reshape)
	registerReference("transpose", transpose)
	registerReference("slice", slice)
	registerReference("concat", concat)
	registerReference("split", split)
	registerReference("expand", expand)
}
