package graph

import (
	"fmt"

	"github.com/loom-ml/loom/tensor"
)

// The ops of expert parallelism by all_to_all dispatch and combine: each ep rank routes the
// tokens it owns (moe_route), lays out one row per (token, slot) for the rank that owns the
// slot's expert (moe_dispatch), an all_to_all over ep brings every rank the rows of its
// experts, the rank runs its experts on them (moe_experts), a second all_to_all brings the
// results home, and moe_combine adds each token's weighed results in expert order, as the
// fused moe op does. The layouts are of fixed size, so that shapes stay static: every
// (token, slot) has a row in the piece of every rank, filled only where it goes, so that no
// token is ever dropped (the capacity is the worst case, ep·k rows per token).

// moeOwner is the doc of which ep rank owns a token.
const moeOwner = "the token at index (i0,...,in) of the leading axes belongs to ep rank (i0+...+in) mod group_size"

func init() {
	Register(&OpSpec{
		Name:   "moe_route",
		Doc:    "The routing of the moe op on x[...,H] with router [E,H]: logits x·routerᵀ in x's dtype, softmax over the E experts in f32, the top_k largest probabilities (renormalised to sum 1 when normalize), rounded to weight_dtype. Returns weights[...,top_k] in weight_dtype and experts[...,top_k] i32, largest first (ties lowest index first), as moe computes them.",
		Inputs: []string{"x", "router"},
		Attrs: []AttrSpec{
			{Name: "top_k", Type: AttrInt, Doc: "experts per token, 1 <= top_k <= E"},
			{Name: "normalize", Type: AttrBool, Default: false, Doc: "divide the top_k probabilities by their sum"},
			{Name: "weight_dtype", Type: AttrDType, Default: tensor.F32, Doc: "the dtype the weights are rounded to"},
		},
		Infer: func(n *Node) ([]Type, error) {
			x, router := inType(n, 0), inType(n, 1)
			if !x.DType.IsFloat() || !router.DType.IsFloat() || len(x.Shape) == 0 {
				return nil, fmt.Errorf("moe_route needs float x [...,H] and router [E,H], got %s, %s", x, router)
			}
			if len(router.Shape) != 2 || !router.Shape.IsConst() || x.Shape[len(x.Shape)-1] != router.Shape[1] {
				return nil, fmt.Errorf("moe_route: x %s does not fit a constant router [E,H] = %s", x.Shape, router.Shape)
			}
			if k := n.Attrs.Int("top_k"); k < 1 || k > router.Shape[0].Size {
				return nil, fmt.Errorf("moe_route: top_k = %d is not in [1, %d]", k, router.Shape[0].Size)
			}
			if wd := n.Attrs.DType("weight_dtype"); !wd.IsFloat() {
				return nil, fmt.Errorf("moe_route: weight_dtype %s is not a float dtype", wd)
			}
			s := x.Shape.Clone()
			s[len(s)-1] = D(n.Attrs.Int("top_k"))
			return []Type{{n.Attrs.DType("weight_dtype"), s}, {tensor.I32, s.Clone()}}, nil
		},
		Decompose: func(b *Builder, n *Node) ([]*Value, error) {
			r := MoERouting{TopK: n.Attrs.Int("top_k"), Renormalize: n.Attrs.Bool("normalize"), WeightDType: n.Attrs.DType("weight_dtype")}
			w, e := decomposeTopKRouting(b, b.Linear(n.Inputs[0], n.Inputs[1]), r)
			return []*Value{w, e}, b.Err()
		},
	})
	Register(&OpSpec{
		Name:   "moe_dispatch",
		Doc:    "The send buffers of an expert-parallel rank for an all_to_all over ep (split and concat axis 0): x[...,H] and each token's experts[...,k] (i32, of num_experts, group_size ranks owning num_experts/group_size consecutive experts each) give rows[G,...,k,H] in x's dtype and ids[G,...,k] i32: row (d,t,j) is x's token t and id (d,t,j) its expert experts[t,j] where this rank owns token t and rank d owns that expert; elsewhere the row is 0 and the id -1. Ownership: " + moeOwner + ".",
		Inputs: []string{"x", "experts"},
		Attrs: []AttrSpec{
			{Name: "num_experts", Type: AttrInt, Doc: "E, the router's experts"},
			{Name: "group_size", Type: AttrInt, Doc: "G, the ep ranks; it divides E"},
			{Name: "rank", Type: AttrInt, Doc: "this rank's index along ep, in [0, G)"},
		},
		Infer: func(n *Node) ([]Type, error) {
			x, ex := inType(n, 0), inType(n, 1)
			if _, err := checkMoEExperts(n, x, ex); err != nil {
				return nil, err
			}
			if r := n.Attrs.Int("rank"); r < 0 || r >= n.Attrs.Int("group_size") {
				return nil, fmt.Errorf("moe_dispatch: rank %d is not in [0, %d)", r, n.Attrs.Int("group_size"))
			}
			G := D(n.Attrs.Int("group_size"))
			ids := append(Shape{G}, ex.Shape...)
			rows := append(ids.Clone(), x.Shape[len(x.Shape)-1])
			return []Type{{x.DType, rows}, {tensor.I32, ids}}, nil
		},
		Decompose: func(b *Builder, n *Node) ([]*Value, error) {
			x, ex := n.Inputs[0], n.Inputs[1]
			G, E := n.Attrs.Int("group_size"), n.Attrs.Int("num_experts")
			lead := ex.Type.Shape[:len(ex.Type.Shape)-1]
			owned := ownedTokens(b, lead, G, n.Attrs.Int("rank")) // [...]
			owned = b.Reshape(owned, append(append(Shape{D(1)}, lead...), D(1))...)
			exG := b.Reshape(ex, append(Shape{D(1)}, ex.Type.Shape...)...)                        // [1,...,k]
			dest := b.Div(exG, b.Scalar(tensor.I32, float64(E/G)))                                // the owning rank
			ranks := b.Iota(tensor.I32, append(Shape{D(G)}, onesShape(len(ex.Type.Shape))...), 0) // [G,1,...,1]
			sent := b.And(b.Compare("eq", dest, ranks), owned)                                    // [G,...,k]
			ids := b.Where(sent, exG, b.Scalar(tensor.I32, -1))
			xs := b.Reshape(x, append(append(Shape{D(1)}, lead...), D(1), x.Type.Shape[len(x.Type.Shape)-1])...)
			rows := b.Where(b.Reshape(sent, append(sent.Type.Shape.Clone(), D(1))...), xs, b.Scalar(x.Type.DType, 0))
			return []*Value{rows, ids}, b.Err()
		},
	})
	Register(&OpSpec{
		Name:   "moe_experts",
		Doc:    "An expert-parallel rank's experts on the rows it received: rows[...,H] and ids[...] (i32, the router's expert of each row) give out[...,H] in rows' dtype, row r being down_l(silu(rows_r·gate_lᵀ) * (rows_r·up_lᵀ)) with l = ids_r - expert_offset where that is a local expert (gate and up [L,I,H], down [L,H,I], the stacked weights of experts expert_offset..expert_offset+L-1), else 0. The rounding is the moe op's: each projection in rows' dtype.",
		Inputs: []string{"rows", "ids", "gate", "up", "down"},
		Attrs:  []AttrSpec{{Name: "expert_offset", Type: AttrInt, Default: 0, Doc: "the router's index of the first local expert"}},
		Infer: func(n *Node) ([]Type, error) {
			rows, ids, gate, up, down := inType(n, 0), inType(n, 1), inType(n, 2), inType(n, 3), inType(n, 4)
			if !rows.DType.IsFloat() || len(rows.Shape) == 0 || ids.DType != tensor.I32 || !ids.Shape.Equal(rows.Shape[:len(rows.Shape)-1]) {
				return nil, fmt.Errorf("moe_experts needs float rows [...,H] and i32 ids [...], got %s, %s", rows, ids)
			}
			H := rows.Shape[len(rows.Shape)-1]
			if err := checkStackedExperts("moe_experts", gate, up, down, H); err != nil {
				return nil, err
			}
			if off := n.Attrs.Int("expert_offset"); off < 0 {
				return nil, fmt.Errorf("moe_experts: expert_offset %d is negative", off)
			}
			return one(Type{rows.DType, rows.Shape.Clone()}), nil
		},
		Decompose: func(b *Builder, n *Node) ([]*Value, error) {
			rows, ids := n.Inputs[0], n.Inputs[1]
			experts := stackedExperts(b, n.Inputs[2], n.Inputs[3], n.Inputs[4])
			sel := b.Reshape(ids, append(ids.Type.Shape.Clone(), D(1))...)
			out := b.Scalar(rows.Type.DType, 0)
			for j := len(experts) - 1; j >= 0; j-- { // each row takes its expert's output, or 0
				e := b.Scalar(tensor.I32, float64(n.Attrs.Int("expert_offset")+j))
				out = b.Where(b.Compare("eq", sel, e), expertMLP(b, rows, experts[j]), out)
			}
			return []*Value{out}, b.Err()
		},
	})
	Register(&OpSpec{
		Name:   "moe_combine",
		Doc:    "The moe op's sum from the rows an all_to_all over ep brought back: rows[G,...,k,H] (row (d,t,j) the output of rank d's expert for slot j of token t), each token's experts[...,k] (i32, of num_experts, rank d owning experts d·E/G.. (d+1)·E/G-1) and weights[...,k] give out[...,H] in rows' dtype: the sum, in expert order, of cast(rows[d(e),t,j] * weights[t,j], rows' dtype) over the slots j of token t (e = experts[t,j]), each product rounded to the promotion of rows' and weights' dtypes first, as moe adds them. A token whose rows are 0 (one this rank does not own) gets 0.",
		Inputs: []string{"rows", "experts", "weights"},
		Attrs:  []AttrSpec{{Name: "num_experts", Type: AttrInt, Doc: "E, the router's experts"}},
		Infer: func(n *Node) ([]Type, error) {
			rows, ex, w := inType(n, 0), inType(n, 1), inType(n, 2)
			if !rows.DType.IsFloat() || !w.DType.IsFloat() || len(rows.Shape) < 3 || rows.Shape[0].IsSym() {
				return nil, fmt.Errorf("moe_combine needs float rows [G,...,k,H] and weights [...,k], got %s, %s", rows, w)
			}
			H := rows.Shape[len(rows.Shape)-1]
			x := Type{rows.DType, append(ex.Shape[:len(ex.Shape)-1:len(ex.Shape)-1], H)}
			n2 := &Node{Op: n.Op, Attrs: Attrs{"num_experts": n.Attrs.Int("num_experts"), "group_size": rows.Shape[0].Size}}
			if _, err := checkMoEExperts(n2, x, ex); err != nil {
				return nil, err
			}
			if !rows.Shape[1:].Equal(append(ex.Shape.Clone(), H)) {
				return nil, fmt.Errorf("moe_combine: rows %s do not fit experts %s: want [G,...,k,H]", rows.Shape, ex.Shape)
			}
			if !w.Shape.Equal(ex.Shape) {
				return nil, fmt.Errorf("moe_combine: weights %s and experts %s differ", w.Shape, ex.Shape)
			}
			if _, err := Promote(rows.DType, w.DType); err != nil {
				return nil, err
			}
			s := ex.Shape.Clone()
			s[len(s)-1] = rows.Shape[len(rows.Shape)-1]
			return one(Type{rows.DType, s}), nil
		},
		Decompose: func(b *Builder, n *Node) ([]*Value, error) {
			rows, ex, w := n.Inputs[0], n.Inputs[1], n.Inputs[2]
			E, G := n.Attrs.Int("num_experts"), rows.Type.Shape[0].Size
			dense := scatterRouting(b, w, ex, E)                         // [...,E]
			sel := b.Reshape(ex, append(ex.Type.Shape.Clone(), D(1))...) // [...,k,1]
			local := rows.Type.Shape[1:].Clone()                         // [...,k,H]
			var out *Value
			for e := range E {
				d := e / (E / G)
				r := b.Reshape(b.Slice(rows, 0, d, d+1), local...)
				r = b.Where(b.Compare("eq", sel, b.Scalar(tensor.I32, float64(e))), r, b.Scalar(rows.Type.DType, 0))
				y := castTo(b, b.Mul(b.Reduce("sum", r, false, -2), b.Slice(dense, -1, e, e+1)), rows.Type.DType)
				if out == nil {
					out = y
				} else {
					out = b.Add(out, y)
				}
			}
			return []*Value{out}, b.Err()
		},
	})
}

