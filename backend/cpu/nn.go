package cpu

import (
	"fmt"
	"slices"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Matrix products, lookups and sources.

// rowF32 returns n elements of t from flat offset off as float32: a view of the storage for
// f32, else a widened copy in buf (which must hold n elements).
func rowF32(t *tensor.Tensor, off, n int, buf []float32) []float32 {
	switch t.DType {
	case tensor.F32:
		return t.F32[off : off+n]
	case tensor.BF16:
		for i, h := range t.Half[off : off+n] {
			buf[i] = tensor.BF16ToF32(h)
		}
	case tensor.F16:
		for i, h := range t.Half[off : off+n] {
			buf[i] = tensor.F16ToF32(h)
		}
	default:
		for i := range n {
			buf[i] = float32(t.At(off + i))
		}
	}
	return buf[:n]
}

// dot is the float32 dot product of two equally long vectors, summed in order.
func dot(a, b []float32) float32 {
	var s float32
	for i, v := range a {
		s += v * b[i]
	}
	return s
}

// workChunk is roughly the least number of multiply-adds worth a goroutine.
const workChunk = 1 << 16

// linear: x[...,K] @ w[N,K]^T -> out[...,N] in x's dtype, accumulated in float32. The work is
// split over the weight rows (output columns) across runtime.GOMAXPROCS goroutines; each
// weight row is widened once into a per-goroutine buffer of K floats, so bf16 and f16 weights
// are never copied whole.
func linear(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	M, N, K, err := linearDims(n, in, out)
	if err != nil {
		return nil, err
	}
	x, w, o := in[0], in[1], out[0]
	res := make([]float32, M*N)
	if M == 0 || N == 0 || K == 0 {
		return []*tensor.Tensor{fromF32(res, o)}, nil
	}
	xs := x.Float32s()
	parallelFor(N, max(1, workChunk/max(1, M*K)), func(lo, hi int) {
		buf := make([]float32, K)
		for j := lo; j < hi; j++ {
			wr := rowF32(w, j*K, K, buf)
			for m := range M {
				res[m*N+j] = dot(xs[m*K:(m+1)*K], wr)
			}
		}
	})
	return []*tensor.Tensor{fromF32(res, o)}, nil
}

// linearDims checks linear's arguments, x[...,K] and w[N,K] of float dtypes to a float
// out[...,N], and returns M (the number of rows of x), N and K.
func linearDims(n *graph.Node, in []*tensor.Tensor, out []Out) (M, N, K int, err error) {
	if err := checkArgs(n, in, out, 2, 1); err != nil {
		return 0, 0, 0, err
	}
	x, w, o := in[0], in[1], out[0]
	if len(w.Shape) != 2 || len(x.Shape) < 1 {
		return 0, 0, 0, fmt.Errorf("linear needs x of rank >= 1 and a 2-D weight, got %v and %v", x.Shape, w.Shape)
	}
	if !x.DType.IsFloat() || !w.DType.IsFloat() || !o.DType.IsFloat() {
		return 0, 0, 0, fmt.Errorf("linear needs float operands and result, got %s, %s -> %s", x.DType, w.DType, o.DType)
	}
	N, K = w.Shape[0], w.Shape[1]
	rx := len(x.Shape)
	if x.Shape[rx-1] != K {
		return 0, 0, 0, fmt.Errorf("x's last dimension %d differs from the weight's input dimension %d", x.Shape[rx-1], K)
	}
	if err := checkShape(append(slices.Clone(x.Shape[:rx-1]), N), o); err != nil {
		return 0, 0, 0, err
	}
	return tensor.Numel(x.Shape[:rx-1]), N, K, nil
}

// matmul: a[...,M,K] @ b[...,K,N] -> out[...,M,N]; the batch dimensions broadcast. Floats
// accumulate in float32, with the output rows split across goroutines; integers (and bools,
// as 0 and 1) accumulate in int64.
func matmul(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 2, 1); err != nil {
		return nil, err
	}
	a, b, o := in[0], in[1], out[0]
	l, err := matmulLayoutOf(a, b, o)
	if err != nil {
		return nil, err
	}
	M, K, N, aOff, bOff, nb := l.M, l.K, l.N, l.aOff, l.bOff, len(l.aOff)
	rows := nb * M
	if !o.DType.IsFloat() {
		av, bv := int64s(a), int64s(b)
		res := make([]int64, rows*N)
		for r := range rows {
			bi, m := r/M, r%M
			for k := range K {
				x := av[aOff[bi]+m*K+k]
				for j := range N {
					res[r*N+j] += x * bv[bOff[bi]+k*N+j]
				}
			}
		}
		return []*tensor.Tensor{fromI64(res, o)}, nil
	}
	res := make([]float32, rows*N)
	parallelFor(rows, max(1, workChunk/max(1, K*N)), func(lo, hi int) {
		abuf, bbuf := make([]float32, K), make([]float32, N)
		for r := lo; r < hi; r++ {
			bi, m := r/M, r%M
			arow := rowF32(a, aOff[bi]+m*K, K, abuf)
			dst := res[r*N : (r+1)*N]
			for k, x := range arow {
				brow := rowF32(b, bOff[bi]+k*N, N, bbuf)
				for j, y := range brow {
					dst[j] += x * y
				}
			}
		}
	})
	return []*tensor.Tensor{fromF32(res, o)}, nil
}

