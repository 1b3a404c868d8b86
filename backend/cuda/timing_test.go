package cuda

import (
	"fmt"
	"os"
	"testing"

	"github.com/loom-ml/loom/tensor"
)

// TestTimings measures the kernels on Llama-3.1-8B prefill shapes (4096 tokens) when
// LOOM_CUDA_TIMINGS=1; it logs time per call and achieved bandwidth or arithmetic rate.
func TestTimings(t *testing.T) {
	d := gpu(t)
	if os.Getenv("LOOM_CUDA_TIMINGS") != "1" {
		t.Skip("set LOOM_CUDA_TIMINGS=1 to time the kernels")
	}
	zeros := func(dt tensor.DType, shape ...int) *Tensor { return zeroed(t, d, dt, shape...) }
	timeIt := func(name string, bytes, flops float64, f func() error) {
		t.Helper()
		per, err := wallTime(d, 2, 10, f)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		el := per.Seconds()
		msg := ""
		if bytes > 0 {
			msg += fmt.Sprintf(" (%.0f GB/s)", bytes/el/1e9)
		}
		if flops > 0 {
			msg += fmt.Sprintf(" (%.1f TFLOP/s)", flops/el/1e12)
		}
		t.Logf("%-52s %9.1f µs%s", name, el*1e6, msg)
	}
	const T, Hd, I, V, H, KV, D = 4096, 4096, 14336, 128256, 32, 8, 128
	bf := tensor.BF16
	x, w, o := zeros(bf, T, Hd), zeros(bf, Hd), zeros(bf, T, Hd)
	timeIt("rmsnorm bf16 [4096,4096]", 2*2*T*Hd, 0, func() error { return RMSNorm(d, o, x, w, 1e-5) })
	r, s := zeros(bf, T, Hd), zeros(bf, T, Hd)
	timeIt("add_rmsnorm bf16 [4096,4096]", 4*2*T*Hd, 0, func() error { return AddRMSNorm(d, o, s, x, r, w, 1e-5) })
	g, u, y := zeros(bf, T, I), zeros(bf, T, I), zeros(bf, T, I)
	timeIt("swiglu bf16 [4096,14336]", 3*2*T*I, 0, func() error { return SwiGLU(d, y, g, u) })
	q, k := zeros(bf, 1, H, T, D), zeros(bf, 1, KV, T, D)
	qo, ko := zeros(bf, 1, H, T, D), zeros(bf, 1, KV, T, D)
	pos := zeros(tensor.I32, 1, T)
	inv := zeros(tensor.F32, D/2)
	timeIt("rope bf16 q[1,32,4096,128] k[1,8,4096,128]", 2*2*float64((H+KV)*T*D), 0, func() error { return Rope(d, qo, ko, q, k, pos, inv, 1) })
	for _, S := range []int{512, 4096} {
		qq, kk, vv, oo := zeros(bf, 1, H, S, D), zeros(bf, 1, KV, S, D), zeros(bf, 1, KV, S, D), zeros(bf, 1, H, S, D)
		ps, err := d.Upload(positions(S))
		if err != nil {
			t.Fatal(err)
		}
		flops := 4 * float64(S) * float64(S+1) / 2 * D * H
		timeIt(fmt.Sprintf("sdpa bf16 causal B1 H32 KV8 D128 S%d", S), 0, flops, func() error { return SDPA(d, oo, qq, kk, vv, ps, 0.088, 0) })
		d.Free(ps)
	}
	wq := zeros(bf, Hd, Hd)
	timeIt("linear bf16 [4096,4096] x [4096,4096]^T", 0, 2*float64(T)*Hd*Hd, func() error { return Linear(d, o, x, wq) })
	wg, yg := zeros(bf, I, Hd), zeros(bf, T, I)
	timeIt("linear bf16 [4096,4096] x [14336,4096]^T", 0, 2*float64(T)*Hd*I, func() error { return Linear(d, yg, x, wg) })
	x1, y1 := zeros(bf, 1, Hd), zeros(bf, 1, I)
	timeIt("linear bf16 [1,4096] x [14336,4096]^T (decode)", 2*float64(I)*Hd, 0, func() error { return Linear(d, y1, x1, wg) })
	tab, ids, e := zeros(bf, V, Hd), zeros(tensor.I32, T), zeros(bf, T, Hd)
	timeIt("embedding bf16 [128256,4096] x 4096 ids", 2*2*T*Hd, 0, func() error { return Embedding(d, e, tab, ids) })
	lg, am := zeros(bf, 64, V), zeros(tensor.I32, 64)
	timeIt("argmax bf16 [64,128256]", 2*64*V, 0, func() error { return Argmax(d, am, lg) })
	tr := zeros(bf, 1, T, H, D)
	trOut := zeros(bf, 1, H, T, D)
	timeIt("transpose bf16 [1,4096,32,128] -> [1,32,4096,128]", 2*2*float64(T*H*D), 0, func() error { return Transpose(d, trOut, tr, []int{0, 2, 1, 3}) })
}

func positions(S int) *tensor.Tensor {
	p := tensor.New(tensor.I32, 1, S)
	for i := range S {
		p.I32[i] = int32(i)
	}
	return p
}