// checkMoEExperts checks x[...,H] against experts[...,k] (i32) and the num_experts and
// group_size attributes of n, and returns k.
func checkMoEExperts(n *Node, x, ex Type) (int, error) {
	if !x.DType.IsFloat() || len(x.Shape) == 0 || ex.DType != tensor.I32 || len(ex.Shape) == 0 || !ex.Shape[:len(ex.Shape)-1].Equal(x.Shape[:len(x.Shape)-1]) {
		return 0, fmt.Errorf("%s needs float x [...,H] and i32 experts [...,k], got %s, %s", n.Op, x, ex)
	}
	k := ex.Shape[len(ex.Shape)-1]
	E, G := n.Attrs.Int("num_experts"), n.Attrs.Int("group_size")
	switch {
	case k.IsSym() || k.Size < 1:
		return 0, fmt.Errorf("%s: experts %s needs a constant slot axis", n.Op, ex.Shape)
	case G < 1 || E < 1 || E%G != 0:
		return 0, fmt.Errorf("%s: %d ep ranks do not divide %d experts", n.Op, G, E)
	case k.Size > E:
		return 0, fmt.Errorf("%s: %d slots per token for %d experts", n.Op, k.Size, E)
	}
	return k.Size, nil
}

// checkStackedExperts checks stacked expert weights: gate and up [L,I,H], down [L,H,I].
func checkStackedExperts(op string, gate, up, down Type, H Dim) error {
	for _, t := range []Type{gate, up, down} {
		if !t.DType.IsFloat() {
			return fmt.Errorf("%s needs float expert weights, got %s, %s, %s", op, gate, up, down)
		}
	}
	if len(gate.Shape) != 3 || !gate.Shape.IsConst() || gate.Shape[2] != H || !up.Shape.Equal(gate.Shape) || gate.Shape[0].Size < 1 {
		return fmt.Errorf("%s: gate %s and up %s must be [L,I,H] with H = %s", op, gate.Shape, up.Shape, H)
	}
	if L, I := gate.Shape[0], gate.Shape[1]; !down.Shape.Equal(Shape{L, H, I}) {
		return fmt.Errorf("%s: down %s must be [L,H,I] = [%s,%s,%s]", op, down.Shape, L, H, I)
	}
	return nil
}

