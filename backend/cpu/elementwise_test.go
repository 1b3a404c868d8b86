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

var broadcastCases = []struct{ a, b []int }{
	{[]int{2, 3}, []int{2, 3}},
	{[]int{2, 3, 4}, []int{3, 1}},
	{[]int{4}, []int{}},
	{[]int{}, []int{2, 2}},
	{[]int{1, 3}, []int{2, 1}},
	{[]int{2, 1, 4}, []int{1, 5, 1}},
}

// binaryExpect computes out[i] = f(a[bcast i], b[bcast i]) over the broadcast shape.
func binaryExpect(a, b *tensor.Tensor, f func(x, y float64) float64) ([]int, []float64) {
	shape := testBroadcast(a.Shape, b.Shape)
	want := make([]float64, tensor.Numel(shape))
	for i := range want {
		idx := unflatten(i, shape)
		want[i] = f(a.At(bcastIndex(idx, a.Shape)), b.At(bcastIndex(idx, b.Shape)))
	}
	return shape, want
}

func TestBinaryArithFloat(t *testing.T) {
	ops := []struct {
		op     string
		f      func(a, b float64) float64
		lo, hi float64 // operand range
	}{
		{"add", func(a, b float64) float64 { return a + b }, -3, 3},
		{"sub", func(a, b float64) float64 { return a - b }, -3, 3},
		{"mul", func(a, b float64) float64 { return a * b }, -3, 3},
		{"div", func(a, b float64) float64 { return a / b }, 0.5, 3},
		{"pow", math.Pow, 0.25, 2},
		{"maximum", math.Max, -3, 3},
		{"minimum", math.Min, -3, 3},
	}
	dtypes := []struct{ a, b, out tensor.DType }{
		{tensor.F32, tensor.F32, tensor.F32},
		{tensor.BF16, tensor.BF16, tensor.BF16},
		{tensor.F16, tensor.F16, tensor.F16},
		{tensor.BF16, tensor.F16, tensor.F32},
		{tensor.BF16, tensor.F32, tensor.F32},
		{tensor.I32, tensor.F32, tensor.F32},
		{tensor.F16, tensor.I64, tensor.F16},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, op := range ops {
		for _, dt := range dtypes {
			for _, sh := range broadcastCases {
				name := fmt.Sprintf("%s/%s%v,%s%v", op.op, dt.a, sh.a, dt.b, sh.b)
				t.Run(name, func(t *testing.T) {
					a := randTensor(rng, dt.a, sh.a, op.lo, op.hi)
					b := randTensor(rng, dt.b, sh.b, op.lo, op.hi)
					if op.op == "div" && dt.b.IsInt() {
						b = randTensor(rng, dt.b, sh.b, 1, 4)
					}
					shape, want := binaryExpect(a, b, op.f)
					got := mustRunOp(t, op.op, nil, a, b)
					checkTensor(t, name, got[0], dt.out, shape, want)
				})
			}
		}
	}
}

func TestBinaryArithNaN(t *testing.T) {
	nan := float32(math.NaN())
	a := tensor.FromF32([]float32{nan, 1, 2}, 3)
	b := tensor.FromF32([]float32{0, nan, 1}, 3)
	for _, op := range []string{"maximum", "minimum", "add"} {
		got := mustRunOp(t, op, nil, a, b)[0]
		if !math.IsNaN(got.At(0)) || !math.IsNaN(got.At(1)) || math.IsNaN(got.At(2)) {
			t.Errorf("%s(%v, %v) = %v, want NaN, NaN, a number", op, a, b, got)
		}
	}
}

// wrap32 is the two's complement wrap of v into int32.
func wrap32(v int64) int64 { return int64(int32(uint32(uint64(v)))) }

func TestBinaryArithInt(t *testing.T) {
	// Random operands with broadcasting against an int64 computation, wrapped for i32.
	ops := map[string]func(a, b int64) int64{
		"add":     func(a, b int64) int64 { return a + b },
		"sub":     func(a, b int64) int64 { return a - b },
		"mul":     func(a, b int64) int64 { return a * b },
		"maximum": func(a, b int64) int64 { return max(a, b) },
		"minimum": func(a, b int64) int64 { return min(a, b) },
		"div": func(a, b int64) int64 {
			q := math.Trunc(float64(a) / float64(b)) // toward zero, computed another way
			return int64(q)
		},
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for op, f := range ops {
		for _, dt := range []struct{ a, b, out tensor.DType }{
			{tensor.I32, tensor.I32, tensor.I32},
			{tensor.I64, tensor.I64, tensor.I64},
			{tensor.I32, tensor.I64, tensor.I64},
		} {
			for _, sh := range broadcastCases {
				name := fmt.Sprintf("%s/%s%v,%s%v", op, dt.a, sh.a, dt.b, sh.b)
				a := randTensor(rng, dt.a, sh.a, -50, 50)
				b := randTensor(rng, dt.b, sh.b, 1, 9)
				shape, want := binaryExpect(a, b, func(x, y float64) float64 {
					v := f(int64(x), int64(y))
					if dt.out == tensor.I32 {
						v = wrap32(v)
					}
					return float64(v)
				})
				got := mustRunOp(t, op, nil, a, b)
				checkTensor(t, name, got[0], dt.out, shape, want)
			}
		}
	}
}

func TestBinaryArithIntCases(t *testing.T) {
	i32 := func(v ...int32) *tensor.Tensor { return tensor.FromI32(v, len(v)) }
	i64 := func(v ...int64) *tensor.Tensor {
		return &tensor.Tensor{DType: tensor.I64, Shape: []int{len(v)}, I64: v}
	}
	bools := func(v ...bool) *tensor.Tensor {
		return &tensor.Tensor{DType: tensor.Bool, Shape: []int{len(v)}, Bool: v}
	}
	for _, tc := range []struct {
		op   string
		a, b *tensor.Tensor
		dt   tensor.DType
		want []float64
	}{
		{"add", i32(math.MaxInt32, -5), i32(1, 3), tensor.I32, []float64{math.MinInt32, -2}},
		{"mul", i32(65536, -3), i32(65536, 7), tensor.I32, []float64{0, -21}},
		{"div", i32(-7, 7, -7, 7, 0), i32(2, 2, -2, -2, 5), tensor.I32, []float64{-3, 3, 3, -3, 0}},
		{"div", i32(math.MinInt32), i32(-1), tensor.I32, []float64{math.MinInt32}},
		{"pow", i64(2, 3, -2, 5, 0), i64(10, 3, 3, 0, 0), tensor.I64, []float64{1024, 27, -8, 1, 1}},
		{"pow", i32(2), i32(31), tensor.I32, []float64{math.MinInt32}},
		{"maximum", i64(-1, 4), i64(3, 2), tensor.I64, []float64{3, 4}},
		{"add", bools(true, true, false), bools(true, false, false), tensor.Bool, []float64{1, 1, 0}},
		{"mul", bools(true, true, false), bools(true, false, false), tensor.Bool, []float64{1, 0, 0}},
		{"sub", i64(math.MinInt64 + 1), i64(1), tensor.I64, []float64{math.MinInt64}},
	} {
		name := fmt.Sprintf("%s(%v,%v)", tc.op, tc.a, tc.b)
		got := mustRunOp(t, tc.op, nil, tc.a, tc.b)
		checkTensor(t, name, got[0], tc.dt, tc.a.Shape, tc.want)
	}
}

func TestBinaryArithIntErrors(t *testing.T) {
	for _, tc := range []struct {
		op   string
		a, b *tensor.Tensor
		want string
	}{
		{"div", tensor.FromI32([]int32{4, 5}, 2), tensor.FromI32([]int32{2, 0}, 2), "integer division by zero"},
		{"div", &tensor.Tensor{DType: tensor.I64, Shape: []int{}, I64: []int64{1}}, &tensor.Tensor{DType: tensor.I64, Shape: []int{}, I64: []int64{0}}, "integer division by zero"},
		{"pow", tensor.FromI32([]int32{2}, 1), tensor.FromI32([]int32{-1}, 1), "negative power"},
	} {
		_, err := runOp(t, tc.op, nil, tc.a, tc.b)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s(%v, %v): error %v, want one containing %q", tc.op, tc.a, tc.b, err, tc.want)
		}
		// The error names the node.
		if err != nil && !strings.Contains(err.Error(), tc.op+"(%x0, %x1)") {
			t.Errorf("%s: error %q does not name the node", tc.op, err)
		}
	}
	// Float division by zero is not an error.
	got := mustRunOp(t, "div", nil, tensor.FromF32([]float32{1, -1, 0}, 3), tensor.FromF32([]float32{0, 0, 0}, 3))[0]
	if !math.IsInf(got.At(0), 1) || !math.IsInf(got.At(1), -1) || !math.IsNaN(got.At(2)) {
		t.Errorf("float division by zero = %v, want +Inf, -Inf, NaN", got)
	}
}

func TestCompare(t *testing.T) {
	ops := map[string]func(a, b float64) bool{
		"eq": func(a, b float64) bool { return a == b },
		"ne": func(a, b float64) bool { return a != b },
		"lt": func(a, b float64) bool { return a < b },
		"le": func(a, b float64) bool { return a <= b },
		"gt": func(a, b float64) bool { return a > b },
		"ge": func(a, b float64) bool { return a >= b },
	}
	rng := rand.New(rand.NewPCG(5, 6))
	for op, f := range ops {
		for _, dt := range [][2]tensor.DType{
			{tensor.F32, tensor.F32}, {tensor.BF16, tensor.BF16}, {tensor.F16, tensor.BF16},
			{tensor.I32, tensor.I32}, {tensor.I32, tensor.I64}, {tensor.I32, tensor.F32}, {tensor.Bool, tensor.Bool},
		} {
			for _, sh := range broadcastCases {
				name := fmt.Sprintf("%s/%s%v,%s%v", op, dt[0], sh.a, dt[1], sh.b)
				lo, hi := -2.0, 3.0 // small integers give many ties
				if dt[0] == tensor.Bool {
					lo, hi = 0, 2
				}
				a := randTensor(rng, dt[0], sh.a, lo, hi)
				b := randTensor(rng, dt[1], sh.b, lo, hi)
				if dt[0].IsFloat() && dt[1].IsFloat() {
					a = fromValues(dt[0], sh.a, values(randTensor(rng, tensor.I32, sh.a, lo, hi)))
				}
				shape, want := binaryExpect(a, b, func(x, y float64) float64 {
					if f(x, y) {
						return 1
					}
					return 0
				})
				got := mustRunOp(t, op, nil, a, b)
				checkTensor(t, name, got[0], tensor.Bool, shape, want)
			}
		}
	}
	// NaN compares unequal to everything, itself included.
	nan := tensor.FromF32([]float32{float32(math.NaN())}, 1)
	for op, want := range map[string]bool{"eq": false, "ne": true, "lt": false, "le": false, "gt": false, "ge": false} {
		if got := mustRunOp(t, op, nil, nan, nan)[0]; got.Bool[0] != want {
			t.Errorf("%s(NaN, NaN) = %v, want %v", op, got.Bool[0], want)
		}
	}
	// Large i64 values compare exactly.
	big := &tensor.Tensor{DType: tensor.I64, Shape: []int{1}, I64: []int64{1<<60 + 1}}
	big2 := &tensor.Tensor{DType: tensor.I64, Shape: []int{1}, I64: []int64{1 << 60}}
	if got := mustRunOp(t, "gt", nil, big, big2)[0]; !got.Bool[0] {
		t.Errorf("gt(2^60+1, 2^60) = false")
	}
}

func TestLogical(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, sh := range broadcastCases {
		a := randTensor(rng, tensor.Bool, sh.a, 0, 2)
		b := randTensor(rng, tensor.Bool, sh.b, 0, 2)
		for op, f := range map[string]func(x, y bool) bool{
			"logical_and": func(x, y bool) bool { return x && y },
			"logical_or":  func(x, y bool) bool { return x || y },
		} {
			shape, want := binaryExpect(a, b, func(x, y float64) float64 {
				if f(x != 0, y != 0) {
					return 1
				}
				return 0
			})
			got := mustRunOp(t, op, nil, a, b)
			checkTensor(t, fmt.Sprintf("%s%v%v", op, sh.a, sh.b), got[0], tensor.Bool, shape, want)
		}
		want := make([]float64, a.Numel())
		for i, v := range a.Bool {
			if !v {
				want[i] = 1
			}
		}
		got := mustRunOp(t, "logical_not", nil, a)
		checkTensor(t, fmt.Sprintf("logical_not%v", sh.a), got[0], tensor.Bool, a.Shape, want)
	}
}

func TestUnaryFloat(t *testing.T) {
	sigmoid := func(x float64) float64 { return 1 / (1 + math.Exp(-x)) }
	ops := []struct {
		op     string
		f      func(float64) float64
		lo, hi float64
	}{
		{"exp", math.Exp, -5, 5},
		{"log", math.Log, 0.01, 10},
		{"sqrt", math.Sqrt, 0, 10},
		{"rsqrt", func(x float64) float64 { return math.Pow(x, -0.5) }, 0.01, 10},
		{"reciprocal", func(x float64) float64 { return math.Pow(x, -1) }, 0.1, 10},
		{"sin", math.Sin, -4, 4},
		{"cos", math.Cos, -4, 4},
		{"tanh", math.Tanh, -4, 4},
		{"sigmoid", sigmoid, -8, 8},
		{"silu", func(x float64) float64 { return x * sigmoid(x) }, -8, 8},
	}
	rng := rand.New(rand.NewPCG(9, 10))
	for _, op := range ops {
		for _, dt := range []tensor.DType{tensor.F32, tensor.BF16, tensor.F16} {
			for _, shape := range [][]int{{}, {7}, {2, 3, 5}} {
				x := randTensor(rng, dt, shape, op.lo, op.hi)
				want := values(x)
				for i, v := range want {
					want[i] = op.f(v)
				}
				got := mustRunOp(t, op.op, nil, x)
				checkTensor(t, fmt.Sprintf("%s/%s%v", op.op, dt, shape), got[0], dt, shape, want)
			}
		}
	}
	// Extremes stay finite where the math is.
	x := tensor.FromF32([]float32{-1000, 1000, 0}, 3)
	checkTensor(t, "sigmoid extremes", mustRunOp(t, "sigmoid", nil, x)[0], tensor.F32, []int{3}, []float64{0, 1, 0.5})
	checkTensor(t, "silu extremes", mustRunOp(t, "silu", nil, x)[0], tensor.F32, []int{3}, []float64{0, 1000, 0})
}

func TestNegAbs(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16, tensor.F16, tensor.I32, tensor.I64} {
		x := randTensor(rng, dt, []int{3, 4}, -10, 10)
		neg, abs := values(x), values(x)
		for i, v := range neg {
			neg[i], abs[i] = -v, math.Abs(v)
		}
		checkTensor(t, "neg/"+dt.String(), mustRunOp(t, "neg", nil, x)[0], dt, x.Shape, neg)
		checkTensor(t, "abs/"+dt.String(), mustRunOp(t, "abs", nil, x)[0], dt, x.Shape, abs)
	}
	m := tensor.FromI32([]int32{math.MinInt32, 5}, 2)
	checkTensor(t, "neg wrap", mustRunOp(t, "neg", nil, m)[0], tensor.I32, []int{2}, []float64{math.MinInt32, -5})
	checkTensor(t, "abs wrap", mustRunOp(t, "abs", nil, m)[0], tensor.I32, []int{2}, []float64{math.MinInt32, 5})
}

