package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// The fast kernels of qkv_rope and swiglu_packed give the bits of the reference kernel (the
// decomposition: split, layout and rope or swiglu, run with reference kernels), and the bits
// of fastRope and fastSwiGLU on the split parts.

// firstBitDiff returns the first flat index where a and b store different bits, or -1.
func firstBitDiff(a, b *tensor.Tensor) int {
	if a.DType != b.DType || !slices.Equal(a.Shape, b.Shape) {
		return 0
	}
	for i := range a.Numel() {
		switch a.DType {
		case tensor.F32:
			if math.Float32bits(a.F32[i]) != math.Float32bits(b.F32[i]) {
				return i
			}
		case tensor.BF16, tensor.F16:
			if a.Half[i] != b.Half[i] {
				return i
			}
		default:
			panic("firstBitDiff: not a float tensor")
		}
	}
	return -1
}

// sameBits reports through t every output of got whose bits differ from want's.
func sameBits(t *testing.T, what string, got, want []*tensor.Tensor) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d outputs, want %d", what, len(got), len(want))
	}
	for o := range want {
		if i := firstBitDiff(got[o], want[o]); i >= 0 {
			if got[o].DType != want[o].DType || !slices.Equal(got[o].Shape, want[o].Shape) {
				t.Errorf("%s output %d: %s%v, want %s%v", what, o, got[o].DType, got[o].Shape, want[o].DType, want[o].Shape)
				continue
			}
			t.Errorf("%s output %d differs first at %v: %v, want %v", what, o, unflatten(i, want[o].Shape), got[o].At(i), want[o].At(i))
		}
	}
}

// runOn runs kernel k on a node of op over the given inputs.
func runOn(t *testing.T, k Kernel, op string, attrs graph.Attrs, in ...*tensor.Tensor) []*tensor.Tensor {
	t.Helper()
	n, outs := nodeFor(t, op, attrs, in)
	res, err := runKernel(k, n, in, outs)
	if err != nil {
		t.Fatalf("%s: %v", op, err)
	}
	return res
}

// layOut copies heads [first, first+nh) of the packed x[B,S,W] as [B,nh,S,D].
func layOut(x *tensor.Tensor, first, nh, D int) *tensor.Tensor {
	B, S, W := x.Shape[0], x.Shape[1], x.Shape[2]
	out := tensor.New(x.DType, B, nh, S, D)
	for b := range B {
		for h := range nh {
			for s := range S {
				tensor.CopyRange(out, ((b*nh+h)*S+s)*D, x, (b*S+s)*W+(first+h)*D, D)
			}
		}
	}
	return out
}

func TestFastQKVRoPE(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for _, tc := range []struct {
		B, S, H, KV, D int
		scaling        float64
		pos            tensor.DType
	}{
		{1, 1, 1, 1, 2, 1, tensor.I32},     // decode, one head each
		{1, 37, 4, 2, 16, 1, tensor.I32},   // GQA, odd S
		{2, 5, 6, 1, 16, 1, tensor.I64},    // H not a power of two, one KV head
		{3, 7, 3, 3, 10, 0.7, tensor.I32},  // MHA, D/2 odd, scaled
		{1, 9, 8, 2, 128, 1.3, tensor.I64}, // a real head size
		{2, 0, 2, 1, 4, 1, tensor.I32},     // no tokens
	} {
		for _, dt := range []tensor.DType{tensor.F32, tensor.BF16, tensor.F16} {
			name := fmt.Sprintf("%s B%d S%d H%d KV%d D%d scaling%g %s", dt, tc.B, tc.S, tc.H, tc.KV, tc.D, tc.scaling, tc.pos)
			t.Run(name, func(t *testing.T) {
				W := (tc.H + 2*tc.KV) * tc.D
				x := randTensor(rng, dt, []int{tc.B, tc.S, W}, -3, 3)
				pos := randTensor(rng, tc.pos, []int{tc.B, tc.S}, 0, 9000)
				inv := make([]float64, tc.D/2)
				for i := range inv {
					inv[i] = float64(float32(math.Pow(500000, -float64(2*i)/float64(tc.D))))
				}
				attrs := graph.Attrs{"heads": tc.H, "kv_heads": tc.KV, "inv_freq": inv, "scaling": tc.scaling}
				got := runOn(t, fastQKVRoPE, "qkv_rope", attrs, x, pos)
				ref, _ := Reference("qkv_rope")
				sameBits(t, "fast vs reference", got, runOn(t, ref, "qkv_rope", attrs, x, pos))

				// The same bits as fastRope on the laid-out q and k, and v as laid out.
				q, k, v := layOut(x, 0, tc.H, tc.D), layOut(x, tc.H, tc.KV, tc.D), layOut(x, tc.H+tc.KV, tc.KV, tc.D)
				rope := runOn(t, fastRope, "rope", graph.Attrs{"inv_freq": inv, "scaling": tc.scaling}, q, k, pos)
				sameBits(t, "fast vs fastRope", got, []*tensor.Tensor{rope[0], rope[1], v})
				if tc.S > 0 && firstBitDiff(got[0], q) < 0 {
					t.Errorf("q came out unrotated")
				}
			})
		}
	}
}

