package cpu

import (
	"fmt"
	"math"
	"slices"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// fastMoE: the fused mixture-of-experts block (op moe; see its Doc) computing only the
// experts each token chose. x[...,H], router [E,H], gate and up [L,I,H], down [L,H,I] (the L
// local experts from expert_offset) -> out[...,H] in x's dtype.
//
// Routing is computed per token as the decomposition's kernels compute it: router logits by
// the dense linear kernel, rounded to x's dtype; softmax in float64 rounded to f32; the
// top_k largest (ties lowest index first, NaN above all); their float64 sum rounded to f32
// and a float32 division when normalize; rounded to weight_dtype. Then the tokens are
// grouped by expert: each local expert's gate, up and down projections run through the
// dense linear kernel's per-row kernels on its own tokens only (expertsOut: every chosen
// expert in one parallel region for gate and up, then one for down), with silu(gate)*up
// rounded as the decomposition's silu and mul nodes round. Each product output·weight is rounded to
// promote(x's dtype, weight_dtype) and then to x's dtype, and a token's products are added
// in expert order, rounding to x's dtype after each add.
//
// The decomposition computes every expert on every token and adds exact zeros for the
// experts a token did not choose, so, in the default build (no fused multiply-add; the
// linear kernel computes each output row the same way whichever rows it is given), this
// kernel gives its bits: it differs only where the decomposition would add a NaN or an
// infinity from an expert the token did not choose, and in the sign of an exact zero sum.
// Tokens that chose no local expert get 0.
func fastMoE(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 5, 1); err != nil {
		return nil, err
	}
	if err := checkFloats(n.Op, in, out); err != nil {
		return nil, err
	}
	x, router, gate, up, down, o := in[0], in[1], in[2], in[3], in[4], out[0]
	if len(x.Shape) == 0 || len(router.Shape) != 2 || len(gate.Shape) != 3 {
		return nil, fmt.Errorf("moe needs x [...,H], router [E,H] and gate [L,I,H], got %v, %v, %v", x.Shape, router.Shape, gate.Shape)
	}
	E, H := router.Shape[0], router.Shape[1]
	L, I := gate.Shape[0], gate.Shape[1]
	if x.Shape[len(x.Shape)-1] != H || gate.Shape[2] != H || !slices.Equal(up.Shape, gate.Shape) || !slices.Equal(down.Shape, []int{L, H, I}) {
		return nil, fmt.Errorf("moe: x %v, router %v, gate %v, up %v, down %v do not fit [...,H], [E,H], [L,I,H], [L,I,H], [L,H,I]", x.Shape, router.Shape, gate.Shape, up.Shape, down.Shape)
	}
	k, normalize, wd, offset := n.Attrs.Int("top_k"), n.Attrs.Bool("normalize"), n.Attrs.DType("weight_dtype"), n.Attrs.Int("expert_offset")
	if k < 1 || k > E || offset < 0 || offset+L > E || !wd.IsFloat() {
		return nil, fmt.Errorf("moe: top_k %d, expert_offset %d, weight_dtype %s do not fit %d local experts of %d", k, offset, wd, L, E)
	}
	if err := checkShape(x.Shape, o); err != nil {
		return nil, err
	}
	if o.DType != x.DType {
		return nil, fmt.Errorf("moe of %s x gives %s, asked for %s", x.DType, x.DType, o.DType)
	}
	act := x.DType
	prod, err := graph.Promote(act, wd)
	if err != nil {
		return nil, err
	}
	T := x.Numel() / max(H, 1)
	res := make([]float32, T*H)
	if T == 0 || H == 0 {
		return []*tensor.Tensor{fromF32(res, o)}, nil
	}
	xs, xbuf := widenInto(x)
	if xbuf != nil {
		defer putF32(xbuf)
	}

	// Routing: each token's chosen experts and their weights; then, per local expert, the
	// tokens that chose it (in token order) and their weights.
	experts, weights := moeRoute(xs, router, T, E, H, k, normalize, act, wd)
	tokens := make([][]int32, L)
	tokenW := make([][]float32, L)
	for t := range T {
		for j := range k {
			if l := int(experts[t*k+j]) - offset; l >= 0 && l < L {
				tokens[l] = append(tokens[l], int32(t))
				tokenW[l] = append(tokenW[l], weights[t*k+j])
			}
		}
	}

	// Every local expert's rows gathered in expert order, run in one pass (expertsOut).
	var groups []moeGroup
	rows := 0
	for l := range L {
		if m := len(tokens[l]); m > 0 {
			groups = append(groups, moeGroup{l: l, m: m, off: rows})
			rows += m
		}
	}
	if rows == 0 {
		return []*tensor.Tensor{fromF32(res, o)}, nil
	}
	xe := getF32(rows * H)
	for _, g := range groups {
		for i, t := range tokens[g.l] {
			copy((*xe)[(g.off+i)*H:(g.off+i+1)*H], xs[int(t)*H:(int(t)+1)*H])
		}
	}
	y := expertsOut(*xe, rows, groups, gate, up, down, act)
	putF32(xe)
	started := make([]bool, T)
	for _, g := range groups {
		for i, t := range tokens[g.l] {
			w := tokenW[g.l][i]
			yr, rr := (*y)[(g.off+i)*H:(g.off+i+1)*H], res[int(t)*H:(int(t)+1)*H]
			if !started[t] {
				for d, v := range yr {
					rr[d] = roundF32(act, roundF32(prod, roundF32(act, v)*w))
				}
				started[t] = true
				continue
			}
			for d, v := range yr {
				rr[d] = roundF32(act, rr[d]+roundF32(act, roundF32(prod, roundF32(act, v)*w)))
			}
		}
	}
	putF32(y)
	return []*tensor.Tensor{fromF32(res, o)}, nil
}