// stackedExperts emits each expert of stacked weights gate and up [L,I,H], down [L,H,I].
func stackedExperts(b *Builder, gate, up, down *Value) []MoEExpert {
	L, I, H := gate.Type.Shape[0].Size, gate.Type.Shape[1], gate.Type.Shape[2]
	experts := make([]MoEExpert, L)
	member := func(w *Value, j int, rows, cols Dim) *Value {
		return b.Reshape(b.Slice(w, 0, j, j+1), rows, cols)
	}
	for j := range experts {
		experts[j] = MoEExpert{Gate: member(gate, j, I, H), Up: member(up, j, I, H), Down: member(down, j, H, I)}
	}
	return experts
}

// ownedTokens emits bool[lead...]: whether this ep rank owns each token (see moeOwner).
func ownedTokens(b *Builder, lead Shape, G, rank int) *Value {
	if len(lead) == 0 { // one token, rank 0's
		return b.Compare("eq", b.Scalar(tensor.I32, 0), b.Scalar(tensor.I32, float64(rank)))
	}
	var sum *Value
	for ax := range lead {
		i := b.Iota(tensor.I32, lead, ax)
		if sum == nil {
			sum = i
		} else {
			sum = b.Add(sum, i)
		}
	}
	g := b.Scalar(tensor.I32, float64(G))
	rem := b.Sub(sum, b.Mul(b.Div(sum, g), g))
	return b.Compare("eq", rem, b.Scalar(tensor.I32, float64(rank)))
}

// onesShape is n dimensions of size 1.
func onesShape(n int) Shape {
	s := make(Shape, n)
	for i := range s {
		s[i] = D(1)
	}
	return s
}

// MoERoute applies moe_route (see its Doc): each token's routing weights and experts.
func (b *Builder) MoERoute(x, router *Value, r MoERouting) (weights, experts *Value) {
	outs := b.Apply("moe_route", Attrs{"top_k": r.TopK, "normalize": r.Renormalize, "weight_dtype": r.WeightDType}, x, router)
	return outs[0], outs[1]
}
