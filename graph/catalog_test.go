package graph

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/loom-ml/loom/tensor"
)

// ty builds a type from a dtype and dims given as ints (sizes) or strings (symbols).
func ty(dt tensor.DType, dims ...any) Type {
	s := Shape{}
	for _, d := range dims {
		switch x := d.(type) {
		case int:
			s = append(s, D(x))
		case string:
			s = append(s, Sym(x))
		default:
			panic(fmt.Sprintf("ty: bad dim %v", d))
		}
	}
	return Type{dt, s}
}

type inferCase struct {
	op    string
	in    []Type
	attrs Attrs
	want  []Type // nil: an error is expected
	err   string // substring of the expected error
}

func (c inferCase) name() string {
	var parts []string
	for _, t := range c.in {
		parts = append(parts, t.String())
	}
	s := c.op + "(" + strings.Join(parts, ",") + ")"
	if len(c.attrs) > 0 {
		var as []string
		for _, k := range sortedKeys(c.attrs) {
			as = append(as, k+"="+FormatAttr(c.attrs[k]))
		}
		s += "{" + strings.Join(as, ",") + "}"
	}
	return s
}

var (
	bf16, f16, f32t, i32, i64, boolt = tensor.BF16, tensor.F16, tensor.F32, tensor.I32, tensor.I64, tensor.Bool
)

