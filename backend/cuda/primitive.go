package cuda

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// The primitive ops of the graph catalog that the fused kernels leave out (kernels/
// primitive.cu): unary math, arithmetic and comparisons of any dtype, logic, where, casts
// between any dtypes, reductions, softmax, batched matmul, iota and topk (the MoE routers'
// one primitive, so that the moe op runs as its decomposition). With them every fused op
// of the catalog can run as its decomposition (expand.go), and a new fused op runs on the
// GPU before it has a kernel of its own. They compute as backend/cpu's reference kernels do
// and favour coverage over speed (see primitive.cu). add, mul and cast take these kernels
// only for operands elementwise.cu does not (integers, bools).

// Codes of the ops in primitive.cu (U_*, B_*, C_*, L_*, R_*).
var (
	unaryCodes = map[string]int32{
		"exp": 0, "log": 1, "sqrt": 2, "rsqrt": 3, "reciprocal": 4, "sin": 5, "cos": 6, "tanh": 7,
		"sigmoid": 8, "silu": 9, "neg": 10, "abs": 11,
	}
	binaryCodes  = map[string]int32{"add": 0, "sub": 1, "mul": 2, "div": 3, "pow": 4, "maximum": 5, "minimum": 6}
	compareCodes = map[string]int32{"eq": 0, "ne": 1, "lt": 2, "le": 3, "gt": 4, "ge": 5}
	logicalCodes = map[string]int32{"logical_and": 0, "logical_or": 1, "logical_not": 2}
	reduceCodes  = map[string]int32{"sum": 0, "mean": 1, "max": 2}
)

func init() {
	for op := range unaryCodes {
		opKernels[op] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
			return unaryPrim(d, n.Op, out[0], in[0])
		}}
	}
	for op := range binaryCodes {
		if op == "add" || op == "mul" {
			continue // elementwise.go's, which come here for integers
		}
		opKernels[op] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
			return binaryPrim(d, n.Op, out[0], in[0], in[1])
		}}
	}
	for op := range compareCodes {
		opKernels[op] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
			return comparePrim(d, n.Op, out[0], in[0], in[1])
		}}
	}
	for op := range logicalCodes {
		opKernels[op] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
			return logicalPrim(d, n.Op, out[0], in)
		}}
	}
	for op := range reduceCodes {
		opKernels[op] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
			return reducePrim(d, n.Op, out[0], in[0], n.Attrs.Ints("axes"), n.Attrs.Bool("keepdim"))
		}}
	}
	opKernels["where"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		return wherePrim(d, out[0], in[0], in[1], in[2])
	}}
	opKernels["softmax"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		return softmaxPrim(d, out[0], in[0], n.Attrs.Int("axis"))
	}}
	opKernels["matmul"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		return matmulPrim(d, out[0], in[0], in[1])
	}}
	opKernels["iota"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		return iotaPrim(d, out[0], n.Attrs.Int("axis"))
	}}
	opKernels["topk"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		return topkPrim(d, out[0], out[1], in[0], n.Attrs.Int("k"))
	}}
}

// dtCode is the code of a dtype in primitive.cu (DT_*).
func dtCode(what string, dt tensor.DType) (int32, error) {
	switch dt {
	case tensor.F32:
		return 0, nil
	case tensor.BF16:
		return 1, nil
	case tensor.I32:
		return 2, nil
	case tensor.I64:
		return 3, nil
	case tensor.Bool:
		return 4, nil
	}
	return 0, fmt.Errorf("%s is %s; CUDA kernels take f32, bf16, i32, i64 or bool", what, dt)
}

// dtCodes gives the codes of the dtypes of ts, named by what.
func dtCodes(what []string, ts ...*Tensor) ([]int32, error) {
	codes := make([]int32, len(ts))
	for i, t := range ts {
		c, err := dtCode(what[i], t.DType)
		if err != nil {
			return nil, err
		}
		codes[i] = c
	}
	return codes, nil
}

// floatOperands reports whether every tensor is f32 or bf16: what elementwise.cu takes.
func floatOperands(ts ...*Tensor) bool {
	for _, t := range ts {
		if t.DType != tensor.F32 && t.DType != tensor.BF16 {
			return false
		}
	}
	return true
}

