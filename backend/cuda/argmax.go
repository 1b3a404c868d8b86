package cuda

import (
	"fmt"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/tensor"
)

// The argmax over the last axis (kernels/argmax.cu; no graph op: tests and samplers use it).

// Argmax writes to out i32[...] the index of the largest element along the last axis of
// x[...,V] (f32 or bf16): the lowest index on ties; NaN never wins (a row that starts with
// NaN gives 0, as sample.Argmax does).
func Argmax(d *Device, out, x *Tensor) error {
	return d.do(func() error { return argmax(d, out, x) })
}

func argmax(d *Device, out, x *Tensor) error {
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
