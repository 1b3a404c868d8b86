package graph

import (
	"fmt"
	"math"

	"github.com/loom-ml/loom/tensor"
)

// Matrix products and lookups.

func init() {
	Register(&OpSpec{
		Name: "matmul", Doc: "Batched matrix product: a[...,M,K] @ b[...,K,N] -> [...,M,N]; batch dimensions broadcast.",
		Inputs: []string{"a", "b"},
		Infer: func(n *Node) ([]Type, error) {
			a, b := inType(n, 0), inType(n, 1)
			if len(a.Shape) < 2 || len(b.Shape) < 2 {
				return nil, fmt.Errorf("matmul needs rank >= 2, got %s and %s", a.Shape, b.Shape)
			}
			ra, rb := len(a.Shape), len(b.Shape)
			if a.Shape[ra-1] != b.Shape[rb-2] {
				return nil, fmt.Errorf("inner dimensions differ: %s @ %s", a.Shape, b.Shape)
			}
			batch, err := Broadcast(a.Shape[:ra-2], b.Shape[:rb-2])
			if err != nil {
				return nil, err
			}
			dt, err := Promote(a.DType, b.DType)
			if err != nil {
				return nil, err
			}
			return one(Type{dt, append(batch, a.Shape[ra-2], b.Shape[rb-1])}), nil
		},
	})
	Register(&OpSpec{
		Name: "linear", Doc: "x[...,K] @ w[N,K]^T -> [...,N] (a torch Linear without bias); the result has x's dtype.",
		Inputs: []string{"x", "w"},
		Infer: func(n *Node) ([]Type, error) {
			x, w := inType(n, 0), inType(n, 1)
			if len(w.Shape) != 2 || len(x.Shape) < 1 {
				return nil, fmt.Errorf("linear needs x of rank >= 1 and a 2-D weight, got %s and %s", x.Shape, w.Shape)
			}
			if x.Shape[len(x.Shape)-1] != w.Shape[1] {
				return nil, fmt.Errorf("x's last dimension %s differs from the weight's input dimension %s", x.Shape[len(x.Shape)-1], w.Shape[1])
			}
			if !x.DType.IsFloat() || !w.DType.IsFloat() {
				return nil, fmt.Errorf("linear needs float operands, got %s and %s", x.DType, w.DType)
			}
			out := x.Shape.Clone()
			out[len(out)-1] = w.Shape[0]
			return one(Type{x.DType, out}), nil
		},
	})
	Register(&OpSpec{
		Name: "embedding", Doc: "Row lookup: table[V,D] gathered by integer ids[...] -> [...,D] in the table's dtype.",
		Inputs: []string{"table", "ids"},
		Infer: func(n *Node) ([]Type, error) {
			tab, ids := inType(n, 0), inType(n, 1)
			if len(tab.Shape) != 2 {
				return nil, fmt.Errorf("embedding table must be 2-D, got %s", tab.Shape)
			}
			if !ids.DType.IsInt() {
				return nil, fmt.Errorf("embedding ids must be integers, got %s", ids.DType)
			}
			return one(Type{tab.DType, append(ids.Shape.Clone(), tab.Shape[1])}), nil
		},
	})
}

// OpParam is the op name of parameter (weight) nodes.
const OpParam = "param"

// OpConst is the op name of constant nodes.
const OpConst = "const"