// qkv_norm_rope's fast kernel gives the bits of its decomposition (split, rmsnorm of each
// head, layout, rope) for every dtype of x and of the norm weights, including bf16 x with
// f32 weights, where q and k come out in f32 beside a bf16 v.
func TestFastQKVNormRoPE(t *testing.T) {
	rng := rand.New(rand.NewPCG(8, 12))
	for _, tc := range []struct {
		B, S, H, KV, D int
		scaling        float64
	}{
		{1, 1, 1, 1, 2, 1},    // decode, one head each
		{1, 1, 32, 4, 128, 1}, // a Qwen3-30B-A3B decode token
		{2, 7, 6, 2, 16, 0.7}, // GQA, scaled
		{1, 9, 3, 3, 10, 1},   // MHA, D/2 odd
		{2, 0, 2, 1, 4, 1},    // no tokens
	} {
		for _, dts := range [][3]tensor.DType{{tensor.F32, tensor.F32, tensor.F32}, {tensor.F32, tensor.BF16, tensor.BF16},
			{tensor.BF16, tensor.BF16, tensor.BF16}, {tensor.BF16, tensor.F32, tensor.F32},
			{tensor.F16, tensor.F16, tensor.F16}} {
			name := fmt.Sprintf("x %s q_norm %s k_norm %s B%d S%d H%d KV%d D%d", dts[0], dts[1], dts[2], tc.B, tc.S, tc.H, tc.KV, tc.D)
			t.Run(name, func(t *testing.T) {
				W := (tc.H + 2*tc.KV) * tc.D
				x := randTensor(rng, dts[0], []int{tc.B, tc.S, W}, -3, 3)
				qn, kn := randTensor(rng, dts[1], []int{tc.D}, 0.2, 2), randTensor(rng, dts[2], []int{tc.D}, 0.2, 2)
				pos := randTensor(rng, tensor.I64, []int{tc.B, tc.S}, 0, 9000)
				inv := make([]float64, tc.D/2)
				for i := range inv {
					inv[i] = float64(float32(math.Pow(1000000, -float64(2*i)/float64(tc.D))))
				}
				attrs := graph.Attrs{"heads": tc.H, "kv_heads": tc.KV, "inv_freq": inv, "scaling": tc.scaling, "eps": 1e-6}
				got := runOn(t, fastQKVNormRoPE, "qkv_norm_rope", attrs, x, qn, kn, pos)
				ref, _ := Reference("qkv_norm_rope")
				sameBits(t, "fast vs reference", got, runOn(t, ref, "qkv_norm_rope", attrs, x, qn, kn, pos))
				if tc.S > 0 && got[0].Float32s()[0] == layOut(x, 0, tc.H, tc.D).Float32s()[0] {
					t.Errorf("q came out as laid out, neither normed nor rotated")
				}
			})
		}
	}
}

func TestFastSwiGLUPacked(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 17))
	for _, shape := range [][]int{{2}, {1, 1, 14}, {3, 5, 1002}, {2, 2 * 2049}, {1, 1, 2 * 2500}, {0, 8}} {
		for _, dt := range []tensor.DType{tensor.F32, tensor.BF16, tensor.F16} {
			t.Run(fmt.Sprintf("%s%v", dt, shape), func(t *testing.T) {
				x := randTensor(rng, dt, shape, -8, 8)
				got := runOn(t, fastSwiGLUPacked, "swiglu_packed", nil, x)
				ref, _ := Reference("swiglu_packed")
				sameBits(t, "fast vs reference", got, runOn(t, ref, "swiglu_packed", nil, x))

				// The same bits as fastSwiGLU on the split halves.
				I := shape[len(shape)-1] / 2
				rows := x.Numel() / max(2*I, 1)
				half := append(append([]int(nil), shape[:len(shape)-1]...), I)
				g, u := tensor.New(dt, half...), tensor.New(dt, half...)
				for r := range rows {
					tensor.CopyRange(g, r*I, x, 2*r*I, I)
					tensor.CopyRange(u, r*I, x, (2*r+1)*I, I)
				}
				sameBits(t, "fast vs fastSwiGLU", got, runOn(t, fastSwiGLU, "swiglu", nil, g, u))
			})
		}
	}
}

