package cpu

import (
	"fmt"
	"slices"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// FP8 weights (graph/catalog_quant.go). dequantize_fp8 has its reference kernel here;
// linear_fp8 runs fastLinearFP8, which dequantizes one weight row at a time into a per-worker
// buffer (never a second copy of the whole weight) and meets it with every row of x. It
// computes what the decomposition does with reference kernels, bit for bit: each weight value
// is decode(w)·scale in f32, rounded to x's dtype, and each output a float32 dot product summed
// in k order. Activations are not quantized (see linear_fp8's doc).

func init() {
	registerReference("dequantize_fp8", dequantizeFP8)
	Register("linear_fp8", fastLinearFP8)
}

// fp8Rows dequantizes rows of an fp8 weight: row j of w[N,K] into a float32 buffer, rounded to
// dtype dt (so that the result is what dequantize_fp8 to dt holds, widened).
type fp8Rows struct {
	w      []uint8
	table  *[256]float32
	scale  []float32 // tensor: 1 value; channel: N; block: ceil(N/bn)*ceil(K/bk)
	scheme string
	bn, bk int
	N, K   int
	round  func(float32) float32 // nil for f32
}

func newFP8Rows(n *graph.Node, w, scale *tensor.Tensor, dt tensor.DType) (*fp8Rows, error) {
	if len(w.Shape) != 2 || !w.DType.IsFloat8() || len(w.U8) != w.Numel() {
		return nil, fmt.Errorf("%s: the weight must be a 2-D f8e4m3 or f8e5m2 matrix, got %s%v", n.Op, w.DType, w.Shape)
	}
	if !scale.DType.IsFloat() {
		return nil, fmt.Errorf("%s: the scale must be a float tensor, got %s", n.Op, scale.DType)
	}
	r := &fp8Rows{w: w.U8, scale: scale.Float32s(), scheme: n.Attrs.String("scheme"), N: w.Shape[0], K: w.Shape[1]}
	r.table = tensor.F8E4M3Table()
	if w.DType == tensor.F8E5M2 {
		r.table = tensor.F8E5M2Table()
	}
	want, err := graph.FP8ScaleShape(r.scheme, r.N, r.K, n.Attrs.Ints("block"))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", n.Op, err)
	}
	if tensor.Numel(want) != len(r.scale) {
		return nil, fmt.Errorf("%s: scale %v does not fit weight %v under the %s scheme (want %v)", n.Op, scale.Shape, w.Shape, r.scheme, want)
	}
	if r.scheme == graph.QuantBlock {
		b := n.Attrs.Ints("block")
		r.bn, r.bk = b[0], b[1]
	}
	switch dt {
	case tensor.BF16:
		r.round = func(v float32) float32 { return tensor.BF16ToF32(tensor.F32ToBF16(v)) }
	case tensor.F16:
		r.round = func(v float32) float32 { return tensor.F16ToF32(tensor.F32ToF16(v)) }
	case tensor.F32:
	default:
		return nil, fmt.Errorf("%s: cannot dequantize to %s", n.Op, dt)
	}
	return r, nil
}

// row writes the real values of weight row j to dst[:K].
func (r *fp8Rows) row(j int, dst []float32) {
	src := r.w[j*r.K : (j+1)*r.K]
	switch r.scheme {
	case graph.QuantTensor, graph.QuantChannel:
		s := r.scale[0]
		if r.scheme == graph.QuantChannel {
			s = r.scale[j]
		}
		for k, b := range src {
			dst[k] = r.table[b] * s
		}
	case graph.QuantBlock:
		kb := (r.K + r.bk - 1) / r.bk
		ss := r.scale[(j/r.bn)*kb : (j/r.bn+1)*kb]
		for k, b := range src {
			dst[k] = r.table[b] * ss[k/r.bk]
		}
	}
	if r.round != nil {
		for k, v := range dst[:r.K] {
			dst[k] = r.round(v)
		}
	}
}

// dequantizeFP8 is dequantize_fp8's reference kernel.
func dequantizeFP8(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 2, 1); err != nil {
		return nil, err
	}
	o := out[0]
	r, err := newFP8Rows(n, in[0], in[1], o.DType)
	if err != nil {
		return nil, err
	}
	if !slices.Equal(o.Shape, in[0].Shape) {
		return nil, fmt.Errorf("dequantize_fp8: output %v, weight %v", o.Shape, in[0].Shape)
	}
	res := make([]float32, r.N*r.K)
	for j := range r.N {
		r.row(j, res[j*r.K:(j+1)*r.K])
	}
	return []*tensor.Tensor{fromF32(res, o)}, nil
}

// fastLinearFP8 is linear_fp8's kernel: x[...,K] @ dequantize(w[N,K], scale)^T -> [...,N].
func fastLinearFP8(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 3, 1); err != nil {
		return nil, err
	}
	x, o := in[0], out[0]
	if !x.DType.IsFloat() || o.DType != x.DType || len(x.Shape) < 1 {
		return nil, fmt.Errorf("linear_fp8: x must be a float tensor of rank >= 1 and the output of its dtype, got %s%v -> %s", x.DType, x.Shape, o.DType)
	}
	r, err := newFP8Rows(n, in[1], in[2], x.DType)
	if err != nil {
		return nil, err
	}
	N, K := r.N, r.K
	rx := len(x.Shape)
	if x.Shape[rx-1] != K {
		return nil, fmt.Errorf("linear_fp8: x's last dimension %d differs from the weight's input dimension %d", x.Shape[rx-1], K)
	}
	if err := checkShape(append(slices.Clone(x.Shape[:rx-1]), N), o); err != nil {
		return nil, err
	}
	M := tensor.Numel(x.Shape[:rx-1])
	res := make([]float32, M*N)
	if M > 0 && N > 0 && K > 0 {
		xs, xbuf := widenInto(x)
		parallelFor(N, max(1, workChunk/max(1, M*K)), func(lo, hi int) {
			p := getF32(K)
			wr := *p
			for j := lo; j < hi; j++ {
				r.row(j, wr)
				for m := range M {
					res[m*N+j] = dot(xs[m*K:(m+1)*K], wr)
				}
			}
			putF32(p)
		})
		if xbuf != nil {
			putF32(xbuf)
		}
	}
	return []*tensor.Tensor{fromF32(res, o)}, nil
}
