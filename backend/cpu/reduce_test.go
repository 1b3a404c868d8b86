package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// reduceExpect computes sum, mean or max of x over axes in float64 (int64 for integer sums
// and maxima), element by element from multi-indices.
func reduceExpect(op string, x *tensor.Tensor, axes []int, keep bool) ([]int, []float64) {
	rank := len(x.Shape)
	red := make([]bool, rank)
	for _, a := range axes {
		red[(a+rank)%rank] = true
	}
	var shape []int
	for d, s := range x.Shape {
		switch {
		case !red[d]:
			shape = append(shape, s)
		case keep:
			shape = append(shape, 1)
		}
	}
	if shape == nil {
		shape = []int{}
	}
	size := tensor.Numel(shape)
	sum, count := make([]float64, size), make([]int, size)
	isum, imax := make([]int64, size), make([]int64, size)
	mx := make([]float64, size)
	for i := range mx {
		mx[i], imax[i] = math.Inf(-1), math.MinInt64
	}
	for i := range x.Numel() {
		idx := unflatten(i, x.Shape)
		var oidx []int
		for d := range rank {
			switch {
			case !red[d]:
				oidx = append(oidx, idx[d])
			case keep:
				oidx = append(oidx, 0)
			}
		}
		o := flatten(oidx, shape)
		v := x.At(i)
		sum[o] += v
		count[o]++
		mx[o] = math.Max(mx[o], v)
		if x.DType == tensor.I64 {
			isum[o] += x.I64[i]
			imax[o] = max(imax[o], x.I64[i])
		}
	}
	want := make([]float64, size)
	for o := range want {
		switch op {
		case "sum":
			want[o] = sum[o]
		case "mean":
			want[o] = sum[o] / float64(count[o])
			if x.DType.IsInt() {
				want[o] = math.Trunc(want[o])
			}
		case "max":
			want[o] = mx[o]
		}
		if x.DType == tensor.Bool && want[o] != 0 {
			want[o] = 1
		}
		if x.DType == tensor.I64 && op != "mean" {
			want[o] = float64(map[string]int64{"sum": isum[o], "max": imax[o]}[op])
		}
	}
	return shape, want
}

func TestReduce(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 32))
	axesCases := [][]int{{-1}, {0}, {0, 2}, {1, -1}, {0, 1, 2}, {-2}}
	for _, op := range []string{"sum", "mean", "max"} {
		for _, dt := range []tensor.DType{tensor.F32, tensor.BF16, tensor.F16, tensor.I32, tensor.I64, tensor.Bool} {
			if dt == tensor.Bool && op == "mean" {
				continue
			}
			for _, axes := range axesCases {
				for _, keep := range []bool{false, true} {
					x := randTensor(rng, dt, []int{2, 3, 4}, -8, 8)
					if dt == tensor.Bool {
						x = randTensor(rng, dt, []int{2, 3, 4}, 0, 1.3)
					}
					name := fmt.Sprintf("%s/%s/axes=%v/keep=%v", op, dt, axes, keep)
					shape, want := reduceExpect(op, x, axes, keep)
					got := mustRunOp(t, op, graph.Attrs{"axes": axes, "keepdim": keep}, x)
					checkTensor(t, name, got[0], dt, shape, want)
				}
			}
		}
	}
}

func TestReduceCases(t *testing.T) {
	ones := make([]float32, 1001)
	for i := range ones {
		ones[i] = 1
	}
	ones[0] = 1e8
	big := tensor.FromF32(ones, 1001)
	i64 := &tensor.Tensor{DType: tensor.I64, Shape: []int{2}, I64: []int64{1 << 60, 1}}
	nan := tensor.FromF32([]float32{1, float32(math.NaN()), 3}, 3)
	for _, tc := range []struct {
		op    string
		x     *tensor.Tensor
		axes  []int
		shape []int
		want  []float64
	}{
		// Accumulated in float64: 1e8 + 1000 ones is exact, a float32 sum would stay at 1e8.
		{"sum", big, []int{0}, []int{}, []float64{100001000}},
		{"mean", big, []int{0}, []int{}, []float64{100001000.0 / 1001}},
		{"sum", i64, []int{0}, []int{}, []float64{1<<60 + 1}},
		{"max", nan, []int{0}, []int{}, []float64{math.NaN()}},
		{"sum", tensor.New(tensor.F32, 2, 0), []int{1}, []int{2}, []float64{0, 0}},
		{"mean", tensor.New(tensor.F32, 2, 0), []int{1}, []int{2}, []float64{math.NaN(), math.NaN()}},
		{"mean", tensor.FromI32([]int32{-3, -4, 7, 8}, 2, 2), []int{1}, []int{2}, []float64{-3, 7}},
	} {
		got := mustRunOp(t, tc.op, graph.Attrs{"axes": tc.axes}, tc.x)[0]
		checkTensorTol(t, fmt.Sprintf("%s(%v)", tc.op, tc.x), got, tc.x.DType, tc.shape, tc.want, 0)
	}
	if got := mustRunOp(t, "sum", graph.Attrs{"axes": []int{0}}, big)[0]; got.F32[0] != 100001000 {
		t.Errorf("sum of 1e8 and 1000 ones = %v, want 100001000 exactly", got.F32[0])
	}
	_, err := runOp(t, "max", graph.Attrs{"axes": []int{1}}, tensor.New(tensor.F32, 2, 0))
	if err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("max over an empty axis: error %v, want one saying the axis is empty", err)
	}
}

func TestSoftmax(t *testing.T) {
	rng := rand.New(rand.NewPCG(33, 34))
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16, tensor.F16} {
		for _, axis := range []int{-1, 0, 1, 2} {
			shape := []int{2, 3, 5}
			x := randTensor(rng, dt, shape, -4, 4)
			ax := (axis + 3) % 3
			want := make([]float64, x.Numel())
			for i := range want {
				idx := unflatten(i, shape)
				den := 0.0
				for j := range shape[ax] {
					jdx := append([]int(nil), idx...)
					jdx[ax] = j
					den += math.Exp(x.At(flatten(jdx, shape)))
				}
				want[i] = math.Exp(x.At(i)) / den
			}
			got := mustRunOp(t, "softmax", graph.Attrs{"axis": axis}, x)
			checkTensor(t, fmt.Sprintf("softmax/%s/axis=%d", dt, axis), got[0], dt, shape, want)
		}
	}
	// The max is subtracted first, so large logits do not overflow; -inf gets zero weight.
	inf := math.Inf(-1)
	x := fromValues(tensor.F32, []int{2, 3}, []float64{1000, 1001, 1002, inf, 0, inf})
	e1, e2 := math.Exp(-1), math.Exp(-2)
	den := 1 + e1 + e2
	checkTensor(t, "softmax large", mustRunOp(t, "softmax", graph.Attrs{"axis": -1}, x)[0], tensor.F32, []int{2, 3},
		[]float64{e2 / den, e1 / den, 1 / den, 0, 1, 0})
}
