package cpu

import (
	"fmt"
	"math"
	"slices"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Fast kernels of the fused ops. Each computes what the op's decomposition computes (see
// graph/catalog_fused.go and graph/decompose.go) in one pass, rounding where the
// decomposition rounds: intermediate values stored in a bf16 or f16 tensor by the
// decomposition are rounded to that dtype here too, and sums run in the same order with the
// same precision, so for f32 and bf16 alike the results equal the decomposition's up to the
// rare last-bit difference.

// roundF32 rounds v to what dtype dt stores (round to nearest even), as a float32.
func roundF32(dt tensor.DType, v float32) float32 {
	switch dt {
	case tensor.BF16:
		return tensor.BF16ToF32(tensor.F32ToBF16(v))
	case tensor.F16:
		return tensor.F16ToF32(tensor.F32ToF16(v))
	}
	return v
}

// storeRow writes src to the float tensor t from flat offset off, rounding to t's dtype.
func storeRow(t *tensor.Tensor, off int, src []float32) {
	switch t.DType {
	case tensor.F32:
		copy(t.F32[off:off+len(src)], src)
	case tensor.BF16:
		dst := t.Half[off : off+len(src)]
		for i, v := range src {
			dst[i] = tensor.F32ToBF16(v)
		}
	case tensor.F16:
		dst := t.Half[off : off+len(src)]
		for i, v := range src {
			dst[i] = tensor.F32ToF16(v)
		}
	}
}

// checkFloats reports an error unless every tensor and output is of a float dtype.
func checkFloats(op string, in []*tensor.Tensor, out []Out) error {
	for i, t := range in {
		if !t.DType.IsFloat() {
			return fmt.Errorf("%s: input %d must be a float tensor, got %s", op, i, t.DType)
		}
	}
	for i, o := range out {
		if !o.DType.IsFloat() {
			return fmt.Errorf("%s: output %d must be float, got %s", op, i, o.DType)
		}
	}
	return nil
}

// floatsOf returns the float tensor t's elements as float32 (Float32s), widened into a pooled
// buffer for bf16 and f16 (returned second, to give back with putF32; nil otherwise).
func floatsOf(t *tensor.Tensor) ([]float32, *[]float32) {
	switch t.DType {
	case tensor.F32, tensor.BF16, tensor.F16:
		return widenInto(t)
	}
	return t.Float32s(), nil
}

// checkNorm checks x[...,D] against the norm weight w[D] and returns D.
func checkNorm(x, w *tensor.Tensor) (int, error) {
	if len(x.Shape) == 0 || len(w.Shape) != 1 || w.Shape[0] != x.Shape[len(x.Shape)-1] {
		return 0, fmt.Errorf("norm weight %v does not fit the last axis of %v", w.Shape, x.Shape)
	}
	return w.Shape[0], nil
}

// normRow writes to dst the RMSNorm of the row xr (values of dtype xdt, widened) with
// weight wv, as DecomposeRMSNorm computes it: the mean of the float32 squares summed in
// float64, rounded to float32, plus eps in float32, rsqrt in float64 rounded to float32,
// x*rsqrt rounded to xdt, times w.
func normRow(dst, xr, wv []float32, eps float32, xdt tensor.DType) {
	var ss float64
	for _, v := range xr {
		ss += float64(v * v)
	}
	mean := float32(ss / float64(len(xr)))
	inv := float32(1 / math.Sqrt(float64(mean+eps)))
	wv = wv[:len(xr)]
	dst = dst[:len(xr)]
	if xdt == tensor.F32 {
		for d, v := range xr {
			dst[d] = wv[d] * (v * inv)
		}
		return
	}
	for d, v := range xr {
		dst[d] = wv[d] * roundF32(xdt, v*inv)
	}
}

// fastRMSNorm: x[...,D] normalised with w[D] -> out[...,D] (dtype promote(w, x)); rows are
// split over the worker pool.
func fastRMSNorm(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 2, 1); err != nil {
		return nil, err
	}
	x, w, o := in[0], in[1], out[0]
	if err := checkFloats(n.Op, in, out); err != nil {
		return nil, err
	}
	D, err := checkNorm(x, w)
	if err != nil {
		return nil, err
	}
	if err := checkShape(x.Shape, o); err != nil {
		return nil, err
	}
	res := newOutDirty(o) // every row is written below
	if D == 0 || x.Numel() == 0 {
		return []*tensor.Tensor{res}, nil
	}
	wv, wbuf := floatsOf(w)
	if wbuf != nil {
		defer putF32(wbuf)
	}
	eps := float32(n.Attrs.Float("eps"))
	rows := x.Numel() / D
	parallel(rows, grainFor(rows, 4*D, 1), func(lo, hi int) {
		buf := getF32(2 * D)
		defer putF32(buf)
		xb, yb := (*buf)[:D], (*buf)[D:]
		for r := lo; r < hi; r++ {
			normRow(yb, rowF32(x, r*D, D, xb), wv, eps, x.DType)
			storeRow(res, r*D, yb)
		}
	})
	return []*tensor.Tensor{res}, nil
}

