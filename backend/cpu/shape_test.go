package cpu

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

var allDTypes = []tensor.DType{tensor.F32, tensor.BF16, tensor.F16, tensor.I32, tensor.I64, tensor.Bool, tensor.F8E4M3, tensor.F8E5M2}

// anyTensor fills a tensor of any dtype with distinct-ish values (bools alternate randomly).
func anyTensor(rng *rand.Rand, dt tensor.DType, shape ...int) *tensor.Tensor {
	if dt == tensor.Bool {
		return randTensor(rng, dt, shape, 0, 2)
	}
	return randTensor(rng, dt, shape, -100, 100)
}

func TestReshape(t *testing.T) {
	rng := rand.New(rand.NewPCG(41, 42))
	for _, dt := range allDTypes {
		x := anyTensor(rng, dt, 2, 3, 4)
		for _, shape := range [][]int{{4, 6}, {24}, {2, 12}, {1, 24, 1}} {
			got := mustRunOp(t, "reshape", graph.Attrs{"shape": constShape(shape)}, x)
			checkTensorTol(t, fmt.Sprintf("reshape %s to %v", dt, shape), got[0], dt, shape, values(x), 0)
		}
	}
	x := tensor.FromF32([]float32{1, 2}, 2)
	got := mustRunOp(t, "reshape", graph.Attrs{"shape": graph.Dims(1, 2)}, x)[0]
	got.F32[0] = 9
	if x.F32[0] != 1 {
		t.Errorf("reshape aliases its input")
	}
}

func TestTranspose(t *testing.T) {
	rng := rand.New(rand.NewPCG(43, 44))
	perms := [][]int{{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}}
	for _, dt := range allDTypes {
		in := []int{2, 3, 4}
		x := anyTensor(rng, dt, in...)
		for _, perm := range perms {
			shape := []int{in[perm[0]], in[perm[1]], in[perm[2]]}
			want := make([]float64, x.Numel())
			for i := range want {
				oidx := unflatten(i, shape)
				iidx := make([]int, 3)
				for d, p := range perm {
					iidx[p] = oidx[d]
				}
				want[i] = x.At(flatten(iidx, in))
			}
			got := mustRunOp(t, "transpose", graph.Attrs{"perm": perm}, x)
			checkTensorTol(t, fmt.Sprintf("transpose %s %v", dt, perm), got[0], dt, shape, want, 0)
		}
	}
}

func TestSlice(t *testing.T) {
	rng := rand.New(rand.NewPCG(45, 46))
	in := []int{5, 6}
	for _, dt := range allDTypes {
		x := anyTensor(rng, dt, in...)
		for _, tc := range []struct{ axis, start, end, step int }{
			{0, 1, 4, 1}, {1, 0, 6, 2}, {-1, 1, 6, 4}, {-2, 0, 5, 3}, {1, 3, 3, 1}, {0, 4, 5, 7}, {1, 2, 5, 1000},
		} {
			ax := (tc.axis + 2) % 2
			shape := slices.Clone(in)
			var picks []int
			for k := tc.start; k < tc.end; k += tc.step {
				picks = append(picks, k)
			}
			shape[ax] = len(picks)
			want := make([]float64, tensor.Numel(shape))
			for i := range want {
				idx := unflatten(i, shape)
				idx[ax] = picks[idx[ax]]
				want[i] = x.At(flatten(idx, in))
			}
			got := mustRunOp(t, "slice", graph.Attrs{"axis": tc.axis, "start": tc.start, "end": tc.end, "step": tc.step}, x)
			checkTensorTol(t, fmt.Sprintf("slice %s %+v", dt, tc), got[0], dt, shape, want, 0)
		}
	}
}

func TestConcat(t *testing.T) {
	rng := rand.New(rand.NewPCG(47, 48))
	for _, dt := range allDTypes {
		for _, tc := range []struct {
			axis   int
			shapes [][]int
		}{
			{1, [][]int{{2, 1, 3}, {2, 2, 3}, {2, 0, 3}}},
			{-1, [][]int{{2, 2, 1}, {2, 2, 4}}},
			{0, [][]int{{1, 2, 2}, {3, 2, 2}}},
			{0, [][]int{{2, 3}}},
		} {
			var ins []*tensor.Tensor
			for _, s := range tc.shapes {
				ins = append(ins, anyTensor(rng, dt, s...))
			}
			rank := len(tc.shapes[0])
			ax := (tc.axis + rank) % rank
			shape := slices.Clone(tc.shapes[0])
			shape[ax] = 0
			for _, s := range tc.shapes {
				shape[ax] += s[ax]
			}
			want := make([]float64, tensor.Numel(shape))
			for i := range want {
				idx := unflatten(i, shape)
				k := 0 // which input holds position idx[ax]
				for idx[ax] >= tc.shapes[k][ax] {
					idx[ax] -= tc.shapes[k][ax]
					k++
				}
				want[i] = ins[k].At(flatten(idx, tc.shapes[k]))
			}
			got := mustRunOp(t, "concat", graph.Attrs{"axis": tc.axis}, ins...)
			checkTensorTol(t, fmt.Sprintf("concat %s %v axis %d", dt, tc.shapes, tc.axis), got[0], dt, shape, want, 0)
		}
	}
}

func TestSplit(t *testing.T) {
	rng := rand.New(rand.NewPCG(49, 50))
	for _, dt := range allDTypes {
		for _, tc := range []struct {
			in    []int
			axis  int
			sizes []int
		}{
			{[]int{2, 7}, -1, []int{3, 0, 4}},
			{[]int{2, 7}, 0, []int{1, 1}},
			{[]int{3, 4, 2}, 1, []int{2, 2}},
			{[]int{5}, 0, []int{5}},
		} {
			x := anyTensor(rng, dt, tc.in...)
			got := mustRunOp(t, "split", graph.Attrs{"axis": tc.axis, "sizes": tc.sizes}, x)
			if len(got) != len(tc.sizes) {
				t.Fatalf("split into %v gave %d outputs", tc.sizes, len(got))
			}
			ax := (tc.axis + len(tc.in)) % len(tc.in)
			start := 0
			for k, size := range tc.sizes {
				shape := slices.Clone(tc.in)
				shape[ax] = size
				want := make([]float64, tensor.Numel(shape))
				for i := range want {
					idx := unflatten(i, shape)
					idx[ax] += start
					want[i] = x.At(flatten(idx, tc.in))
				}
				checkTensorTol(t, fmt.Sprintf("split %s%v %v output %d", dt, tc.in, tc.sizes, k), got[k], dt, shape, want, 0)
				start += size
			}
		}
	}
}

func TestExpand(t *testing.T) {
	rng := rand.New(rand.NewPCG(51, 52))
	for _, dt := range allDTypes {
		for _, tc := range []struct{ in, out []int }{
			{[]int{3, 1}, []int{2, 3, 4}},
			{[]int{}, []int{2, 2}},
			{[]int{1}, []int{5}},
			{[]int{2, 1, 3}, []int{2, 4, 3}},
			{[]int{2, 3}, []int{2, 3}},
		} {
			x := anyTensor(rng, dt, tc.in...)
			want := make([]float64, tensor.Numel(tc.out))
			for i := range want {
				want[i] = x.At(bcastIndex(unflatten(i, tc.out), tc.in))
			}
			got := mustRunOp(t, "expand", graph.Attrs{"shape": constShape(tc.out)}, x)
			checkTensorTol(t, fmt.Sprintf("expand %s%v to %v", dt, tc.in, tc.out), got[0], dt, tc.out, want, 0)
		}
	}
}
