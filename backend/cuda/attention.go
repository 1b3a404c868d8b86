package cuda

import (
	"fmt"
	"slices"
	"strings"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Causal attention without a cache (graph op sdpa, kernels/attention.cu).

func init() {
	opKernels["sdpa"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		return sdpa(d, out[0], in[0], in[1], in[2], in[3], float32(n.Attrs.Float("scale")), n.Attrs.Int("window"))
	}}
}

// SDPA computes causal attention of q[B,H,S,D] over k, v [B,KV,S,D] (H a multiple of KV,
// one dtype f32 or bf16, D <= 256) at positions[B,S] into out[B,H,S,D], with the scores
// scaled by scale and, when window > 0, a sliding window, as graph op sdpa.
func SDPA(d *Device, out, q, k, v, pos *Tensor, scale float32, window int) error {
	return d.do(func() error { return sdpa(d, out, q, k, v, pos, scale, window) })
}

// Attention tiling; must match attention.cu.
const (
	attWarps = 4
	attRows  = 4
	attBR    = attWarps * attRows
	attBC    = 32
	attMaxD  = 256
)

func sdpa(d *Device, out, q, k, v, pos *Tensor, scale float32, window int) error {
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
