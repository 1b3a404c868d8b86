package cuda

import (
	"fmt"
	"math/bits"
	"slices"
	"strings"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/tensor"
)

// Kernels, one method per op. Every method checks shapes and dtypes, queues its kernels on
// the device's stream and returns; outputs are tensors the caller allocated with the shape
// and dtype the op's doc gives. Float tensors may be f32 or bf16; math is f32 (see each
// kernel file for where it rounds). Inputs and outputs must not overlap unless a method says
// so.

// floatName returns the kernel suffix of a float dtype the kernels support.
func floatName(what string, dt tensor.DType) (string, error) {
	switch dt {
	case tensor.F32, tensor.BF16:
		return dtypeName(dt), nil
	}
	return "", fmt.Errorf("%s is %s; CUDA kernels take f32 or bf16", what, dt)
}

// intName returns the kernel suffix of an index dtype (positions, ids).
func intName(what string, dt tensor.DType) (string, error) {
	switch dt {
	case tensor.I32, tensor.I64:
		return dtypeName(dt), nil
	}
	return "", fmt.Errorf("%s is %s; want i32 or i64", what, dt)
}

// promote is the dtype of a binary op on a and b: bf16 only when both are.
func promote(a, b tensor.DType) tensor.DType {
	if a == tensor.BF16 && b == tensor.BF16 {
		return tensor.BF16
	}
	return tensor.F32
}

func checkOut(what string, t *Tensor, dt tensor.DType, shape []int) error {
	if t == nil {
		return fmt.Errorf("%s is nil", what)
	}
	if t.DType != dt || !slices.Equal(t.Shape, shape) {
		return fmt.Errorf("%s is %s%v, want %s%v", what, t.DType, t.Shape, dt, shape)
	}
	return nil
}

func checkLive(ts ...*Tensor) error {
	for i, t := range ts {
		if t == nil {
			return fmt.Errorf("operand %d is nil", i)
		}
		if t.ptr == 0 && t.Numel() > 0 {
			return fmt.Errorf("operand %d (%s%v) was freed", i, t.DType, t.Shape)
		}
	}
	return nil
}

// gridStride returns the grid of a grid-stride loop over n elements with blocks of 256.
func (d *Device) gridStride(n int64) cubind.Dim3 {
	g := (n + 255) / 256
	g = min(g, int64(d.info.SMs)*16)
	return cubind.Dim3{X: int(max(g, 1)), Y: 1, Z: 1}
}

var block256 = cubind.Dim3{X: 256, Y: 1, Z: 1}

// rowBlock picks a block size (a multiple of 32, at most 1024) for one row of n elements.
func rowBlock(n int) cubind.Dim3 {
	t := 32
	if n > 256 {
		t = min(1024, 1<<bits.Len(uint(n/8-1)))
	}
	return cubind.Dim3{X: max(t, 32), Y: 1, Z: 1}
}

// Embedding gathers rows of table[V,D] (f32 or bf16) by ids[...] (i32 or i64) into
// out[...,D] (f32 or bf16: the table's dtype as the graph op has it, or the other one,
// which fuses a cast). An id outside [0, V) gives a zero row and an error at the next Sync
// or Download.
func (d *Device) Embedding(out, table, ids *Tensor) error {
	return d.do(func() error { return d.embedding(out, table, ids) })
}

func (d *Device) embedding(out, table, ids *Tensor) error {
	if err := checkLive(out, table, ids); err != nil {
		return fmt.Errorf("cuda: embedding: %w", err)
	}
	tn, err := floatName("table", table.DType)
	if err != nil {
		return fmt.Errorf("cuda: embedding: %w", err)
	}
	on, err := floatName("output", out.DType)
	if err != nil {
		return fmt.Errorf("cuda: embedding: %w", err)
	}
	in, err := intName("ids", ids.DType)
	if err != nil {
		return fmt.Errorf("cuda: embedding: %w", err)
	}
	if len(table.Shape) != 2 {
		return fmt.Errorf("cuda: embedding: table must be [V,D], got %v", table.Shape)
	}
	V, D := table.Shape[0], table.Shape[1]
	if err := checkOut("output", out, out.DType, append(slices.Clone(ids.Shape), D)); err != nil {
		return fmt.Errorf("cuda: embedding: %w", err)
	}
	rows := ids.Numel()
	if rows == 0 || D == 0 {
		return nil
	}
	return d.launch("embedding.cu", "embedding_"+tn+"_"+on+"_"+in, cubind.Dim3{X: rows, Y: 1, Z: 1}, rowBlock(D), 0, func(a *cubind.Args) {
		a.Ptr(out.ptr).Ptr(table.ptr).Ptr(ids.ptr).I32(int32(V)).I32(int32(D)).Ptr(d.errWord)
	})
}