// addMulAny runs add or mul: on elementwise.cu's kernels (addMul) for f32 and bf16
// operands, on primitive.cu's otherwise.
func addMulAny(d *Device, op string, out, a, b *Tensor) error {
	if floatOperands(a, b) {
		return addMul(d, op, out, a, b)
	}
	return binaryPrim(d, op, out, a, b)
}

// castAny runs cast: as a strided copy (cast) within one dtype or between f32 and bf16, on
// primitive.cu's kernel between other dtypes.
func castAny(d *Device, out, x *Tensor) error {
	if out.DType == x.DType || floatOperands(out, x) {
		return cast(d, out, x)
	}
	return castPrim(d, out, x)
}

// broadcastAll gives the NumPy broadcast of shapes and, over its dimensions, the element
// strides each operand is read at (0 along a dimension it broadcasts).
func broadcastAll(shapes ...[]int) ([]int, [][]int64, error) {
	r := 0
	for _, s := range shapes {
		r = max(r, len(s))
	}
	shape := make([]int, r)
	for i := range shape {
		shape[i] = 1
	}
	for _, s := range shapes {
		for i, n := range s {
			j := i + r - len(s)
			switch {
			case n == shape[j] || n == 1:
			case shape[j] == 1:
				shape[j] = n
			default:
				return nil, nil, fmt.Errorf("shapes %v do not broadcast", shapes)
			}
		}
	}
	st := make([][]int64, len(shapes))
	for k, s := range shapes {
		st[k] = make([]int64, r)
		rs := rowStrides(s)
		for i, n := range s {
			if n != 1 {
				st[k][i+r-len(s)] = rs[i]
			}
		}
	}
	return shape, st, nil
}

// collapseDims drops the dimensions of size 1 of shape and merges neighbours along which
// every operand (element strides st, one slice per operand over shape) is contiguous, so
// that the walk keeps its row-major order in fewer dimensions; at most maxRank may remain.
func collapseDims(shape []int, st ...[]int64) ([]int64, [][]int64, error) {
	var dims []int64
	cst := make([][]int64, len(st))
	for i, n := range shape {
		if n == 1 {
			continue
		}
		if k := len(dims) - 1; k >= 0 {
			merge := true
			for j := range st {
				merge = merge && cst[j][k] == st[j][i]*int64(n)
			}
			if merge {
				dims[k] *= int64(n)
				for j := range st {
					cst[j][k] = st[j][i]
				}
				continue
			}
		}
		dims = append(dims, int64(n))
		for j := range st {
			cst[j] = append(cst[j], st[j][i])
		}
	}
	if len(dims) > maxRank {
		return nil, nil, fmt.Errorf("a walk over %v needs %d dimensions, kernels take %d", shape, len(dims), maxRank)
	}
	return dims, cst, nil
}

// putI64s appends vs, padded with zeros to n values, as little-endian int64s.
func putI64s(b []byte, n int, vs ...int64) []byte {
	for i := range n {
		v := int64(0)
		if i < len(vs) {
			v = vs[i]
		}
		b = binary.LittleEndian.AppendUint64(b, uint64(v))
	}
	return b
}

// bcastWalk encodes the Bcast (primitive.cu) of an elementwise kernel over shape, the output
// contiguous, its inputs (at most 3) read at strides st over shape.
func bcastWalk(shape []int, st [][]int64) ([]byte, error) {
	dims, cst, err := collapseDims(shape, append([][]int64{rowStrides(shape)}, st...)...)
	if err != nil {
		return nil, err
	}
	b := putI64s(nil, maxRank, dims...)
	for k := range 3 {
		var s []int64
		if k < len(st) {
			s = cst[1+k]
		}
		b = putI64s(b, maxRank, s...)
	}
	return putI64s(b, 2, int64(tensor.Numel(shape)), int64(len(dims))), nil
}

