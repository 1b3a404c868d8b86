package cpu

import (
	"fmt"
	"slices"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// The kernels of expert parallelism by all_to_all (ops moe_route, moe_dispatch, moe_experts
// and moe_combine; see their Docs). Together, with the all_to_all between them, they give
// the fused moe kernel's bits (fastMoE): the routing is moeRoute, each expert runs through
// the same dense linear kernel on its rows (expertsOut), and the combine adds each token's
// products in expert order with fastMoE's rounding.

// fastMoERoute: x[...,H], router [E,H] -> weights[...,k] (weight_dtype), experts[...,k] i32.
func fastMoERoute(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 2, 2); err != nil {
		return nil, err
	}
	if err := checkFloats(n.Op, in, out[:1]); err != nil {
		return nil, err
	}
	x, router := in[0], in[1]
	if len(x.Shape) == 0 || len(router.Shape) != 2 || x.Shape[len(x.Shape)-1] != router.Shape[1] {
		return nil, fmt.Errorf("moe_route needs x [...,H] and router [E,H], got %v, %v", x.Shape, router.Shape)
	}
	E, H := router.Shape[0], router.Shape[1]
	k, normalize, wd := n.Attrs.Int("top_k"), n.Attrs.Bool("normalize"), n.Attrs.DType("weight_dtype")
	if k < 1 || k > E || !wd.IsFloat() {
		return nil, fmt.Errorf("moe_route: top_k %d, weight_dtype %s do not fit %d experts", k, wd, E)
	}
	shape := slices.Clone(x.Shape)
	shape[len(shape)-1] = k
	if err := checkShape(shape, out[0]); err != nil {
		return nil, err
	}
	if err := checkShape(shape, out[1]); err != nil {
		return nil, err
	}
	if out[0].DType != wd || out[1].DType != tensor.I32 {
		return nil, fmt.Errorf("moe_route gives %s and i32, asked for %s and %s", wd, out[0].DType, out[1].DType)
	}
	T := x.Numel() / max(H, 1)
	xs, xbuf := widenInto(x)
	if xbuf != nil {
		defer putF32(xbuf)
	}
	experts, weights := make([]int32, T*k), make([]float32, T*k)
	if T > 0 && H > 0 {
		experts, weights = moeRoute(xs, router, T, E, H, k, normalize, x.DType, wd)
	}
	return []*tensor.Tensor{fromF32(weights, out[0]), {DType: tensor.I32, Shape: shape, I32: experts}}, nil
}

// moeTokenOwners gives, for each token of the leading shape lead (row-major), the ep rank
// that owns it: the sum of its indices modulo G (the moe_dispatch op's rule).
func moeTokenOwners(lead []int, G int) []int {
	owners := make([]int, tensor.Numel(lead))
	idx := make([]int, len(lead))
	sum := 0
	for t := range owners {
		owners[t] = sum % G
		for a := len(lead) - 1; a >= 0; a-- { // next index, odometer style
			idx[a]++
			sum++
			if idx[a] < lead[a] {
				break
			}
			sum -= idx[a]
			idx[a] = 0
		}
	}
	return owners
}

// moeSlots checks experts[...,k] (i32) against x[...,H] and returns the tokens T and k.
func moeSlots(op string, x, experts *tensor.Tensor, E int) (T, k int, err error) {
	if len(x.Shape) == 0 || experts.DType != tensor.I32 || len(experts.Shape) != len(x.Shape) || !slices.Equal(experts.Shape[:len(x.Shape)-1], x.Shape[:len(x.Shape)-1]) {
		return 0, 0, fmt.Errorf("%s needs x [...,H] and i32 experts [...,k], got %s%v, %s%v", op, x.DType, x.Shape, experts.DType, experts.Shape)
	}
	k = experts.Shape[len(experts.Shape)-1]
	for i, e := range experts.I32 {
		if e < 0 || int(e) >= E {
			return 0, 0, fmt.Errorf("%s: slot %d names expert %d, not one of the %d", op, i, e, E)
		}
	}
	return tensor.Numel(x.Shape[:len(x.Shape)-1]), k, nil
}