// RMSNorm normalises x[...,D] with w[D] into out[...,D] of dtype promote(w, x): out = w *
// round_x(x * rsqrt(mean(x²) + eps)), as graph op rmsnorm. out may be x itself.
func (d *Device) RMSNorm(out, x, w *Tensor, eps float32) error {
	return d.do(func() error { return d.rmsnorm(out, x, w, eps) })
}

func (d *Device) rmsnorm(out, x, w *Tensor, eps float32) error {
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
func (d *Device) AddRMSNorm(normed, sum, x, residual, w *Tensor, eps float32) error {
	return d.do(func() error { return d.addRMSNorm(normed, sum, x, residual, w, eps) })
}

func (d *Device) addRMSNorm(normed, sum, x, r, w *Tensor, eps float32) error {
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

// Rope rotates q[B,H,S,D] and k[B,KV,S,D] (one dtype, f32 or bf16) at positions[B,S] (i32
// or i64) into qOut and kOut of the same shapes and dtype, with invFreq f32[D/2] and
// scaling, as graph op rope.
func (d *Device) Rope(qOut, kOut, q, k, pos, invFreq *Tensor, scaling float32) error {
	return d.do(func() error { return d.rope(qOut, kOut, q, k, pos, invFreq, scaling) })
}

func (d *Device) rope(qOut, kOut, q, k, pos, invFreq *Tensor, scaling float32) error {
	if err := checkLive(qOut, kOut, q, k, pos, invFreq); err != nil {
		return fmt.Errorf("cuda: rope: %w", err)
	}
	xn, err := floatName("q", q.DType)
	if err != nil {
		return fmt.Errorf("cuda: rope: %w", err)
	}
	if k.DType != q.DType {
		return fmt.Errorf("cuda: rope: q is %s but k is %s", q.DType, k.DType)
	}
	pn, err := intName("positions", pos.DType)
	if err != nil {
		return fmt.Errorf("cuda: rope: %w", err)
	}
	if len(pos.Shape) != 2 {
		return fmt.Errorf("cuda: rope: positions must be [B,S], got %v", pos.Shape)
	}
	if invFreq.DType != tensor.F32 || len(invFreq.Shape) != 1 {
		return fmt.Errorf("cuda: rope: inv_freq must be f32[D/2], got %s%v", invFreq.DType, invFreq.Shape)
	}
	B, S, half := pos.Shape[0], pos.Shape[1], invFreq.Shape[0]
	for i, t := range []*Tensor{q, k} {
		if len(t.Shape) != 4 || t.Shape[0] != B || t.Shape[2] != S || t.Shape[3] != 2*half {
			return fmt.Errorf("cuda: rope: %s %v does not fit positions %v and %d inverse frequencies", []string{"q", "k"}[i], t.Shape, pos.Shape, half)
		}
		if err := checkOut([]string{"q output", "k output"}[i], []*Tensor{qOut, kOut}[i], t.DType, t.Shape); err != nil {
			return fmt.Errorf("cuda: rope: %w", err)
		}
	}
	scaled := ropeScaled(scaling)
	for i, t := range []*Tensor{q, k} {
		o := []*Tensor{qOut, kOut}[i]
		total := int64(t.Numel() / 2)
		if total == 0 {
			continue
		}
		grid := cubind.Dim3{X: int((total + 255) / 256), Y: 1, Z: 1}
		heads := t.Shape[1]
		err := d.launch("rope.cu", "rope_"+xn+"_"+pn, grid, block256, 0, func(a *cubind.Args) {
			a.Ptr(o.ptr).Ptr(t.ptr).Ptr(pos.ptr).Ptr(invFreq.ptr).I32(int32(heads)).I32(int32(S)).I32(int32(half)).
				F32(scaling).I32(scaled).I64(total)
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// SwiGLU computes out = silu(gate) * up elementwise (gate and up of one shape; out of dtype
// promote(gate, up)), as graph op swiglu. out may be gate or up itself.
func (d *Device) SwiGLU(out, gate, up *Tensor) error {
	return d.do(func() error { return d.swiglu(out, gate, up) })
}

func (d *Device) swiglu(out, g, u *Tensor) error {
	if err := checkLive(out, g, u); err != nil {
		return fmt.Errorf("cuda: swiglu: %w", err)
	}
	gn, err := floatName("gate", g.DType)
	if err != nil {
		return fmt.Errorf("cuda: swiglu: %w", err)
	}
	un, err := floatName("up", u.DType)
	if err != nil {
		return fmt.Errorf("cuda: swiglu: %w", err)
	}
	if !slices.Equal(g.Shape, u.Shape) {
		return fmt.Errorf("cuda: swiglu: gate %v and up %v differ in shape", g.Shape, u.Shape)
	}
	if err := checkOut("output", out, promote(g.DType, u.DType), g.Shape); err != nil {
		return fmt.Errorf("cuda: swiglu: %w", err)
	}
	n := int64(g.Numel())
	if n == 0 {
		return nil
	}
	return d.launch("elementwise.cu", "swiglu_"+gn+"_"+un, d.gridStride(n), block256, 0, func(a *cubind.Args) {
		a.Ptr(out.ptr).Ptr(g.ptr).Ptr(u.ptr).I64(n)
	})
}

// Add computes out = a + b with NumPy broadcasting (out has the broadcast shape and dtype
// promote(a, b)), as graph op add. out may be a or b itself when it has that one's shape.
func (d *Device) Add(out, a, b *Tensor) error {
	return d.do(func() error { return d.binary("add", out, a, b) })
}

// Mul computes out = a * b like Add.
func (d *Device) Mul(out, a, b *Tensor) error {
	return d.do(func() error { return d.binary("mul", out, a, b) })
}

func (d *Device) binary(op string, out, a, b *Tensor) error {
	if err := checkLive(out, a, b); err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	an, err := floatName("a", a.DType)
	if err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	bn, err := floatName("b", b.DType)
	if err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	shape, sa, sb, err := broadcastStrides(a.Shape, b.Shape)
	if err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	if err := checkOut("output", out, promote(a.DType, b.DType), shape); err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	n := int64(tensor.Numel(shape))
	if n == 0 {
		return nil
	}
	suffix := an + "_" + bn
	if slices.Equal(a.Shape, b.Shape) {
		return d.launch("elementwise.cu", op+"_flat_"+suffix, d.gridStride(n), block256, 0, func(args *cubind.Args) {
			args.Ptr(out.ptr).Ptr(a.ptr).Ptr(b.ptr).I64(n)
		})
	}
	p, err := newStrided(shape, sa, sb, 0, 0)
	if err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	return d.launch("elementwise.cu", op+"_bcast_"+suffix, d.gridStride(n), block256, 0, func(args *cubind.Args) {
		args.Ptr(out.ptr).Ptr(a.ptr).Ptr(b.ptr).Struct(p)
	})
}

// Cast converts x to out's dtype (f32 or bf16, same shape), rounding to nearest even.
func (d *Device) Cast(out, x *Tensor) error {
	return d.do(func() error { return d.cast(out, x) })
}

func (d *Device) cast(out, x *Tensor) error {
	if err := checkLive(out, x); err != nil {
		return fmt.Errorf("cuda: cast: %w", err)
	}
	if !slices.Equal(out.Shape, x.Shape) {
		return fmt.Errorf("cuda: cast: output %v and input %v differ in shape", out.Shape, x.Shape)
	}
	n := x.Numel()
	return d.copyStrided(out, x, []int{n}, []int64{1}, []int64{1}, 0, 0)
}

// copyStrided copies the iteration space dims from src (element strides ss, offset srcOff)
// to dst (strides ds, offset dstOff), converting between f32 and bf16 when the dtypes
// differ; same dtypes copy raw elements of any type. planCopy picks the kernel: vectors and
// 32-bit index math where the walk allows, else the general kernel.
func (d *Device) copyStrided(dst, src *Tensor, dims []int, ss, ds []int64, srcOff, dstOff int64) error {
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
	grid := d.gridStride(p.w.n())
	if p.is32 {
		grid = d.gridCopy(p.w.n())
	}
	return d.launch("elementwise.cu", p.name, grid, block256, 0, func(a *cubind.Args) {
		a.Ptr(dst.ptr).Ptr(src.ptr).Struct(p.args())
	})
}

// gridCopy returns the grid of the 32-bit copy kernels over n elements, in blocks of 256:
// one element per thread while that takes at most 8 blocks per SM, else up to COPY_UNROLL
// (4, elementwise.cu) per thread and pass, with at most 16 blocks per SM. The bound keeps
// the kernels' 32-bit indices (below 2^31 plus 4 passes of the grid) from overflowing.
func (d *Device) gridCopy(n int64) cubind.Dim3 {
	sms := int64(max(d.info.SMs, 1))
	g := (n + 255) / 256
	if g > 8*sms {
		g = min(max(8*sms, (n+1023)/1024), 16*sms)
	}
	return cubind.Dim3{X: int(max(g, 1)), Y: 1, Z: 1}
}

// SDPA computes causal attention of q[B,H,S,D] over k, v [B,KV,S,D] (H a multiple of KV,
// one dtype f32 or bf16, D <= 256) at positions[B,S] into out[B,H,S,D], with the scores
// scaled by scale and, when window > 0, a sliding window, as graph op sdpa.
func (d *Device) SDPA(out, q, k, v, pos *Tensor, scale float32, window int) error {
	return d.do(func() error { return d.sdpa(out, q, k, v, pos, scale, window) })
}

// Attention tiling; must match attention.cu.
const (
	attWarps = 4
	attRows  = 4
	attBR    = attWarps * attRows
	attBC    = 32
	attMaxD  = 256
)

func (d *Device) sdpa(out, q, k, v, pos *Tensor, scale float32, window int) error {
	if err := checkLive(out, q, k, v, pos); err != nil {
		return fmt.Errorf("cuda: sdpa: %w", err)
	}
	xn, err := floatName("q", q.DType)
	if err != nil {
		return fmt.Errorf("cuda: sdpa: %w", err)
	}
	if k.DType != q.DType || v.DType != q.DType {
		return fmt.Errorf("cuda: sdpa: q, k and v must share a dtype, got %s, %s, %s", q.DType, k.DType, v.DType)
	}
	if _, err := intName("positions", pos.DType); err != nil {
		return fmt.Errorf("cuda: sdpa: %w", err)
	}
	if len(q.Shape) != 4 || len(k.Shape) != 4 || !slices.Equal(k.Shape, v.Shape) {
		return fmt.Errorf("cuda: sdpa: want q [B,H,S,D] and k, v [B,KV,S,D], got %v, %v, %v", q.Shape, k.Shape, v.Shape)
	}
	B, H, S, D, KV := q.Shape[0], q.Shape[1], q.Shape[2], q.Shape[3], k.Shape[1]
	if KV == 0 || H%KV != 0 {
		return fmt.Errorf("cuda: sdpa: query heads %d are not a multiple of KV heads %d", H, KV)
	}
	if k.Shape[0] != B || k.Shape[2] != S || k.Shape[3] != D {
		return fmt.Errorf("cuda: sdpa: q %v and k %v disagree on batch, sequence or head size", q.Shape, k.Shape)
	}
	if !slices.Equal(pos.Shape, []int{B, S}) {
		return fmt.Errorf("cuda: sdpa: positions %v do not match q %v", pos.Shape, q.Shape)
	}
	if D > attMaxD {
		return fmt.Errorf("cuda: sdpa: head size %d is above the kernel's limit %d", D, attMaxD)
	}
	if err := checkOut("output", out, q.DType, q.Shape); err != nil {
		return fmt.Errorf("cuda: sdpa: %w", err)
	}
	if q.Numel() == 0 {
		return nil
	}
	if B > 65535 || H > 65535 {
		return fmt.Errorf("cuda: sdpa: batch %d or heads %d above the grid limit 65535", B, H)
	}
	// Instantiated head-size classes: values per lane 1, 2, 3, 4 or 8 (D up to 32, 64, 96,
	// 128, 256).
	dl := (D + 31) / 32
	if dl > 4 {
		dl = 8
	}
	shared := 4*(attBC*(D+1)+attBC*D+attBR*D+(attBR*D)%2) + 8*attBC
	name := fmt.Sprintf("sdpa_%s_d%d", xn, dl)
	inst := fmt.Sprintf("SDPA(%s, %s, %d)", strings.ToUpper(xn), xn, dl)
	pos64 := int32(0)
	if pos.DType == tensor.I64 {
		pos64 = 1
	}
	grid := cubind.Dim3{X: (S + attBR - 1) / attBR, Y: H, Z: B}
	return d.launchX("attention.cu", inst, name, grid, cubind.Dim3{X: attWarps * 32, Y: 1, Z: 1}, shared, func(a *cubind.Args) {
		a.Ptr(out.ptr).Ptr(q.ptr).Ptr(k.ptr).Ptr(v.ptr).Ptr(pos.ptr).I32(pos64).I32(int32(H)).I32(int32(KV)).I32(int32(S)).
			I32(int32(D)).F32(scale).I32(int32(window))
	})
}

// Argmax writes to out i32[...] the index of the largest element along the last axis of
// x[...,V] (f32 or bf16): the lowest index on ties; NaN never wins (a row that starts with
// NaN gives 0, as sample.Argmax does).
func (d *Device) Argmax(out, x *Tensor) error {
	return d.do(func() error { return d.argmax(out, x) })
}

func (d *Device) argmax(out, x *Tensor) error {
	if err := checkLive(out, x); err != nil {
		return fmt.Errorf("cuda: argmax: %w", err)
	}
	xn, err := floatName("x", x.DType)
	if err != nil {
		return fmt.Errorf("cuda: argmax: %w", err)
	}
	if len(x.Shape) == 0 || x.Shape[len(x.Shape)-1] == 0 {
		return fmt.Errorf("cuda: argmax: x %v needs a non-empty last axis", x.Shape)
	}
	rowsShape := x.Shape[:len(x.Shape)-1]
	if err := checkOut("output", out, tensor.I32, rowsShape); err != nil {
		return fmt.Errorf("cuda: argmax: %w", err)
	}
	rows, V := tensor.Numel(rowsShape), x.Shape[len(x.Shape)-1]
	if rows == 0 {
		return nil
	}
	return d.launch("argmax.cu", "argmax_"+xn, cubind.Dim3{X: rows, Y: 1, Z: 1}, cubind.Dim3{X: 512, Y: 1, Z: 1}, 0, func(a *cubind.Args) {
		a.Ptr(out.ptr).Ptr(x.ptr).I32(int32(V))
	})
}

// Linear computes out[...,N] = x[...,K] @ w[N,K]ᵀ through cuBLAS with f32 accumulation, out
// of x's dtype, as graph op linear. bf16 x and w multiply as bf16 (one rounding, at the
// end); f32 x and w as f32; f32 x with bf16 w is rounded to bf16 first (a bf16 GEMM with an
// f32 result).
func (d *Device) Linear(out, x, w *Tensor) error {
	return d.do(func() error { return d.linear(out, x, w) })
}

func (d *Device) linear(out, x, w *Tensor) error {
	if err := checkLive(out, x, w); err != nil {
		return fmt.Errorf("cuda: linear: %w", err)
	}
	if len(w.Shape) != 2 || len(x.Shape) < 1 || x.Shape[len(x.Shape)-1] != w.Shape[1] {
		return fmt.Errorf("cuda: linear: x %v does not fit weight %v ([N,K])", x.Shape, w.Shape)
	}
	N, K := w.Shape[0], w.Shape[1]
	M := x.Numel() / max(K, 1)
	if K == 0 {
		M = tensor.Numel(x.Shape[:len(x.Shape)-1])
	}
	oshape := append(slices.Clone(x.Shape[:len(x.Shape)-1]), N)
	if err := checkOut("output", out, x.DType, oshape); err != nil {
		return fmt.Errorf("cuda: linear: %w", err)
	}
	if M == 0 || N == 0 {
		return nil
	}
	if K == 0 {
		return wrap("cuda: linear", d.memset8(out.ptr, 0, uint64(out.Bytes())))
	}
	if max(M, N, K) > 1<<31-1 {
		return fmt.Errorf("cuda: linear: %dx%dx%d exceeds cuBLAS's 32-bit sizes", M, N, K)
	}
	if ok, err := d.gemv(out, x, w); ok || err != nil {
		return err
	}
	return d.gemm(out, x, w, M, N, K)
}

func wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}
