package local

import (
	"sync"

	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/tensor"
)

// block is the number of elements a reducer folds at a time: its accumulators stay in L1.
const block = 1024

// reducer folds the same range of several tensors elementwise, in tensor order, into a
// destination that may be one of them: each block is read whole before it is written.
// bf16 and f16 accumulate in f32 and round once.
type reducer struct {
	dt   tensor.DType
	op   dist.ReduceOp
	f32  [][]float32
	half [][]uint16
	i32  [][]int32
	acc  [block]float32
	tmp  [block]float32
	iacc [block]int32
}

var reducers = sync.Pool{New: func() any { return new(reducer) }}

func newReducer(dt tensor.DType, op dist.ReduceOp, srcs []*tensor.Tensor) *reducer {
	r := reducers.Get().(*reducer)
	r.dt, r.op = dt, op
	r.f32, r.half, r.i32 = r.f32[:0], r.half[:0], r.i32[:0]
	for _, t := range srcs {
		switch dt {
		case tensor.F32:
			r.f32 = append(r.f32, t.F32)
		case tensor.BF16, tensor.F16:
			r.half = append(r.half, t.Half)
		case tensor.I32:
			r.i32 = append(r.i32, t.I32)
		}
	}
	return r
}

func (r *reducer) release() {
	clear(r.f32)
	clear(r.half)
	clear(r.i32)
	reducers.Put(r)
}

// reduce writes the fold of the sources' elements [sOff, sOff+n) to dst's [dOff, dOff+n).
// alias says whether dst may share storage with a source.
func (r *reducer) reduce(dst *tensor.Tensor, dOff, sOff, n int, alias bool) {
	switch r.dt {
	case tensor.F32:
		foldNative(dst.F32[dOff:dOff+n], r.f32, sOff, r.op, r.acc[:], alias)
	case tensor.I32:
		foldNative(dst.I32[dOff:dOff+n], r.i32, sOff, r.op, r.iacc[:], alias)
	case tensor.BF16, tensor.F16:
		r.foldHalf(dst.Half[dOff:dOff+n], sOff)
	}
}

// foldNative folds srcs[*][off:off+len(dst)] into dst block by block, so that a block of
// the result stays in L1 while the sources stream past. When dst may alias a source, each
// block is folded in acc and copied out after all its sources have been read.
func foldNative[T float32 | int32](dst []T, srcs [][]T, off int, op dist.ReduceOp, acc []T, alias bool) {
	for lo := 0; lo < len(dst); lo += block {
		hi := min(lo+block, len(dst))
		a := dst[lo:hi]
		if alias {
			a = acc[:hi-lo]
		}
		if len(srcs) == 1 {
			copy(a, srcs[0][off+lo:off+hi])
		} else {
			combine2(a, srcs[0][off+lo:off+hi], srcs[1][off+lo:off+hi], op)
		}
		for _, s := range srcs[min(2, len(srcs)):] {
			combineInto(a, s[off+lo:off+hi], op)
		}
		if alias {
			copy(dst[lo:hi], a)
		}
	}
}

// combine2 sets d = x op y elementwise.
func combine2[T float32 | int32](d, x, y []T, op dist.ReduceOp) {
	x, y = x[:len(d)], y[:len(d)] // one bounds check, not one per element
	if op == dist.Max {
		for i := range d {
			d[i] = max(x[i], y[i])
		}
		return
	}
	for i := range d {
		d[i] = x[i] + y[i]
	}
}

// combineInto sets d = d op x elementwise.
func combineInto[T float32 | int32](d, x []T, op dist.ReduceOp) {
	x = x[:len(d)]
	if op == dist.Max {
		for i := range d {
			d[i] = max(d[i], x[i])
		}
		return
	}
	for i := range d {
		d[i] += x[i]
	}
}

func (r *reducer) foldHalf(dst []uint16, off int) {
	bf := r.dt == tensor.BF16
	for lo := 0; lo < len(dst); lo += block {
		hi := min(lo+block, len(dst))
		a, t := r.acc[:hi-lo], r.tmp[:hi-lo]
		widen(a, r.half[0][off+lo:off+hi], bf)
		for _, s := range r.half[1:] {
			widen(t, s[off+lo:off+hi], bf)
			combineInto(a, t, r.op)
		}
		d := dst[lo:hi]
		if bf {
			for i, v := range a {
				d[i] = tensor.F32ToBF16(v)
			}
		} else {
			for i, v := range a {
				d[i] = tensor.F32ToF16(v)
			}
		}
	}
}

func widen(dst []float32, src []uint16, bf bool) {
	if bf {
		for i, h := range src {
			dst[i] = tensor.BF16ToF32(h)
		}
		return
	}
	for i, h := range src {
		dst[i] = tensor.F16ToF32(h)
	}
}

// copyBox copies the box of the given shape that starts at srcStart in src to dstStart in
// dst (tensors of one dtype and rank), in runs as long as the layouts allow.
func copyBox(dst *tensor.Tensor, dstStart []int, src *tensor.Tensor, srcStart []int, box []int) {
	rank := len(box)
	if tensor.Numel(box) == 0 {
		return
	}
	// Trailing axes the box covers whole in both tensors merge into one contiguous run,
	// together with the first axis before them.
	m := rank - 1
	for m > 0 && box[m] == src.Shape[m] && box[m] == dst.Shape[m] {
		m--
	}
	run := tensor.Numel(box[m:])
	sStride, dStride := tensor.Strides(src.Shape), tensor.Strides(dst.Shape)
	idx := make([]int, m) // odometer over the axes before m
	for {
		sOff, dOff := 0, 0
		for i := range rank {
			c := 0
			if i < m {
				c = idx[i]
			}
			sOff += (srcStart[i] + c) * sStride[i]
			dOff += (dstStart[i] + c) * dStride[i]
		}
		tensor.CopyRange(dst, dOff, src, sOff, run)
		i := m - 1
		for ; i >= 0; i-- {
			idx[i]++
			if idx[i] < box[i] {
				break
			}
			idx[i] = 0
		}
		if i < 0 {
			return
		}
	}
}

// sameStorage reports whether two tensors share their first element.
func sameStorage(a, b *tensor.Tensor) bool {
	if a == b {
		return true
	}
	if a.DType != b.DType || a.Numel() == 0 || b.Numel() == 0 {
		return false
	}
	switch a.DType {
	case tensor.F32:
		return &a.F32[0] == &b.F32[0]
	case tensor.BF16, tensor.F16:
		return &a.Half[0] == &b.Half[0]
	case tensor.I32:
		return &a.I32[0] == &b.I32[0]
	case tensor.I64:
		return &a.I64[0] == &b.I64[0]
	case tensor.Bool:
		return &a.Bool[0] == &b.Bool[0]
	}
	return false
}

// stageBuf is a staging buffer that grows to the largest message staged in it.
type stageBuf struct {
	f32  []float32
	half []uint16
	i32  []int32
}

// tensor returns a tensor of dtype dt with m elements in the buffer, of unspecified content.
func (b *stageBuf) tensor(dt tensor.DType, m int) *tensor.Tensor {
	t := &tensor.Tensor{DType: dt, Shape: []int{m}}
	switch dt {
	case tensor.F32:
		t.F32 = grow(&b.f32, m)
	case tensor.BF16, tensor.F16:
		t.Half = grow(&b.half, m)
	case tensor.I32:
		t.I32 = grow(&b.i32, m)
	}
	return t
}

func grow[T any](b *[]T, m int) []T {
	if cap(*b) < m {
		*b = make([]T, m)
	}
	return (*b)[:m]
}