// elementwise checks out against the broadcast of the inputs' shapes and dtype dt, and
// returns the Bcast of the walk (nil when there is nothing to compute).
func elementwise(out *Tensor, dt tensor.DType, ins ...*Tensor) ([]byte, error) {
	shapes := make([][]int, len(ins))
	for i, t := range ins {
		shapes[i] = t.Shape
	}
	shape, st, err := broadcastAll(shapes...)
	if err != nil {
		return nil, err
	}
	if err := checkOut("output", out, dt, shape); err != nil {
		return nil, err
	}
	if tensor.Numel(shape) == 0 {
		return nil, nil
	}
	return bcastWalk(shape, st)
}

// unaryPrim runs a unary op of unaryCodes: x -> out of x's dtype and shape.
func unaryPrim(d *Device, op string, out, x *Tensor) error {
	code, ok := unaryCodes[op]
	if !ok {
		return fmt.Errorf("cuda: no unary kernel for op %s", op)
	}
	if err := checkLive(out, x); err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	c, err := dtCodes([]string{"x"}, x)
	if err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	if code < unaryCodes["neg"] && !floatOperands(x) {
		return fmt.Errorf("cuda: %s: x is %s; want f32 or bf16", op, x.DType)
	}
	if x.DType == tensor.Bool {
		return fmt.Errorf("cuda: %s: x is bool", op)
	}
	if err := checkOut("output", out, x.DType, x.Shape); err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	n := int64(x.Numel())
	if n == 0 {
		return nil
	}
	return d.launch("primitive.cu", "prim_unary", gridStride(d, n), block256, 0, func(a *cubind.Args) {
		a.Ptr(out.ptr).I32(c[0]).Ptr(x.ptr).I32(c[0]).I32(code).I64(n)
	})
}

// binaryPrim runs a binary op of binaryCodes with broadcasting: out has the broadcast shape
// and the dtype graph.Promote gives. Integer div and pow are refused (the CPU reports a
// division by zero or a negative power; these kernels could not).
func binaryPrim(d *Device, op string, out, a, b *Tensor) error {
	code, ok := binaryCodes[op]
	if !ok {
		return fmt.Errorf("cuda: no binary kernel for op %s", op)
	}
	if err := checkLive(out, a, b); err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	c, err := dtCodes([]string{"a", "b", "output"}, a, b, out)
	if err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	dt, err := graph.Promote(a.DType, b.DType)
	if err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	if !dt.IsFloat() && (op == "div" || op == "pow") {
		return fmt.Errorf("cuda: %s of %s and %s: integer %s has no CUDA kernel", op, a.DType, b.DType, op)
	}
	p, err := elementwise(out, dt, a, b)
	if err != nil || p == nil {
		return wrap("cuda: "+op, err)
	}
	return d.launch("primitive.cu", "prim_binary", gridStride(d, int64(out.Numel())), block256, 0, func(args *cubind.Args) {
		args.Ptr(out.ptr).I32(c[2]).Ptr(a.ptr).I32(c[0]).Ptr(b.ptr).I32(c[1]).I32(code).Struct(p)
	})
}

// comparePrim runs a comparison of compareCodes with broadcasting into bool out: as
// doubles when either side is a float, else as integers (bools as 0 and 1).
func comparePrim(d *Device, op string, out, a, b *Tensor) error {
	code, ok := compareCodes[op]
	if !ok {
		return fmt.Errorf("cuda: no comparison kernel for op %s", op)
	}
	if err := checkLive(out, a, b); err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	c, err := dtCodes([]string{"a", "b"}, a, b)
	if err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	asFloat := int32(0)
	if a.DType.IsFloat() || b.DType.IsFloat() {
		asFloat = 1
	}
	p, err := elementwise(out, tensor.Bool, a, b)
	if err != nil || p == nil {
		return wrap("cuda: "+op, err)
	}
	return d.launch("primitive.cu", "prim_compare", gridStride(d, int64(out.Numel())), block256, 0, func(args *cubind.Args) {
		args.Ptr(out.ptr).Ptr(a.ptr).I32(c[0]).Ptr(b.ptr).I32(c[1]).I32(code).I32(asFloat).Struct(p)
	})
}

