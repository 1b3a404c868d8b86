package cuda

import (
	"fmt"
	"slices"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Elementwise kernels of kernels/elementwise.cu: swiglu, add and mul, cast. add, mul and
// cast of integers and bools go to primitive.cu's kernels (primitive.go).

func init() {
	opKernels["swiglu"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		return swiglu(d, out[0], in[0], in[1])
	}}
	opKernels["add"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		return addMulAny(d, "add", out[0], in[0], in[1])
	}}
	opKernels["mul"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		return addMulAny(d, "mul", out[0], in[0], in[1])
	}}
	opKernels["cast"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		return castAny(d, out[0], in[0])
	}}
}

// SwiGLU computes out = silu(gate) * up elementwise (gate and up of one shape; out of dtype
// promote(gate, up)), as graph op swiglu. out may be gate or up itself.
func SwiGLU(d *Device, out, gate, up *Tensor) error {
	return d.do(func() error { return swiglu(d, out, gate, up) })
}

func swiglu(d *Device, out, g, u *Tensor) error {
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
	return d.launch("elementwise.cu", "swiglu_"+gn+"_"+un, gridStride(d, n), block256, 0, func(a *cubind.Args) {
		a.Ptr(out.ptr).Ptr(g.ptr).Ptr(u.ptr).I64(n)
	})
}

// Add computes out = a + b with NumPy broadcasting (out has the broadcast shape and dtype
// promote(a, b)), as graph op add. out may be a or b itself when it has that one's shape.
func Add(d *Device, out, a, b *Tensor) error {
	return d.do(func() error { return addMul(d, "add", out, a, b) })
}

// Mul computes out = a * b like Add.
func Mul(d *Device, out, a, b *Tensor) error {
	return d.do(func() error { return addMul(d, "mul", out, a, b) })
}

func addMul(d *Device, op string, out, a, b *Tensor) error {
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
		return d.launch("elementwise.cu", op+"_flat_"+suffix, gridStride(d, n), block256, 0, func(args *cubind.Args) {
			args.Ptr(out.ptr).Ptr(a.ptr).Ptr(b.ptr).I64(n)
		})
	}
	p, err := newStrided(shape, sa, sb, 0, 0)
	if err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	return d.launch("elementwise.cu", op+"_bcast_"+suffix, gridStride(d, n), block256, 0, func(args *cubind.Args) {
		args.Ptr(out.ptr).Ptr(a.ptr).Ptr(b.ptr).Struct(p)
	})
}

// Cast converts x to out's dtype (f32 or bf16, same shape), rounding to nearest even.
func Cast(d *Device, out, x *Tensor) error {
	return d.do(func() error { return cast(d, out, x) })
}

func cast(d *Device, out, x *Tensor) error {
	if err := checkLive(out, x); err != nil {
		return fmt.Errorf("cuda: cast: %w", err)
	}
	if !slices.Equal(out.Shape, x.Shape) {
		return fmt.Errorf("cuda: cast: output %v and input %v differ in shape", out.Shape, x.Shape)
	}
	n := x.Numel()
	return copyStrided(d, out, x, []int{n}, []int64{1}, []int64{1}, 0, 0)
}
