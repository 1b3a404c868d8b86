package graph

import "fmt"

// Reductions and normalizations over axes.

func inferReduce(n *Node) ([]Type, error) {
	t := inType(n, 0)
	if len(n.Attrs.Ints("axes")) == 0 {
		return nil, fmt.Errorf("%s needs at least one axis", n.Op)
	}
	s, err := reduceShape(t.Shape, n.Attrs.Ints("axes"), n.Attrs.Bool("keepdim"))
	if err != nil {
		return nil, err
	}
	return one(Type{t.DType, s}), nil
}

func reduceAttrs() []AttrSpec {
	return []AttrSpec{
		{Name: "axes", Type: AttrInts, Doc: "axes to reduce; negative counts from the end"},
		{Name: "keepdim", Type: AttrBool, Default: false, Doc: "keep reduced axes as size 1"},
	}
}

func init() {
	Register(&OpSpec{Name: "sum", Doc: "Sum over axes.", Inputs: []string{"x"}, Attrs: reduceAttrs(), Infer: inferReduce})
	Register(&OpSpec{Name: "mean", Doc: "Arithmetic mean over axes (accumulated in f32).", Inputs: []string{"x"}, Attrs: reduceAttrs(), Infer: inferReduce})
	Register(&OpSpec{Name: "max", Doc: "Maximum over axes.", Inputs: []string{"x"}, Attrs: reduceAttrs(), Infer: inferReduce})
	Register(&OpSpec{
		Name: "softmax", Doc: "exp(x - max) / sum(exp(x - max)) along one axis.",
		Inputs: []string{"x"},
		Attrs:  []AttrSpec{{Name: "axis", Type: AttrInt, Default: -1}},
		Infer: func(n *Node) ([]Type, error) {
			t := inType(n, 0)
			if !t.DType.IsFloat() {
				return nil, fmt.Errorf("softmax needs a float input, got %s", t.DType)
			}
			if _, err := normAxis(n.Attrs.Int("axis"), len(t.Shape)); err != nil {
				return nil, err
			}
			return one(t), nil
		},
	})
}
