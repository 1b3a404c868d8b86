package cpu

import (
	"errors"
	"fmt"
	"math"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Elementwise reference kernels. Binary and ternary ops broadcast with NumPy rules: inputs
// a[...] and b[...] give out[broadcast(a, b)]. Arithmetic runs in float32 when the output
// dtype is a float (inputs widened), else in int64 (bools as 0 and 1) and is stored in the
// output dtype.

// floatOps computes a binary op on float32 operands.
var floatOps = map[string]func(a, b float32) float32{
	"add":     func(a, b float32) float32 { return a + b },
	"sub":     func(a, b float32) float32 { return a - b },
	"mul":     func(a, b float32) float32 { return a * b },
	"div":     func(a, b float32) float32 { return a / b },
	"pow":     func(a, b float32) float32 { return float32(math.Pow(float64(a), float64(b))) },
	"maximum": func(a, b float32) float32 { return max(a, b) }, // NaN wins, as in torch
	"minimum": func(a, b float32) float32 { return min(a, b) },
}

var errIntDivZero = errors.New("integer division by zero")

// intOps computes a binary op on int64 operands.
var intOps = map[string]func(a, b int64) (int64, error){
	"add": func(a, b int64) (int64, error) { return a + b, nil },
	"sub": func(a, b int64) (int64, error) { return a - b, nil },
	"mul": func(a, b int64) (int64, error) { return a * b, nil },
	"div": func(a, b int64) (int64, error) {
		if b == 0 {
			return 0, errIntDivZero
		}
		return a / b, nil // truncates toward zero
	},
	"pow":     intPow,
	"maximum": func(a, b int64) (int64, error) { return max(a, b), nil },
	"minimum": func(a, b int64) (int64, error) { return min(a, b), nil },
}

// intPow is a^b by repeated squaring, wrapping on overflow like int64 multiplication.
func intPow(a, b int64) (int64, error) {
	if b < 0 {
		return 0, fmt.Errorf("integer %d raised to a negative power %d", a, b)
	}
	r := int64(1)
	for b > 0 {
		if b&1 == 1 {
			r *= a
		}
		a *= a
		b >>= 1
	}
	return r, nil
}

// broadcastArgs checks that n has nIn inputs and one output, and that the inputs broadcast
// to the output's shape; it returns the output and the inputs' strides in it.
func broadcastArgs(n *graph.Node, in []*tensor.Tensor, out []Out, nIn int) (Out, [][]int, error) {
	if err := checkArgs(n, in, out, nIn, 1); err != nil {
		return Out{}, nil, err
	}
	o := out[0]
	shapes := make([][]int, len(in))
	for i, t := range in {
		shapes[i] = t.Shape
	}
	b, err := broadcastShapes(shapes...)
	if err != nil {
		return o, nil, err
	}
	if err := checkShape(b, o); err != nil {
		return o, nil, err
	}
	st := make([][]int, len(in))
	for i, t := range in {
		if st[i], err = broadcastStrides(t.Shape, o.Shape); err != nil {
			return o, nil, err
		}
	}
	return o, st, nil
}

// unaryArgs checks that n has one input and one output of the input's shape, and returns
// the output.
func unaryArgs(n *graph.Node, in []*tensor.Tensor, out []Out) (Out, error) {
	if err := checkArgs(n, in, out, 1, 1); err != nil {
		return Out{}, err
	}
	return out[0], checkShape(in[0].Shape, out[0])
}

// binaryArith: add, sub, mul, div, pow, maximum, minimum. a[...] op b[...] -> out[broadcast].
func binaryArith(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	o, st, err := broadcastArgs(n, in, out, 2)
	if err != nil {
		return nil, err
	}
	zero := make([]int, 2)
	if o.DType.IsFloat() {
		f := floatOps[n.Op]
		if f == nil {
			return nil, fmt.Errorf("no float arithmetic for op %s", n.Op)
		}
		a, b := in[0].Float32s(), in[1].Float32s()
		res := make([]float32, tensor.Numel(o.Shape))
		walk(o.Shape, st, zero, func(i int, off []int) { res[i] = f(a[off[0]], b[off[1]]) })
		return []*tensor.Tensor{fromF32(res, o)}, nil
	}
	f := intOps[n.Op]
	if f == nil {
		return nil, fmt.Errorf("no integer arithmetic for op %s", n.Op)
	}
	a, b := int64s(in[0]), int64s(in[1])
	res := make([]int64, tensor.Numel(o.Shape))
	var firstErr error
	walk(o.Shape, st, zero, func(i int, off []int) {
		if firstErr != nil {
			return
		}
		v, err := f(a[off[0]], b[off[1]])
		if err != nil {
			firstErr = fmt.Errorf("element %d: %w", i, err)
		}
		res[i] = v
	})
	if firstErr != nil {
		return nil, firstErr
	}
	return []*tensor.Tensor{fromI64(res, o)}, nil
}

// compare: eq, ne, lt, le, gt, ge. a[...] op b[...] -> bool[broadcast]. Integers and bools
// compare as int64; when either side is a float both compare as float64 (exact for every
// float storage dtype).
func compare(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	o, st, err := broadcastArgs(n, in, out, 2)
	if err != nil {
		return nil, err
	}
	var cmp func(c int) bool // c is the sign of a - b; NaN comparisons get c = 2
	switch n.Op {
	case "eq":
		cmp = func(c int) bool { return c == 0 }
	case "ne":
		cmp = func(c int) bool { return c != 0 }
	case "lt":
		cmp = func(c int) bool { return c == -1 }
	case "le":
		cmp = func(c int) bool { return c == -1 || c == 0 }
	case "gt":
		cmp = func(c int) bool { return c == 1 }
	case "ge":
		cmp = func(c int) bool { return c == 1 || c == 0 }
	default:
		return nil, fmt.Errorf("unknown comparison %s", n.Op)
	}
	res := make([]bool, tensor.Numel(o.Shape))
	zero := make([]int, 2)
	if in[0].DType.IsFloat() || in[1].DType.IsFloat() {
		a, b := float64s(in[0]), float64s(in[1])
		walk(o.Shape, st, zero, func(i int, off []int) {
			x, y := a[off[0]], b[off[1]]
			c := 2
			switch {
			case x < y:
				c = -1
			case x > y:
				c = 1
			case x == y:
				c = 0
			}
			res[i] = cmp(c)
		})
	} else {
		a, b := int64s(in[0]), int64s(in[1])
		walk(o.Shape, st, zero, func(i int, off []int) {
			x, y := a[off[0]], b[off[1]]
			c := 0
			if x < y {
				c = -1
			} else if x > y {
				c = 1
			}
			res[i] = cmp(c)
		})
	}
	return []*tensor.Tensor{fromBool(res, o)}, nil
}

// logical: logical_and, logical_or on bool[...] pairs (broadcast), logical_not on bool[...].
func logical(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	nIn := 2
	if n.Op == "logical_not" {
		nIn = 1
	}
	o, st, err := broadcastArgs(n, in, out, nIn)
	if err != nil {
		return nil, err
	}
	ops := make([][]bool, len(in))
	for i, t := range in {
		if ops[i], err = bools(t, fmt.Sprintf("input %d", i)); err != nil {
			return nil, err
		}
	}
	res := make([]bool, tensor.Numel(o.Shape))
	zero := make([]int, len(in))
	switch n.Op {
	case "logical_and":
		walk(o.Shape, st, zero, func(i int, off []int) { res[i] = ops[0][off[0]] && ops[1][off[1]] })
	case "logical_or":
		walk(o.Shape, st, zero, func(i int, off []int) { res[i] = ops[0][off[0]] || ops[1][off[1]] })
	case "logical_not":
		walk(o.Shape, st, zero, func(i int, off []int) { res[i] = !ops[0][off[0]] })
	default:
		return nil, fmt.Errorf("unknown logical op %s", n.Op)
	}
	return []*tensor.Tensor{fromBool(res, o)}, nil
}

// unaryFloatOps are computed in float64 from the float32-widened input, then rounded.
var unaryFloatOps = map[string]func(x float64) float64{
	"exp":        math.Exp,
	"log":        math.Log,
	"sqrt":       math.Sqrt,
	"rsqrt":      func(x float64) float64 { return 1 / math.Sqrt(x) },
	"reciprocal": func(x float64) float64 { return 1 / x },
	"sin":        math.Sin,
	"cos":        math.Cos,
	"tanh":       math.Tanh,
	"sigmoid":    func(x float64) float64 { return 1 / (1 + math.Exp(-x)) },
	"silu":       func(x float64) float64 { return x / (1 + math.Exp(-x)) },
}

// unaryFloat: exp, log, sqrt, rsqrt, reciprocal, sin, cos, tanh, sigmoid, silu.
// x[...] -> out[...] in the output's float dtype.
func unaryFloat(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	o, err := unaryArgs(n, in, out)
	if err != nil {
		return nil, err
	}
	f := unaryFloatOps[n.Op]
	if f == nil {
		return nil, fmt.Errorf("unknown unary op %s", n.Op)
	}
	x := in[0].Float32s()
	res := make([]float32, len(x))
	for i, v := range x {
		res[i] = float32(f(float64(v)))
	}
	return []*tensor.Tensor{fromF32(res, o)}, nil
}

// unaryNumeric: neg, abs. x[...] -> out[...]; floats in float32, integers in int64 (wrapping:
// neg and abs of the most negative value give it back).
func unaryNumeric(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	o, err := unaryArgs(n, in, out)
	if err != nil {
		return nil, err
	}
	neg := n.Op == "neg"
	if !neg && n.Op != "abs" {
		return nil, fmt.Errorf("unknown unary op %s", n.Op)
	}
	if o.DType.IsFloat() {
		x := in[0].Float32s()
		res := make([]float32, len(x))
		for i, v := range x {
			if neg {
				res[i] = -v
			} else {
				res[i] = float32(math.Abs(float64(v)))
			}
		}
		return []*tensor.Tensor{fromF32(res, o)}, nil
	}
	x := int64s(in[0])
	res := make([]int64, len(x))
	for i, v := range x {
		if neg || v < 0 {
			v = -v
		}
		res[i] = v
	}
	return []*tensor.Tensor{fromI64(res, o)}, nil
}

// where: cond bool[...], a[...], b[...] -> out[broadcast of all three], cond ? a : b, values
// converted to the output dtype.
func where(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	o, st, err := broadcastArgs(n, in, out, 3)
	if err != nil {
		return nil, err
	}
	cond, err := bools(in[0], "condition")
	if err != nil {
		return nil, err
	}
	if o.DType.IsFloat() {
		return []*tensor.Tensor{fromF32(choose(o.Shape, st, cond, in[1].Float32s(), in[2].Float32s()), o)}, nil
	}
	return []*tensor.Tensor{fromI64(choose(o.Shape, st, cond, int64s(in[1]), int64s(in[2])), o)}, nil
}

// choose returns cond ? a : b for every element of shape, the three operands read at their
// strides st in it.
func choose[T any](shape []int, st [][]int, cond []bool, a, b []T) []T {
	res := make([]T, tensor.Numel(shape))
	walk(shape, st, make([]int, 3), func(i int, off []int) {
		if cond[off[0]] {
			res[i] = a[off[1]]
		} else {
			res[i] = b[off[2]]
		}
	})
	return res
}

// cast: x[...] -> out[...] in attribute dtype, converted by tensor.Cast (floats round to
// nearest even, floats to integers truncate toward zero, nonzero is true).
func cast(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	o, err := unaryArgs(n, in, out)
	if err != nil {
		return nil, err
	}
	if dt := n.Attrs.DType("dtype"); dt != o.DType {
		return nil, fmt.Errorf("cast to %s but the output is declared %s", dt, o.DType)
	}
	r := in[0].Cast(o.DType)
	if r == in[0] {
		r = r.Clone() // never hand back an input
	}
	return []*tensor.Tensor{r}, nil
}

func init() {
	for op := range floatOps {
		registerReference(op, binaryArith)
	}
	for _, op := range []string{"eq", "ne", "lt", "le", "gt", "ge"} {
		registerReference(op, compare)
	}
	for _, op := range []string{"logical_and", "logical_or", "logical_not"} {
		registerReference(op, logical)
	}
	for op := range unaryFloatOps {
		registerReference(op, unaryFloat)
	}
	registerReference("neg", unaryNumeric)
	registerReference("abs", unaryNumeric)
	registerReference("where", where)
	registerReference("cast", cast)
}
