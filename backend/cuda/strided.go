package cuda

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"slices"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

func init() {
	opKernels["reshape"] = &opKernel{view: true}
	opKernels["transpose"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		return transpose(d, out[0], in[0], n.Attrs.Ints("perm"))
	}}
	opKernels["slice"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		ax, err := graph.NormAxis(n.Attrs.Int("axis"), len(in[0].Shape))
		if err != nil {
			return err
		}
		return slice(d, out[0], in[0], ax, n.Attrs.Int("start"), n.Attrs.Int("end"), n.Attrs.Int("step"))
	}}
	opKernels["concat"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		ax, err := graph.NormAxis(n.Attrs.Int("axis"), len(in[0].Shape))
		if err != nil {
			return err
		}
		return concat(d, out[0], ax, in)
	}}
	opKernels["split"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		ax, err := graph.NormAxis(n.Attrs.Int("axis"), len(in[0].Shape))
		if err != nil {
			return err
		}
		start := 0
		for i, o := range out {
			size := n.Attrs.Ints("sizes")[i]
			if err := slice(d, o, in[0], ax, start, start+size, 1); err != nil {
				return err
			}
			start += size
		}
		return nil
	}}
	opKernels["expand"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		return expand(d, out[0], in[0])
	}}
	opKernels["repeat_kv"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		return repeatKV(d, out[0], in[0], n.Attrs.Int("n"))
	}}
}

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

// stridedWalk is the iteration space of a strided copy after collapsing: dims (row-major)
// with the source and destination element strides of each, and the offsets of element 0.
type stridedWalk struct {
	dims, ss, ds   []int64
	srcOff, dstOff int64
}

// collapseWalk drops the dimensions of size 1 of the walk dims (source strides ss,
// destination strides ds) and merges dimensions contiguous in both operands, so that any
// walk that collapses to maxRank dimensions fits the kernels. A walk of one element is one
// dimension of size 1.
func collapseWalk(dims []int, ss, ds []int64, srcOff, dstOff int64) (stridedWalk, error) {
	w := stridedWalk{srcOff: srcOff, dstOff: dstOff}
	for i, n := range dims {
		if n == 1 {
			continue
		}
		if k := len(w.dims) - 1; k >= 0 && w.ss[k] == ss[i]*int64(n) && w.ds[k] == ds[i]*int64(n) {
			w.dims[k] *= int64(n)
			w.ss[k], w.ds[k] = ss[i], ds[i]
			continue
		}
		w.dims = append(w.dims, int64(n))
		w.ss = append(w.ss, ss[i])
		w.ds = append(w.ds, ds[i])
	}
	if len(w.dims) > maxRank {
		return w, fmt.Errorf("a strided walk over %v needs %d dimensions, kernels take %d", dims, len(w.dims), maxRank)
	}
	if len(w.dims) == 0 { // a single element
		w.dims, w.ss, w.ds = []int64{1}, []int64{0}, []int64{0}
	}
	return w, nil
}

// n is the number of elements of the walk.
func (w stridedWalk) n() int64 {
	n := int64(1)
	for _, x := range w.dims {
		n *= x
	}
	return n
}

// encode returns the Strided struct (common.cuh) of the walk.
func (w stridedWalk) encode() []byte {
	b := make([]byte, 0, 8*(3*maxRank+3)+8)
	put := func(v int64) { b = binary.LittleEndian.AppendUint64(b, uint64(v)) }
	for _, arr := range [][]int64{w.dims, w.ss, w.ds} {
		for i := range maxRank {
			if i < len(arr) {
				put(arr[i])
			} else {
				put(0)
			}
		}
	}
	put(w.n())
	put(w.srcOff)
	put(w.dstOff)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(w.dims)))
	b = binary.LittleEndian.AppendUint32(b, 0)
	return b
}