// logicalPrim runs logical_and, logical_or (two bool inputs, broadcasting) or logical_not
// (one) into bool out.
func logicalPrim(d *Device, op string, out *Tensor, in []*Tensor) error {
	code, ok := logicalCodes[op]
	want := 2
	if op == "logical_not" {
		want = 1
	}
	if !ok || len(in) != want {
		return fmt.Errorf("cuda: %s: want %d inputs, got %d", op, want, len(in))
	}
	if err := checkLive(append([]*Tensor{out}, in...)...); err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	for i, t := range in {
		if t.DType != tensor.Bool {
			return fmt.Errorf("cuda: %s: input %d is %s; want bool", op, i, t.DType)
		}
	}
	p, err := elementwise(out, tensor.Bool, in...)
	if err != nil || p == nil {
		return wrap("cuda: "+op, err)
	}
	b := in[0]
	if len(in) > 1 {
		b = in[1]
	}
	return d.launch("primitive.cu", "prim_logical", gridStride(d, int64(out.Numel())), block256, 0, func(args *cubind.Args) {
		args.Ptr(out.ptr).Ptr(in[0].ptr).Ptr(b.ptr).I32(code).Struct(p)
	})
}

// wherePrim runs where(cond, a, b) with broadcasting: cond bool, out of graph.Promote(a, b).
func wherePrim(d *Device, out, cond, a, b *Tensor) error {
	if err := checkLive(out, cond, a, b); err != nil {
		return fmt.Errorf("cuda: where: %w", err)
	}
	if cond.DType != tensor.Bool {
		return fmt.Errorf("cuda: where: the condition is %s; want bool", cond.DType)
	}
	c, err := dtCodes([]string{"a", "b", "output"}, a, b, out)
	if err != nil {
		return fmt.Errorf("cuda: where: %w", err)
	}
	dt, err := graph.Promote(a.DType, b.DType)
	if err != nil {
		return fmt.Errorf("cuda: where: %w", err)
	}
	p, err := elementwise(out, dt, cond, a, b)
	if err != nil || p == nil {
		return wrap("cuda: where", err)
	}
	return d.launch("primitive.cu", "prim_where", gridStride(d, int64(out.Numel())), block256, 0, func(args *cubind.Args) {
		args.Ptr(out.ptr).I32(c[2]).Ptr(cond.ptr).Ptr(a.ptr).I32(c[0]).Ptr(b.ptr).I32(c[1]).Struct(p)
	})
}

// castPrim converts x to out's dtype (same shape) between any dtypes, as tensor.Cast does.
func castPrim(d *Device, out, x *Tensor) error {
	if err := checkLive(out, x); err != nil {
		return fmt.Errorf("cuda: cast: %w", err)
	}
	c, err := dtCodes([]string{"x", "output"}, x, out)
	if err != nil {
		return fmt.Errorf("cuda: cast: %w", err)
	}
	if !slices.Equal(out.Shape, x.Shape) {
		return fmt.Errorf("cuda: cast: output %v and input %v differ in shape", out.Shape, x.Shape)
	}
	n := int64(x.Numel())
	if n == 0 {
		return nil
	}
	return d.launch("primitive.cu", "prim_cast", gridStride(d, n), block256, 0, func(a *cubind.Args) {
		a.Ptr(out.ptr).I32(c[1]).Ptr(x.ptr).I32(c[0]).I64(n)
	})
}

