package cpu

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Test helpers. Expected values in the tests are computed from multi-indices with plain loops,
// independently of the strided walks the kernels use.

// constShape turns a concrete shape into a graph shape.
func constShape(s []int) graph.Shape { return graph.Dims(s...) }

// runOp builds a graph with one input per tensor (named x0, x1, ...), one op node whose
// outputs are the graph outputs, compiles it and runs it.
func runOp(t *testing.T, op string, attrs graph.Attrs, in ...*tensor.Tensor) ([]*tensor.Tensor, error) {
	t.Helper()
	b := graph.NewBuilder("t")
	vals := make([]*graph.Value, len(in))
	feeds := map[string]*tensor.Tensor{}
	for i, x := range in {
		name := fmt.Sprintf("x%d", i)
		vals[i] = b.Input(name, x.DType, constShape(x.Shape))
		feeds[name] = x
	}
	b.Output(b.Apply(op, attrs, vals...)...)
	g, err := b.Build()
	if err != nil {
		t.Fatalf("build %s: %v", op, err)
	}
	p, err := Compile(context.Background(), g, nil)
	if err != nil {
		t.Fatalf("compile %s: %v", op, err)
	}
	return p.Run(context.Background(), feeds)
}

// mustRunOp is runOp that fails the test on a run error.
func mustRunOp(t *testing.T, op string, attrs graph.Attrs, in ...*tensor.Tensor) []*tensor.Tensor {
	t.Helper()
	out, err := runOp(t, op, attrs, in...)
	if err != nil {
		t.Fatalf("%s: %v", op, err)
	}
	return out
}

// fromValues builds a tensor of dtype dt from float64 values (converted like tensor.Cast).
func fromValues(dt tensor.DType, shape []int, vals []float64) *tensor.Tensor {
	if len(vals) != tensor.Numel(shape) {
		panic(fmt.Sprintf("fromValues: %d values for shape %v", len(vals), shape))
	}
	switch dt {
	case tensor.I64:
		t := tensor.New(tensor.I64, shape...)
		for i, v := range vals {
			t.I64[i] = int64(v)
		}
		return t
	case tensor.I32:
		t := tensor.New(tensor.I32, shape...)
		for i, v := range vals {
			t.I32[i] = int32(v)
		}
		return t
	case tensor.Bool:
		t := tensor.New(tensor.Bool, shape...)
		for i, v := range vals {
			t.Bool[i] = v != 0
		}
		return t
	}
	f := make([]float32, len(vals))
	for i, v := range vals {
		f[i] = float32(v)
	}
	return tensor.FromF32(f, shape...).Cast(dt)
}

// randTensor fills a tensor with uniform values in [lo, hi) (integers: truncated).
func randTensor(rng *rand.Rand, dt tensor.DType, shape []int, lo, hi float64) *tensor.Tensor {
	vals := make([]float64, tensor.Numel(shape))
	for i := range vals {
		vals[i] = lo + (hi-lo)*rng.Float64()
		if dt.IsInt() || dt == tensor.Bool {
			vals[i] = math.Floor(vals[i])
		}
	}
	return fromValues(dt, shape, vals)
}

// values returns every element widened to float64.
func values(t *tensor.Tensor) []float64 {
	out := make([]float64, t.Numel())
	for i := range out {
		out[i] = t.At(i)
	}
	return out
}

// unflatten turns a row-major flat index into a multi-index of shape.
func unflatten(i int, shape []int) []int {
	idx := make([]int, len(shape))
	for d := len(shape) - 1; d >= 0; d-- {
		if shape[d] > 0 {
			idx[d] = i % shape[d]
			i /= shape[d]
		}
	}
	return idx
}

// flatten turns a multi-index of shape into a row-major flat index.
func flatten(idx, shape []int) int {
	f := 0
	for d := range shape {
		f = f*shape[d] + idx[d]
	}
	return f
}

// bcastIndex maps a multi-index of the broadcast output to the flat index of an input of
// shape in (aligned at the right; size-1 dimensions repeat).
func bcastIndex(outIdx, in []int) int {
	off := len(outIdx) - len(in)
	idx := make([]int, len(in))
	for d := range in {
		idx[d] = outIdx[off+d] % in[d]
	}
	return flatten(idx, in)
}

// testBroadcast is NumPy broadcasting of two concrete shapes, written out for the tests.
func testBroadcast(shapes ...[]int) []int {
	rank := 0
	for _, s := range shapes {
		rank = max(rank, len(s))
	}
	out := make([]int, rank)
	for d := range out {
		out[d] = 1
		for _, s := range shapes {
			if k := d - (rank - len(s)); k >= 0 && s[k] != 1 {
				out[d] = s[k]
			}
		}
	}
	return out
}

// roundTo rounds a float64 to what dtype dt stores.
func roundTo(dt tensor.DType, v float64) float64 {
	switch dt {
	case tensor.F32:
		return float64(float32(v))
	case tensor.BF16:
		return float64(tensor.BF16ToF32(tensor.F32ToBF16(float32(v))))
	case tensor.F16:
		return float64(tensor.F16ToF32(tensor.F32ToF16(float32(v))))
	}
	return v
}

// tolerance is the relative error allowed when a kernel computes in float32 and the test in
// float64 (both rounded to the output dtype): about one unit in the last place.
func tolerance(dt tensor.DType) float64 {
	switch dt {
	case tensor.BF16:
		return 1.0 / 128
	case tensor.F16:
		return 1.0 / 1024
	}
	return 1e-6
}

// checkTensor compares got with the expected dtype, shape and values: exact for integers and
// bools, within tolerance(dt) (relative, with an absolute floor) for floats. NaN matches NaN.
func checkTensor(t *testing.T, what string, got *tensor.Tensor, dt tensor.DType, shape []int, want []float64) {
	t.Helper()
	checkTensorTol(t, what, got, dt, shape, want, tolerance(dt))
}

// checkTensorTol is checkTensor with an explicit relative tolerance for floats.
func checkTensorTol(t *testing.T, what string, got *tensor.Tensor, dt tensor.DType, shape []int, want []float64, rtol float64) {
	t.Helper()
	if got == nil {
		t.Fatalf("%s: nil result", what)
	}
	if err := got.Validate(); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if got.DType != dt || !slices.Equal(got.Shape, shape) {
		t.Fatalf("%s: got %s%v, want %s%v", what, got.DType, got.Shape, dt, shape)
	}
	if len(want) != got.Numel() {
		t.Fatalf("%s: test wants %d values for %d elements", what, len(want), got.Numel())
	}
	bad := 0
	for i, w := range want {
		g := got.At(i)
		ok := g == w || (math.IsNaN(g) && math.IsNaN(w))
		if !ok && dt.IsFloat() && !math.IsInf(w, 0) {
			w = roundTo(dt, w)
			ok = math.Abs(g-w) <= rtol*math.Max(math.Abs(w), 1e-3)
		}
		if !ok {
			if bad++; bad <= 5 {
				t.Errorf("%s: element %d (index %v) = %v, want %v", what, i, unflatten(i, shape), g, w)
			}
		}
	}
	if bad > 5 {
		t.Errorf("%s: %d elements differ in all", what, bad)
	}
}