// Sources: ops with no inputs.
func init() {
	Register(&OpSpec{
		Name: OpParam, Doc: "A weight read from the checkpoint at load time; optionally one slice of it (for sharding). A stacked param (stack=N) is N checkpoint tensors of one dtype and shape stacked along a new dimension 0, member i named by the key with its * replaced by i (a mixture-of-experts op's expert weights); see ParamRef.",
		Attrs: []AttrSpec{
			{Name: "key", Type: AttrString, Doc: "the checkpoint tensor name"},
			{Name: "dtype", Type: AttrDType, Doc: "the stored dtype"},
			{Name: "shape", Type: AttrShape, Doc: "the full stored shape"},
			{Name: "slice_dim", Type: AttrInt, Default: -1, Doc: "the dimension cut into slice_count equal parts; -1: no slice"},
			{Name: "slice_index", Type: AttrInt, Default: 0, Doc: "which part this graph reads"},
			{Name: "slice_count", Type: AttrInt, Default: 1, Doc: "how many parts"},
			{Name: "stack", Type: AttrInt, Default: 0, Doc: "0: the key names one tensor; N > 0: N tensors stacked along dimension 0, the key holding one * for the member's index"},
			{Name: "member_part", Type: AttrInt, Default: 0, Doc: "a stacked param's members cut into member_parts equal runs: which run this graph reads (expert parallelism), on top of a slice along another dimension (tensor parallelism within each expert)"},
			{Name: "member_parts", Type: AttrInt, Default: 1, Doc: "how many runs of members; 1: all of them"},
		},
		Infer: func(n *Node) ([]Type, error) {
			s := n.Attrs.Shape("shape")
			if !s.IsConst() {
				return nil, fmt.Errorf("param %q has a symbolic shape %s", n.Attrs.String("key"), s)
			}
			if err := checkShape(s); err != nil {
				return nil, fmt.Errorf("param %q: shape %s: %w", n.Attrs.String("key"), s, err)
			}
			if n.Attrs.String("key") == "" {
				return nil, fmt.Errorf("param has an empty key")
			}
			if err := checkDType(n.Attrs.DType("dtype")); err != nil {
				return nil, fmt.Errorf("param %q: %w", n.Attrs.String("key"), err)
			}
			if stack := n.Attrs.Int("stack"); stack != 0 {
				ref := ParamRef{Key: n.Attrs.String("key"), Stack: stack, Shape: make([]int, len(s))}
				for i, d := range s {
					ref.Shape[i] = d.Size
				}
				if err := ref.CheckStack(); err != nil {
					return nil, err
				}
			}
			out := s.Clone()
			if part, parts := n.Attrs.Int("member_part"), n.Attrs.Int("member_parts"); parts > 1 || part != 0 {
				stack := n.Attrs.Int("stack")
				switch {
				case stack <= 0:
					return nil, fmt.Errorf("param %q: member_parts %d on a param that is not stacked", n.Attrs.String("key"), parts)
				case parts < 1 || part < 0 || part >= parts || stack%parts != 0:
					return nil, fmt.Errorf("param %q: member run %d of %d does not fit its %d members", n.Attrs.String("key"), part, parts, stack)
				case n.Attrs.Int("slice_dim") == 0:
					return nil, fmt.Errorf("param %q: member runs and a slice along dimension 0 both select members", n.Attrs.String("key"))
				}
				out[0] = D(stack / parts)
			}
			if dim := n.Attrs.Int("slice_dim"); dim >= 0 {
				cnt, idx := n.Attrs.Int("slice_count"), n.Attrs.Int("slice_index")
				if dim >= len(s) || cnt < 1 || idx < 0 || idx >= cnt || s[dim].Size%cnt != 0 {
					return nil, fmt.Errorf("param %q: slice %d of %d along dimension %d does not fit shape %s", n.Attrs.String("key"), idx, cnt, dim, s)
				}
				out[dim] = D(s[dim].Size / cnt)
			}
			return one(Type{n.Attrs.DType("dtype"), out}), nil
		},
	})
	Register(&OpSpec{
		Name: OpConst, Doc: "A constant tensor of a constant shape; a single value fills the whole shape.",
		Attrs: []AttrSpec{
			{Name: "dtype", Type: AttrDType},
			{Name: "shape", Type: AttrShape},
			{Name: "values", Type: AttrFloats, Doc: "row-major values, or one value for all elements"},
		},
		Infer: func(n *Node) ([]Type, error) {
			s := n.Attrs.Shape("shape")
			if !s.IsConst() {
				return nil, fmt.Errorf("const has a symbolic shape %s", s)
			}
			if err := checkShape(s); err != nil {
				return nil, fmt.Errorf("const shape %s: %w", s, err)
			}
			nv, want := len(n.Attrs.Floats("values")), 1
			for _, d := range s {
				if d.Size != 0 && want > math.MaxInt/d.Size {
					return nil, fmt.Errorf("const of shape %s is too large", s)
				}
				want *= d.Size
			}
			if nv != 1 && nv != want {
				return nil, fmt.Errorf("const of shape %s has %d values, want 1 or %d", s, nv, want)
			}
			dt := n.Attrs.DType("dtype")
			if err := checkDType(dt); err != nil {
				return nil, fmt.Errorf("const: %w", err)
			}
			return one(Type{dt, s.Clone()}), nil
		},
	})
	Register(&OpSpec{
		Name: "iota", Doc: "A tensor whose elements are their index along one axis: 0, 1, 2, ...",
		Attrs: []AttrSpec{
			{Name: "shape", Type: AttrShape, Doc: "may hold symbols"},
			{Name: "axis", Type: AttrInt, Default: 0},
			{Name: "dtype", Type: AttrDType, Default: tensor.I32},
		},
		Infer: func(n *Node) ([]Type, error) {
			s := n.Attrs.Shape("shape")
			if err := checkShape(s); err != nil {
				return nil, fmt.Errorf("iota shape %s: %w", s, err)
			}
			if _, err := normAxis(n.Attrs.Int("axis"), len(s)); err != nil {
				return nil, err
			}
			dt := n.Attrs.DType("dtype")
			if err := checkDType(dt); err != nil {
				return nil, fmt.Errorf("iota: %w", err)
			}
			if dt == tensor.Bool {
				return nil, fmt.Errorf("iota needs a numeric dtype, got bool")
			}
			return one(Type{dt, s.Clone()}), nil
		},
	})
}