// newStrided encodes a Strided struct (common.cuh) for the iteration space dims with source
// strides ss and destination strides ds. Dimensions of size 1 are dropped and dimensions
// contiguous in both operands merged, so any walk that collapses to 6 dimensions fits.
func newStrided(dims []int, ss, ds []int64, srcOff, dstOff int64) ([]byte, error) {
	w, err := collapseWalk(dims, ss, ds, srcOff, dstOff)
	if err != nil {
		return nil, err
	}
	return w.encode(), nil
}

// vectorizable reports whether the walk can move v consecutive elements at a time: its
// innermost dimension is contiguous in both operands (strides 1) with a length that v
// divides, and every other stride and both offsets are multiples of v, so that each vector
// starts at a multiple of v elements.
func (w stridedWalk) vectorizable(v int64) bool {
	if v == 1 {
		return true
	}
	r := len(w.dims) - 1
	if w.ss[r] != 1 || w.ds[r] != 1 || w.dims[r]%v != 0 || w.srcOff%v != 0 || w.dstOff%v != 0 {
		return false
	}
	for i := range r {
		if w.ss[i]%v != 0 || w.ds[i]%v != 0 {
			return false
		}
	}
	return true
}

// vectorized returns the walk in units of v elements (see vectorizable).
func (w stridedWalk) vectorized(v int64) stridedWalk {
	r := len(w.dims) - 1
	out := stridedWalk{dims: slices.Clone(w.dims), ss: slices.Clone(w.ss), ds: slices.Clone(w.ds), srcOff: w.srcOff / v, dstOff: w.dstOff / v}
	out.dims[r] /= v
	for i := range r {
		out.ss[i] /= v
		out.ds[i] /= v
	}
	return out
}

// fits32 reports whether the walk's element count and every offset it reaches in either
// operand are below 2^31, so that 32-bit index math (Strided32) covers it.
func (w stridedWalk) fits32() bool {
	const lim = 1<<31 - 1
	if w.srcOff < 0 || w.dstOff < 0 || w.srcOff > lim || w.dstOff > lim {
		return false
	}
	n, so, do := int64(1), w.srcOff, w.dstOff
	for i, d := range w.dims {
		if d > lim || w.ss[i] < 0 || w.ds[i] < 0 || w.ss[i] > lim || w.ds[i] > lim {
			return false
		}
		n *= d
		so += (d - 1) * w.ss[i]
		do += (d - 1) * w.ds[i]
		if n > lim || so > lim || do > lim {
			return false
		}
	}
	return true
}

// fastDiv returns the multiplier and shift that divide by d (1 <= d < 2^31) as
// q = (umulhi(i, mul) + i) >> shr, exact for every i < 2^31 (fast_div in common.cuh): the
// round-up method of Granlund and Montgomery with l = ceil(log2 d) and
// mul = floor(2^32 * (2^l - d) / d) + 1; the sum cannot overflow 32 bits for such i.
func fastDiv(d uint32) (mul, shr uint32) {
	l := uint32(bits.Len32(d - 1)) // ceil(log2 d); 0 for d = 1
	m := (uint64(1)<<32)*((uint64(1)<<l)-uint64(d))/uint64(d) + 1
	return uint32(m), l
}

// encode32 returns the Strided32 struct (common.cuh) of a walk that fits32.
func (w stridedWalk) encode32() []byte {
	b := make([]byte, 0, 4*(5*maxRank+4))
	put := func(v uint32) { b = binary.LittleEndian.AppendUint32(b, v) }
	var mul, shr [maxRank]uint32
	for i, d := range w.dims {
		mul[i], shr[i] = fastDiv(uint32(d))
	}
	for i := range maxRank {
		put(uint32(at(w.dims, i)))
	}
	for _, arr := range [][maxRank]uint32{mul, shr} {
		for _, v := range arr {
			put(v)
		}
	}
	for i := range maxRank {
		put(uint32(at(w.ss, i)))
	}
	for i := range maxRank {
		put(uint32(at(w.ds, i)))
	}
	put(uint32(w.n()))
	put(uint32(w.srcOff))
	put(uint32(w.dstOff))
	put(uint32(len(w.dims)))
	return b
}