// fastAddRMSNorm: x[...,D] + residual[...,D] = sum, rounded to sum's dtype; returns
// (rmsnorm(sum, w[D]), sum). Rows are split over the worker pool.
func fastAddRMSNorm(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 3, 2); err != nil {
		return nil, err
	}
	x, r, w := in[0], in[1], in[2]
	if err := checkFloats(n.Op, in, out); err != nil {
		return nil, err
	}
	if !slices.Equal(x.Shape, r.Shape) {
		return nil, fmt.Errorf("x %v and residual %v differ in shape", x.Shape, r.Shape)
	}
	D, err := checkNorm(x, w)
	if err != nil {
		return nil, err
	}
	for i := range out {
		if err := checkShape(x.Shape, out[i]); err != nil {
			return nil, fmt.Errorf("output %d: %w", i, err)
		}
	}
	normed, sum := newOutDirty(out[0]), newOutDirty(out[1]) // every row is written below
	if D == 0 || x.Numel() == 0 {
		return []*tensor.Tensor{normed, sum}, nil
	}
	wv, wbuf := floatsOf(w)
	if wbuf != nil {
		defer putF32(wbuf)
	}
	eps := float32(n.Attrs.Float("eps"))
	sdt := sum.DType
	rows := x.Numel() / D
	parallel(rows, grainFor(rows, 5*D, 1), func(lo, hi int) {
		buf := getF32(3 * D)
		defer putF32(buf)
		xb, rb, yb := (*buf)[:D], (*buf)[D:2*D], (*buf)[2*D:]
		for row := lo; row < hi; row++ {
			xr, rr := rowF32(x, row*D, D, xb), rowF32(r, row*D, D, rb)
			for d := range yb {
				yb[d] = roundF32(sdt, xr[d]+rr[d])
			}
			storeRow(sum, row*D, yb)
			normRow(yb, yb, wv, eps, sdt)
			storeRow(normed, row*D, yb)
		}
	})
	return []*tensor.Tensor{normed, sum}, nil
}

// fastRope: q[B,H,S,D] and k[B,KV,S,D] rotated at positions[B,S] -> (q', k'). cos and sin
// are computed once per call for each position (D/2 of each, rounded to q's dtype as the
// decomposition's tables are) and shared by q and k; the rows of q and k are then split over
// the worker pool.
func fastRope(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 3, 2); err != nil {
		return nil, err
	}
	q, k, pos := in[0], in[1], in[2]
	if err := checkFloats(n.Op, in[:2], out); err != nil {
		return nil, err
	}
	if len(pos.Shape) != 2 || !pos.DType.IsInt() {
		return nil, fmt.Errorf("positions must be integer [B,S], got %s%v", pos.DType, pos.Shape)
	}
	B, S := pos.Shape[0], pos.Shape[1]
	invFreq := n.Attrs.Floats("inv_freq")
	half := len(invFreq)
	for i, t := range []*tensor.Tensor{q, k} {
		if len(t.Shape) != 4 || t.Shape[0] != B || t.Shape[2] != S || t.Shape[3] != 2*half {
			return nil, fmt.Errorf("input %d %v does not fit positions %v and %d inverse frequencies", i, t.Shape, pos.Shape, half)
		}
		if err := checkShape(t.Shape, out[i]); err != nil {
			return nil, fmt.Errorf("output %d: %w", i, err)
		}
	}
	tdt := q.DType // the decomposition casts the tables to q's dtype
	for i, t := range []*tensor.Tensor{q, k} {
		if dt, err := graph.Promote(t.DType, tdt); err != nil || dt != out[i].DType {
			return nil, fmt.Errorf("output %d is %s but %s rotated with %s tables gives another dtype", i, out[i].DType, t.DType, tdt)
		}
	}
	D := 2 * half
	res := []*tensor.Tensor{newOut(out[0]), newOut(out[1])}
	if D == 0 || B*S == 0 {
		return res, nil
	}
	cosT, sinT := ropeTables(pos, invFreq, n.Attrs.Float("scaling"), tdt)
	// Rows: every (b, head, s) of q, then of k.
	qRows, kRows := q.Numel()/D, k.Numel()/D
	H, KV := q.Shape[1], k.Shape[1]
	parallel(qRows+kRows, grainFor(qRows+kRows, 8*D, 1), func(lo, hi int) {
		buf := getF32(2 * D)
		defer putF32(buf)
		xb, yb := (*buf)[:D], (*buf)[D:]
		for r := lo; r < hi; r++ {
			x, o, heads, row := q, res[0], H, r
			if r >= qRows {
				x, o, heads, row = k, res[1], KV, r-qRows
			}
			b, s := row/(heads*S), row%S
			c, sn := cosT[(b*S+s)*half:(b*S+s+1)*half], sinT[(b*S+s)*half:(b*S+s+1)*half]
			rotateRow(yb, rowF32(x, row*D, D, xb), c, sn, o.DType)
			storeRow(o, row*D, yb)
		}
	})
	return res, nil
}

