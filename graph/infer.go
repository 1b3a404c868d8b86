package graph

import (
	"fmt"

	"github.com/loom-ml/loom/tensor"
)

// Broadcast combines shapes with NumPy rules: shapes align at the right; each pair of
// dimensions must be equal or one of them a constant 1.
func Broadcast(shapes ...Shape) (Shape, error) {
	rank := 0
	for _, s := range shapes {
		rank = max(rank, len(s))
	}
	out := make(Shape, rank)
	for i := range out {
		out[i] = D(1)
	}
	for _, s := range shapes {
		off := rank - len(s)
		for i, d := range s {
			cur := out[off+i]
			switch {
			case d == cur:
			case d == D(1):
			case cur == D(1):
				out[off+i] = d
			default:
				return nil, fmt.Errorf("shapes %v do not broadcast (dimension %s against %s)", shapes, cur, d)
			}
		}
	}
	return out, nil
}

// Promote gives the result dtype of a binary arithmetic op: equal dtypes stay; a float beats
// an integer; f32 beats bf16 and f16; bf16 with f16 gives f32; i64 beats i32.
func Promote(a, b tensor.DType) (tensor.DType, error) {
	switch {
	case a == b:
		return a, nil
	case a == tensor.Bool || b == tensor.Bool:
		return tensor.Invalid, fmt.Errorf("cannot mix bool with %s in arithmetic", map[bool]tensor.DType{true: b, false: a}[a == tensor.Bool])
	case a.IsFloat() && !b.IsFloat():
		return a, nil
	case b.IsFloat() && !a.IsFloat():
		return b, nil
	case a.IsFloat() && b.IsFloat():
		return tensor.F32, nil // (f32, x), (bf16, f16)
	default:
		return tensor.I64, nil // i32 with i64
	}
}

func one(t Type) []Type { return []Type{t} }

func inType(n *Node, i int) Type { return n.Inputs[i].Type }

// numelParts splits a shape into its constant product and its multiset of symbols.
func numelParts(s Shape) (int, map[string]int) {
	p, syms := 1, map[string]int{}
	for _, d := range s {
		if d.IsSym() {
			syms[d.Sym]++
		} else {
			p *= d.Size
		}
	}
	return p, syms
}

// sameNumel reports whether two shapes certainly hold the same number of elements.
func sameNumel(a, b Shape) bool {
	pa, sa := numelParts(a)
	pb, sb := numelParts(b)
	if pa != pb || len(sa) != len(sb) {
		return false
	}
	for k, v := range sa {
		if sb[k] != v {
			return false
		}
	}
	return true
}

// reduceShape drops (or keeps as 1) the given axes.
func reduceShape(s Shape, axes []int, keep bool) (Shape, error) {
	drop := map[int]bool{}
	for _, a := range axes {
		ax, err := normAxis(a, len(s))
		if err != nil {
			return nil, err
		}
		if drop[ax] {
			return nil, fmt.Errorf("axis %d repeated", a)
		}
		drop[ax] = true
	}
	var out Shape
	for i, d := range s {
		switch {
		case !drop[i]:
			out = append(out, d)
		case keep:
			out = append(out, D(1))
		}
	}
	if out == nil {
		out = Shape{}
	}
	return out, nil
}