// reducePrim runs a reduction of reduceCodes of x over axes (negative counts from the end)
// into out: x's dtype, x's shape without those axes (as 1 with keepdim).
func reducePrim(d *Device, op string, out, x *Tensor, axes []int, keepdim bool) error {
	code, ok := reduceCodes[op]
	if !ok {
		return fmt.Errorf("cuda: no reduction kernel for op %s", op)
	}
	if err := checkLive(out, x); err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	c, err := dtCodes([]string{"x"}, x)
	if err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	if len(axes) == 0 {
		return fmt.Errorf("cuda: %s needs at least one axis", op)
	}
	sel := make([]bool, len(x.Shape))
	for _, a := range axes {
		ax, err := graph.NormAxis(a, len(x.Shape))
		if err != nil {
			return fmt.Errorf("cuda: %s: %w", op, err)
		}
		if sel[ax] {
			return fmt.Errorf("cuda: %s: axis %d repeated in %v", op, a, axes)
		}
		sel[ax] = true
	}
	st := rowStrides(x.Shape)
	var oshape, kshape, rshape []int
	var kst, rst []int64
	count := 1
	for i, n := range x.Shape {
		if sel[i] {
			rshape, rst = append(rshape, n), append(rst, st[i])
			count *= n
			if keepdim {
				oshape = append(oshape, 1)
			}
			continue
		}
		kshape, kst = append(kshape, n), append(kst, st[i])
		oshape = append(oshape, n)
	}
	if err := checkOut("output", out, x.DType, oshape); err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	nout := tensor.Numel(oshape)
	switch {
	case nout == 0:
		return nil
	case op == "max" && count == 0:
		return fmt.Errorf("cuda: max over an empty axis (shape %v, axes %v)", x.Shape, axes)
	case op == "mean" && count == 0 && !out.DType.IsFloat():
		return fmt.Errorf("cuda: mean over an empty axis (shape %v, axes %v) has no %s value", x.Shape, axes, out.DType)
	}
	kdims, kc, err := collapseDims(kshape, kst)
	if err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	rdims, rc, err := collapseDims(rshape, rst)
	if err != nil {
		return fmt.Errorf("cuda: %s: %w", op, err)
	}
	p := putI64s(nil, maxRank, kdims...)
	p = putI64s(p, maxRank, kc[0]...)
	p = putI64s(p, maxRank, rdims...)
	p = putI64s(p, maxRank, rc[0]...)
	p = putI64s(p, 4, int64(nout), int64(count), int64(len(kdims)), int64(len(rdims)))
	asFloat := int32(0)
	if x.DType.IsFloat() || op == "mean" {
		asFloat = 1
	}
	return d.launch("primitive.cu", "prim_reduce", gridStride(d, int64(nout)), block256, 0, func(a *cubind.Args) {
		a.Ptr(out.ptr).I32(c[0]).Ptr(x.ptr).I32(c[0]).I32(code).I32(asFloat).Struct(p)
	})
}

// softmaxPrim runs softmax of x (f32 or bf16) along axis into out of x's dtype and shape.
func softmaxPrim(d *Device, out, x *Tensor, axis int) error {
	if err := checkLive(out, x); err != nil {
		return fmt.Errorf("cuda: softmax: %w", err)
	}
	if !floatOperands(x) {
		return fmt.Errorf("cuda: softmax: x is %s; want f32 or bf16", x.DType)
	}
	c, _ := dtCode("x", x.DType)
	ax, err := graph.NormAxis(axis, len(x.Shape))
	if err != nil {
		return fmt.Errorf("cuda: softmax: %w", err)
	}
	if err := checkOut("output", out, x.DType, x.Shape); err != nil {
		return fmt.Errorf("cuda: softmax: %w", err)
	}
	outer, L, inner := int64(tensor.Numel(x.Shape[:ax])), int64(x.Shape[ax]), int64(tensor.Numel(x.Shape[ax+1:]))
	if outer*L*inner == 0 {
		return nil
	}
	return d.launch("primitive.cu", "prim_softmax", gridStride(d, outer*inner), block256, 0, func(a *cubind.Args) {
		a.Ptr(out.ptr).I32(c).Ptr(x.ptr).I32(c).I64(outer).I64(L).I64(inner)
	})
}