// ropeTables returns the cos and sin tables [B*S, half] of positions pos[B,S] as the
// decomposition's rotary tables hold them: angle = float32(position) * float32(inv_freq),
// cos and sin in float64 rounded to float32, times scaling unless it is 1, rounded to tdt.
// Positions are split over the worker pool.
func ropeTables(pos *tensor.Tensor, invFreq []float64, scaling float64, tdt tensor.DType) (cosT, sinT []float32) {
	half, bs := len(invFreq), pos.Numel()
	ps := pos.Int64s()
	inv := make([]float32, half)
	for i, f := range invFreq {
		inv[i] = float32(f)
	}
	sc, scaled := float32(scaling), scaling != 1
	cosT, sinT = make([]float32, bs*half), make([]float32, bs*half)
	parallel(bs, grainFor(bs, 40*half, 1), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			p := float32(ps[r])
			for i, f := range inv {
				a := float64(p * f)
				c, s := float32(math.Cos(a)), float32(math.Sin(a))
				if scaled {
					c, s = c*sc, s*sc
				}
				cosT[r*half+i], sinT[r*half+i] = roundF32(tdt, c), roundF32(tdt, s)
			}
		}
	})
	return cosT, sinT
}

// rotateRow writes to dst[D] the rotation of one head row xr[D] (widened) with the cos and
// sin c, sn [D/2] of its position: x*cos + rotate_half(x)*sin with each product and the sum
// rounded to mdt, the dtype of x*cos and rot*sin in the decomposition.
func rotateRow(dst, xr, c, sn []float32, mdt tensor.DType) {
	half := len(c)
	x1, x2 := xr[:half], xr[half:2*half]
	for i := range half {
		dst[i] = roundF32(mdt, roundF32(mdt, x1[i]*c[i])+roundF32(mdt, -x2[i]*sn[i]))
		dst[half+i] = roundF32(mdt, roundF32(mdt, x2[i]*c[i])+roundF32(mdt, x1[i]*sn[i]))
	}
}

// fastRepeatKV: x[B,KV,S,D] -> out[B,KV*n,S,D], each KV head copied n times in place, in
// any dtype.
func fastRepeatKV(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 1, 1); err != nil {
		return nil, err
	}
	x, o := in[0], out[0]
	rep := n.Attrs.Int("n")
	if len(x.Shape) != 4 || rep < 1 {
		return nil, fmt.Errorf("repeat_kv needs x [B,KV,S,D] and n >= 1, got %v and n=%d", x.Shape, rep)
	}
	if err := sameDType(x, o); err != nil {
		return nil, err
	}
	B, KV := x.Shape[0], x.Shape[1]
	block := x.Shape[2] * x.Shape[3]
	if KV > 0 && rep > math.MaxInt/KV {
		return nil, fmt.Errorf("repeat_kv: %d heads repeated %d times overflows", KV, rep)
	}
	if err := checkShape([]int{B, KV * rep, x.Shape[2], x.Shape[3]}, o); err != nil {
		return nil, err
	}
	res := newOut(o)
	for b := range B {
		for h := range KV {
			src := (b*KV + h) * block
			for r := range rep {
				tensor.CopyRange(res, ((b*KV+h)*rep+r)*block, x, src, block)
			}
		}
	}
	return []*tensor.Tensor{res}, nil
}

