package graph

import "github.com/loom-ml/loom/tensor"

// Typed helpers over Builder.Op, one per catalog op, so frontends read like the model code
// they mirror.

// Param declares a weight read from the checkpoint tensor key; the value is named after key.
func (b *Builder) Param(key string, dt tensor.DType, shape Shape) *Value {
	return b.Named(key, OpParam, Attrs{"key": key, "dtype": dt, "shape": shape})
}

// Const is a constant tensor; one value fills the whole shape.
func (b *Builder) Const(dt tensor.DType, shape Shape, values ...float64) *Value {
	return b.Op(OpConst, Attrs{"dtype": dt, "shape": shape, "values": values})
}

// Scalar is a rank-0 constant.
func (b *Builder) Scalar(dt tensor.DType, v float64) *Value { return b.Const(dt, Shape{}, v) }

// Iota counts 0, 1, ... along axis of shape.
func (b *Builder) Iota(dt tensor.DType, shape Shape, axis int) *Value {
	return b.Op("iota", Attrs{"shape": shape, "axis": axis, "dtype": dt})
}

func (b *Builder) Add(x, y *Value) *Value     { return b.Op("add", nil, x, y) }
func (b *Builder) Sub(x, y *Value) *Value     { return b.Op("sub", nil, x, y) }
func (b *Builder) Mul(x, y *Value) *Value     { return b.Op("mul", nil, x, y) }
func (b *Builder) Div(x, y *Value) *Value     { return b.Op("div", nil, x, y) }
func (b *Builder) Pow(x, y *Value) *Value     { return b.Op("pow", nil, x, y) }
func (b *Builder) Maximum(x, y *Value) *Value { return b.Op("maximum", nil, x, y) }
func (b *Builder) Minimum(x, y *Value) *Value { return b.Op("minimum", nil, x, y) }

// Compare applies a comparison op (eq, ne, lt, le, gt, ge).
func (b *Builder) Compare(op string, x, y *Value) *Value { return b.Op(op, nil, x, y) }

func (b *Builder) And(x, y *Value) *Value { return b.Op("logical_and", nil, x, y) }

// Unary applies a one-input elementwise op such as exp, rsqrt, silu or neg.
func (b *Builder) Unary(op string, x *Value) *Value { return b.Op(op, nil, x) }

func (b *Builder) Neg(x *Value) *Value { return b.Op("neg", nil, x) }

func (b *Builder) Where(cond, x, y *Value) *Value { return b.Op("where", nil, cond, x, y) }

func (b *Builder) Cast(x *Value, dt tensor.DType) *Value {
	return b.Op("cast", Attrs{"dtype": dt}, x)
}

// Reduce applies sum, mean or max over axes.
func (b *Builder) Reduce(op string, x *Value, keepdim bool, axes ...int) *Value {
	return b.Op(op, Attrs{"axes": axes, "keepdim": keepdim}, x)
}

func (b *Builder) Softmax(x *Value, axis int) *Value {
	return b.Op("softmax", Attrs{"axis": axis}, x)
}

func (b *Builder) Matmul(x, y *Value) *Value { return b.Op("matmul", nil, x, y) }

// Linear is x @ w^T.
func (b *Builder) Linear(x, w *Value) *Value { return b.Op("linear", nil, x, w) }

func (b *Builder) Embedding(table, ids *Value) *Value { return b.Op("embedding", nil, table, ids) }

func (b *Builder) Reshape(x *Value, shape ...Dim) *Value {
	return b.Op("reshape", Attrs{"shape": Shape(shape)}, x)
}

func (b *Builder) Transpose(x *Value, perm ...int) *Value {
	return b.Op("transpose", Attrs{"perm": perm}, x)
}

// Slice takes [start:end] along axis.
func (b *Builder) Slice(x *Value, axis, start, end int) *Value {
	return b.Op("slice", Attrs{"axis": axis, "start": start, "end": end}, x)
}

func (b *Builder) Concat(axis int, xs ...*Value) *Value {
	return b.Op("concat", Attrs{"axis": axis}, xs...)
}

func (b *Builder) Split(x *Value, axis int, sizes ...int) []*Value {
	return b.Apply("split", Attrs{"axis": axis, "sizes": sizes}, x)
}

func (b *Builder) Expand(x *Value, shape ...Dim) *Value {
	return b.Op("expand", Attrs{"shape": Shape(shape)}, x)
}