func TestWhere(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	shapes := [][3][]int{
		{{2, 3}, {2, 3}, {2, 3}},
		{{2, 1, 4}, {3, 1}, {}},
		{{4}, {3, 1}, {2, 1, 1}},
	}
	for _, dt := range [][3]tensor.DType{
		{tensor.F32, tensor.F32, tensor.F32},
		{tensor.BF16, tensor.BF16, tensor.BF16},
		{tensor.F16, tensor.BF16, tensor.F32},
		{tensor.I32, tensor.F32, tensor.F32},
		{tensor.I32, tensor.I64, tensor.I64},
		{tensor.I32, tensor.I32, tensor.I32},
		{tensor.Bool, tensor.Bool, tensor.Bool},
	} {
		for _, sh := range shapes {
			cond := randTensor(rng, tensor.Bool, sh[0], 0, 2)
			a := randTensor(rng, dt[0], sh[1], -5, 5)
			b := randTensor(rng, dt[1], sh[2], -5, 5)
			if dt[0] == tensor.Bool {
				a, b = randTensor(rng, tensor.Bool, sh[1], 0, 2), randTensor(rng, tensor.Bool, sh[2], 0, 2)
			}
			shape := testBroadcast(sh[0], sh[1], sh[2])
			want := make([]float64, tensor.Numel(shape))
			for i := range want {
				idx := unflatten(i, shape)
				if cond.At(bcastIndex(idx, sh[0])) != 0 {
					want[i] = a.At(bcastIndex(idx, sh[1]))
				} else {
					want[i] = b.At(bcastIndex(idx, sh[2]))
				}
			}
			got := mustRunOp(t, "where", nil, cond, a, b)
			checkTensor(t, fmt.Sprintf("where/%v/%v", dt, sh), got[0], dt[2], shape, want)
		}
	}
}