// at is xs[i], or 0 past its end.
func at(xs []int64, i int) int64 {
	if i < len(xs) {
		return xs[i]
	}
	return 0
}

// forceGeneralCopy makes copyStrided run every walk through the general kernels (64-bit
// index math, one element per thread), as before the fast paths; tests set it to compare
// the two.
var forceGeneralCopy bool

// copyPlan is the kernel of one strided copy: its name, the walk in the kernel's units
// (elements, or vectors of elements) and whether it takes a Strided32.
type copyPlan struct {
	name string
	w    stridedWalk
	is32 bool
}

// args is the walk's kernel argument.
func (p copyPlan) args() []byte {
	if p.is32 {
		return p.w.encode32()
	}
	return p.w.encode()
}

// planCopy picks the kernel of a strided copy of walk w from src to dst (element sizes
// srcSize and dstSize; device addresses srcPtr and dstPtr). castName is "" for a raw
// copy (one dtype), else the dtype pair of the conversion ("bf16_f32"). A raw copy moves
// vectors of up to 16 bytes and a cast vectors of up to 4 elements when the walk is
// vectorizable and both addresses are aligned to the vectors, and takes the 32-bit kernel
// when the walk, in those units, fits32; else the general kernel of one element.
func planCopy(w stridedWalk, srcSize, dstSize int, srcPtr, dstPtr uint64, castName string) copyPlan {
	general := copyPlan{name: fmt.Sprintf("copy_b%d", srcSize), w: w}
	if castName != "" {
		general.name = "cast_" + castName
	}
	if forceGeneralCopy {
		return general
	}
	aligned := func(v int) bool {
		return w.vectorizable(int64(v)) && srcPtr%uint64(v*srcSize) == 0 && dstPtr%uint64(v*dstSize) == 0
	}
	if castName != "" {
		v := 4
		for v > 1 && !aligned(v) {
			v /= 2
		}
		vw := w.vectorized(int64(v))
		if !vw.fits32() {
			return general
		}
		return copyPlan{name: fmt.Sprintf("cast32_%s_v%d", castName, v), w: vw, is32: true}
	}
	v := 1
	for _, bytes := range []int{16, 8, 4, 2} {
		if bytes > srcSize && bytes%srcSize == 0 && aligned(bytes/srcSize) {
			v = bytes / srcSize
			break
		}
	}
	vw := w.vectorized(int64(v))
	p := copyPlan{name: fmt.Sprintf("copy_b%d", v*srcSize), w: vw}
	if vw.fits32() {
		p.name, p.is32 = fmt.Sprintf("copy32_b%d", v*srcSize), true
	}
	return p
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
func Transpose(d *Device, out, x *Tensor, perm []int) error {
	return d.do(func() error { return transpose(d, out, x, perm) })
}

func transpose(d *Device, out, x *Tensor, perm []int) error {
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
	return copyStrided(d, out, x, shape, st, rowStrides(shape), 0, 0)
}

// Concat joins xs along axis into out (all of one dtype; other dimensions equal).
func Concat(d *Device, out *Tensor, axis int, xs ...*Tensor) error {
	return d.do(func() error { return concat(d, out, axis, xs) })
}

func concat(d *Device, out *Tensor, axis int, xs []*Tensor) error {
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
		if err := copyStrided(d, out, x, x.Shape, rowStrides(x.Shape), ost, 0, off); err != nil {
			return err
		}
		off += int64(x.Shape[axis]) * ost[axis]
	}
	return nil
}

// Slice copies elements start, start+step, ... (< end) along axis of x into out.
func Slice(d *Device, out, x *Tensor, axis, start, end, step int) error {
	return d.do(func() error { return slice(d, out, x, axis, start, end, step) })
}

func slice(d *Device, out, x *Tensor, axis, start, end, step int) error {
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
	return copyStrided(d, out, x, shape, src, rowStrides(shape), int64(start)*st[axis], 0)
}