func inferCases() []inferCase {
	var cases []inferCase
	for _, op := range []string{"add", "sub", "mul", "div", "pow", "maximum", "minimum"} {
		cases = append(cases,
			inferCase{op: op, in: []Type{ty(bf16, "B", 1, 4), ty(f32t, "S", 1)}, want: []Type{ty(f32t, "B", "S", 4)}},
			inferCase{op: op, in: []Type{ty(i32, 2), ty(i64)}, want: []Type{ty(i64, 2)}},
			inferCase{op: op, in: []Type{ty(bf16, 3), ty(f16, 3)}, want: []Type{ty(f32t, 3)}},
			inferCase{op: op, in: []Type{ty(f32t, 2, 3), ty(f32t, 4)}, err: "do not broadcast (dimension 3 against 4)"},
			inferCase{op: op, in: []Type{ty(f32t, "B"), ty(f32t, "S")}, err: "do not broadcast"},
			inferCase{op: op, in: []Type{ty(boolt, 2), ty(f32t, 2)}, err: "cannot mix bool with f32"},
		)
	}
	for _, op := range []string{"eq", "ne", "lt", "le", "gt", "ge"} {
		cases = append(cases,
			inferCase{op: op, in: []Type{ty(i64, "S", 1), ty(i64, 1, "S")}, want: []Type{ty(boolt, "S", "S")}},
			inferCase{op: op, in: []Type{ty(boolt, 2), ty(f32t, 2)}, err: "cannot compare bool with f32"},
			inferCase{op: op, in: []Type{ty(f32t, 2), ty(f32t, 3)}, err: "do not broadcast"},
		)
	}
	for _, op := range []string{"logical_and", "logical_or"} {
		cases = append(cases,
			inferCase{op: op, in: []Type{ty(boolt, "B", 1), ty(boolt, 4)}, want: []Type{ty(boolt, "B", 4)}},
			inferCase{op: op, in: []Type{ty(boolt, 2), ty(i32, 2)}, err: op + " needs bool inputs, got i32"},
		)
	}
	cases = append(cases,
		inferCase{op: "logical_not", in: []Type{ty(boolt, "B")}, want: []Type{ty(boolt, "B")}},
		inferCase{op: "logical_not", in: []Type{ty(f32t, 2)}, err: "logical_not needs bool inputs, got f32"},
	)
	for _, op := range []string{"exp", "log", "sqrt", "rsqrt", "reciprocal", "sin", "cos", "tanh", "sigmoid", "silu"} {
		cases = append(cases,
			inferCase{op: op, in: []Type{ty(bf16, "B", 8)}, want: []Type{ty(bf16, "B", 8)}},
			inferCase{op: op, in: []Type{ty(i32, 2)}, err: op + " needs a float input, got i32"},
		)
	}
	for _, op := range []string{"neg", "abs"} {
		cases = append(cases,
			inferCase{op: op, in: []Type{ty(i64, 3)}, want: []Type{ty(i64, 3)}},
			inferCase{op: op, in: []Type{ty(boolt, 3)}, err: op + " needs a numeric input, got bool"},
		)
	}
	cases = append(cases,
		inferCase{op: "where", in: []Type{ty(boolt, "S", "S"), ty(f32t, "B", 1, "S", "S"), ty(f32t)}, want: []Type{ty(f32t, "B", 1, "S", "S")}},
		inferCase{op: "where", in: []Type{ty(f32t, 2), ty(f32t, 2), ty(f32t, 2)}, err: "condition must be bool, got f32"},
		inferCase{op: "where", in: []Type{ty(boolt, 3), ty(f32t, 2), ty(f32t, 2)}, err: "do not broadcast"},

		inferCase{op: "cast", in: []Type{ty(f32t, "B", 2)}, attrs: Attrs{"dtype": i64}, want: []Type{ty(i64, "B", 2)}},
		inferCase{op: "cast", in: []Type{ty(f32t, 2)}, attrs: Attrs{"dtype": tensor.Invalid}, err: "target: invalid dtype"},
		inferCase{op: "cast", in: []Type{ty(f32t, 2)}, attrs: Attrs{"dtype": tensor.DType(77)}, err: "unknown dtype dtype(77)"},
		inferCase{op: "cast", in: []Type{ty(f32t, 2)}, attrs: Attrs{"dtype": "f16"}, err: "cast attribute dtype: want dtype, got string"},

		inferCase{op: "matmul", in: []Type{ty(f32t, "B", 1, 3, 4), ty(bf16, 2, 4, 5)}, want: []Type{ty(f32t, "B", 2, 3, 5)}},
		inferCase{op: "matmul", in: []Type{ty(f32t, "S", "T"), ty(f32t, "T", 8)}, want: []Type{ty(f32t, "S", 8)}},
		inferCase{op: "matmul", in: []Type{ty(f32t, 3, 4), ty(f32t, 5, 6)}, err: "inner dimensions differ: [3,4] @ [5,6]"},
		inferCase{op: "matmul", in: []Type{ty(f32t, 4), ty(f32t, 4, 6)}, err: "matmul needs rank >= 2"},
		inferCase{op: "matmul", in: []Type{ty(f32t, 2, 3, 4), ty(f32t, 5, 4, 6)}, err: "do not broadcast"},

		inferCase{op: "linear", in: []Type{ty(bf16, "B", "S", 64), ty(f32t, 32, 64)}, want: []Type{ty(bf16, "B", "S", 32)}},
		inferCase{op: "linear", in: []Type{ty(f32t, "B", 64), ty(f32t, 64, 32)}, err: "last dimension 64 differs from the weight's input dimension 32"},
		inferCase{op: "linear", in: []Type{ty(f32t, "B", 64), ty(f32t, 32, 64, 1)}, err: "2-D weight"},
		inferCase{op: "linear", in: []Type{ty(i32, 64), ty(f32t, 32, 64)}, err: "linear needs float operands"},

		inferCase{op: "embedding", in: []Type{ty(bf16, 512, 64), ty(i32, "B", "S")}, want: []Type{ty(bf16, "B", "S", 64)}},
		inferCase{op: "embedding", in: []Type{ty(bf16, 512, 64), ty(f32t, "B")}, err: "embedding ids must be integers, got f32"},
		inferCase{op: "embedding", in: []Type{ty(bf16, 512), ty(i32, "B")}, err: "embedding table must be 2-D"},

		inferCase{op: "param", attrs: Attrs{"key": "w", "dtype": bf16, "shape": Dims(8, 4)}, want: []Type{ty(bf16, 8, 4)}},
		inferCase{op: "param", attrs: Attrs{"key": "w", "dtype": bf16, "shape": Dims(8, 4), "slice_dim": 1, "slice_index": 1, "slice_count": 2}, want: []Type{ty(bf16, 8, 2)}},
		inferCase{op: "param", attrs: Attrs{"key": "w", "dtype": bf16, "shape": Dims(8, 4), "slice_dim": 1, "slice_count": 3}, err: `param "w": slice 0 of 3 along dimension 1 does not fit shape [8,4]`},
		inferCase{op: "param", attrs: Attrs{"key": "w", "dtype": bf16, "shape": Dims(8, 4), "slice_dim": 2, "slice_count": 2}, err: "does not fit shape"},
		inferCase{op: "param", attrs: Attrs{"key": "w", "dtype": bf16, "shape": Dims(8, 4), "slice_dim": 0, "slice_index": 2, "slice_count": 2}, err: "does not fit shape"},
		inferCase{op: "param", attrs: Attrs{"key": "w", "dtype": bf16, "shape": Shape{symB}}, err: `param "w" has a symbolic shape [B]`},
		inferCase{op: "param", attrs: Attrs{"key": "", "dtype": bf16, "shape": Dims(2)}, err: "param has an empty key"},
		inferCase{op: "param", attrs: Attrs{"key": "w", "dtype": bf16, "shape": Dims(-2)}, err: "dimension 0 is negative"},
		inferCase{op: "param", attrs: Attrs{"key": "w", "dtype": tensor.Invalid, "shape": Dims(2)}, err: `param "w": invalid dtype`},
		inferCase{op: "param", attrs: Attrs{"key": "w", "dtype": bf16}, err: "missing required attribute shape"},

		inferCase{op: "const", attrs: Attrs{"dtype": f32t, "shape": Dims(2, 3), "values": []float64{1, 2, 3, 4, 5, 6}}, want: []Type{ty(f32t, 2, 3)}},
		inferCase{op: "const", attrs: Attrs{"dtype": i32, "shape": Shape{}, "values": []float64{7}}, want: []Type{ty(i32)}},
		inferCase{op: "const", attrs: Attrs{"dtype": f32t, "shape": Dims(2, 3), "values": []float64{1, 2}}, err: "const of shape [2,3] has 2 values, want 1 or 6"},
		inferCase{op: "const", attrs: Attrs{"dtype": f32t, "shape": Dims(-1, -1), "values": []float64{1}}, err: "dimension 0 is negative"},
		inferCase{op: "const", attrs: Attrs{"dtype": f32t, "shape": Shape{symS}, "values": []float64{1}}, err: "const has a symbolic shape [S]"},
		inferCase{op: "const", attrs: Attrs{"dtype": f32t, "shape": Dims(1<<40, 1<<40), "values": []float64{1, 2}}, err: "too large"},
		inferCase{op: "const", attrs: Attrs{"dtype": tensor.Invalid, "shape": Dims(1), "values": []float64{1}}, err: "const: invalid dtype"},

		inferCase{op: "iota", attrs: Attrs{"shape": Shape{symS, symS}, "axis": 1}, want: []Type{ty(i32, "S", "S")}},
		inferCase{op: "iota", attrs: Attrs{"shape": Dims(4), "dtype": f32t}, want: []Type{ty(f32t, 4)}},
		inferCase{op: "iota", attrs: Attrs{"shape": Dims(2, 2), "axis": 2}, err: "axis 2 out of range for rank 2"},
		inferCase{op: "iota", attrs: Attrs{"shape": Dims(2), "dtype": boolt}, err: "iota needs a numeric dtype, got bool"},
		inferCase{op: "iota", attrs: Attrs{"shape": Dims(-2)}, err: "dimension 0 is negative"},

		inferCase{op: "softmax", in: []Type{ty(f32t, "B", 4, "S", "S")}, want: []Type{ty(f32t, "B", 4, "S", "S")}},
		inferCase{op: "softmax", in: []Type{ty(f32t, 2, 3)}, attrs: Attrs{"axis": 0}, want: []Type{ty(f32t, 2, 3)}},
		inferCase{op: "softmax", in: []Type{ty(f32t, 2, 3)}, attrs: Attrs{"axis": 2}, err: "axis 2 out of range for rank 2"},
		inferCase{op: "softmax", in: []Type{ty(i32, 2)}, err: "softmax needs a float input, got i32"},
		inferCase{op: "softmax", in: []Type{ty(f32t, 2)}, attrs: Attrs{"axis": 1.0}, err: "want int, got float64"},

		inferCase{op: "reshape", in: []Type{ty(bf16, "B", "S", 64)}, attrs: Attrs{"shape": Shape{symB, symS, D(4), D(16)}}, want: []Type{ty(bf16, "B", "S", 4, 16)}},
		inferCase{op: "reshape", in: []Type{ty(f32t, 6)}, attrs: Attrs{"shape": Shape{}}, err: "cannot reshape [6] to []: element counts differ"},
		inferCase{op: "reshape", in: []Type{ty(f32t, "B", 6)}, attrs: Attrs{"shape": Shape{symS, D(6)}}, err: "element counts differ"},
		inferCase{op: "reshape", in: []Type{ty(f32t, 6)}, attrs: Attrs{"shape": Dims(-2, -3)}, err: "negative dimension in [-2,-3]"},

		inferCase{op: "transpose", in: []Type{ty(f32t, "B", "S", 4, 16)}, attrs: Attrs{"perm": []int{0, 2, 1, 3}}, want: []Type{ty(f32t, "B", 4, "S", 16)}},
		inferCase{op: "transpose", in: []Type{ty(f32t, 2, 3)}, attrs: Attrs{"perm": []int{0, 0}}, err: "perm [0 0] is not a permutation"},
		inferCase{op: "transpose", in: []Type{ty(f32t, 2, 3)}, attrs: Attrs{"perm": []int{1, 2}}, err: "is not a permutation"},
		inferCase{op: "transpose", in: []Type{ty(f32t, 2, 3)}, attrs: Attrs{"perm": []int{1, 0, 2}}, err: "perm [1 0 2] has 3 entries for rank 2"},

		inferCase{op: "gather", in: []Type{ty(f32t, 1, "S", 64), ty(i32, "N")}, attrs: Attrs{"axis": 1}, want: []Type{ty(f32t, 1, "N", 64)}},
		inferCase{op: "gather", in: []Type{ty(f32t, 1, "S", 64), ty(i32, 2, 3)}, attrs: Attrs{"axis": -1}, want: []Type{ty(f32t, 1, "S", 2, 3)}},
		inferCase{op: "gather", in: []Type{ty(f32t, 1, "S", 64), ty(f32t, "N")}, attrs: Attrs{"axis": 1}, err: "indices must be integers, got f32"},
		inferCase{op: "gather", in: []Type{ty(f32t, 1, "S", 64), ty(i32, "N")}, attrs: Attrs{"axis": 3}, err: "axis 3 out of range for rank 3"},
		inferCase{op: "slice", in: []Type{ty(f32t, "B", 10)}, attrs: Attrs{"axis": -1, "start": 1, "end": 10, "step": 3}, want: []Type{ty(f32t, "B", 3)}},
		inferCase{op: "slice", in: []Type{ty(f32t, 10)}, attrs: Attrs{"axis": 0, "start": 4, "end": 4}, want: []Type{ty(f32t, 0)}},
		inferCase{op: "slice", in: []Type{ty(f32t, 10)}, attrs: Attrs{"axis": 0, "start": 0, "end": 10, "step": math.MaxInt}, want: []Type{ty(f32t, 1)}},
		inferCase{op: "slice", in: []Type{ty(f32t, 10)}, attrs: Attrs{"axis": 0, "start": 2, "end": 11}, err: "slice [2:11:1] out of range for axis 0 of size 10"},
		inferCase{op: "slice", in: []Type{ty(f32t, 10)}, attrs: Attrs{"axis": 0, "start": 5, "end": 4}, err: "out of range"},
		inferCase{op: "slice", in: []Type{ty(f32t, 10)}, attrs: Attrs{"axis": 0, "start": 0, "end": 4, "step": 0}, err: "out of range"},
		inferCase{op: "slice", in: []Type{ty(f32t, "S")}, attrs: Attrs{"axis": 0, "start": 0, "end": 1}, err: "slice along symbolic axis 0 (S) is not supported"},
		inferCase{op: "slice", in: []Type{ty(f32t, 10)}, attrs: Attrs{"axis": 1, "start": 0, "end": 1}, err: "axis 1 out of range for rank 1"},
		inferCase{op: "slice", in: []Type{ty(f32t, 10)}, attrs: Attrs{"axis": 0, "start": 0}, err: "missing required attribute end"},

		inferCase{op: "concat", in: []Type{ty(f32t, "B", 2), ty(f32t, "B", 3), ty(f32t, "B", 0)}, attrs: Attrs{"axis": 1}, want: []Type{ty(f32t, "B", 5)}},
		inferCase{op: "concat", in: []Type{ty(i32, 2)}, attrs: Attrs{"axis": 0}, want: []Type{ty(i32, 2)}},
		inferCase{op: "concat", in: []Type{ty(f32t, 2), ty(bf16, 2)}, attrs: Attrs{"axis": 0}, err: "input 1 is bf16, input 0 is f32"},
		inferCase{op: "concat", in: []Type{ty(f32t, 2, 3), ty(f32t, 2, 4)}, attrs: Attrs{"axis": 0}, err: "input 1 has shape [2,4], input 0 has [2,3]"},
		inferCase{op: "concat", in: []Type{ty(f32t, 2, 3), ty(f32t, 2)}, attrs: Attrs{"axis": 0}, err: "input 1 has rank 1, input 0 has 2"},
		inferCase{op: "concat", in: []Type{ty(f32t, "S"), ty(f32t, 2)}, attrs: Attrs{"axis": 0}, err: "concat along symbolic dimension S is not supported"},
		inferCase{op: "concat", in: nil, attrs: Attrs{"axis": 0}, err: "concat takes at least 1 inputs, got 0"},

		inferCase{op: "split", in: []Type{ty(bf16, "B", "S", 64)}, attrs: Attrs{"axis": -1, "sizes": []int{16, 16, 32}},
			want: []Type{ty(bf16, "B", "S", 16), ty(bf16, "B", "S", 16), ty(bf16, "B", "S", 32)}},
		inferCase{op: "split", in: []Type{ty(f32t, 6)}, attrs: Attrs{"axis": 0, "sizes": []int{2, 3}}, err: "split sizes [2 3] do not add up to axis 0 of [6]"},
		inferCase{op: "split", in: []Type{ty(f32t, 6)}, attrs: Attrs{"axis": 0, "sizes": []int{}}, err: "do not add up"},
		inferCase{op: "split", in: []Type{ty(f32t, 6)}, attrs: Attrs{"axis": 0, "sizes": []int{-2, 8}}, err: "negative split size"},
		inferCase{op: "split", in: []Type{ty(f32t, 0)}, attrs: Attrs{"axis": 0, "sizes": []int{math.MaxInt, math.MaxInt, 2}}, err: "do not add up"},
		inferCase{op: "split", in: []Type{ty(f32t, "S")}, attrs: Attrs{"axis": 0, "sizes": []int{1}}, err: "do not add up"},
		inferCase{op: "split", in: []Type{ty(f32t, 6)}, attrs: Attrs{"axis": -2, "sizes": []int{6}}, err: "axis -2 out of range for rank 1"},

		inferCase{op: "expand", in: []Type{ty(f32t, "B", 1, 4)}, attrs: Attrs{"shape": Shape{D(2), symB, D(3), D(4)}}, want: []Type{ty(f32t, 2, "B", 3, 4)}},
		inferCase{op: "expand", in: []Type{ty(f32t, 3)}, attrs: Attrs{"shape": Dims(1)}, err: "cannot expand [3] to [1]"},
		inferCase{op: "expand", in: []Type{ty(f32t, 3)}, attrs: Attrs{"shape": Dims(4)}, err: "do not broadcast"},
	)
	invFreq8 := []float64{1, 0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125}
	cases = append(cases,
		inferCase{op: "rmsnorm", in: []Type{ty(bf16, "B", "S", 64), ty(bf16, 64)}, attrs: Attrs{"eps": 1e-05}, want: []Type{ty(bf16, "B", "S", 64)}},
		inferCase{op: "rmsnorm", in: []Type{ty(bf16, "B", 64), ty(f32t, 64)}, attrs: Attrs{"eps": 1e-06}, want: []Type{ty(f32t, "B", 64)}},
		inferCase{op: "rmsnorm", in: []Type{ty(bf16, "B", 64), ty(bf16, 32)}, attrs: Attrs{"eps": 1e-05}, err: "norm weight [32] does not fit the last axis of [B,64]"},
		inferCase{op: "rmsnorm", in: []Type{ty(i32, "B", 64), ty(bf16, 64)}, attrs: Attrs{"eps": 1e-05}, err: "norm needs float operands"},
		inferCase{op: "rmsnorm", in: []Type{ty(bf16, 64), ty(bf16, 64)}, err: "missing required attribute eps (float)"},

		inferCase{op: "add_rmsnorm", in: []Type{ty(bf16, "B", 64), ty(bf16, "B", 64), ty(bf16, 64)}, attrs: Attrs{"eps": 1e-05},
			want: []Type{ty(bf16, "B", 64), ty(bf16, "B", 64)}},
		inferCase{op: "add_rmsnorm", in: []Type{ty(bf16, "B", 64), ty(bf16, "S", 64), ty(bf16, 64)}, attrs: Attrs{"eps": 1e-05},
			err: "x [B,64] and residual [S,64] differ in shape"},

		inferCase{op: "rope", in: []Type{ty(f32t, "B", 4, "S", 16), ty(f32t, "B", 2, "S", 16), ty(i64, "B", "S")}, attrs: Attrs{"inv_freq": invFreq8},
			want: []Type{ty(f32t, "B", 4, "S", 16), ty(f32t, "B", 2, "S", 16)}},
		inferCase{op: "rope", in: []Type{ty(f32t, "B", 4, "S", 16), ty(f32t, "B", 2, "S", 16), ty(i64, "B", "S")}, attrs: Attrs{"inv_freq": []float64{1, 2, 3}},
			err: "head size 16 needs 16/2 inverse frequencies, got 3"},
		inferCase{op: "rope", in: []Type{ty(f32t, "B", 4, "S", 16), ty(f32t, "B", 2, "S", 16), ty(i64, "S")}, attrs: Attrs{"inv_freq": invFreq8},
			err: "positions must be integer [B,S], got i64[S]"},
		inferCase{op: "rope", in: []Type{ty(f32t, "B", 4, "S", 16), ty(f32t, "B", 2, "S", 8), ty(i64, "B", "S")}, attrs: Attrs{"inv_freq": invFreq8},
			err: "[B,2,S,8] does not fit positions [B,S] and head size 16"},

		inferCase{op: "repeat_kv", in: []Type{ty(bf16, "B", 2, "S", 16)}, attrs: Attrs{"n": 3}, want: []Type{ty(bf16, "B", 6, "S", 16)}},
		inferCase{op: "repeat_kv", in: []Type{ty(bf16, "B", 2, "S", 16)}, attrs: Attrs{"n": 0}, err: "n >= 1, got [B,2,S,16] and n=0"},
		inferCase{op: "repeat_kv", in: []Type{ty(bf16, "B", "KV", "S", 16)}, attrs: Attrs{"n": 2}, err: "constant KV"},
		inferCase{op: "repeat_kv", in: []Type{ty(bf16, "B", 2, "S", 16)}, attrs: Attrs{"n": math.MaxInt}, err: "overflows"},

		inferCase{op: "sdpa", in: []Type{ty(bf16, "B", 4, "S", 16), ty(bf16, "B", 2, "S", 16), ty(bf16, "B", 2, "S", 16), ty(i32, "B", "S")},
			attrs: Attrs{"scale": 0.25}, want: []Type{ty(bf16, "B", 4, "S", 16)}},
		inferCase{op: "sdpa", in: []Type{ty(bf16, "B", 3, "S", 16), ty(bf16, "B", 2, "S", 16), ty(bf16, "B", 2, "S", 16), ty(i32, "B", "S")},
			attrs: Attrs{"scale": 0.25}, err: "query heads 3 are not a multiple of KV heads 2"},
		inferCase{op: "sdpa", in: []Type{ty(bf16, "B", 4, "S", 16), ty(bf16, "B", 2, "S", 16), ty(bf16, "B", 2, "S", 16), ty(f32t, "B", "S")},
			attrs: Attrs{"scale": 0.25}, err: "positions must be integer [B,S]"},
		inferCase{op: "sdpa", in: []Type{ty(bf16, "B", 4, "S", 16), ty(bf16, "B", 2, "S", 16), ty(bf16, "B", 2, "S", 8), ty(i32, "B", "S")},
			attrs: Attrs{"scale": 0.25}, err: "want q [B,H,S,D] and k, v [B,KV,S,D]"},

		inferCase{op: "paged_attention", in: []Type{ty(bf16, 1, 4, "S", 16), ty(bf16, 1, 2, "S", 16), ty(bf16, 1, 2, "S", 16), ty(i32, 1, "S"),
			ty(bf16, "NB", 16, 2, 16), ty(bf16, "NB", 16, 2, 16), ty(i32, "S"), ty(i32, "S"), ty(i32, "N", "M")},
			attrs: Attrs{"scale": 0.25}, want: []Type{ty(bf16, 1, 4, "S", 16)}},
		inferCase{op: "paged_attention", in: []Type{ty(bf16, 1, 4, "S", 16), ty(bf16, 1, 2, "S", 16), ty(bf16, 1, 2, "S", 16), ty(i32, 1, "S"),
			ty(bf16, "NB", 16, 4, 16), ty(bf16, "NB", 16, 4, 16), ty(i32, "S"), ty(i32, "S"), ty(i32, "N", "M")},
			attrs: Attrs{"scale": 0.25}, err: "caches must be float [NB,BS,2,16]"},
		inferCase{op: "paged_attention", in: []Type{ty(bf16, 1, 4, "S", 16), ty(bf16, 1, 2, "S", 16), ty(bf16, 1, 2, "S", 16), ty(i32, 1, "S"),
			ty(bf16, "NB", 16, 2, 16), ty(bf16, "NB", 16, 2, 16), ty(i32, "T"), ty(i32, "S"), ty(i32, "N", "M")},
			attrs: Attrs{"scale": 0.25}, err: "slot_mapping and token_seq must be integer [S]"},

		inferCase{op: "swiglu", in: []Type{ty(bf16, "B", 128), ty(f32t, "B", 128)}, want: []Type{ty(f32t, "B", 128)}},
		inferCase{op: "swiglu", in: []Type{ty(bf16, "B", 128), ty(bf16, "B", 64)}, err: "must be float tensors of one shape"},
		inferCase{op: "swiglu", in: []Type{ty(i32, 4), ty(i32, 4)}, err: "must be float tensors of one shape"},
	)
	tp2 := func(extra Attrs) Attrs { // group tp of 2 ranks, plus extra attributes
		a := Attrs{"group": "tp", "group_size": 2}
		for k, v := range extra {
			a[k] = v
		}
		return a
	}
	cases = append(cases,
		inferCase{op: "all_reduce", in: []Type{ty(bf16, "B", "S", 64)}, attrs: tp2(nil), want: []Type{ty(bf16, "B", "S", 64)}},
		inferCase{op: "all_reduce", in: []Type{ty(i32, 3)}, attrs: tp2(Attrs{"op": "max", "strategy": "twoshot"}), want: []Type{ty(i32, 3)}},
		inferCase{op: "all_reduce", in: []Type{ty(f32t, 3)}, attrs: Attrs{"group_size": 2}, err: "missing required attribute group"},
		inferCase{op: "all_reduce", in: []Type{ty(f32t, 3)}, attrs: Attrs{"group": "tp"}, err: "missing required attribute group_size"},
		inferCase{op: "all_reduce", in: []Type{ty(f32t, 3)}, attrs: Attrs{"group": "", "group_size": 2}, err: `group "" is not a mesh axis name`},
		inferCase{op: "all_reduce", in: []Type{ty(f32t, 3)}, attrs: Attrs{"group": "tp", "group_size": 0}, err: "group_size must be >= 1, got 0"},
		inferCase{op: "all_reduce", in: []Type{ty(f32t, 3)}, attrs: tp2(Attrs{"op": "mean"}), err: `op "mean" is not one of ["sum" "max"]`},
		inferCase{op: "all_reduce", in: []Type{ty(f32t, 3)}, attrs: tp2(Attrs{"strategy": "ring"}), err: `strategy "ring" is not one of`},
		inferCase{op: "all_reduce", in: []Type{ty(i64, 3)}, attrs: tp2(nil), err: "all_reduce reduces f32, bf16, f16 or i32, got i64"},

		inferCase{op: "all_gather", in: []Type{ty(bf16, "B", "S", 32)}, attrs: tp2(Attrs{"axis": -1}), want: []Type{ty(bf16, "B", "S", 64)}},
		inferCase{op: "all_gather", in: []Type{ty(i64, 3, 0)}, attrs: Attrs{"group": "dp", "group_size": 4, "axis": 1}, want: []Type{ty(i64, 3, 0)}},
		inferCase{op: "all_gather", in: []Type{ty(f32t, "B", 4)}, attrs: tp2(Attrs{"axis": 0}), err: "all_gather along symbolic dimension B (axis 0 of [B,4]) is not supported"},
		inferCase{op: "all_gather", in: []Type{ty(f32t, 4)}, attrs: tp2(Attrs{"axis": 1}), err: "all_gather axis: axis 1 out of range for rank 1"},
		inferCase{op: "all_gather", in: []Type{ty(f32t, math.MaxInt/2)}, attrs: Attrs{"group": "tp", "group_size": 3, "axis": 0}, err: "overflows"},
		inferCase{op: "all_gather", in: []Type{ty(f32t, 4)}, attrs: tp2(nil), err: "missing required attribute axis"},

		inferCase{op: "reduce_scatter", in: []Type{ty(f32t, "B", 8, 3)}, attrs: tp2(Attrs{"axis": 1}), want: []Type{ty(f32t, "B", 4, 3)}},
		inferCase{op: "reduce_scatter", in: []Type{ty(f16, 6)}, attrs: Attrs{"group": "tp", "group_size": 3, "axis": 0, "op": "max"}, want: []Type{ty(f16, 2)}},
		inferCase{op: "reduce_scatter", in: []Type{ty(f32t, 6)}, attrs: Attrs{"group": "tp", "group_size": 4, "axis": 0}, err: "reduce_scatter: axis 0 of [6] is not divisible by group_size 4"},
		inferCase{op: "reduce_scatter", in: []Type{ty(boolt, 4)}, attrs: tp2(Attrs{"axis": 0}), err: "reduce_scatter reduces f32, bf16, f16 or i32, got bool"},
		inferCase{op: "reduce_scatter", in: []Type{ty(f32t, "S")}, attrs: tp2(Attrs{"axis": 0}), err: "along symbolic dimension S"},

		inferCase{op: "all_to_all", in: []Type{ty(bf16, "B", 8, 6)}, attrs: tp2(Attrs{"split_axis": 1, "concat_axis": 2}), want: []Type{ty(bf16, "B", 4, 12)}},
		inferCase{op: "all_to_all", in: []Type{ty(f32t, 8, 6)}, attrs: tp2(Attrs{"split_axis": 0, "concat_axis": -2}), want: []Type{ty(f32t, 8, 6)}},
		inferCase{op: "all_to_all", in: []Type{ty(f32t, 8, 5)}, attrs: tp2(Attrs{"split_axis": 1, "concat_axis": 0}), err: "all_to_all: axis 1 of [8,5] is not divisible by group_size 2"},
		inferCase{op: "all_to_all", in: []Type{ty(f32t, "T", 4)}, attrs: tp2(Attrs{"split_axis": 1, "concat_axis": 0}), err: "all_to_all along symbolic dimension T"},
		inferCase{op: "all_to_all", in: []Type{ty(f32t, 4)}, attrs: tp2(Attrs{"split_axis": 0, "concat_axis": 3}), err: "all_to_all concat_axis: axis 3 out of range"},
		inferCase{op: "all_to_all", in: []Type{ty(f32t, 4)}, attrs: Attrs{"group": "2tp", "group_size": 2, "split_axis": 0, "concat_axis": 0}, err: `group "2tp" is not a mesh axis name`},

		inferCase{op: "all_reduce_add_rmsnorm", in: []Type{ty(f32t, "B", "S", 64), ty(f32t, "B", "S", 64), ty(bf16, 64)}, attrs: tp2(Attrs{"eps": 1e-5}), want: []Type{ty(f32t, "B", "S", 64), ty(f32t, "B", "S", 64)}},
		inferCase{op: "all_reduce_add_rmsnorm", in: []Type{ty(bf16, 2, 8), ty(bf16, 2, 8), ty(bf16, 8)}, attrs: tp2(Attrs{"eps": 1e-6, "strategy": "oneshot"}), want: []Type{ty(bf16, 2, 8), ty(bf16, 2, 8)}},
		inferCase{op: "all_reduce_add_rmsnorm", in: []Type{ty(f32t, "B", 64), ty(f32t, "B", 32), ty(f32t, 64)}, attrs: tp2(Attrs{"eps": 1e-5}), err: "x [B,64] and residual [B,32] differ in shape"},
		inferCase{op: "all_reduce_add_rmsnorm", in: []Type{ty(f32t, 8), ty(f32t, 8), ty(f32t, 8)}, attrs: tp2(Attrs{"eps": 1e-5, "strategy": "ring"}), err: `strategy "ring" is not one of`},
		inferCase{op: "all_reduce_add_rmsnorm", in: []Type{ty(f32t, 8), ty(f32t, 8), ty(f32t, 8)}, attrs: Attrs{"group": "tp", "group_size": 0, "eps": 1e-5}, err: "group_size must be >= 1, got 0"},
		inferCase{op: "all_reduce_add_rmsnorm", in: []Type{ty(f32t, 8), ty(f32t, 8), ty(f32t, 8)}, attrs: tp2(nil), err: "missing required attribute eps"},

		inferCase{op: "linear_all_reduce", in: []Type{ty(f32t, "B", "S", 80), ty(bf16, 64, 80)}, attrs: tp2(nil), want: []Type{ty(f32t, "B", "S", 64)}},
		inferCase{op: "linear_all_reduce", in: []Type{ty(bf16, 3, 16), ty(f32t, 8, 16)}, attrs: Attrs{"group": "tp", "group_size": 4, "strategy": "twoshot"}, want: []Type{ty(bf16, 3, 8)}},
		inferCase{op: "linear_all_reduce", in: []Type{ty(f32t, "B", 80), ty(f32t, 64, 40)}, attrs: tp2(nil), err: "x's last dimension 80 differs from the weight's input dimension 40"},
		inferCase{op: "linear_all_reduce", in: []Type{ty(f32t, "B", 40), ty(f32t, 64, 40)}, attrs: Attrs{"group": "world", "group_size": 2, "strategy": "fast"}, err: `strategy "fast" is not one of`},
		inferCase{op: "linear_all_reduce", in: []Type{ty(f32t, "B", 40), ty(f32t, 64, 40)}, attrs: Attrs{"group_size": 2}, err: "missing required attribute group"},
	)
	for _, op := range []string{"sum", "mean", "max"} {
		cases = append(cases,
			inferCase{op: op, in: []Type{ty(f32t, "B", "S", 64)}, attrs: Attrs{"axes": []int{-1}, "keepdim": true}, want: []Type{ty(f32t, "B", "S", 1)}},
			inferCase{op: op, in: []Type{ty(f32t, "B", "S", 64)}, attrs: Attrs{"axes": []int{0, 2}}, want: []Type{ty(f32t, "S")}},
			inferCase{op: op, in: []Type{ty(f32t, 4)}, attrs: Attrs{"axes": []int{0}}, want: []Type{ty(f32t)}},
			inferCase{op: op, in: []Type{ty(f32t, 2, 3)}, attrs: Attrs{"axes": []int{2}}, err: "axis 2 out of range for rank 2"},
			inferCase{op: op, in: []Type{ty(f32t, 2, 3)}, attrs: Attrs{"axes": []int{1, -1}}, err: "axis -1 repeated"},
			inferCase{op: op, in: []Type{ty(f32t, 2, 3)}, attrs: Attrs{"axes": []int{}}, err: op + " needs at least one axis"},
		)
	}
	cases = append(cases, packedInferCases()...)
	cases = append(cases, moeInferCases()...)
	cases = append(cases, cpInferCases()...)
	cases = append(cases, quantInferCases()...)
	return cases
}

