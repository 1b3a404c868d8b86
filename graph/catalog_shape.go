package graph

import "fmt"

// Shape ops: they move or select elements without arithmetic.

func init() {
	Register(&OpSpec{
		Name: "reshape", Doc: "Reinterprets x (row-major) with a new shape holding the same number of elements.",
		Inputs: []string{"x"},
		Attrs:  []AttrSpec{{Name: "shape", Type: AttrShape, Doc: "the new shape; may name symbols bound by the graph inputs"}},
		Infer: func(n *Node) ([]Type, error) {
			t, s := inType(n, 0), n.Attrs.Shape("shape")
			for _, d := range s {
				if !d.IsSym() && d.Size < 0 {
					return nil, fmt.Errorf("negative dimension in %s", s)
				}
			}
			if !sameNumel(t.Shape, s) {
				return nil, fmt.Errorf("cannot reshape %s to %s: element counts differ", t.Shape, s)
			}
			return one(Type{t.DType, s.Clone()}), nil
		},
	})
	Register(&OpSpec{
		Name: "transpose", Doc: "Permutes axes: output axis i is input axis perm[i].",
		Inputs: []string{"x"},
		Attrs:  []AttrSpec{{Name: "perm", Type: AttrInts}},
		Infer: func(n *Node) ([]Type, error) {
			t, perm := inType(n, 0), n.Attrs.Ints("perm")
			if len(perm) != len(t.Shape) {
				return nil, fmt.Errorf("perm %v has %d entries for rank %d", perm, len(perm), len(t.Shape))
			}
			seen := make([]bool, len(perm))
			out := make(Shape, len(perm))
			for i, p := range perm {
				if p < 0 || p >= len(perm) || seen[p] {
					return nil, fmt.Errorf("perm %v is not a permutation", perm)
				}
				seen[p] = true
				out[i] = t.Shape[p]
			}
			return one(Type{t.DType, out}), nil
		},
	})
	Register(&OpSpec{
		Name: "slice", Doc: "Takes elements start, start+step, ... (< end) along one axis of constant size.",
		Inputs: []string{"x"},
		Attrs: []AttrSpec{
			{Name: "axis", Type: AttrInt},
			{Name: "start", Type: AttrInt},
			{Name: "end", Type: AttrInt, Doc: "exclusive"},
			{Name: "step", Type: AttrInt, Default: 1},
		},
		Infer: func(n *Node) ([]Type, error) {
			t := inType(n, 0)
			ax, err := normAxis(n.Attrs.Int("axis"), len(t.Shape))
			if err != nil {
				return nil, err
			}
			d := t.Shape[ax]
			if d.IsSym() {
				return nil, fmt.Errorf("slice along symbolic axis %d (%s) is not supported", ax, d)
			}
			start, end, step := n.Attrs.Int("start"), n.Attrs.Int("end"), n.Attrs.Int("step")
			if step < 1 || start < 0 || end > d.Size || start > end {
				return nil, fmt.Errorf("slice [%d:%d:%d] out of range for axis %d of size %d", start, end, step, ax, d.Size)
			}
			out := t.Shape.Clone()
			count := 0
			if end > start {
				count = (end-start-1)/step + 1 // no overflow for a huge step
			}
			out[ax] = D(count)
			return one(Type{t.DType, out}), nil
		},
	})
	Register(&OpSpec{
		Name: "concat", Doc: "Joins inputs along one axis; other dimensions must match.",
		Inputs: []string{"x"}, Variadic: true, MinInputs: 1,
		Attrs: []AttrSpec{{Name: "axis", Type: AttrInt}},
		Infer: func(n *Node) ([]Type, error) {
			first := inType(n, 0)
			ax, err := normAxis(n.Attrs.Int("axis"), len(first.Shape))
			if err != nil {
				return nil, err
			}
			out := first.Shape.Clone()
			total := 0
			for i, in := range n.Inputs {
				t := in.Type
				if t.DType != first.DType {
					return nil, fmt.Errorf("input %d is %s, input 0 is %s", i, t.DType, first.DType)
				}
				if len(t.Shape) != len(first.Shape) {
					return nil, fmt.Errorf("input %d has rank %d, input 0 has %d", i, len(t.Shape), len(first.Shape))
				}
				for j, d := range t.Shape {
					if j == ax {
						if d.IsSym() {
							return nil, fmt.Errorf("concat along symbolic dimension %s is not supported", d)
						}
						total += d.Size
					} else if d != first.Shape[j] {
						return nil, fmt.Errorf("input %d has shape %s, input 0 has %s", i, t.Shape, first.Shape)
					}
				}
			}
			out[ax] = D(total)
			return one(Type{first.DType, out}), nil
		},
	})
	Register(&OpSpec{
		Name: "split", Doc: "Cuts x along one axis into consecutive pieces of the given sizes (one output each).",
		Inputs: []string{"x"},
		Attrs:  []AttrSpec{{Name: "axis", Type: AttrInt}, {Name: "sizes", Type: AttrInts}},
		Infer: func(n *Node) ([]Type, error) {
			t := inType(n, 0)
			ax, err := normAxis(n.Attrs.Int("axis"), len(t.Shape))
			if err != nil {
				return nil, err
			}
			sizes := n.Attrs.Ints("sizes")
			sum := 0
			for _, s := range sizes {
				if s < 0 {
					return nil, fmt.Errorf("negative split size in %v", sizes)
				}
				if s > t.Shape[ax].Size-sum { // sum+s would pass the axis (or overflow)
					sum = -1
					break
				}
				sum += s
			}
			if len(sizes) == 0 || t.Shape[ax].IsSym() || sum != t.Shape[ax].Size {
				return nil, fmt.Errorf("split sizes %v do not add up to axis %d of %s", sizes, ax, t.Shape)
			}
			var outs []Type
			for _, s := range sizes {
				sh := t.Shape.Clone()
				sh[ax] = D(s)
				outs = append(outs, Type{t.DType, sh})
			}
			return outs, nil
		},
	})
	Register(&OpSpec{
		Name: "expand", Doc: "Broadcasts x to a larger shape (NumPy rules: size-1 dimensions repeat).",
		Inputs: []string{"x"},
		Attrs:  []AttrSpec{{Name: "shape", Type: AttrShape}},
		Infer: func(n *Node) ([]Type, error) {
			t, s := inType(n, 0), n.Attrs.Shape("shape")
			b, err := Broadcast(t.Shape, s)
			if err != nil {
				return nil, err
			}
			if !b.Equal(s) {
				return nil, fmt.Errorf("cannot expand %s to %s", t.Shape, s)
			}
			return one(Type{t.DType, s.Clone()}), nil
		},
	})
}

func init() {
	Register(&OpSpec{
		Name: "gather", Doc: "Selects entries of x along one axis by integer indices: out = x[..., indices, ...], with indices' shape in place of that axis. An index outside the axis is an error.",
		Inputs: []string{"x", "indices"},
		Attrs:  []AttrSpec{{Name: "axis", Type: AttrInt}},
		Infer: func(n *Node) ([]Type, error) {
			x, idx := inType(n, 0), inType(n, 1)
			if !idx.DType.IsInt() {
				return nil, fmt.Errorf("indices must be integers, got %s", idx.DType)
			}
			ax, err := normAxis(n.Attrs.Int("axis"), len(x.Shape))
			if err != nil {
				return nil, err
			}
			out := append(append(x.Shape[:ax:ax].Clone(), idx.Shape...), x.Shape[ax+1:]...)
			return one(Type{x.DType, out}), nil
		},
	})
}
