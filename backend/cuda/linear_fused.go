package cuda

import (
	"fmt"
	"strings"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Kernels of the linears fused with the packed op that reads their output, linear_swiglu and
// linear_qkv_rope (graph/catalog_fused.go). Where the decode GEMV takes the product (few rows,
// see planGemv) one kernel computes it and applies swiglu, or lays out and rotates q and k, in
// its epilogue (kernels/gemv.cu): the packed projections are never written, and the packed
// op's launch is gone. Elsewhere the linear runs into the step's workspace and the packed
// op's kernel reads it, as the two ops would run apart. Either way the bits are those of
// linear followed by swiglu_packed or qkv_rope.

// linearState is the compile-time state of linear and the fused linears: the weight widened
// to f32 (Options.ExactF32Linear; nil when not), and linear_qkv_rope's inverse frequencies.
type linearState struct {
	wide, invFreq *Tensor
}

// linearOps are the ops whose inputs 0 and 1 are a linear's x and w.
var linearOps = map[string]bool{"linear": true, "linear_swiglu": true, "linear_qkv_rope": true}

// weight returns the weight a linear step multiplies by: the widened one when there is one.
func (s *linearState) weight(w *Tensor) *Tensor {
	if s != nil && s.wide != nil {
		return s.wide
	}
	return w
}

func init() {
	opKernels["linear_swiglu"] = &opKernel{
		prepare:   func(*Device, *graph.Node) (any, error) { return &linearState{}, nil },
		workspace: linearWorkspace,
		run: func(d *Device, n *graph.Node, in, out []*Tensor, state any) error {
			return linearSwiGLU(d, out[0], in[0], state.(*linearState).weight(in[1]), out[1])
		},
	}
	opKernels["linear_qkv_rope"] = &opKernel{
		prepare: func(d *Device, n *graph.Node) (any, error) {
			inv, err := uploadInvFreq(d, n)
			if err != nil {
				return nil, err
			}
			return &linearState{invFreq: inv.(*Tensor)}, nil
		},
		workspace: linearWorkspace,
		run: func(d *Device, n *graph.Node, in, out []*Tensor, state any) error {
			st := state.(*linearState)
			return linearQKVRope(d, out[0], out[1], out[2], in[0], st.weight(in[1]), in[2], st.invFreq, out[3],
				n.Attrs.Int("heads"), n.Attrs.Int("kv_heads"), float32(n.Attrs.Float("scaling")))
		},
	}
}

// linearWorkspace is the bytes of a fused linear's packed projections [...,N] in x's dtype,
// where they go when the GEMV does not take the product.
func linearWorkspace(n *graph.Node, in [][]int) int64 {
	x, w := in[0], in[1]
	if len(x) < 1 || len(w) != 2 || x[len(x)-1] == 0 {
		return 0
	}
	return int64(tensor.Numel(x)/x[len(x)-1]) * int64(w[0]) * int64(n.Inputs[0].Type.DType.Size())
}

// fusedGemvPlan is planGemv's plan for a fused linear, with a tiling of an even number of
// rows per warp (the epilogue pairs rows: gate and up, or the two halves of a rotation), or
// false when the product goes through linear. half > 0 plans linear_qkv_rope for heads of
// 2*half (a warp's rotation pairs stay in one head, so their count must divide half).
//
// Measured on an H200 (TestLinearFusedTimings with LOOM_GEMV_SWEEP=1, graph-replayed µs,
// Llama-3.1-8B decode shapes, M=1): linear_swiglu keeps linear's tiling made even (twice the
// rows, half the unroll): tp=2 4096->2×7168 27.7 (the other tilings 27.5-29.9), tp=1
// 4096->2×14336 53.0 (52.9-53.6). linear_qkv_rope takes 4 rows (two pairs) per warp, 4
// loads in flight per lane and 8 warps: tp=2 4096->3072 8.0 against 8.9 with linear's made
// even (rows 2, unroll 4), tp=1 4096->6144 14.1 against 16.9.
func fusedGemvPlan(x, w *Tensor, half int) (gemvPlan, bool) {
	p, ok := planGemv(x, w)
	if !ok {
		return gemvPlan{}, false
	}
	if p.cfg.rows%2 != 0 { // the same loads in flight per lane: twice the rows, half the unroll
		p.cfg.rows *= 2
		p.cfg.unroll = max(1, p.cfg.unroll/2)
	}
	if half > 0 && p.M == 1 && gemvTiling == nil && half%2 == 0 {
		p.cfg = gemvConfig{rows: 4, unroll: 4, warps: 8}
	}
	if half > 0 && half%(p.cfg.rows/2) != 0 {
		p.cfg.rows, p.cfg.unroll = 2, max(1, p.cfg.unroll*p.cfg.rows/2)
	}
	return p, true
}

// LinearSwiGLU runs graph op linear_swiglu: out[...,I] = silu(g) * u of the packed
// projections [g|u] = x[...,K] · w[2I,K]ᵀ, rounded to x's dtype, as Linear then SwiGLUPacked
// compute it. ws (nil, or at least linearWorkspace bytes) takes the projections when the
// GEMV does not; without it such products are an error. Nothing is allocated.
func LinearSwiGLU(d *Device, out, x, w, ws *Tensor) error {
	return d.do(func() error { return linearSwiGLU(d, out, x, w, ws) })
}

func linearSwiGLU(d *Device, out, x, w, ws *Tensor) error {
	if err := checkLive(out, x, w); err != nil {
		return fmt.Errorf("cuda: linear_swiglu: %w", err)
	}
	if len(w.Shape) != 2 || len(x.Shape) < 1 || x.Shape[len(x.Shape)-1] != w.Shape[1] || w.Shape[0]%2 != 0 {
		return fmt.Errorf("cuda: linear_swiglu: x %v does not fit weight %v ([2I,K])", x.Shape, w.Shape)
	}
	I := w.Shape[0] / 2
	oshape := append(append([]int(nil), x.Shape[:len(x.Shape)-1]...), I)
	if err := checkOut("output", out, x.DType, oshape); err != nil {
		return fmt.Errorf("cuda: linear_swiglu: %w", err)
	}
	p, ok := fusedGemvPlan(x, w, 0)
	if !ok {
		y, err := packedScratch(d, "linear_swiglu", ws, x, w)
		if err != nil {
			return err
		}
		if err := linear(d, y, x, w); err != nil {
			return err
		}
		return swigluPacked(d, out, y)
	}
	c := p.cfg
	xn := dtypeName(x.DType)
	name := fmt.Sprintf("gemv_swiglu_%s_m%d_r%d_u%d", xn, p.M, c.rows, c.unroll)
	inst := fmt.Sprintf("GEMV_SWIGLU(%s, %d, %d, %d, %s)", name, p.M, c.rows, c.unroll, strings.ToUpper(xn))
	perBlock := c.rows / 2 * c.warps
	grid := cubind.Dim3{X: (I + perBlock - 1) / perBlock, Y: 1, Z: 1}
	err := d.launchX("gemv.cu", inst, name, grid, cubind.Dim3{X: 32 * c.warps, Y: 1, Z: 1}, 0, func(a *cubind.Args) {
		a.Ptr(out.ptr).Ptr(x.ptr).Ptr(w.ptr).I32(int32(I)).I32(int32(p.K))
	})
	return wrap("cuda: linear_swiglu (gemv)", err)
}

// packedScratch is the packed projections x · wᵀ as a tensor of x's dtype in the workspace.
func packedScratch(d *Device, op string, ws, x, w *Tensor) (*Tensor, error) {
	shape := append(append([]int(nil), x.Shape[:len(x.Shape)-1]...), w.Shape[0])
	need := tensor.Numel(shape) * x.DType.Size()
	if ws == nil || ws.Bytes() < need {
		return nil, fmt.Errorf("cuda: %s: the product %s%v needs %d bytes of workspace", op, x.DType, shape, need)
	}
	return workspaceTensor(ws, x.DType, shape), nil
}

// LinearQKVRoPE runs graph op linear_qkv_rope: the packed projections x[B,S,K] · w[(H +
// 2*KV)*D, K]ᵀ rounded to x's dtype, laid out and rotated as QKVRoPE does (q[B,H,S,D],
// k[B,KV,S,D], v[B,KV,S,D], positions[B,S] i32 or i64, invFreq f32[D/2]). ws is as for
// LinearSwiGLU.
func LinearQKVRoPE(d *Device, qOut, kOut, vOut, x, w, pos, invFreq, ws *Tensor, heads, kvHeads int, scaling float32) error {
	return d.do(func() error {
		return linearQKVRope(d, qOut, kOut, vOut, x, w, pos, invFreq, ws, heads, kvHeads, scaling)
	})
}

func linearQKVRope(d *Device, qOut, kOut, vOut, x, w, pos, invFreq, ws *Tensor, H, KV int, scaling float32) error {
	if err := checkLive(qOut, kOut, vOut, x, w, pos, invFreq); err != nil {
		return fmt.Errorf("cuda: linear_qkv_rope: %w", err)
	}
	if len(w.Shape) != 2 || len(x.Shape) != 3 || x.Shape[2] != w.Shape[1] {
		return fmt.Errorf("cuda: linear_qkv_rope: x %v does not fit weight %v ([N,K])", x.Shape, w.Shape)
	}
	p, ok := fusedGemvPlan(x, w, invFreq.Numel())
	if !ok || len(pos.Shape) != 2 || x.Shape[0]*x.Shape[1] != p.M {
		y, err := packedScratch(d, "linear_qkv_rope", ws, x, w)
		if err != nil {
			return err
		}
		if err := linear(d, y, x, w); err != nil {
			return err
		}
		return qkvRope(d, qOut, kOut, vOut, y, pos, invFreq, H, KV, scaling)
	}
	sh, err := checkQKVRope([]int{x.Shape[0], x.Shape[1], w.Shape[0]}, x.DType, pos, invFreq, [3]*Tensor{qOut, kOut, vOut}, H, KV)
	if err != nil {
		return fmt.Errorf("cuda: linear_qkv_rope: %w", err)
	}
	S, half, pn := sh.S, sh.half, sh.pn
	c := p.cfg
	xn := dtypeName(x.DType)
	name := fmt.Sprintf("gemv_qkv_rope_%s_%s_m%d_r%d_u%d", xn, pn, p.M, c.rows, c.unroll)
	inst := fmt.Sprintf("GEMV_QKV_ROPE(%s, %d, %d, %d, %s, %s)", name, p.M, c.rows, c.unroll, strings.ToUpper(xn), map[string]string{"i32": "int", "i64": "i64"}[pn])
	perBlock := c.rows / 2 * c.warps
	grid := cubind.Dim3{X: ((H+2*KV)*half + perBlock - 1) / perBlock, Y: 1, Z: 1}
	err = d.launchX("gemv.cu", inst, name, grid, cubind.Dim3{X: 32 * c.warps, Y: 1, Z: 1}, 0, func(a *cubind.Args) {
		a.Ptr(qOut.ptr).Ptr(kOut.ptr).Ptr(vOut.ptr).Ptr(x.ptr).Ptr(w.ptr).Ptr(pos.ptr).Ptr(invFreq.ptr).
			I32(int32(H)).I32(int32(KV)).I32(int32(S)).I32(int32(half)).F32(scaling).I32(ropeScaled(scaling)).I32(int32(p.K))
	})
	return wrap("cuda: linear_qkv_rope (gemv)", err)
}