// TestFastLinearPacked: linear_swiglu and linear_qkv_rope give the bits of the fast kernels
// run apart (linear, then the packed op) and, within rounding, their reference kernels' (the
// decomposition).
func TestFastLinearPacked(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 23))
	inv := []float64{1, 0.1, 0.01, 0.001} // D = 8
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		for _, S := range []int{1, 5} {
			t.Run(fmt.Sprintf("%s S%d", dt, S), func(t *testing.T) {
				x := randTensor(rng, dt, []int{1, S, 32}, -1, 1)
				pos := randTensor(rng, tensor.I32, []int{1, S}, 0, 4000)
				w := randTensor(rng, tensor.BF16, []int{(3 + 2*1) * 8, 32}, -0.3, 0.3)
				attrs := graph.Attrs{"heads": 3, "kv_heads": 1, "inv_freq": inv, "scaling": 0.8}
				for _, c := range []struct {
					op, packed string
					attrs      graph.Attrs
					rest       []*tensor.Tensor
				}{
					{"linear_swiglu", "swiglu_packed", nil, nil},
					{"linear_qkv_rope", "qkv_rope", attrs, []*tensor.Tensor{pos}},
				} {
					fast, _ := Lookup(c.op)
					ref, _ := Reference(c.op)
					in := append([]*tensor.Tensor{x, w}, c.rest...)
					got := runOn(t, fast, c.op, c.attrs, in...)
					// The reference's linear sums in another order than the fast one (FMA with
					// GOEXPERIMENT=simd): close, not the same bits.
					rtol := map[tensor.DType]float64{tensor.F32: 1e-4, tensor.BF16: 2.0 / 128}[dt]
					for o, r := range runOn(t, ref, c.op, c.attrs, in...) {
						checkTensorTol(t, fmt.Sprintf("%s output %d fast vs reference", c.op, o), got[o], r.DType, r.Shape, values(r), rtol)
					}
					y := runOn(t, fastLinear, "linear", nil, x, w)
					packed, _ := Lookup(c.packed)
					sameBits(t, c.op+" fast vs apart", got, runOn(t, packed, c.packed, c.attrs, append([]*tensor.Tensor{y[0]}, c.rest...)...))
				}
			})
		}
	}
}

// TestFastPackedErrors: inputs that do not fit the node are errors, not panics.
func TestFastPackedErrors(t *testing.T) {
	inv := []float64{1, 0.5}
	qkvNode, qkvOuts := nodeFor(t, "qkv_rope", graph.Attrs{"heads": 2, "kv_heads": 1, "inv_freq": inv},
		[]*tensor.Tensor{tensor.New(tensor.F32, 1, 3, 16), tensor.New(tensor.I32, 1, 3)})
	swNode, swOuts := nodeFor(t, "swiglu_packed", nil, []*tensor.Tensor{tensor.New(tensor.F32, 3, 8)})
	lswNode, lswOuts := nodeFor(t, "linear_swiglu", nil, []*tensor.Tensor{tensor.New(tensor.F32, 3, 4), tensor.New(tensor.BF16, 8, 4)})
	for _, c := range []struct {
		name string
		k    Kernel
		n    *graph.Node
		outs []Out
		in   []*tensor.Tensor
	}{
		{"qkv_rope x too narrow", fastQKVRoPE, qkvNode, qkvOuts, []*tensor.Tensor{tensor.New(tensor.F32, 1, 3, 12), tensor.New(tensor.I32, 1, 3)}},
		{"qkv_rope positions of other S", fastQKVRoPE, qkvNode, qkvOuts, []*tensor.Tensor{tensor.New(tensor.F32, 1, 3, 16), tensor.New(tensor.I32, 1, 4)}},
		{"qkv_rope float positions", fastQKVRoPE, qkvNode, qkvOuts, []*tensor.Tensor{tensor.New(tensor.F32, 1, 3, 16), tensor.New(tensor.F32, 1, 3)}},
		{"qkv_rope integer x", fastQKVRoPE, qkvNode, qkvOuts, []*tensor.Tensor{tensor.New(tensor.I32, 1, 3, 16), tensor.New(tensor.I32, 1, 3)}},
		{"swiglu_packed odd last axis", fastSwiGLUPacked, swNode, swOuts, []*tensor.Tensor{tensor.New(tensor.F32, 3, 7)}},
		{"swiglu_packed other rows", fastSwiGLUPacked, swNode, swOuts, []*tensor.Tensor{tensor.New(tensor.F32, 4, 8)}},
		{"swiglu_packed bf16 x for f32 output", fastSwiGLUPacked, swNode, swOuts, []*tensor.Tensor{tensor.New(tensor.BF16, 3, 8)}},
		{"linear_swiglu no weight", fastLinearThen("swiglu_packed"), lswNode, lswOuts, []*tensor.Tensor{tensor.New(tensor.F32, 3, 4)}},
		{"linear_swiglu 1-D weight", fastLinearThen("swiglu_packed"), lswNode, lswOuts, []*tensor.Tensor{tensor.New(tensor.F32, 3, 4), tensor.New(tensor.BF16, 32)}},
		{"linear_swiglu weight of other K", fastLinearThen("swiglu_packed"), lswNode, lswOuts, []*tensor.Tensor{tensor.New(tensor.F32, 3, 4), tensor.New(tensor.BF16, 8, 5)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := c.k(c.n, c.in, c.outs); err == nil {
				t.Error("no error")
			}
		})
	}
}
