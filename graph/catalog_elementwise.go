package graph

import (
	"fmt"

	"github.com/loom-ml/loom/tensor"
)

// Elementwise ops. Binary and ternary ops broadcast with NumPy rules.

func inferBinaryArith(n *Node) ([]Type, error) {
	a, b := inType(n, 0), inType(n, 1)
	dt, err := Promote(a.DType, b.DType)
	if err != nil {
		return nil, err
	}
	s, err := Broadcast(a.Shape, b.Shape)
	if err != nil {
		return nil, err
	}
	return one(Type{dt, s}), nil
}

func inferCompare(n *Node) ([]Type, error) {
	a, b := inType(n, 0), inType(n, 1)
	if (a.DType == tensor.Bool) != (b.DType == tensor.Bool) {
		return nil, fmt.Errorf("cannot compare %s with %s", a.DType, b.DType)
	}
	s, err := Broadcast(a.Shape, b.Shape)
	if err != nil {
		return nil, err
	}
	return one(Type{tensor.Bool, s}), nil
}

func inferLogical(n *Node) ([]Type, error) {
	var shapes []Shape
	for _, in := range n.Inputs {
		if in.Type.DType != tensor.Bool {
			return nil, fmt.Errorf("%s needs bool inputs, got %s", n.Op, in.Type.DType)
		}
		shapes = append(shapes, in.Type.Shape)
	}
	s, err := Broadcast(shapes...)
	if err != nil {
		return nil, err
	}
	return one(Type{tensor.Bool, s}), nil
}

func inferUnaryFloat(n *Node) ([]Type, error) {
	t := inType(n, 0)
	if !t.DType.IsFloat() {
		return nil, fmt.Errorf("%s needs a float input, got %s", n.Op, t.DType)
	}
	return one(t), nil
}

func inferUnaryNumeric(n *Node) ([]Type, error) {
	t := inType(n, 0)
	if t.DType == tensor.Bool {
		return nil, fmt.Errorf("%s needs a numeric input, got bool", n.Op)
	}
	return one(t), nil
}

func init() {
	for _, op := range []struct {
		name, doc   string
		commutative bool
	}{
		{"add", "Elementwise a + b.", true},
		{"sub", "Elementwise a - b.", false},
		{"mul", "Elementwise a * b.", true},
		{"div", "Elementwise a / b (integer division truncates toward zero).", false},
		{"pow", "Elementwise a raised to the power b.", false},
		{"maximum", "Elementwise max(a, b).", true},
		{"minimum", "Elementwise min(a, b).", true},
	} {
		Register(&OpSpec{Name: op.name, Doc: op.doc, Inputs: []string{"a", "b"}, Commutative: op.commutative, Infer: inferBinaryArith})
	}
	for _, op := range []struct{ name, doc string }{
		{"eq", "Elementwise a == b, giving bool."},
		{"ne", "Elementwise a != b, giving bool."},
		{"lt", "Elementwise a < b, giving bool."},
		{"le", "Elementwise a <= b, giving bool."},
		{"gt", "Elementwise a > b, giving bool."},
		{"ge", "Elementwise a >= b, giving bool."},
	} {
		Register(&OpSpec{Name: op.name, Doc: op.doc, Inputs: []string{"a", "b"}, Commutative: op.name == "eq" || op.name == "ne", Infer: inferCompare})
	}
	Register(&OpSpec{Name: "logical_and", Doc: "Elementwise a AND b on bools.", Inputs: []string{"a", "b"}, Commutative: true, Infer: inferLogical})
	Register(&OpSpec{Name: "logical_or", Doc: "Elementwise a OR b on bools.", Inputs: []string{"a", "b"}, Commutative: true, Infer: inferLogical})
	Register(&OpSpec{Name: "logical_not", Doc: "Elementwise NOT x on bools.", Inputs: []string{"x"}, Infer: inferLogical})
	for _, op := range []struct{ name, doc string }{
		{"exp", "Elementwise e^x."},
		{"log", "Elementwise natural logarithm."},
		{"sqrt", "Elementwise square root."},
		{"rsqrt", "Elementwise 1/sqrt(x)."},
		{"reciprocal", "Elementwise 1/x."},
		{"sin", "Elementwise sine."},
		{"cos", "Elementwise cosine."},
		{"tanh", "Elementwise hyperbolic tangent."},
		{"sigmoid", "Elementwise 1/(1+e^-x)."},
		{"silu", "Elementwise x*sigmoid(x) (SiLU, swish)."},
	} {
		Register(&OpSpec{Name: op.name, Doc: op.doc, Inputs: []string{"x"}, Infer: inferUnaryFloat})
	}
	Register(&OpSpec{Name: "neg", Doc: "Elementwise -x.", Inputs: []string{"x"}, Infer: inferUnaryNumeric})
	Register(&OpSpec{Name: "abs", Doc: "Elementwise |x|.", Inputs: []string{"x"}, Infer: inferUnaryNumeric})
	Register(&OpSpec{
		Name: "where", Doc: "Elementwise cond ? a : b, broadcasting all three.",
		Inputs: []string{"cond", "a", "b"},
		Infer: func(n *Node) ([]Type, error) {
			c, a, b := inType(n, 0), inType(n, 1), inType(n, 2)
			if c.DType != tensor.Bool {
				return nil, fmt.Errorf("condition must be bool, got %s", c.DType)
			}
			dt, err := Promote(a.DType, b.DType)
			if err != nil {
				return nil, err
			}
			s, err := Broadcast(c.Shape, a.Shape, b.Shape)
			if err != nil {
				return nil, err
			}
			return one(Type{dt, s}), nil
		},
	})
	Register(&OpSpec{
		Name: "cast", Doc: "Converts x to another dtype (floats round to nearest even; float to int truncates).",
		Inputs: []string{"x"},
		Attrs:  []AttrSpec{{Name: "dtype", Type: AttrDType, Doc: "target dtype"}},
		Infer: func(n *Node) ([]Type, error) {
			dt := n.Attrs.DType("dtype")
			if err := checkDType(dt); err != nil {
				return nil, fmt.Errorf("target: %w", err)
			}
			return one(Type{dt, inType(n, 0).Shape}), nil
		},
	})
}
