package cuda

import (
	"fmt"
	"slices"
	"strings"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// RMSNorm and the residual add with RMSNorm (graph ops rmsnorm and add_rmsnorm,
// kernels/norm.cu).

func init() {
	opKernels["rmsnorm"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		return rmsnorm(d, out[0], in[0], in[1], float32(n.Attrs.Float("eps")))
	}}
	opKernels["add_rmsnorm"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		return addRMSNorm(d, out[0], out[1], in[0], in[1], in[2], float32(n.Attrs.Float("eps")))
	}}
}

// RMSNorm normalises x[...,D] with w[D] into out[...,D] of dtype promote(w, x): out = w *
// round_x(x * rsqrt(mean(x²) + eps)), as graph op rmsnorm. out may be x itself.
func RMSNorm(d *Device, out, x, w *Tensor, eps float32) error {
	return d.do(func() error { return rmsnorm(d, out, x, w, eps) })
}

func rmsnorm(d *Device, out, x, w *Tensor, eps float32) error {
	if err := checkLive(out, x, w); err != nil {
		return fmt.Errorf("cuda: rmsnorm: %w", err)
	}
	xn, err := floatName("x", x.DType)
	if err != nil {
		return fmt.Errorf("cuda: rmsnorm: %w", err)
	}
	wn, err := floatName("w", w.DType)
	if err != nil {
		return fmt.Errorf("cuda: rmsnorm: %w", err)
	}
	D, err := normDim(x, w)
	if err != nil {
		return fmt.Errorf("cuda: rmsnorm: %w", err)
	}
	if err := checkOut("output", out, promote(w.DType, x.DType), x.Shape); err != nil {
		return fmt.Errorf("cuda: rmsnorm: %w", err)
	}
	rows := x.Numel() / max(D, 1)
	if rows == 0 || D == 0 {
		return nil
	}
	args := func(a *cubind.Args) { a.Ptr(out.ptr).Ptr(x.ptr).Ptr(w.ptr).I32(int32(D)).F32(eps) }
	grid := cubind.Dim3{X: rows, Y: 1, Z: 1}
	if np, ok := planNorm(D, operand{x.ptr, x.DType}, operand{w.ptr, w.DType}, operand{out.ptr, out.DType}); ok {
		inst, name := rmsnormVec(xn, wn, np)
		return d.launchX("norm.cu", inst, name, grid, np.block(), 0, args)
	}
	return d.launch("norm.cu", "rmsnorm_"+xn+"_"+wn, grid, rowBlock(D), 0, args)
}

// rmsnormVec returns the instantiation and the name of rmsnorm's register form for x and
// w of the dtypes named xn and wn.
func rmsnormVec(xn, wn string, p normLaunch) (inst, name string) {
	inst = fmt.Sprintf("RMSNORM_VEC(%s, %s, %s, %s, %d, %d)", strings.ToUpper(xn), xn, strings.ToUpper(wn), wn, p.vec, p.nv)
	return inst, fmt.Sprintf("rmsnorm_%s_%s_v%d_n%d", xn, wn, p.vec, p.nv)
}

// addRMSNormVec returns the instantiation and the name of add_rmsnorm's register form for
// x, residual and w of the dtypes named xn, rn and wn.
func addRMSNormVec(xn, rn, wn string, p normLaunch) (inst, name string) {
	inst = fmt.Sprintf("ADD_RMSNORM_VEC(%s, %s, %s, %s, %s, %s, %d, %d)", strings.ToUpper(xn), xn, strings.ToUpper(rn), rn,
		strings.ToUpper(wn), wn, p.vec, p.nv)
	return inst, fmt.Sprintf("add_rmsnorm_%s_%s_%s_v%d_n%d", xn, rn, wn, p.vec, p.nv)
}

// forceLoopNorm makes rmsnorm and add_rmsnorm always run the loop kernels (norm.cu's
// first forms); tests set it to compare them with the register forms.
var forceLoopNorm bool

// operand is a kernel operand's address and dtype, for alignment checks.
type operand struct {
	ptr cubind.DevicePtr
	dt  tensor.DType
}

// normLaunch is the launch of the register forms of rmsnorm and add_rmsnorm (norm.cu):
// vectors of vec elements, nv of them per thread, threads per block (a multiple of 32).
type normLaunch struct{ vec, nv, threads int }

func (p normLaunch) block() cubind.Dim3 { return cubind.Dim3{X: p.threads, Y: 1, Z: 1} }

// maxNormElems bounds the elements a thread of the register forms holds (nv * vec), so
// that a block of 1024 threads needs no more than its 64 registers per thread; longer rows
// take the loop kernels.
const maxNormElems = 32

