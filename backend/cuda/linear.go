package cuda

import (
	"fmt"
	"slices"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// The GEMM of graph op linear: the decode GEMV (gemv.go) or cuBLAS (gemm_tune.go).

func init() {
	opKernels["linear"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, state any) error {
		st, _ := state.(*linearState) // the weight widened to f32 at compile time, if it was
		return linear(d, out[0], in[0], st.weight(in[1]))
	}}
}

// Linear computes out[...,N] = x[...,K] @ w[N,K]ᵀ through cuBLAS with f32 accumulation, out
// of x's dtype, as graph op linear. bf16 x and w multiply as bf16 (one rounding, at the
// end); f32 x and w as f32; f32 x with bf16 w is rounded to bf16 first (a bf16 GEMM with an
// f32 result).
func Linear(d *Device, out, x, w *Tensor) error {
	return d.do(func() error { return linear(d, out, x, w) })
}

func linear(d *Device, out, x, w *Tensor) error {
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
	if ok, err := gemv(d, out, x, w); ok || err != nil {
		return err
	}
	return gemm(d, out, x, w, M, N, K)
}
