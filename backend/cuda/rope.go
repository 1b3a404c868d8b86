package cuda

import (
	"fmt"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// The rotary embedding (graph op rope, kernels/rope.cu).

func init() {
	opKernels["rope"] = &opKernel{
		prepare: uploadInvFreq,
		run: func(d *Device, n *graph.Node, in, out []*Tensor, state any) error {
			return rope(d, out[0], out[1], in[0], in[1], in[2], state.(*Tensor), float32(n.Attrs.Float("scaling")))
		},
	}
}

// Rope rotates q[B,H,S,D] and k[B,KV,S,D] (one dtype, f32 or bf16) at positions[B,S] (i32
// or i64) into qOut and kOut of the same shapes and dtype, with invFreq f32[D/2] and
// scaling, as graph op rope.
func Rope(d *Device, qOut, kOut, q, k, pos, invFreq *Tensor, scaling float32) error {
	return d.do(func() error { return rope(d, qOut, kOut, q, k, pos, invFreq, scaling) })
}

func rope(d *Device, qOut, kOut, q, k, pos, invFreq *Tensor, scaling float32) error {
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

// uploadInvFreq puts a rotary node's inv_freq attribute on the device as f32, for the rope
// kernels.
func uploadInvFreq(d *Device, n *graph.Node) (any, error) {
	inv := n.Attrs.Floats("inv_freq")
	f := make([]float32, len(inv))
	for i, v := range inv {
		f[i] = float32(v)
	}
	return d.upload(tensor.FromF32(f, len(f)))
}
