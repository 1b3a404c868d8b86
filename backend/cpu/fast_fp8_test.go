package cpu

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// randFP8 is a random fp8 weight with no NaN (nor, for e5m2, infinity) patterns.
func randFP8(rng *rand.Rand, dt tensor.DType, n, k int) *tensor.Tensor {
	w := tensor.New(dt, n, k)
	for i := range w.U8 {
		for {
			b := uint8(rng.IntN(256))
			if dt == tensor.F8E4M3 && b&0x7F != 0x7F || dt == tensor.F8E5M2 && b&0x7C != 0x7C {
				w.U8[i] = b
				break
			}
		}
	}
	return w
}

func fp8Node(t *testing.T, op string, attrs graph.Attrs, in []*tensor.Tensor) (*graph.Node, []Out) {
	t.Helper()
	b := graph.NewBuilder(op)
	vals := make([]*graph.Value, len(in))
	for i, x := range in {
		vals[i] = b.Input(fmt.Sprintf("in%d", i), x.DType, graph.Dims(x.Shape...))
	}
	v := b.Op(op, attrs, vals...)
	if err := b.Err(); err != nil {
		t.Fatal(err)
	}
	shape, err := v.Type.Shape.Resolve(nil)
	if err != nil {
		t.Fatal(err)
	}
	return v.Producer, []Out{{DType: v.Type.DType, Shape: shape}}
}

// TestLinearFP8 holds linear_fp8's kernel to its decomposition (dequantize_fp8 then linear,
// reference kernels) bit for bit, and dequantize_fp8 to decode(w)·scale computed in float64,
// for each scheme (blocks that do not divide the weight included), both fp8 formats and x in
// f32 and bf16.
func TestLinearFP8(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 8))
	const N, K = 37, 70
	for _, wdt := range []tensor.DType{tensor.F8E4M3, tensor.F8E5M2} {
		for _, xdt := range []tensor.DType{tensor.F32, tensor.BF16} {
			for _, sc := range []struct {
				scheme string
				block  []int
				shape  []int
			}{
				{graph.QuantTensor, nil, []int{1}},
				{graph.QuantChannel, nil, []int{N, 1}},
				{graph.QuantBlock, []int{16, 32}, []int{3, 3}},
				{graph.QuantBlock, []int{8, 8}, []int{5, 9}},
			} {
				name := fmt.Sprintf("%s/%s/x=%s/%v", wdt, sc.scheme, xdt, sc.block)
				w := randFP8(rng, wdt, N, K)
				s := randTensor(rng, tensor.F32, sc.shape, 0.001, 0.01)
				x := randTensor(rng, xdt, []int{3, 5, K}, -1, 1)
				attrs := graph.Attrs{"scheme": sc.scheme, "block": sc.block}
				if sc.block == nil {
					attrs["block"] = []int{}
				}
				n, out := fp8Node(t, "linear_fp8", attrs, []*tensor.Tensor{x, w, s})
				got, err := fastLinearFP8(n, []*tensor.Tensor{x, w, s}, out)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				ref, _ := Reference("linear_fp8")
				want, err := ref(n, []*tensor.Tensor{x, w, s}, out)
				if err != nil {
					t.Fatalf("%s: decomposition: %v", name, err)
				}
				gf, wf := got[0].Float32s(), want[0].Float32s()
				for i := range wf {
					if gf[i] != wf[i] {
						t.Fatalf("%s: element %d = %g, decomposition %g", name, i, gf[i], wf[i])
					}
				}

				dattrs := graph.Attrs{"scheme": sc.scheme, "block": attrs["block"], "dtype": tensor.F32}
				dn, dout := fp8Node(t, "dequantize_fp8", dattrs, []*tensor.Tensor{w, s})
				d, err := dequantizeFP8(dn, []*tensor.Tensor{w, s}, dout)
				if err != nil {
					t.Fatal(err)
				}
				for j := range N {
					for k := range K {
						si := 0
						switch sc.scheme {
						case graph.QuantChannel:
							si = j
						case graph.QuantBlock:
							si = (j/sc.block[0])*sc.shape[1] + k/sc.block[1]
						}
						exact := float64(w.At(j*K+k)) * float64(s.F32[si])
						if g := d[0].F32[j*K+k]; g != float32(exact) {
							t.Fatalf("%s: dequantized [%d,%d] = %g, want %g", name, j, k, g, float32(exact))
						}
					}
				}
			}
		}
	}
}

func TestLinearFP8Errors(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	x := randTensor(rng, tensor.F32, []int{2, 16}, -1, 1)
	w := randFP8(rng, tensor.F8E4M3, 8, 16)
	s := randTensor(rng, tensor.F32, []int{8, 1}, 0.01, 0.02)
	n, out := fp8Node(t, "linear_fp8", graph.Attrs{"scheme": "channel"}, []*tensor.Tensor{x, w, s})
	for _, tc := range []struct {
		in   []*tensor.Tensor
		want string
	}{
		{[]*tensor.Tensor{x, x, s}, "the weight must be a 2-D f8e4m3 or f8e5m2 matrix"},
		{[]*tensor.Tensor{x, w, randTensor(rng, tensor.F32, []int{4, 1}, 0, 1)}, "scale [4 1] does not fit weight [8 16] under the channel scheme"},
		{[]*tensor.Tensor{randTensor(rng, tensor.F32, []int{2, 8}, 0, 1), w, s}, "x's last dimension 8 differs"},
	} {
		_, err := fastLinearFP8(n, tc.in, out)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want %q", err, tc.want)
		}
	}
}
