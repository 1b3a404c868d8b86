package cpu

import (
	"fmt"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// gatherKernel selects entries of x[outer..., A, inner...] along axis by indices[idx...]:
// out[outer..., idx..., inner...] = x[outer..., indices[idx...], inner...]. It copies whole
// inner blocks, in x's storage dtype.
func gatherKernel(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	x, idx := in[0], in[1].Int64s()
	ax, err := graph.NormAxis(n.Attrs.Int("axis"), len(x.Shape))
	if err != nil {
		return nil, err
	}
	outer, inner := tensor.Numel(x.Shape[:ax]), tensor.Numel(x.Shape[ax+1:])
	size := x.Shape[ax]
	for _, i := range idx {
		if i < 0 || i >= int64(size) {
			return nil, fmt.Errorf("gather index %d outside axis %d of size %d", i, ax, size)
		}
	}
	res := tensor.New(x.DType, out[0].Shape...)
	for o := range outer {
		for j, i := range idx {
			tensor.CopyRange(res, (o*len(idx)+j)*inner, x, (o*size+int(i))*inner, inner)
		}
	}
	return []*tensor.Tensor{res}, nil
}

func init() { registerReference("gather", gatherKernel) }
