package cpu

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/loom-ml/loom/tensor"
)

// TestFastBinaryBits holds the fast add, sub and mul to the reference kernel bit for bit:
// every float dtype pairing, shapes under and over a chunk and the parallel grain, rows
// repeated over leading dimensions on either side, and the broadcasts that go to the
// reference.
func TestFastBinaryBits(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, op := range []string{"add", "sub", "mul"} {
		for _, dts := range [][2]tensor.DType{
			{tensor.F32, tensor.F32}, {tensor.BF16, tensor.BF16}, {tensor.F16, tensor.F16},
			{tensor.F32, tensor.BF16}, {tensor.BF16, tensor.F32},
		} {
			for _, shapes := range [][2][]int{
				{{1, 7}, {1, 7}},
				{{3, 896}, {3, 896}},
				{{1, 128, 896}, {1, 128, 896}},
				{{2, 5, 4099}, {2, 5, 4099}},
				{{4, 896}, {896}},      // broadcast: reference
				{{4, 1, 3}, {1, 5, 3}}, // broadcast both ways
				{{0, 8}, {0, 8}},
			} {
				a := randTensor(rng, dts[0], shapes[0], -4, 4)
				b := randTensor(rng, dts[1], shapes[1], -4, 4)
				n, outs := nodeFor(t, op, nil, []*tensor.Tensor{a, b})
				ref, _ := Reference(op)
				want, err := runKernel(ref, n, []*tensor.Tensor{a, b}, outs)
				if err != nil {
					t.Fatal(err)
				}
				got, err := runKernel(fastBinary, n, []*tensor.Tensor{a, b}, outs)
				if err != nil {
					t.Fatalf("%s %v %v: %v", op, dts, shapes, err)
				}
				if got[0].DType != want[0].DType || !slices.Equal(got[0].Shape, want[0].Shape) {
					t.Fatalf("%s %v %v: got %s%v, want %s%v", op, dts, shapes, got[0].DType, got[0].Shape, want[0].DType, want[0].Shape)
				}
				if !slices.Equal(got[0].F32, want[0].F32) || !slices.Equal(got[0].Half, want[0].Half) {
					t.Errorf("%s %v %v: fast and reference results differ", op, dts, shapes)
				}
			}
		}
	}
}
