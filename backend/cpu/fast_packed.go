package cpu

import (
	"fmt"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Fast kernels of the fused ops over packed projections (qkv_rope, qkv_norm_rope,
// swiglu_packed): the arithmetic of fastRMSNorm, fastRope and fastSwiGLU (rotateRow, ropeTables, swigluRow), reading the parts
// of the packed input in place instead of split copies, so the results are the same bits.

// fastQKVRoPE: x[B,S,(H+2*KV)*D] and positions[B,S] -> q[B,H,S,D], k[B,KV,S,D] rotated as
// fastRope rotates them, and v[B,KV,S,D] copied (packedRoPE).
func fastQKVRoPE(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 2, 3); err != nil {
		return nil, err
	}
	return packedRoPE(n, in[0], in[1], nil, nil, out)
}

// fastQKVNormRoPE: qkv_norm_rope, fastQKVRoPE with each head of q normed by q_norm[D] and
// of k by k_norm[D] as fastRMSNorm norms a row (packedRoPE).
func fastQKVNormRoPE(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 4, 3); err != nil {
		return nil, err
	}
	return packedRoPE(n, in[0], in[3], in[1], in[2], out)
}

// packedRoPE lays out x[B,S,(H+2*KV)*D] as q[B,H,S,D], k[B,KV,S,D] and v[B,KV,S,D], each
// head of q and k normed first when qn and kn are given (normRow, rounded to the promotion
// of the weights' dtype and x's, which q and k take) and rotated at positions[B,S] as
// fastRope rotates it; v is copied. Output rows (every (b, head, s) of q, k, then v) are split over the worker pool;
// each reads its D elements of x in place.
func packedRoPE(n *graph.Node, x, pos, qn, kn *tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	floats := []*tensor.Tensor{x}
	if qn != nil {
		floats = append(floats, qn, kn)
	}
	if err := checkFloats(n.Op, floats, out); err != nil {
		return nil, err
	}
	if len(pos.Shape) != 2 || !pos.DType.IsInt() {
		return nil, fmt.Errorf("positions must be integer [B,S], got %s%v", pos.DType, pos.Shape)
	}
	B, S := pos.Shape[0], pos.Shape[1]
	H, KV := n.Attrs.Int("heads"), n.Attrs.Int("kv_heads")
	invFreq := n.Attrs.Floats("inv_freq")
	half := len(invFreq)
	D := 2 * half
	if H < 1 || KV < 1 || half < 1 {
		return nil, fmt.Errorf("%s needs heads, kv_heads and inverse frequencies >= 1, got %d, %d and %d", n.Op, H, KV, half)
	}
	W := (H + 2*KV) * D // x's last axis
	if len(x.Shape) != 3 || x.Shape[0] != B || x.Shape[1] != S || x.Shape[2] != W {
		return nil, fmt.Errorf("x %v does not fit positions %v with %d+2*%d heads of %d", x.Shape, pos.Shape, H, KV, D)
	}
	dts := [3]tensor.DType{x.DType, x.DType, x.DType}
	var norms [2][]float32
	if qn != nil {
		for i, w := range []*tensor.Tensor{qn, kn} {
			if len(w.Shape) != 1 || w.Shape[0] != D {
				return nil, fmt.Errorf("norm weight %d %v does not fit heads of %d", i, w.Shape, D)
			}
			norms[i] = w.Float32s()
			dt, err := graph.Promote(w.DType, x.DType)
			if err != nil {
				return nil, err
			}
			dts[i] = dt
		}
		if dts[1] != dts[0] {
			return nil, fmt.Errorf("q_norm is %s and k_norm %s: the norms must have one dtype", qn.DType, kn.DType)
		}
	}
	heads := [3]int{H, KV, KV}
	res := make([]*tensor.Tensor, 3)
	for i := range res {
		shape := []int{B, heads[i], S, D}
		if err := checkShape(shape, out[i]); err != nil {
			return nil, fmt.Errorf("output %d: %w", i, err)
		}
		if out[i].DType != dts[i] {
			return nil, fmt.Errorf("output %d is %s, want %s", i, out[i].DType, dts[i])
		}
		res[i] = newShaped(out[i].arena, dts[i], shape, true)
	}
	if B*S == 0 {
		return res, nil
	}
	cosT, sinT := ropeTables(pos, invFreq, n.Attrs.Float("scaling"), dts[0])
	eps := float32(n.Attrs.Float("eps"))
	qRows, kRows, vRows := B*H*S, B*KV*S, B*KV*S
	parallel(qRows+kRows+vRows, grainFor(qRows+kRows+vRows, 8*D, 1), func(lo, hi int) {
		buf := getF32(3 * D)
		defer putF32(buf)
		xb, yb, nb := (*buf)[:D], (*buf)[D:2*D], (*buf)[2*D:]
		for r := lo; r < hi; r++ {
			part, row, first := 0, r, 0 // first: the part's first head on x's last axis
			switch {
			case r >= qRows+kRows:
				part, row, first = 2, r-qRows-kRows, H+KV
			case r >= qRows:
				part, row, first = 1, r-qRows, H
			}
			nh := heads[part]
			b, h, s := row/(nh*S), row/S%nh, row%S
			src := (b*S+s)*W + (first+h)*D
			if part == 2 {
				tensor.CopyRange(res[2], row*D, x, src, D)
				continue
			}
			xr := rowF32(x, src, D, xb)
			if qn != nil {
				normRow(nb, xr, norms[part], eps, x.DType)
				for i, v := range nb {
					nb[i] = roundF32(dts[part], v)
				}
				xr = nb
			}
			t := (b*S + s) * half
			rotateRow(yb, xr, cosT[t:t+half], sinT[t:t+half], dts[part])
			storeRow(res[part], row*D, yb)
		}
	})
	return res, nil
}