// Expand broadcasts x to out's shape (NumPy rules: size-1 dimensions repeat).
func Expand(d *Device, out, x *Tensor) error {
	return d.do(func() error { return expand(d, out, x) })
}

func expand(d *Device, out, x *Tensor) error {
	if err := checkLive(out, x); err != nil {
		return fmt.Errorf("cuda: expand: %w", err)
	}
	shape, sx, _, err := broadcastStrides(x.Shape, out.Shape)
	if err != nil || !slices.Equal(shape, out.Shape) || out.DType != x.DType {
		return fmt.Errorf("cuda: expand: %s%v does not expand to %s%v", x.DType, x.Shape, out.DType, out.Shape)
	}
	return copyStrided(d, out, x, shape, sx, rowStrides(shape), 0, 0)
}

// copyStrided copies the iteration space dims from src (element strides ss, offset srcOff)
// to dst (strides ds, offset dstOff), converting between f32 and bf16 when the dtypes
// differ; same dtypes copy raw elements of any type. planCopy picks the kernel: vectors and
// 32-bit index math where the walk allows, else the general kernel.
func copyStrided(d *Device, dst, src *Tensor, dims []int, ss, ds []int64, srcOff, dstOff int64) error {
	n := int64(tensor.Numel(dims))
	if n == 0 {
		return nil
	}
	w, err := collapseWalk(dims, ss, ds, srcOff, dstOff)
	if err != nil {
		return fmt.Errorf("cuda: copy: %w", err)
	}
	castName := ""
	if src.DType != dst.DType {
		sn, err := floatName("source", src.DType)
		if err != nil {
			return fmt.Errorf("cuda: cast: %w", err)
		}
		dn, err := floatName("destination", dst.DType)
		if err != nil {
			return fmt.Errorf("cuda: cast: %w", err)
		}
		castName = sn + "_" + dn
	}
	p := planCopy(w, src.DType.Size(), dst.DType.Size(), uint64(src.ptr), uint64(dst.ptr), castName)
	grid := gridStride(d, p.w.n())
	if p.is32 {
		grid = gridCopy(d, p.w.n())
	}
	return d.launch("elementwise.cu", p.name, grid, block256, 0, func(a *cubind.Args) {
		a.Ptr(dst.ptr).Ptr(src.ptr).Struct(p.args())
	})
}

// gridCopy returns the grid of the 32-bit copy kernels over n elements, in blocks of 256:
// one element per thread while that takes at most 8 blocks per SM, else up to COPY_UNROLL
// (4, elementwise.cu) per thread and pass, with at most 16 blocks per SM. The bound keeps
// the kernels' 32-bit indices (below 2^31 plus 4 passes of the grid) from overflowing.
func gridCopy(d *Device, n int64) cubind.Dim3 {
	sms := int64(max(d.info.SMs, 1))
	g := (n + 255) / 256
	if g > 8*sms {
		g = min(max(8*sms, (n+1023)/1024), 16*sms)
	}
	return cubind.Dim3{X: int(max(g, 1)), Y: 1, Z: 1}
}

// repeatKV copies each KV head of x[B,KV,S,D] n times in place into out[B,KV*n,S,D].
func repeatKV(d *Device, out, x *Tensor, n int) error {
	if err := checkLive(out, x); err != nil {
		return fmt.Errorf("cuda: repeat_kv: %w", err)
	}
	if len(x.Shape) != 4 || n < 1 {
		return fmt.Errorf("cuda: repeat_kv: want x [B,KV,S,D] and n >= 1, got %v and %d", x.Shape, n)
	}
	B, KV, S, D := x.Shape[0], x.Shape[1], x.Shape[2], x.Shape[3]
	if err := checkOut("output", out, x.DType, []int{B, KV * n, S, D}); err != nil {
		return fmt.Errorf("cuda: repeat_kv: %w", err)
	}
	dims := []int{B, KV, n, S, D}
	st := rowStrides(x.Shape)
	return copyStrided(d, out, x, dims, []int64{st[0], st[1], 0, st[2], st[3]}, rowStrides(dims), 0, 0)
}