// planNorm plans the register forms for rows of D elements of the given operands: vectors
// of 16 bytes of the widest operand dtype, halved until they divide D and every operand
// is aligned to them; as many vectors per thread (a power of two) as keeps the block at
// most 1024 threads, and threads for every vector of the row. ok is false when a thread
// would hold more than maxNormElems elements, or forceLoopNorm is set.
func planNorm(D int, ops ...operand) (p normLaunch, ok bool) {
	if forceLoopNorm || D <= 0 {
		return p, false
	}
	size := 1
	for _, o := range ops {
		size = max(size, o.dt.Size())
	}
	aligned := func(v int) bool {
		if D%v != 0 {
			return false
		}
		for _, o := range ops {
			if uint64(o.ptr)%uint64(v*o.dt.Size()) != 0 {
				return false
			}
		}
		return true
	}
	p.vec = max(16/size, 1)
	for p.vec > 1 && !aligned(p.vec) {
		p.vec /= 2
	}
	nvec := D / p.vec
	p.nv = 1
	for nvec > p.nv*1024 {
		p.nv *= 2
	}
	if p.nv*p.vec > maxNormElems {
		return p, false
	}
	p.threads = ((nvec+p.nv-1)/p.nv + 31) / 32 * 32
	return p, true
}

// planAddNorm is planNorm for add_rmsnorm's operands (and all_reduce_add_rmsnorm's, whose
// vector form matches it thread for thread).
func planAddNorm(D int, normed, sum, x, r, w *Tensor) (normLaunch, bool) {
	return planNorm(D, operand{x.ptr, x.DType}, operand{r.ptr, r.DType}, operand{w.ptr, w.DType},
		operand{sum.ptr, sum.DType}, operand{normed.ptr, normed.DType})
}

func normDim(x, w *Tensor) (int, error) {
	if len(x.Shape) == 0 || len(w.Shape) != 1 || w.Shape[0] != x.Shape[len(x.Shape)-1] {
		return 0, fmt.Errorf("norm weight %v does not fit the last axis of %v", w.Shape, x.Shape)
	}
	return w.Shape[0], nil
}

// AddRMSNorm adds x and residual [...,D] into sum (dtype promote(x, residual)), then
// normalises sum with w[D] into normed (dtype promote(w, sum)), as graph op add_rmsnorm.
// sum may be x or residual itself (in place).
func AddRMSNorm(d *Device, normed, sum, x, residual, w *Tensor, eps float32) error {
	return d.do(func() error { return addRMSNorm(d, normed, sum, x, residual, w, eps) })
}

func addRMSNorm(d *Device, normed, sum, x, r, w *Tensor, eps float32) error {
	if err := checkLive(normed, sum, x, r, w); err != nil {
		return fmt.Errorf("cuda: add_rmsnorm: %w", err)
	}
	var names [3]string
	for i, t := range []*Tensor{x, r, w} {
		n, err := floatName([]string{"x", "residual", "w"}[i], t.DType)
		if err != nil {
			return fmt.Errorf("cuda: add_rmsnorm: %w", err)
		}
		names[i] = n
	}
	if !slices.Equal(x.Shape, r.Shape) {
		return fmt.Errorf("cuda: add_rmsnorm: x %v and residual %v differ in shape", x.Shape, r.Shape)
	}
	D, err := normDim(x, w)
	if err != nil {
		return fmt.Errorf("cuda: add_rmsnorm: %w", err)
	}
	sdt := promote(x.DType, r.DType)
	if err := checkOut("sum", sum, sdt, x.Shape); err != nil {
		return fmt.Errorf("cuda: add_rmsnorm: %w", err)
	}
	if err := checkOut("normed", normed, promote(w.DType, sdt), x.Shape); err != nil {
		return fmt.Errorf("cuda: add_rmsnorm: %w", err)
	}
	rows := x.Numel() / max(D, 1)
	if rows == 0 || D == 0 {
		return nil
	}
	args := func(a *cubind.Args) {
		a.Ptr(normed.ptr).Ptr(sum.ptr).Ptr(x.ptr).Ptr(r.ptr).Ptr(w.ptr).I32(int32(D)).F32(eps)
	}
	grid := cubind.Dim3{X: rows, Y: 1, Z: 1}
	suffix := names[0] + "_" + names[1] + "_" + names[2]
	if np, ok := planAddNorm(D, normed, sum, x, r, w); ok {
		inst, name := addRMSNormVec(names[0], names[1], names[2], np)
		return d.launchX("norm.cu", inst, name, grid, np.block(), 0, args)
	}
	return d.launch("norm.cu", "add_rmsnorm_"+suffix, grid, rowBlock(D), 0, args)
}
