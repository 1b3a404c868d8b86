package cuda

import (
	"encoding/binary"
	"fmt"
	"slices"
)

// maxRank is the most dimensions a strided kernel walks (MAX_RANK in common.cuh).
const maxRank = 6

// rowStrides returns the element strides of a row-major shape.
func rowStrides(shape []int) []int64 {
	st := make([]int64, len(shape))
	acc := int64(1)
	for i := len(shape) - 1; i >= 0; i-- {
		st[i] = acc
		acc *= int64(shape[i])
	}
	return st
}

// broadcastStrides returns the NumPy broadcast shape of a and b and, over its dimensions,
// the element strides at which a and b are read (0 along a dimension they broadcast).
func broadcastStrides(a, b []int) (shape []int, sa, sb []int64, err error) {
	r := max(len(a), len(b))
	shape = make([]int, r)
	sa, sb = make([]int64, r), make([]int64, r)
	stA, stB := rowStrides(a), rowStrides(b)
	for i := range r {
		ia, ib := i-(r-len(a)), i-(r-len(b))
		da, db := 1, 1
		if ia >= 0 {
			da = a[ia]
		}
		if ib >= 0 {
			db = b[ib]
		}
		switch {
		case da == db:
			shape[i] = da
		case da == 1:
			shape[i] = db
		case db == 1:
			shape[i] = da
		default:
			return nil, nil, nil, fmt.Errorf("shapes %v and %v do not broadcast", a, b)
		}
		if ia >= 0 && da != 1 {
			sa[i] = stA[ia]
		}
		if ib >= 0 && db != 1 {
			sb[i] = stB[ib]
		}
	}
	return shape, sa, sb, nil
}

// newStrided encodes a Strided struct (common.cuh) for the iteration space dims with source
// strides ss and destination strides ds. Dimensions of size 1 are dropped and dimensions
// contiguous in both operands merged, so any walk that collapses to 6 dimensions fits.
func newStrided(dims []int, ss, ds []int64, srcOff, dstOff int64) ([]byte, error) {
	var cd []int64
	var cs, cdst []int64
	for i, n := range dims {
		if n == 1 {
			continue
		}
		if k := len(cd) - 1; k >= 0 && cs[k] == ss[i]*int64(n) && cdst[k] == ds[i]*int64(n) {
			cd[k] *= int64(n)
			cs[k], cdst[k] = ss[i], ds[i]
			continue
		}
		cd = append(cd, int64(n))
		cs = append(cs, ss[i])
		cdst = append(cdst, ds[i])
	}
	if len(cd) > maxRank {
		return nil, fmt.Errorf("a strided walk over %v needs %d dimensions, kernels take %d", dims, len(cd), maxRank)
	}
	if len(cd) == 0 { // a single element
		cd, cs, cdst = []int64{1}, []int64{0}, []int64{0}
	}
	n := int64(1)
	for _, x := range cd {
		n *= x
	}
	b := make([]byte, 0, 8*(3*maxRank+3)+8)
	put := func(v int64) { b = binary.LittleEndian.AppendUint64(b, uint64(v)) }
	for _, arr := range [][]int64{cd, cs, cdst} {
		for i := range maxRank {
			if i < len(arr) {
				put(arr[i])
			} else {
				put(0)
			}
		}
	}
	put(n)
	put(srcOff)
	put(dstOff)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(cd)))
	b = binary.LittleEndian.AppendUint32(b, 0)
	return b, nil
}

// permuted returns shape and strides of x read through a transpose: output axis i is input
// axis perm[i].
func permuted(shape []int, perm []int) ([]int, []int64, error) {
	if len(perm) != len(shape) {
		return nil, nil, fmt.Errorf("perm %v does not fit rank %d", perm, len(shape))
	}
	st := rowStrides(shape)
	out, ost := make([]int, len(shape)), make([]int64, len(shape))
	seen := make([]bool, len(shape))
	for i, p := range perm {
		if p < 0 || p >= len(shape) || seen[p] {
			return nil, nil, fmt.Errorf("perm %v is not a permutation of %d axes", perm, len(shape))
		}
		seen[p] = true
		out[i], ost[i] = shape[p], st[p]
	}
	return out, ost, nil
}

// Transpose permutes x's axes into out: output axis i is input axis perm[i].
func (d *Device) Transpose(out, x *Tensor, perm []int) error {
	return d.do(func() error { return d.transpose(out, x, perm) })
}