// fastSwiGLUPacked: x[...,2I] -> silu(gate) * up [...,I] with gate the first I elements of
// each row of x and up the last I, as fastSwiGLU computes it. Chunks of rows are split over
// the worker pool.
func fastSwiGLUPacked(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 1, 1); err != nil {
		return nil, err
	}
	x, o := in[0], out[0]
	if err := checkFloats(n.Op, in, out); err != nil {
		return nil, err
	}
	if len(x.Shape) == 0 || x.Shape[len(x.Shape)-1]%2 != 0 {
		return nil, fmt.Errorf("x %v has no even last axis", x.Shape)
	}
	shape := append([]int(nil), x.Shape...)
	I := shape[len(shape)-1] / 2
	shape[len(shape)-1] = I
	if err := checkShape(shape, o); err != nil {
		return nil, err
	}
	if o.DType != x.DType {
		return nil, fmt.Errorf("output is %s, want x's dtype %s", o.DType, x.DType)
	}
	res := newShaped(o.arena, o.DType, shape, false) // every chunk is written below
	if I == 0 || x.Numel() == 0 {
		return []*tensor.Tensor{res}, nil
	}
	// Work items: chunks of at most 1024 outputs of one row, so that one long row (decoding)
	// is split too.
	const chunk = 1024
	rows, per := x.Numel()/(2*I), (I+chunk-1)/chunk
	parallel(rows*per, grainFor(rows*per, 20*min(I, chunk), 1), func(lo, hi int) {
		buf := getF32(3 * chunk)
		defer putF32(buf)
		for it := lo; it < hi; it++ {
			r, c := it/per, it%per*chunk
			m := min(chunk, I-c)
			gb, ub, yb := (*buf)[:m], (*buf)[chunk:chunk+m], (*buf)[2*chunk:2*chunk+m]
			swigluRow(yb, rowF32(x, 2*r*I+c, m, gb), rowF32(x, (2*r+1)*I+c, m, ub), x.DType)
			storeRow(res, r*I+c, yb)
		}
	})
	return []*tensor.Tensor{res}, nil
}

// linearThenOps are the linears fused with the packed op that reads their output, and that op.
var linearThenOps = map[string]string{"linear_swiglu": "swiglu_packed", "linear_qkv_rope": "qkv_rope"}

// fastLinearThen is the kernel of a linear fused with the packed op that reads its output
// (linear_swiglu, linear_qkv_rope): the linear kernel in use (fastLinear unless replaced)
// into a temporary of x's dtype, then the packed op's (linearThenOps) with the node's
// attributes and the node's inputs after x and w. The same bits as the two ops run apart.
func fastLinearThen(op string) Kernel {
	return func(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
		if len(in) < 2 {
			return nil, fmt.Errorf("%s needs x and w, got %d inputs", n.Op, len(in))
		}
		x, w := in[0], in[1]
		if len(x.Shape) < 1 || len(w.Shape) != 2 {
			return nil, fmt.Errorf("%s needs x[...,K] and w[N,K], got %v and %v", n.Op, x.Shape, w.Shape)
		}
		lin, _ := Lookup("linear")
		shape := append(append([]int(nil), x.Shape[:len(x.Shape)-1]...), w.Shape[0])
		y, err := lin(&graph.Node{Op: "linear", Scope: n.Scope}, in[:2], []Out{{DType: x.DType, Shape: shape, arena: out[0].arena}})
		if err != nil {
			return nil, fmt.Errorf("%s: linear: %w", n.Op, err)
		}
		return thenOp(n, op, y[0], in[2:], out)
	}
}

// thenOp runs the packed op of fused node n on y, the linear's output, and rest, the node's
// inputs after x and w.
func thenOp(n *graph.Node, op string, y *tensor.Tensor, rest []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	next, ok := Lookup(op)
	if !ok {
		return nil, fmt.Errorf("no kernel for %s", op)
	}
	return next(&graph.Node{Op: op, Attrs: n.Attrs, Scope: n.Scope}, append([]*tensor.Tensor{y}, rest...), out)
}

func init() {
	Register("qkv_rope", fastQKVRoPE)
	Register("qkv_norm_rope", fastQKVNormRoPE)
	Register("swiglu_packed", fastSwiGLUPacked)
	for op, next := range linearThenOps {
		k := fastLinearThen(next)
		Register(op, k)
		ownKernels[op] = k
	}
}
