package graph

import (
	"fmt"
	"slices"

	"github.com/loom-ml/loom/tensor"
)

// Quantized weights. An FP8 checkpoint's linear weight is an f8e4m3 (or f8e5m2) matrix
// w[N,K] and a scale: real weight = w * scale, the scale one of
//
//	tensor  one value for the whole matrix: [] or [1]
//	channel one per output row: [N,1] or [N]
//	block   one per block of bn rows and bk columns: [ceil(N/bn), ceil(K/bk)] (Hugging Face's
//	        weight_scale_inv, whatever its name says: a multiplier)
//
// dequantize_fp8 is the primitive that applies it; linear_fp8 is the quantized linear, which
// decomposes into dequantize_fp8 then linear, so every backend runs it. Sharding slices a
// channel or block scale with its weight (block scales only on block boundaries).

// The schemes of dequantize_fp8 and linear_fp8.
const (
	QuantTensor  = "tensor"
	QuantChannel = "channel"
	QuantBlock   = "block"
)

// FP8ScaleShape is the scale shape a scheme wants for a weight [n,k] (block: [bn,bk]).
func FP8ScaleShape(scheme string, n, k int, block []int) ([]int, error) {
	switch scheme {
	case QuantTensor:
		return []int{1}, nil
	case QuantChannel:
		return []int{n, 1}, nil
	case QuantBlock:
		if len(block) != 2 || block[0] < 1 || block[1] < 1 {
			return nil, fmt.Errorf("block scheme needs block = [rows, cols], both positive, got %v", block)
		}
		return []int{(n + block[0] - 1) / block[0], (k + block[1] - 1) / block[1]}, nil
	}
	return nil, fmt.Errorf("unknown fp8 scheme %q (want tensor, channel or block)", scheme)
}

// checkFP8Weight checks an fp8 weight and its scale against the node's scheme.
func checkFP8Weight(n *Node, w, s Type) error {
	if !w.DType.IsFloat8() || len(w.Shape) != 2 {
		return fmt.Errorf("the weight must be a 2-D f8e4m3 or f8e5m2 matrix, got %s", w)
	}
	if !s.DType.IsFloat() {
		return fmt.Errorf("the scale must be a float tensor, got %s", s)
	}
	scheme, block := n.Attrs.String("scheme"), n.Attrs.Ints("block")
	if scheme != QuantBlock && len(block) != 0 {
		return fmt.Errorf("block %v is only for the block scheme, not %s", block, scheme)
	}
	if w.Shape[0].IsSym() || w.Shape[1].IsSym() {
		return fmt.Errorf("the weight's shape %s must be constant", w.Shape)
	}
	want, err := FP8ScaleShape(scheme, w.Shape[0].Size, w.Shape[1].Size, block)
	if err != nil {
		return err
	}
	got := make([]int, len(s.Shape))
	for i, d := range s.Shape {
		if d.IsSym() {
			return fmt.Errorf("the scale's shape %s must be constant", s.Shape)
		}
		got[i] = d.Size
	}
	ok := slices.Equal(got, want)
	switch scheme {
	case QuantTensor:
		ok = tensor.Numel(got) == 1 && len(got) <= 1
	case QuantChannel:
		ok = ok || slices.Equal(got, want[:1])
	}
	if !ok {
		what := ""
		if scheme == QuantBlock {
			what = fmt.Sprintf(" of %v blocks", block)
		}
		return fmt.Errorf("scale %s does not fit weight %s under the %s scheme%s (want %v)", s.Shape, w.Shape, scheme, what, want)
	}
	return nil
}

var fp8Attrs = []AttrSpec{
	{Name: "scheme", Type: AttrString, Doc: "tensor, channel or block: what one scale value covers"},
	{Name: "block", Type: AttrInts, Default: []int{}, Doc: "the block scheme's [rows, cols] per scale value"},
}

