package cuda

import (
	"fmt"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Kernels of the fused ops over packed projections, qkv_rope, qkv_norm_rope and swiglu_packed (see
// graph/catalog_fused.go): they read the output of a fused q/k/v or gate/up GEMM in place
// instead of its split copies. Kernels are in kernels/packed.cu.

func init() {
	opKernels["qkv_rope"] = &opKernel{
		prepare: uploadInvFreq,
		run: func(d *Device, n *graph.Node, in, out []*Tensor, state any) error {
			return qkvRope(d, out[0], out[1], out[2], in[0], in[1], state.(*Tensor),
				n.Attrs.Int("heads"), n.Attrs.Int("kv_heads"), float32(n.Attrs.Float("scaling")))
		},
	}
	opKernels["qkv_norm_rope"] = &opKernel{
		prepare:  uploadInvFreq,
		supports: qkvNormRopeSupports,
		run: func(d *Device, n *graph.Node, in, out []*Tensor, state any) error {
			return qkvNormRope(d, out[0], out[1], out[2], in[0], in[1], in[2], in[3], state.(*Tensor),
				n.Attrs.Int("heads"), n.Attrs.Int("kv_heads"), float32(n.Attrs.Float("scaling")), float32(n.Attrs.Float("eps")))
		},
	}
	opKernels["swiglu_packed"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		return swigluPacked(d, out[0], in[0])
	}}
}

// qkvRopeSpan is how many work items of a token row (rotation pairs of q and k, elements of
// v) one block of qkv_rope serves: a row is spread over several blocks, so that decoding a
// few tokens still fills several SMs.
const qkvRopeSpan = 512

// QKVRoPE runs graph op qkv_rope: x[B,S,(H+2*KV)*D] (f32 or bf16) holds per token H heads
// of q, then KV of k, then KV of v; positions[B,S] is i32 or i64 and invFreq f32[D/2]. It
// writes q[B,H,S,D] and k[B,KV,S,D] rotated as Rope rotates them, and v[B,KV,S,D], all of
// x's dtype. One kernel launch whose configuration depends only on the shapes; nothing is
// allocated, so it can be captured in a CUDA graph.
func QKVRoPE(d *Device, qOut, kOut, vOut, x, pos, invFreq *Tensor, heads, kvHeads int, scaling float32) error {
	return d.do(func() error { return qkvRope(d, qOut, kOut, vOut, x, pos, invFreq, heads, kvHeads, scaling) })
}

func qkvRope(d *Device, qOut, kOut, vOut, x, pos, invFreq *Tensor, H, KV int, scaling float32) error {
	if err := checkLive(qOut, kOut, vOut, x, pos, invFreq); err != nil {
		return fmt.Errorf("cuda: qkv_rope: %w", err)
	}
	xn, err := floatName("x", x.DType)
	if err != nil {
		return fmt.Errorf("cuda: qkv_rope: %w", err)
	}
	sh, err := checkQKVRope(x.Shape, x.DType, pos, invFreq, [3]*Tensor{qOut, kOut, vOut}, H, KV)
	if err != nil {
		return fmt.Errorf("cuda: qkv_rope: %w", err)
	}
	B, S, half, D, pn := sh.B, sh.S, sh.half, 2*sh.half, sh.pn
	rows, total := B*S, (H+KV)*half+KV*D
	if rows == 0 {
		return nil
	}
	blocks := (total + qkvRopeSpan - 1) / qkvRopeSpan
	if rows > 1<<31-1 || blocks > 65535 || (H+2*KV)*D > 1<<31-1 {
		return fmt.Errorf("cuda: qkv_rope: %d rows of %d work items exceed the grid", rows, total)
	}
	grid := cubind.Dim3{X: rows, Y: blocks, Z: 1}
	return d.launch("packed.cu", "qkv_rope_"+xn+"_"+pn, grid, block256, 8*half, func(a *cubind.Args) {
		a.Ptr(qOut.ptr).Ptr(kOut.ptr).Ptr(vOut.ptr).Ptr(x.ptr).Ptr(pos.ptr).Ptr(invFreq.ptr).
			I32(int32(H)).I32(int32(KV)).I32(int32(S)).I32(int32(half)).F32(scaling).I32(ropeScaled(scaling)).I32(qkvRopeSpan)
	})
}

// qkvNormRopeSupports tells whether qkv_norm_rope's kernel takes node n: f32 or bf16 x, and
// norm weights of f32 or bf16 whose promotion with x's dtype is x's dtype (bf16 x with f32
// weights would make f32 q and k beside a bf16 v). Other nodes run as the decomposition.
func qkvNormRopeSupports(n *graph.Node) error {
	x := n.Inputs[0].Type.DType
	for _, w := range []*graph.Value{n.Inputs[1], n.Inputs[2]} {
		if err := qkvNormDTypes(x, w.Type.DType); err != nil {
			return err
		}
	}
	return nil
}

func qkvNormDTypes(x, w tensor.DType) error {
	if _, err := floatName("x", x); err != nil {
		return err
	}
	if _, err := floatName("the norm weight", w); err != nil {
		return err
	}
	if p, err := graph.Promote(w, x); err != nil || p != x {
		return fmt.Errorf("norm weights of %s with x of %s give another dtype than x's", w, x)
	}
	return nil
}

// QKVNormRoPE runs graph op qkv_norm_rope: QKVRoPE with each head of q normalised by
// qNorm[D] and each of k by kNorm[D] (eps) before the rotation, as RMSNorm normalises a row.
// x and the outputs are f32 or bf16; the weights f32 or bf16 whose promotion with x's dtype
// is x's dtype. One kernel launch; nothing is allocated.
func QKVNormRoPE(d *Device, qOut, kOut, vOut, x, qNorm, kNorm, pos, invFreq *Tensor, heads, kvHeads int, scaling, eps float32) error {
	return d.do(func() error {
		return qkvNormRope(d, qOut, kOut, vOut, x, qNorm, kNorm, pos, invFreq, heads, kvHeads, scaling, eps)
	})
}

func qkvNormRope(d *Device, qOut, kOut, vOut, x, qNorm, kNorm, pos, invFreq *Tensor, H, KV int, scaling, eps float32) error {
	if err := checkLive(qOut, kOut, vOut, x, qNorm, kNorm, pos, invFreq); err != nil {
		return fmt.Errorf("cuda: qkv_norm_rope: %w", err)
	}
	sh, err := checkQKVRope(x.Shape, x.DType, pos, invFreq, [3]*Tensor{qOut, kOut, vOut}, H, KV)
	if err != nil {
		return fmt.Errorf("cuda: qkv_norm_rope: %w", err)
	}
	D := 2 * sh.half
	for i, w := range []*Tensor{qNorm, kNorm} {
		name := []string{"q_norm", "k_norm"}[i]
		if err := qkvNormDTypes(x.DType, w.DType); err != nil {
			return fmt.Errorf("cuda: qkv_norm_rope: %s: %w", name, err)
		}
		if w.DType != qNorm.DType || len(w.Shape) != 1 || w.Shape[0] != D {
			return fmt.Errorf("cuda: qkv_norm_rope: %s is %s%v, want [%d] of one dtype with q_norm", name, w.DType, w.Shape, D)
		}
	}
	rows := sh.B * sh.S
	if rows == 0 {
		return nil
	}
	blocks := (H + 2*KV + 7) / 8 // a warp per head, 8 warps a block
	if rows > 1<<31-1 || blocks > 65535 || (H+2*KV)*D > 1<<31-1 {
		return fmt.Errorf("cuda: qkv_norm_rope: %d rows of %d heads exceed the grid", rows, H+2*KV)
	}
	name := "qkv_norm_rope_" + dtypeName(x.DType) + "_" + dtypeName(qNorm.DType) + "_" + sh.pn
	grid := cubind.Dim3{X: rows, Y: blocks, Z: 1}
	return d.launch("packed.cu", name, grid, block256, 8*sh.half, func(a *cubind.Args) {
		a.Ptr(qOut.ptr).Ptr(kOut.ptr).Ptr(vOut.ptr).Ptr(x.ptr).Ptr(qNorm.ptr).Ptr(kNorm.ptr).Ptr(pos.ptr).Ptr(invFreq.ptr).
			I32(int32(H)).I32(int32(KV)).I32(int32(sh.S)).I32(int32(sh.half)).F32(scaling).I32(ropeScaled(scaling)).F32(eps)
	})
}

// qkvRopeShape is what checkQKVRope finds: the token grid [B,S], half the head size, and
// the positions' dtype name.
type qkvRopeShape struct {
	B, S, half int
	pn         string
}

// checkQKVRope checks the operands of qkv_rope over packed projections of shape packed and
// dtype dt (x[B,S,(H+2*KV)*D], or the product a fused linear computes): positions[B,S] i32
// or i64, invFreq f32[D/2], H and KV heads, and q, k, v outputs [B,heads,S,D] of dt.
func checkQKVRope(packed []int, dt tensor.DType, pos, invFreq *Tensor, outs [3]*Tensor, H, KV int) (qkvRopeShape, error) {
	var sh qkvRopeShape
	pn, err := intName("positions", pos.DType)
	if err != nil {
		return sh, err
	}
	if len(pos.Shape) != 2 {
		return sh, fmt.Errorf("positions must be [B,S], got %v", pos.Shape)
	}
	if invFreq.DType != tensor.F32 || len(invFreq.Shape) != 1 || invFreq.Shape[0] < 1 {
		return sh, fmt.Errorf("inv_freq must be f32[D/2], got %s%v", invFreq.DType, invFreq.Shape)
	}
	sh = qkvRopeShape{B: pos.Shape[0], S: pos.Shape[1], half: invFreq.Shape[0], pn: pn}
	D := 2 * sh.half
	if H < 1 || KV < 1 {
		return sh, fmt.Errorf("needs heads and kv_heads >= 1, got %d and %d", H, KV)
	}
	if len(packed) != 3 || packed[0] != sh.B || packed[1] != sh.S || packed[2] != (H+2*KV)*D {
		return sh, fmt.Errorf("the packed projections %v do not fit positions %v with %d+2*%d heads of %d", packed, pos.Shape, H, KV, D)
	}
	for i, o := range outs {
		nh := []int{H, KV, KV}[i]
		if err := checkOut([]string{"q output", "k output", "v output"}[i], o, dt, []int{sh.B, nh, sh.S, D}); err != nil {
			return sh, err
		}
	}
	return sh, nil
}

// ropeScaled is the kernels' flag for a scaling other than 1 (cos and sin multiplied).
func ropeScaled(scaling float32) int32 {
	if scaling != 1 {
		return 1
	}
	return 0
}

// SwiGLUPacked runs graph op swiglu_packed: x[...,2I] (f32 or bf16; gate the first I of each
// row, up the last I) -> out[...,I] of x's dtype, silu(gate) * up computed as SwiGLU computes
// it. One grid-stride launch; nothing is allocated.
func SwiGLUPacked(d *Device, out, x *Tensor) error {
	return d.do(func() error { return swigluPacked(d, out, x) })
}

func swigluPacked(d *Device, out, x *Tensor) error {
	if err := checkLive(out, x); err != nil {
		return fmt.Errorf("cuda: swiglu_packed: %w", err)
	}
	xn, err := floatName("x", x.DType)
	if err != nil {
		return fmt.Errorf("cuda: swiglu_packed: %w", err)
	}
	if len(x.Shape) == 0 || x.Shape[len(x.Shape)-1]%2 != 0 {
		return fmt.Errorf("cuda: swiglu_packed: x %v has no even last axis", x.Shape)
	}
	shape := append([]int(nil), x.Shape...)
	I := shape[len(shape)-1] / 2
	shape[len(shape)-1] = I
	if err := checkOut("output", out, x.DType, shape); err != nil {
		return fmt.Errorf("cuda: swiglu_packed: %w", err)
	}
	n := int64(tensor.Numel(shape))
	if n == 0 {
		return nil
	}
	return d.launch("packed.cu", "swiglu_packed_"+xn, gridStride(d, n), block256, 0, func(a *cubind.Args) {
		a.Ptr(out.ptr).Ptr(x.ptr).I64(int64(I)).I64(n)
	})
}
