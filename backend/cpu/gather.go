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
	copyBlock := func(dst, src int) {
		switch x.DType {
		case tensor.F32:
			copy(res.F32[dst:dst+inner], x.F32[src:src+inner])
		case tensor.BF16, tensor.F16:
			copy(res.Half[dst:dst+inner], x.Half[src:src+inner])
		case tensor.I32:
			copy(res.I32[dst:dst+inner], x.I32[src:src+inner])
		case tensor.I64:
			copy(res.I64[dst:dst+inner], x.I64[src:src+inner])
		case tensor.Bool:
			copy(res.Bool[dst:dst+inner], x.Bool[src:src+inner])
		}
	}
	for o := range outer {
		for j, i := range idx {
			copyBlock((o*len(idx)+j)*inner, (o*size+int(i))*inner)
		}
	}
	return []*tensor.Tensor{res}, nil
}

func init() { registerReference("gather", gatherKernel) }