// fastSDPA: causal attention of q[B,H,S,D] over k, v[B,KV,S,D] at positions[B,S] ->
// out[B,H,S,D]. Query head h reads KV head h/(H/KV) directly (no repeated copy). Each query
// row scores only its visible keys (position <= its own, and > its own - window when window
// > 0), takes a float64 softmax over them and sums the values in key order; the (b, h)
// pairs are split over the worker pool. Like the decomposition, raw scores are rounded to
// the dtype of q·kᵀ and probabilities to q's dtype before they weight v.
func fastSDPA(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 4, 1); err != nil {
		return nil, err
	}
	q, k, v, pos, o := in[0], in[1], in[2], in[3], out[0]
	if err := checkFloats(n.Op, in[:3], out); err != nil {
		return nil, err
	}
	if len(q.Shape) != 4 || len(k.Shape) != 4 || !slices.Equal(k.Shape, v.Shape) {
		return nil, fmt.Errorf("want q [B,H,S,D] and k, v [B,KV,S,D], got %v, %v, %v", q.Shape, k.Shape, v.Shape)
	}
	B, H, S, D, KV := q.Shape[0], q.Shape[1], q.Shape[2], q.Shape[3], k.Shape[1]
	if KV == 0 || H%KV != 0 {
		return nil, fmt.Errorf("query heads %d are not a multiple of KV heads %d", H, KV)
	}
	if k.Shape[0] != B || k.Shape[2] != S || k.Shape[3] != D {
		return nil, fmt.Errorf("q %v and k %v disagree on batch, sequence or head size", q.Shape, k.Shape)
	}
	if len(pos.Shape) != 2 || !pos.DType.IsInt() || pos.Shape[0] != B || pos.Shape[1] != S {
		return nil, fmt.Errorf("positions must be integer [B,S] matching q %v, got %s%v", q.Shape, pos.DType, pos.Shape)
	}
	if err := checkShape(q.Shape, o); err != nil {
		return nil, err
	}
	sdt, err := graph.Promote(q.DType, k.DType) // dtype of the raw scores q·kᵀ
	if err != nil {
		return nil, err
	}
	res := newOut(o)
	if q.Numel() == 0 {
		return []*tensor.Tensor{res}, nil
	}
	rep := H / KV
	scale := float32(n.Attrs.Float("scale"))
	window := int64(n.Attrs.Int("window"))
	ps := pos.Int64s()
	qs, qbuf := widenInto(q)
	ks, kbuf := widenInto(k)
	vs, vbuf := widenInto(v)
	parallel(B*H, grainFor(B*H, 2*S*S*D, 1), func(lo, hi int) {
		buf := getF32(2*S + D)
		defer putF32(buf)
		sc, acc := (*buf)[:S], (*buf)[S:S+D]
		idx := make([]int, S)
		e := make([]float64, S)
		for bh := lo; bh < hi; bh++ {
			b, h := bh/H, bh%H
			kvBase := (b*KV + h/rep) * S * D
			kh, vh := ks[kvBase:kvBase+S*D], vs[kvBase:kvBase+S*D]
			pb := ps[b*S : (b+1)*S]
			for i := range S {
				qr := qs[(bh*S+i)*D : (bh*S+i+1)*D]
				// Visible keys, in key order.
				nv := 0
				for j, pj := range pb {
					if pj <= pb[i] && (window <= 0 || pj+window > pb[i]) {
						idx[nv] = j
						nv++
					}
				}
				attendRow(acc, qr, kh, vh, idx[:nv], sc[:nv], e[:nv], scale, sdt, q.DType)
				storeRow(res, (bh*S+i)*D, acc)
			}
		}
	})
	for _, p := range []*[]float32{qbuf, kbuf, vbuf} {
		if p != nil {
			putF32(p)
		}
	}
	return []*tensor.Tensor{res}, nil
}