// moeRoute computes every token's top-k experts (largest weight first) and their weights,
// as the decomposition's router computes them (see fastMoE).
func moeRoute(xs []float32, router *tensor.Tensor, T, E, H, k int, normalize bool, act, wd tensor.DType) (experts []int32, weights []float32) {
	logits := make([]float32, T*E)
	gemmRows(logits, xs, router, T, E, H)
	experts, weights = make([]int32, T*k), make([]float32, T*k)
	e := make([]float64, E)
	probs := make([]float32, E)
	chosen := make([]bool, E)
	for t := range T {
		row := logits[t*E : (t+1)*E]
		m := math.Inf(-1)
		for j, v := range row {
			row[j] = roundF32(act, v)
			m = max(m, float64(row[j]))
		}
		sum := 0.0
		for j, v := range row {
			e[j] = math.Exp(float64(v) - m)
			sum += e[j]
		}
		for j := range row {
			probs[j] = float32(e[j] / sum)
			chosen[j] = false
		}
		vals := weights[t*k : (t+1)*k]
		for j := range k {
			best := -1
			for i, p := range probs {
				if !chosen[i] && (best < 0 || greater(p, probs[best])) {
					best = i
				}
			}
			chosen[best] = true
			experts[t*k+j], vals[j] = int32(best), probs[best]
		}
		if normalize {
			s := 0.0
			for _, v := range vals {
				s += float64(v)
			}
			for j := range vals {
				vals[j] /= float32(s)
			}
		}
		for j := range vals {
			vals[j] = roundF32(wd, vals[j])
		}
	}
	return experts, weights
}

// expertView is expert l of stacked weights w [L,N,K] as a [N,K] tensor sharing w's storage.
func expertView(w *tensor.Tensor, l int) *tensor.Tensor {
	N, K := w.Shape[1], w.Shape[2]
	lo, hi := l*N*K, (l+1)*N*K
	v := &tensor.Tensor{DType: w.DType, Shape: []int{N, K}}
	if w.DType == tensor.F32 {
		v.F32 = w.F32[lo:hi]
	} else {
		v.Half = w.Half[lo:hi]
	}
	return v
}

// roundAll rounds every value to what dtype dt stores.
func roundAll(dt tensor.DType, vs []float32) {
	if dt == tensor.F32 {
		return
	}
	for i, v := range vs {
		vs[i] = roundF32(dt, v)
	}
}

func init() { Register("moe", fastMoE) }