// fastMoEDispatch: x[...,H], experts[...,k] i32 -> rows[G,...,k,H], ids[G,...,k] i32.
func fastMoEDispatch(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 2, 2); err != nil {
		return nil, err
	}
	x, ex := in[0], in[1]
	if !x.DType.IsFloat() {
		return nil, fmt.Errorf("moe_dispatch: x must be a float tensor, got %s", x.DType)
	}
	E, G, rank := n.Attrs.Int("num_experts"), n.Attrs.Int("group_size"), n.Attrs.Int("rank")
	if G < 1 || E%G != 0 || rank < 0 || rank >= G {
		return nil, fmt.Errorf("moe_dispatch: rank %d of %d ep ranks over %d experts", rank, G, E)
	}
	T, k, err := moeSlots(n.Op, x, ex, E)
	if err != nil {
		return nil, err
	}
	H := x.Shape[len(x.Shape)-1]
	idShape := append([]int{G}, ex.Shape...)
	rowShape := append(slices.Clone(idShape), H)
	if err := checkShape(rowShape, out[0]); err != nil {
		return nil, err
	}
	if err := checkShape(idShape, out[1]); err != nil {
		return nil, err
	}
	if out[0].DType != x.DType || out[1].DType != tensor.I32 {
		return nil, fmt.Errorf("moe_dispatch gives %s and i32, asked for %s and %s", x.DType, out[0].DType, out[1].DType)
	}
	rows, ids := tensor.New(x.DType, rowShape...), tensor.New(tensor.I32, idShape...)
	for i := range ids.I32 {
		ids.I32[i] = -1
	}
	per := E / G
	for t, owner := range moeTokenOwners(x.Shape[:len(x.Shape)-1], G) {
		if owner != rank {
			continue
		}
		for j := range k {
			e := ex.I32[t*k+j]
			slot := (int(e)/per*T+t)*k + j
			ids.I32[slot] = e
			tensor.CopyRange(rows, slot*H, x, t*H, H)
		}
	}
	return []*tensor.Tensor{rows, ids}, nil
}

// fastMoEExperts: rows[...,H], ids[...] i32, gate and up [L,I,H], down [L,H,I] ->
// out[...,H]: each row through its local expert (expertsOut), grouped by expert; rows of
// other experts (ids outside expert_offset..expert_offset+L-1) get 0.
func fastMoEExperts(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 5, 1); err != nil {
		return nil, err
	}
	rows, ids, gate, up, down, o := in[0], in[1], in[2], in[3], in[4], out[0]
	if err := checkFloats(n.Op, []*tensor.Tensor{rows, gate, up, down}, out); err != nil {
		return nil, err
	}
	if len(rows.Shape) == 0 || ids.DType != tensor.I32 || !slices.Equal(ids.Shape, rows.Shape[:len(rows.Shape)-1]) || len(gate.Shape) != 3 {
		return nil, fmt.Errorf("moe_experts needs rows [...,H], i32 ids [...] and gate [L,I,H], got %v, %s%v, %v", rows.Shape, ids.DType, ids.Shape, gate.Shape)
	}
	H := rows.Shape[len(rows.Shape)-1]
	L, I := gate.Shape[0], gate.Shape[1]
	if gate.Shape[2] != H || !slices.Equal(up.Shape, gate.Shape) || !slices.Equal(down.Shape, []int{L, H, I}) {
		return nil, fmt.Errorf("moe_experts: rows %v, gate %v, up %v, down %v do not fit [...,H], [L,I,H], [L,I,H], [L,H,I]", rows.Shape, gate.Shape, up.Shape, down.Shape)
	}
	if err := checkShape(rows.Shape, o); err != nil {
		return nil, err
	}
	if o.DType != rows.DType {
		return nil, fmt.Errorf("moe_experts of %s rows gives %s, asked for %s", rows.DType, rows.DType, o.DType)
	}
	offset, act := n.Attrs.Int("expert_offset"), rows.DType
	R := ids.Numel()
	res := make([]float32, R*H)
	byExpert := make([][]int32, L)
	for r, id := range ids.I32 {
		if l := int(id) - offset; l >= 0 && l < L {
			byExpert[l] = append(byExpert[l], int32(r))
		}
	}
	var groups []moeGroup
	m := 0
	for l, rs := range byExpert {
		if len(rs) > 0 {
			groups = append(groups, moeGroup{l: l, m: len(rs), off: m})
			m += len(rs)
		}
	}
	if m == 0 || H == 0 {
		return []*tensor.Tensor{fromF32(res, o)}, nil
	}
	xe := getF32(m * H)
	for _, g := range groups {
		for i, r := range byExpert[g.l] {
			widen((*xe)[(g.off+i)*H:(g.off+i+1)*H], rows, int(r)*H)
		}
	}
	y := expertsOut(*xe, m, groups, gate, up, down, act)
	putF32(xe)
	for _, g := range groups {
		for i, r := range byExpert[g.l] {
			copy(res[int(r)*H:(int(r)+1)*H], (*y)[(g.off+i)*H:(g.off+i+1)*H])
		}
	}
	putF32(y)
	return []*tensor.Tensor{fromF32(res, o)}, nil // rounds to act, as the decomposition's last linear
}