// matmulPrim runs the batched product a[...,M,K] @ b[...,K,N] -> out[...,M,N] (batch
// dimensions broadcast; out of graph.Promote(a, b)).
func matmulPrim(d *Device, out, a, b *Tensor) error {
	if err := checkLive(out, a, b); err != nil {
		return fmt.Errorf("cuda: matmul: %w", err)
	}
	c, err := dtCodes([]string{"a", "b", "output"}, a, b, out)
	if err != nil {
		return fmt.Errorf("cuda: matmul: %w", err)
	}
	ra, rb := len(a.Shape), len(b.Shape)
	if ra < 2 || rb < 2 || a.Shape[ra-1] != b.Shape[rb-2] {
		return fmt.Errorf("cuda: matmul: %v @ %v: want a[...,M,K] and b[...,K,N]", a.Shape, b.Shape)
	}
	M, K, N := a.Shape[ra-2], a.Shape[ra-1], b.Shape[rb-1]
	batch, st, err := broadcastAll(a.Shape[:ra-2], b.Shape[:rb-2])
	if err != nil {
		return fmt.Errorf("cuda: matmul: %w", err)
	}
	dt, err := graph.Promote(a.DType, b.DType)
	if err != nil {
		return fmt.Errorf("cuda: matmul: %w", err)
	}
	if err := checkOut("output", out, dt, append(slices.Clone(batch), M, N)); err != nil {
		return fmt.Errorf("cuda: matmul: %w", err)
	}
	total := int64(out.Numel())
	if total == 0 {
		return nil
	}
	// Batch strides in elements of a and b: their batch strides times the matrix sizes.
	for i := range batch {
		st[0][i] *= int64(M * K)
		st[1][i] *= int64(K * N)
	}
	dims, cst, err := collapseDims(batch, rowStrides(batch), st[0], st[1])
	if err != nil {
		return fmt.Errorf("cuda: matmul: %w", err)
	}
	p := putI64s(nil, maxRank, dims...)
	p = putI64s(p, maxRank, cst[1]...)
	p = putI64s(p, maxRank, cst[2]...)
	p = putI64s(p, 5, int64(M), int64(K), int64(N), int64(tensor.Numel(batch)), int64(len(dims)))
	return d.launch("primitive.cu", "prim_matmul", gridStride(d, total), block256, 0, func(args *cubind.Args) {
		args.Ptr(out.ptr).I32(c[2]).Ptr(a.ptr).I32(c[0]).Ptr(b.ptr).I32(c[1]).Struct(p)
	})
}

// iotaPrim fills out with each element's index along axis.
func iotaPrim(d *Device, out *Tensor, axis int) error {
	if err := checkLive(out); err != nil {
		return fmt.Errorf("cuda: iota: %w", err)
	}
	c, err := dtCode("output", out.DType)
	if err != nil {
		return fmt.Errorf("cuda: iota: %w", err)
	}
	ax, err := graph.NormAxis(axis, len(out.Shape))
	if err != nil {
		return fmt.Errorf("cuda: iota: %w", err)
	}
	n := int64(out.Numel())
	if n == 0 {
		return nil
	}
	stride, size := rowStrides(out.Shape)[ax], int64(out.Shape[ax])
	return d.launch("primitive.cu", "prim_iota", gridStride(d, n), block256, 0, func(a *cubind.Args) {
		a.Ptr(out.ptr).I32(c).I64(n).I64(stride).I64(size)
	})
}

// topkPrim writes the k largest entries of each row of x[...,N] (f32 or bf16) along its
// last axis, largest first (ties lowest index first, NaN above all), into vals[...,k] of
// x's dtype and their indices into idx[...,k] (i32), as backend/cpu's topk.
func topkPrim(d *Device, vals, idx, x *Tensor, k int) error {
	if err := checkLive(vals, idx, x); err != nil {
		return fmt.Errorf("cuda: topk: %w", err)
	}
	if !floatOperands(x) || len(x.Shape) == 0 {
		return fmt.Errorf("cuda: topk: x is %s%v; want f32 or bf16 of rank >= 1", x.DType, x.Shape)
	}
	N := x.Shape[len(x.Shape)-1]
	if k < 1 || k > N {
		return fmt.Errorf("cuda: topk: k = %d is not in [1, %d]", k, N)
	}
	shape := slices.Clone(x.Shape)
	shape[len(shape)-1] = k
	if err := checkOut("values", vals, x.DType, shape); err != nil {
		return fmt.Errorf("cuda: topk: %w", err)
	}
	if err := checkOut("indices", idx, tensor.I32, shape); err != nil {
		return fmt.Errorf("cuda: topk: %w", err)
	}
	rows := int64(x.Numel() / N)
	if rows == 0 {
		return nil
	}
	c, _ := dtCode("x", x.DType)
	return d.launch("primitive.cu", "prim_topk", gridStride(d, rows), block256, 0, func(a *cubind.Args) {
		a.Ptr(vals.ptr).I32(c).Ptr(idx.ptr).Ptr(x.ptr).I32(c).I64(rows).I64(int64(N)).I64(int64(k))
	})
}