// embedding: table[V,D] gathered by integer ids[...] -> out[...,D] in the table's dtype. An
// id outside [0, V) is an error that names it.
func embedding(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 2, 1); err != nil {
		return nil, err
	}
	tab, ids, o := in[0], in[1], out[0]
	if len(tab.Shape) != 2 {
		return nil, fmt.Errorf("embedding table must be 2-D, got %v", tab.Shape)
	}
	if !ids.DType.IsInt() {
		return nil, fmt.Errorf("embedding ids must be integers, got %s", ids.DType)
	}
	V, D := tab.Shape[0], tab.Shape[1]
	if err := checkShape(append(slices.Clone(ids.Shape), D), o); err != nil {
		return nil, err
	}
	res := tensor.New(tab.DType, o.Shape...)
	for i, id := range int64s(ids) {
		if id < 0 || id >= int64(V) {
			return nil, fmt.Errorf("id %d (at position %d) is out of range for an embedding table of %d rows", id, i, V)
		}
		tensor.CopyRange(res, i*D, tab, int(id)*D, D)
	}
	return []*tensor.Tensor{res.Cast(o.DType)}, nil
}

// constant: no inputs -> out[shape] filled from the "values" attribute (row-major, or one
// value for every element), converted to the output dtype.
func constant(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 0, 1); err != nil {
		return nil, err
	}
	t, err := backend.Const(n, out[0].DType, out[0].Shape)
	if err != nil {
		return nil, err
	}
	return []*tensor.Tensor{t}, nil
}

// iota: no inputs -> out[shape] (symbols resolved) whose elements are their index along the
// "axis" attribute, in the output dtype.
func iota(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 0, 1); err != nil {
		return nil, err
	}
	o := out[0]
	ax, err := graph.NormAxis(n.Attrs.Int("axis"), len(o.Shape))
	if err != nil {
		return nil, err
	}
	stride := tensor.Strides(o.Shape)[ax]
	res := make([]int64, tensor.Numel(o.Shape))
	for i := range res {
		res[i] = int64(i / stride % o.Shape[ax])
	}
	return []*tensor.Tensor{fromI64(res, o)}, nil
}

func init() {
	registerReference("linear", linear)
	registerReference("matmul", matmul)
	registerReference("embedding", embedding)
	registerReference(graph.OpConst, constant)
	registerReference("iota", iota)
}

// matmulLayout is the shape of a batched matmul a[...,M,K] @ b[...,K,N]: the matrix sizes
// and, per broadcast batch, the element offsets of its a and b matrices.
type matmulLayout struct {
	M, K, N    int
	aOff, bOff []int
}

// matmulLayoutOf checks a matmul's operands against each other and its output o and gives
// their layout.
func matmulLayoutOf(a, b *tensor.Tensor, o Out) (matmulLayout, error) {
	var l matmulLayout
	ra, rb := len(a.Shape), len(b.Shape)
	if ra < 2 || rb < 2 {
		return l, fmt.Errorf("matmul needs rank >= 2, got %v and %v", a.Shape, b.Shape)
	}
	l.M, l.K, l.N = a.Shape[ra-2], a.Shape[ra-1], b.Shape[rb-1]
	if b.Shape[rb-2] != l.K {
		return l, fmt.Errorf("inner dimensions differ: %v @ %v", a.Shape, b.Shape)
	}
	batch, err := broadcastShapes(a.Shape[:ra-2], b.Shape[:rb-2])
	if err != nil {
		return l, err
	}
	if err := checkShape(append(slices.Clone(batch), l.M, l.N), o); err != nil {
		return l, err
	}
	sa, err := broadcastStrides(a.Shape[:ra-2], batch)
	if err != nil {
		return l, err
	}
	sb, err := broadcastStrides(b.Shape[:rb-2], batch)
	if err != nil {
		return l, err
	}
	nb := tensor.Numel(batch)
	l.aOff, l.bOff = make([]int, nb), make([]int, nb)
	walk(batch, [][]int{sa, sb}, []int{0, 0}, func(i int, off []int) {
		l.aOff[i], l.bOff[i] = off[0]*l.M*l.K, off[1]*l.K*l.N
	})
	return l, nil
}