func init() {
	Register(&OpSpec{
		Name: "dequantize_fp8", Doc: "The real values of an fp8 weight: w[N,K] (f8e4m3 or f8e5m2) times its scale (tensor [] or [1], channel [N,1] or [N], block [ceil(N/bn), ceil(K/bk)] with block=[bn,bk]), each product computed in f32 and rounded to dtype. -> [N,K] of dtype.",
		Inputs: []string{"w", "scale"},
		Attrs:  append(slices.Clone(fp8Attrs), AttrSpec{Name: "dtype", Type: AttrDType, Doc: "the result's float dtype"}),
		Infer: func(n *Node) ([]Type, error) {
			w, s := inType(n, 0), inType(n, 1)
			if err := checkFP8Weight(n, w, s); err != nil {
				return nil, err
			}
			dt := n.Attrs.DType("dtype")
			if !dt.IsFloat() {
				return nil, fmt.Errorf("dtype must be a float type, got %s", dt)
			}
			return one(Type{dt, w.Shape.Clone()}), nil
		},
	})
	Register(&OpSpec{
		Name: "linear_fp8", Doc: "The quantized linear: x[...,K] @ dequantize_fp8(w[N,K], scale, dtype=x's)^T -> [...,N] of x's dtype (see dequantize_fp8 for the schemes and scale shapes). activation_scheme records what the checkpoint asks of an FP8 GEMM (none, dynamic: per-token scales computed at run time, static: the checkpoint's input_scale); the decomposition, and the CPU, compute in x's dtype on the dequantized weight and do not quantize activations; the CUDA backend's FP8 GEMM (more than 8 rows of bf16 x, dynamic or static) quantizes x to e4m3 as FP8 serving engines do.",
		Inputs: []string{"x", "w", "scale"},
		Attrs: append(slices.Clone(fp8Attrs), AttrSpec{Name: "activation_scheme", Type: AttrString, Default: "none",
			Doc: "none, dynamic or static: how an FP8 GEMM would quantize x"}),
		Infer: func(n *Node) ([]Type, error) {
			x, w, s := inType(n, 0), inType(n, 1), inType(n, 2)
			if err := checkFP8Weight(n, w, s); err != nil {
				return nil, err
			}
			switch a := n.Attrs.String("activation_scheme"); a {
			case "none", "dynamic", "static":
			default:
				return nil, fmt.Errorf("activation_scheme %q: want none, dynamic or static", a)
			}
			if len(x.Shape) < 1 || !x.DType.IsFloat() {
				return nil, fmt.Errorf("x must be a float tensor of rank >= 1, got %s", x)
			}
			if x.Shape[len(x.Shape)-1] != w.Shape[1] {
				return nil, fmt.Errorf("x's last dimension %s differs from the weight's input dimension %s", x.Shape[len(x.Shape)-1], w.Shape[1])
			}
			out := x.Shape.Clone()
			out[len(out)-1] = w.Shape[0]
			return one(Type{x.DType, out}), nil
		},
		Decompose: func(b *Builder, n *Node) ([]*Value, error) {
			x := n.Inputs[0]
			w := b.DequantizeFP8(n.Inputs[1], n.Inputs[2], n.Attrs.String("scheme"), n.Attrs.Ints("block"), x.Type.DType)
			return []*Value{b.Linear(x, w)}, b.Err()
		},
	})
}

// DequantizeFP8 emits dequantize_fp8(w, scale) in dtype dt.
func (b *Builder) DequantizeFP8(w, scale *Value, scheme string, block []int, dt tensor.DType) *Value {
	return b.Op("dequantize_fp8", Attrs{"scheme": scheme, "block": blockAttr(block), "dtype": dt}, w, scale)
}

// LinearFP8 emits linear_fp8(x, w, scale).
func (b *Builder) LinearFP8(x, w, scale *Value, scheme string, block []int, activation string) *Value {
	if activation == "" {
		activation = "none"
	}
	return b.Op("linear_fp8", Attrs{"scheme": scheme, "block": blockAttr(block), "activation_scheme": activation}, x, w, scale)
}

func blockAttr(block []int) []int {
	if block == nil {
		return []int{}
	}
	return slices.Clone(block)
}

// IsLinear reports whether n is a linear or a quantized linear (linear_fp8): x is its input
// 0 and its weight [N,K] its input 1; a quantized linear's scale is input 2.
func IsLinear(n *Node) bool { return n != nil && (n.Op == "linear" || n.Op == "linear_fp8") }