// attendRow sets acc[D] to the attention output of one query row qr over the keys and values
// kh, vh [S,D] listed in idx: scores sc = round_sdt(q·k)*scale, probabilities
// round_pdt(softmax(sc)) in float64 (e is scratch), then acc = sum of p*v in idx order.
// With no visible key the result is NaN, as softmax over an all -inf row gives.
func attendRow(acc, qr, kh, vh []float32, idx []int, sc []float32, e []float64, scale float32, sdt, pdt tensor.DType) {
	D := len(qr)
	if len(idx) == 0 {
		for d := range acc {
			acc[d] = float32(math.NaN())
		}
		return
	}
	t := 0
	for ; t+4 <= len(idx); t += 4 {
		s0, s1, s2, s3 := dot1x4F32(qr, kh[idx[t]*D:(idx[t]+1)*D], kh[idx[t+1]*D:(idx[t+1]+1)*D],
			kh[idx[t+2]*D:(idx[t+2]+1)*D], kh[idx[t+3]*D:(idx[t+3]+1)*D])
		sc[t], sc[t+1], sc[t+2], sc[t+3] = s0, s1, s2, s3
	}
	for ; t < len(idx); t++ {
		sc[t] = dot(qr, kh[idx[t]*D:(idx[t]+1)*D])
	}
	softmaxRow(sc, e, scale, sdt, pdt)
	clear(acc)
	t = 0
	for ; t+4 <= len(idx); t += 4 {
		p0, p1, p2, p3 := sc[t], sc[t+1], sc[t+2], sc[t+3]
		v0, v1, v2, v3 := vh[idx[t]*D:(idx[t]+1)*D], vh[idx[t+1]*D:(idx[t+1]+1)*D], vh[idx[t+2]*D:(idx[t+2]+1)*D], vh[idx[t+3]*D:(idx[t+3]+1)*D]
		for d := range acc {
			acc[d] = acc[d] + p0*v0[d] + p1*v1[d] + p2*v2[d] + p3*v3[d]
		}
	}
	for ; t < len(idx); t++ {
		p, vr := sc[t], vh[idx[t]*D:(idx[t]+1)*D]
		for d := range acc {
			acc[d] += p * vr[d]
		}
	}
}

// fastSwiGLU: silu(gate[...]) * up[...] -> out[...] (dtype promote(gate, up)); silu in
// float64 rounded to gate's dtype, as the decomposition's silu node stores it.
func fastSwiGLU(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 2, 1); err != nil {
		return nil, err
	}
	g, u, o := in[0], in[1], out[0]
	if err := checkFloats(n.Op, in, out); err != nil {
		return nil, err
	}
	if !slices.Equal(g.Shape, u.Shape) {
		return nil, fmt.Errorf("gate %v and up %v differ in shape", g.Shape, u.Shape)
	}
	if err := checkShape(g.Shape, o); err != nil {
		return nil, err
	}
	res := newOutDirty(o) // every chunk is written below
	const chunk = 1024
	size := g.Numel()
	parallel(size, grainFor(size, 20, chunk), func(lo, hi int) {
		buf := getF32(3 * chunk)
		defer putF32(buf)
		for c := lo; c < hi; c += chunk {
			m := min(chunk, hi-c)
			gb, ub, yb := (*buf)[:m], (*buf)[chunk:chunk+m], (*buf)[2*chunk:2*chunk+m]
			swigluRow(yb, rowF32(g, c, m, gb), rowF32(u, c, m, ub), g.DType)
			storeRow(res, c, yb)
		}
	})
	return []*tensor.Tensor{res}, nil
}

// swigluRow writes silu(gr[i]) * ur[i] to dst: silu in float64 rounded to float32 and then to
// gdt, the gate's dtype, as the decomposition's silu node stores it; the product in float32.
// dst must not overlap gr or ur.
func swigluRow(dst, gr, ur []float32, gdt tensor.DType) {
	ur, dst = ur[:len(gr)], dst[:len(gr)]
	siluF32(dst, gr)
	if gdt == tensor.F32 {
		for i, u := range ur {
			dst[i] *= u
		}
		return
	}
	for i, u := range ur {
		dst[i] = roundF32(gdt, dst[i]) * u
	}
}

func init() {
	Register("linear", fastLinear)
	ownKernels["linear"] = fastLinear
	Register("matmul", fastMatmul)
	Register("rmsnorm", fastRMSNorm)
	Register("add_rmsnorm", fastAddRMSNorm)
	Register("rope", fastRope)
	Register("repeat_kv", fastRepeatKV)
	Register("sdpa", fastSDPA)
	Register("swiglu", fastSwiGLU)
}