// fastMoECombine: rows[G,...,k,H], experts[...,k] i32, weights[...,k] -> out[...,H]: each
// token's products rows·weight added in expert order with fastMoE's rounding.
func fastMoECombine(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 3, 1); err != nil {
		return nil, err
	}
	rows, ex, w, o := in[0], in[1], in[2], out[0]
	if err := checkFloats(n.Op, []*tensor.Tensor{rows, w}, out); err != nil {
		return nil, err
	}
	E := n.Attrs.Int("num_experts")
	if len(rows.Shape) < 3 || ex.DType != tensor.I32 || !slices.Equal(rows.Shape[1:len(rows.Shape)-1], ex.Shape) || !slices.Equal(w.Shape, ex.Shape) {
		return nil, fmt.Errorf("moe_combine needs rows [G,...,k,H], i32 experts [...,k] and weights [...,k], got %v, %s%v, %v", rows.Shape, ex.DType, ex.Shape, w.Shape)
	}
	G, H := rows.Shape[0], rows.Shape[len(rows.Shape)-1]
	if G < 1 || E%G != 0 {
		return nil, fmt.Errorf("moe_combine: %d ep ranks do not divide %d experts", G, E)
	}
	x := &tensor.Tensor{DType: rows.DType, Shape: append(slices.Clone(ex.Shape[:len(ex.Shape)-1]), H)}
	T, k, err := moeSlots(n.Op, x, ex, E)
	if err != nil {
		return nil, err
	}
	if err := checkShape(x.Shape, o); err != nil {
		return nil, err
	}
	if o.DType != rows.DType {
		return nil, fmt.Errorf("moe_combine of %s rows gives %s, asked for %s", rows.DType, rows.DType, o.DType)
	}
	act := rows.DType
	prod, err := graph.Promote(act, w.DType)
	if err != nil {
		return nil, err
	}
	ws, wbuf := widenInto(w)
	if wbuf != nil {
		defer putF32(wbuf)
	}
	per := E / G
	res := make([]float32, T*H)
	v := make([]float32, H)
	order := make([]int, k)
	for t := range T {
		for j := range order {
			order[j] = j
		}
		slices.SortFunc(order, func(a, b int) int { return int(ex.I32[t*k+a]) - int(ex.I32[t*k+b]) })
		rr := res[t*H : (t+1)*H]
		for i, j := range order {
			slot := (int(ex.I32[t*k+j])/per*T+t)*k + j
			widen(v, rows, slot*H)
			wt := ws[t*k+j]
			if i == 0 {
				for d, y := range v {
					rr[d] = roundF32(act, roundF32(prod, y*wt))
				}
				continue
			}
			for d, y := range v {
				rr[d] = roundF32(act, rr[d]+roundF32(act, roundF32(prod, y*wt)))
			}
		}
	}
	return []*tensor.Tensor{fromF32(res, o)}, nil
}

func init() {
	Register("moe_route", fastMoERoute)
	Register("moe_dispatch", fastMoEDispatch)
	Register("moe_experts", fastMoEExperts)
	Register("moe_combine", fastMoECombine)
}