func TestCast(t *testing.T) {
	f32 := tensor.FromF32([]float32{1.5, -2.7, 0, 3.14159265, 70000}, 5)
	for _, tc := range []struct {
		in   *tensor.Tensor
		dt   tensor.DType
		want []float64
	}{
		{f32, tensor.I32, []float64{1, -2, 0, 3, 70000}},
		{f32, tensor.I64, []float64{1, -2, 0, 3, 70000}},
		{f32, tensor.Bool, []float64{1, 1, 0, 1, 1}},
		{f32, tensor.BF16, []float64{1.5, -2.703125, 0, 3.140625, 70144}},
		{f32, tensor.F16, []float64{1.5, -2.69921875, 0, 3.140625, math.Inf(1)}},
		{tensor.FromI32([]int32{-3, 0, 7}, 3), tensor.F32, []float64{-3, 0, 7}},
		{tensor.FromI32([]int32{-3, 0, 7}, 3), tensor.I64, []float64{-3, 0, 7}},
		{tensor.FromI32([]int32{-3, 0, 7}, 3), tensor.Bool, []float64{1, 0, 1}},
		{&tensor.Tensor{DType: tensor.Bool, Shape: []int{2}, Bool: []bool{true, false}}, tensor.F16, []float64{1, 0}},
		{&tensor.Tensor{DType: tensor.I64, Shape: []int{2}, I64: []int64{-9, 1 << 20}}, tensor.I32, []float64{-9, 1 << 20}},
		{fromValues(tensor.BF16, []int{2}, []float64{0.1, -7}), tensor.F32, []float64{0.10009765625, -7}},
	} {
		got := mustRunOp(t, "cast", graph.Attrs{"dtype": tc.dt}, tc.in)[0]
		checkTensor(t, fmt.Sprintf("cast %v to %s", tc.in, tc.dt), got, tc.dt, tc.in.Shape, tc.want)
	}
	// A cast to the same dtype gives a new tensor, not the input.
	got := mustRunOp(t, "cast", graph.Attrs{"dtype": tensor.F32}, f32)[0]
	got.F32[0] = 42
	if f32.F32[0] != 1.5 {
		t.Errorf("cast to the same dtype aliases its input")
	}
}