func (d *Device) transpose(out, x *Tensor, perm []int) error {
	if err := checkLive(out, x); err != nil {
		return fmt.Errorf("cuda: transpose: %w", err)
	}
	shape, st, err := permuted(x.Shape, perm)
	if err != nil {
		return fmt.Errorf("cuda: transpose: %w", err)
	}
	if err := checkOut("output", out, x.DType, shape); err != nil {
		return fmt.Errorf("cuda: transpose: %w", err)
	}
	return d.copyStrided(out, x, shape, st, rowStrides(shape), 0, 0)
}

// Concat joins xs along axis into out (all of one dtype; other dimensions equal).
func (d *Device) Concat(out *Tensor, axis int, xs ...*Tensor) error {
	return d.do(func() error { return d.concat(out, axis, xs) })
}

func (d *Device) concat(out *Tensor, axis int, xs []*Tensor) error {
	if err := checkLive(append([]*Tensor{out}, xs...)...); err != nil {
		return fmt.Errorf("cuda: concat: %w", err)
	}
	if len(xs) == 0 || axis < 0 || axis >= len(xs[0].Shape) {
		return fmt.Errorf("cuda: concat: axis %d of %d inputs", axis, len(xs))
	}
	shape := slices.Clone(xs[0].Shape)
	shape[axis] = 0
	for _, x := range xs {
		if x.DType != xs[0].DType || len(x.Shape) != len(shape) {
			return fmt.Errorf("cuda: concat: inputs %s%v and %s%v do not join", xs[0].DType, xs[0].Shape, x.DType, x.Shape)
		}
		for i := range shape {
			if i != axis && x.Shape[i] != xs[0].Shape[i] {
				return fmt.Errorf("cuda: concat: inputs %v and %v differ off axis %d", xs[0].Shape, x.Shape, axis)
			}
		}
		shape[axis] += x.Shape[axis]
	}
	if err := checkOut("output", out, xs[0].DType, shape); err != nil {
		return fmt.Errorf("cuda: concat: %w", err)
	}
	ost := rowStrides(shape)
	off := int64(0)
	for _, x := range xs {
		if err := d.copyStrided(out, x, x.Shape, rowStrides(x.Shape), ost, 0, off); err != nil {
			return err
		}
		off += int64(x.Shape[axis]) * ost[axis]
	}
	return nil
}

// Slice copies elements start, start+step, ... (< end) along axis of x into out.
func (d *Device) Slice(out, x *Tensor, axis, start, end, step int) error {
	return d.do(func() error { return d.slice(out, x, axis, start, end, step) })
}

func (d *Device) slice(out, x *Tensor, axis, start, end, step int) error {
	if err := checkLive(out, x); err != nil {
		return fmt.Errorf("cuda: slice: %w", err)
	}
	if axis < 0 || axis >= len(x.Shape) || step < 1 || start < 0 || end > x.Shape[axis] || start > end {
		return fmt.Errorf("cuda: slice [%d:%d:%d] of axis %d is out of range for %v", start, end, step, axis, x.Shape)
	}
	shape := slices.Clone(x.Shape)
	shape[axis] = 0
	if end > start {
		shape[axis] = (end-start-1)/step + 1 // no overflow for a huge step
	}
	if err := checkOut("output", out, x.DType, shape); err != nil {
		return fmt.Errorf("cuda: slice: %w", err)
	}
	st := rowStrides(x.Shape)
	src := slices.Clone(st)
	src[axis] *= int64(step)
	return d.copyStrided(out, x, shape, src, rowStrides(shape), int64(start)*st[axis], 0)
}

// Expand broadcasts x to out's shape (NumPy rules: size-1 dimensions repeat).
func (d *Device) Expand(out, x *Tensor) error {
	return d.do(func() error { return d.expand(out, x) })
}

func (d *Device) expand(out, x *Tensor) error {
	if err := checkLive(out, x); err != nil {
		return fmt.Errorf("cuda: expand: %w", err)
	}
	shape, sx, _, err := broadcastStrides(x.Shape, out.Shape)
	if err != nil || !slices.Equal(shape, out.Shape) || out.DType != x.DType {
		return fmt.Errorf("cuda: expand: %s%v does not expand to %s%v", x.DType, x.Shape, out.DType, out.Shape)
	}
	return d.copyStrided(out, x, shape, sx, rowStrides(shape), 0, 0)
}
