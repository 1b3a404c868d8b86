package graph

import (
	"fmt"

	"github.com/loom-ml/loom/tensor"
)

// ParamRef describes the checkpoint data a param node reads: the tensor Key, its stored
// DType and full Shape, and optionally one slice of it. With SliceDim >= 0, dimension
// SliceDim is cut into SliceCount equal parts and part SliceIndex is read.
type ParamRef struct {
	Key        string
	DType      tensor.DType
	Shape      []int
	SliceDim   int
	SliceIndex int
	SliceCount int
}

// ParamOf returns the reference of a param node.
func ParamOf(n *Node) (ParamRef, error) {
	if n.Op != OpParam {
		return ParamRef{}, fmt.Errorf("node %s is a %s, not a param", n.Out(), n.Op)
	}
	full := n.Attrs.Shape("shape")
	shape := make([]int, len(full))
	for i, d := range full {
		if d.IsSym() {
			return ParamRef{}, fmt.Errorf("param %q has a symbolic shape %s", n.Attrs.String("key"), full)
		}
		shape[i] = d.Size
	}
	return ParamRef{
		Key: n.Attrs.String("key"), DType: n.Attrs.DType("dtype"), Shape: shape,
		SliceDim: n.Attrs.Int("slice_dim"), SliceIndex: n.Attrs.Int("slice_index"), SliceCount: n.Attrs.Int("slice_count"),
	}, nil
}

// LocalShape is the shape of the part this reference reads.
func (r ParamRef) LocalShape() []int {
	s := append([]int(nil), r.Shape...)
	if r.SliceDim >= 0 && r.SliceDim < len(s) && r.SliceCount > 0 {
		s[r.SliceDim] /= r.SliceCount
	}
	return s
}

func (r ParamRef) String() string {
	if r.SliceDim < 0 {
		return fmt.Sprintf("%q %s%v", r.Key, r.DType, r.Shape)
	}
	return fmt.Sprintf("%q %s%v slice %d/%d of dim %d", r.Key, r.DType, r.Shape, r.SliceIndex, r.SliceCount, r.SliceDim)
}
