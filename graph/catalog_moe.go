package graph

import (
	"fmt"

	"github.com/loom-ml/loom/tensor"
)

// Ops of mixture-of-experts routing.

func init() {
	Register(&OpSpec{
		Name: "topk", Doc: "The k largest entries of x[...,N] along its last axis, largest first, and where they are: values[...,k] in x's dtype and indices[...,k] i32 (torch.topk with sorted=True). Equal values come lowest index first; NaN counts as larger than every number.",
		Inputs: []string{"x"},
		Attrs:  []AttrSpec{{Name: "k", Type: AttrInt, Doc: "how many entries, 1 <= k <= N"}},
		Infer: func(n *Node) ([]Type, error) {
			x, k := inType(n, 0), n.Attrs.Int("k")
			if !x.DType.IsFloat() || len(x.Shape) == 0 {
				return nil, fmt.Errorf("topk needs a float input of rank >= 1, got %s", x)
			}
			last := x.Shape[len(x.Shape)-1]
			if last.IsSym() {
				return nil, fmt.Errorf("topk along a symbolic axis (%s) is not supported", last)
			}
			if k < 1 || k > last.Size {
				return nil, fmt.Errorf("topk: k = %d is not in [1, %d] (the last axis of %s)", k, last.Size, x.Shape)
			}
			s := x.Shape.Clone()
			s[len(s)-1] = D(k)
			return []Type{{x.DType, s}, {tensor.I32, s.Clone()}}, nil
		},
	})
}

// TopK returns the k largest entries of x along its last axis and their indices (op topk).
func (b *Builder) TopK(x *Value, k int) (values, indices *Value) {
	outs := b.Apply("topk", Attrs{"k": k}, x) // placeholders enough for both on an error
	return outs[0], outs[1]
}