func TestInfer(t *testing.T) {
	for _, c := range inferCases() {
		t.Run(c.name(), func(t *testing.T) {
			g := New("t")
			var ins []*Value
			for i, typ := range c.in {
				v, err := g.AddInput(fmt.Sprintf("in%d", i), typ)
				if err != nil {
					t.Fatal(err)
				}
				ins = append(ins, v)
			}
			n, err := g.NewNode(c.op, c.attrs, ins, "")
			if c.want == nil {
				if err == nil {
					t.Fatalf("no error; outputs %v", n.Outputs)
				}
				if !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %q lacks %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(n.Outputs) != len(c.want) {
				t.Fatalf("%d outputs, want %d", len(n.Outputs), len(c.want))
			}
			for i, o := range n.Outputs {
				if !o.Type.Equal(c.want[i]) {
					t.Errorf("output %d: %s, want %s", i, o.Type, c.want[i])
				}
			}
		})
	}
}

// TestInferCoversCatalog makes sure every op has a valid and an invalid inference case, so a
// new op must get both.
func TestInferCoversCatalog(t *testing.T) {
	valid, invalid := map[string]bool{}, map[string]bool{}
	for _, c := range inferCases() {
		if _, ok := Lookup(c.op); !ok {
			t.Errorf("case for unknown op %s", c.op)
		}
		if c.want != nil {
			valid[c.op] = true
		} else {
			invalid[c.op] = true
		}
	}
	for _, s := range Ops() {
		if !valid[s.Name] {
			t.Errorf("op %s has no valid inference case in catalog_test.go", s.Name)
		}
		if !invalid[s.Name] {
			t.Errorf("op %s has no invalid inference case in catalog_test.go", s.Name)
		}
	}
}

func TestCatalogDeclarations(t *testing.T) {
	ops := Ops()
	if len(ops) == 0 {
		t.Fatal("empty catalog")
	}
	for i, s := range ops {
		if strings.TrimSpace(s.Doc) == "" {
			t.Errorf("op %s has no Doc", s.Name)
		}
		if i > 0 && ops[i-1].Name >= s.Name {
			t.Errorf("Ops not sorted: %s before %s", ops[i-1].Name, s.Name)
		}
		if got, ok := Lookup(s.Name); !ok || got != s {
			t.Errorf("Lookup(%q) does not return the listed spec", s.Name)
		}
		if s.Variadic && len(s.Inputs) == 0 {
			t.Errorf("op %s is variadic without a named input", s.Name)
		}
		seen := map[string]bool{}
		for _, a := range s.Attrs {
			if seen[a.Name] {
				t.Errorf("op %s declares attribute %s twice", s.Name, a.Name)
			}
			seen[a.Name] = true
			if !validName(a.Name) {
				t.Errorf("op %s attribute %q is not a valid name", s.Name, a.Name)
			}
		}
		if !validName(s.Name) {
			t.Errorf("op name %q is not a valid name", s.Name)
		}
	}
}

// packedInferCases are the inference cases of the fused ops over packed projections,
// qkv_rope and swiglu_packed.
func packedInferCases() []inferCase {
	inv := []float64{1, 0.5, 0.25, 0.125} // D = 8
	qkv := func(h, kv int, extra Attrs) Attrs {
		a := Attrs{"heads": h, "kv_heads": kv, "inv_freq": inv}
		for k, v := range extra {
			a[k] = v
		}
		return a
	}
	return []inferCase{
		{op: "qkv_rope", in: []Type{ty(bf16, "B", "S", 64), ty(i32, "B", "S")}, attrs: qkv(4, 2, nil),
			want: []Type{ty(bf16, "B", 4, "S", 8), ty(bf16, "B", 2, "S", 8), ty(bf16, "B", 2, "S", 8)}},
		{op: "qkv_rope", in: []Type{ty(f32t, 1, "S", 24), ty(i64, 1, "S")}, attrs: qkv(1, 1, Attrs{"scaling": 0.5}),
			want: []Type{ty(f32t, 1, 1, "S", 8), ty(f32t, 1, 1, "S", 8), ty(f32t, 1, 1, "S", 8)}},
		{op: "qkv_rope", in: []Type{ty(f32t, "B", "S", 56), ty(i32, "B", "S")}, attrs: qkv(4, 2, nil), err: "last axis 56 is not (4+2*2)*8"},
		{op: "qkv_rope", in: []Type{ty(f32t, "B", "S", "N"), ty(i32, "B", "S")}, attrs: qkv(4, 2, nil), err: "last axis N is not"},
		{op: "qkv_rope", in: []Type{ty(f32t, "B", "S", 64), ty(i32, "S")}, attrs: qkv(4, 2, nil), err: "positions must be integer [B,S]"},
		{op: "qkv_rope", in: []Type{ty(f32t, "B", "S", 64), ty(f32t, "B", "S")}, attrs: qkv(4, 2, nil), err: "positions must be integer [B,S]"},
		{op: "qkv_rope", in: []Type{ty(f32t, "B", "T", 64), ty(i32, "B", "S")}, attrs: qkv(4, 2, nil), err: "x must be float [B,S,(H+2*KV)*D] fitting positions"},
		{op: "qkv_rope", in: []Type{ty(i32, "B", "S", 64), ty(i32, "B", "S")}, attrs: qkv(4, 2, nil), err: "x must be float"},
		{op: "qkv_rope", in: []Type{ty(f32t, "B", "S", 64), ty(i32, "B", "S")}, attrs: qkv(4, 0, nil), err: "heads, kv_heads and inverse frequencies >= 1"},
		{op: "qkv_rope", in: []Type{ty(f32t, "B", "S", 64), ty(i32, "B", "S")}, attrs: Attrs{"heads": 4, "kv_heads": 2}, err: "missing required attribute inv_freq"},

		{op: "qkv_norm_rope", in: []Type{ty(bf16, "B", "S", 64), ty(bf16, 8), ty(bf16, 8), ty(i32, "B", "S")}, attrs: qkv(4, 2, Attrs{"eps": 1e-6}),
			want: []Type{ty(bf16, "B", 4, "S", 8), ty(bf16, "B", 2, "S", 8), ty(bf16, "B", 2, "S", 8)}},
		{op: "qkv_norm_rope", in: []Type{ty(bf16, "B", "S", 64), ty(f32t, 8), ty(f32t, 8), ty(i32, "B", "S")}, attrs: qkv(4, 2, Attrs{"eps": 1e-6}),
			want: []Type{ty(f32t, "B", 4, "S", 8), ty(f32t, "B", 2, "S", 8), ty(bf16, "B", 2, "S", 8)}},
		{op: "qkv_norm_rope", in: []Type{ty(bf16, "B", "S", 64), ty(bf16, 8), ty(f32t, 8), ty(i32, "B", "S")}, attrs: qkv(4, 2, Attrs{"eps": 1e-6}), err: "the norms must have one dtype"},
		{op: "qkv_norm_rope", in: []Type{ty(f32t, "B", "S", 64), ty(f32t, 4), ty(f32t, 8), ty(i32, "B", "S")}, attrs: qkv(4, 2, Attrs{"eps": 1e-6}), err: "q_norm: norm weight [4] does not fit"},
		{op: "qkv_norm_rope", in: []Type{ty(f32t, "B", "S", 64), ty(f32t, 8), ty(i32, 8), ty(i32, "B", "S")}, attrs: qkv(4, 2, Attrs{"eps": 1e-6}), err: "k_norm: norm needs float operands"},
		{op: "qkv_norm_rope", in: []Type{ty(f32t, "B", "S", 56), ty(f32t, 8), ty(f32t, 8), ty(i32, "B", "S")}, attrs: qkv(4, 2, Attrs{"eps": 1e-6}), err: "last axis 56 is not (4+2*2)*8"},

		{op: "swiglu_packed", in: []Type{ty(bf16, "B", "S", 320)}, want: []Type{ty(bf16, "B", "S", 160)}},
		{op: "swiglu_packed", in: []Type{ty(f32t, 6)}, want: []Type{ty(f32t, 3)}},
		{op: "swiglu_packed", in: []Type{ty(f32t, "B", 7)}, err: "last axis 7 is not of a constant even size"},
		{op: "swiglu_packed", in: []Type{ty(f32t, "B", "I")}, err: "last axis I is not of a constant even size"},
		{op: "swiglu_packed", in: []Type{ty(i32, 4)}, err: "x must be a float tensor"},
		{op: "swiglu_packed", in: []Type{ty(f32t)}, err: "x must be a float tensor"},

		{op: "linear_swiglu", in: []Type{ty(bf16, "B", "S", 16), ty(bf16, 320, 16)}, want: []Type{ty(bf16, "B", "S", 160)}},
		{op: "linear_swiglu", in: []Type{ty(f32t, 3, 16), ty(bf16, 6, 16)}, want: []Type{ty(f32t, 3, 3)}},
		{op: "linear_swiglu", in: []Type{ty(f32t, 3, 16), ty(bf16, 7, 16)}, err: "last axis 7 is not of a constant even size"},
		{op: "linear_swiglu", in: []Type{ty(f32t, 3, 16), ty(bf16, 6, 8)}, err: "differs from the weight's input dimension"},
		{op: "linear_qkv_rope", in: []Type{ty(bf16, "B", "S", 16), ty(bf16, 64, 16), ty(i32, "B", "S")}, attrs: qkv(4, 2, nil),
			want: []Type{ty(bf16, "B", 4, "S", 8), ty(bf16, "B", 2, "S", 8), ty(bf16, "B", 2, "S", 8)}},
		{op: "linear_qkv_rope", in: []Type{ty(bf16, "B", "S", 16), ty(bf16, 56, 16), ty(i32, "B", "S")}, attrs: qkv(4, 2, nil), err: "last axis 56 is not (4+2*2)*8"},
		{op: "linear_qkv_rope", in: []Type{ty(bf16, "B", "S", 16), ty(bf16, 64, 16), ty(i32, "S")}, attrs: qkv(4, 2, nil), err: "positions must be integer [B,S]"},
		{op: "linear_qkv_rope", in: []Type{ty(bf16, "B", "S", 16), ty(bf16, 64, 12), ty(i32, "B", "S")}, attrs: qkv(4, 2, nil), err: "differs from the weight's input dimension"},
	}
}

// TestPackedDecompositions builds the decompositions of qkv_rope and swiglu_packed: they give
// the types the ops infer, and are the split, the per-part layout and the rope (or swiglu)
// that fuse_gemms leaves behind.
func TestPackedDecompositions(t *testing.T) {
	inv := []float64{1, 0.5, 0.25, 0.125}
	for _, c := range []struct {
		op    string
		in    []Type
		attrs Attrs
		ops   map[string]int // ops the decomposition must hold, with their counts
	}{
		{"qkv_rope", []Type{ty(bf16, "B", "S", 64), ty(i32, "B", "S")}, Attrs{"heads": 4, "kv_heads": 2, "inv_freq": inv},
			map[string]int{"split": 1, "reshape": 3 + 1 + 4, "transpose": 3, "cos": 1, "sin": 1, "neg": 2}}, // layout, positions, tables
		{"qkv_rope", []Type{ty(f32t, 2, 5, 40), ty(i64, 2, 5)}, Attrs{"heads": 3, "kv_heads": 1, "inv_freq": inv, "scaling": 0.5},
			map[string]int{"split": 1, "transpose": 3, "cos": 1, "sin": 1, "neg": 2}},
		{"swiglu_packed", []Type{ty(f32t, "B", "S", 320)}, nil, map[string]int{"split": 1, "swiglu": 1}},
		{"linear_swiglu", []Type{ty(f32t, "B", "S", 16), ty(bf16, 320, 16)}, nil, map[string]int{"linear": 1, "swiglu_packed": 1}},
		{"linear_qkv_rope", []Type{ty(bf16, "B", "S", 16), ty(bf16, 64, 16), ty(i32, "B", "S")}, Attrs{"heads": 4, "kv_heads": 2, "inv_freq": inv},
			map[string]int{"linear": 1, "qkv_rope": 1}},
	} {
		t.Run(c.op, func(t *testing.T) {
			b := NewBuilder("d")
			var ins []*Value
			for i, typ := range c.in {
				ins = append(ins, b.Input(fmt.Sprintf("in%d", i), typ.DType, typ.Shape))
			}
			outs := b.Apply(c.op, c.attrs, ins...)
			if err := b.Err(); err != nil {
				t.Fatal(err)
			}
			n := outs[0].Producer
			start := len(b.Graph().Nodes)
			spec, _ := Lookup(c.op)
			got, err := spec.Decompose(b, n)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(n.Outputs) {
				t.Fatalf("%d values, want %d", len(got), len(n.Outputs))
			}
			for i, v := range got {
				if !v.Type.Equal(n.Outputs[i].Type) {
					t.Errorf("value %d is %s, the op gives %s", i, v.Type, n.Outputs[i].Type)
				}
			}
			b.Output(got...)
			if _, err := b.Build(); err != nil { // verified: the op's own node stays intact
				t.Fatal(err)
			}
			ops := map[string]int{}
			for _, m := range b.Graph().Nodes[start:] {
				ops[m.Op]++
			}
			for op, want := range c.ops {
				if ops[op] != want {
					t.Errorf("%d %s nodes, want %d (all: %v)", ops[op], op, want, ops)
				}
			}
		})
	}
}
