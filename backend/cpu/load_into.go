package cpu

import (
	"context"
	"fmt"
	"slices"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Params read straight into a concatenation. A concat along axis 0 whose inputs are all params
// that nothing else reads (a fused GEMM's concat(w_q, w_k, w_v), or gate and up) is a
// contiguous run of its parts: when the weights can read into a caller's tensor
// (graph.WeightsInto), compile allocates the concatenation once and reads each part into its
// place, instead of loading the parts and folding the concat over them. The parts are never
// held beside the whole, and each byte is copied once.

// directConcats returns the indices of the concat nodes of g to read straight from w, and of
// the param nodes they read (loaded there, not on their own). uses counts each slot's readers.
func directConcats(g *graph.Graph, w backend.Weights, slot map[*graph.Value]int, uses []int) (concats, params map[int]bool) {
	if _, ok := w.(graph.WeightsInto); !ok {
		return nil, nil
	}
	index := make(map[*graph.Node]int, len(g.Nodes))
	for i, n := range g.Nodes {
		index[n] = i
	}
	concats, params = map[int]bool{}, map[int]bool{}
	for i, n := range g.Nodes {
		if n.Op != "concat" || len(n.Inputs) == 0 || len(n.Outputs) != 1 {
			continue
		}
		if ax, err := graph.NormAxis(n.Attrs.Int("axis"), len(n.Out().Type.Shape)); err != nil || ax != 0 {
			continue
		}
		if _, err := resolveOuts(n, nil); err != nil {
			continue
		}
		ok := true
		for _, in := range n.Inputs {
			p := in.Producer
			if p == nil || p.Op != graph.OpParam || uses[slot[in]] != 1 || in.Type.DType != n.Out().Type.DType {
				ok = false
				break
			}
		}
		if !ok {
			continue
		}
		concats[i] = true
		for _, in := range n.Inputs {
			params[index[in.Producer]] = true
		}
	}
	return concats, params
}

// loadConcat reads the params that concat node n joins along axis 0 into one tensor of outs[0],
// each into its run of rows, and stores it as n's fixed value. The tensor's memory is advised
// to be backed by huge pages (load_hugepage*.go): faulting in fresh memory 4 KiB at a time
// costs more than copying into it. Where w views the whole concatenation (viewConcat), that
// view is the fixed value instead; where it cannot but partable (partableConcats), the params
// are loaded as views each and kept as the parts (loadParts, parted.go), with no copy.
func (p *Program) loadConcat(ctx context.Context, n *graph.Node, outs []Out, w graph.WeightsInto, partable bool, slot map[*graph.Value]int, uses []int) error {
	if cv, ok := w.(concatViewer); ok {
		done, err := p.viewConcat(ctx, n, outs, cv, slot, uses)
		if done || err != nil {
			return err
		}
	}
	if partable {
		return p.loadParts(ctx, n, w, slot)
	}
	out := tensor.New(outs[0].DType, outs[0].Shape...)
	adviseHugePages(out)
	off := 0
	for _, in := range n.Inputs {
		ref, err := graph.ParamOf(in.Producer)
		if err != nil {
			return err
		}
		shape, err := in.Type.Shape.Resolve(nil)
		if err != nil {
			return fmt.Errorf("param %s: %w", ref, err)
		}
		size := tensor.Numel(shape)
		if off+size > out.Numel() {
			return fmt.Errorf("%s: its params hold more than its %v output", n, outs[0].Shape)
		}
		if err := w.LoadInto(ctx, ref, out.View(off, shape...)); err != nil {
			return fmt.Errorf("load param %s: %w", ref, err)
		}
		off += size
		p.params++
		p.paramBytes += size * out.DType.Size()
		uses[slot[in]]--
	}
	if off != out.Numel() {
		return fmt.Errorf("%s: its params hold %d elements, its output %d", n, off, out.Numel())
	}
	p.fixed[slot[n.Out()]] = out
	p.folded++
	return nil
}

// concatViewer is weights that can give the concatenation along axis 0 of params that they
// store one right after the other as one tensor sharing their storage, and true; or false,
// and the caller reads the parts (model.Checkpoint.Mapped: gate_proj and up_proj lie next to
// each other in a safetensors file).
type concatViewer interface {
	ViewConcat(ctx context.Context, refs []graph.ParamRef) (*tensor.Tensor, bool, error)
}

// viewConcat stores as concat node n's fixed value the view w gives of its params'
// concatenation, and reports whether it could.
func (p *Program) viewConcat(ctx context.Context, n *graph.Node, outs []Out, w concatViewer, slot map[*graph.Value]int, uses []int) (bool, error) {
	refs := make([]graph.ParamRef, len(n.Inputs))
	for i, in := range n.Inputs {
		ref, err := graph.ParamOf(in.Producer)
		if err != nil {
			return false, err
		}
		refs[i] = ref
	}
	t, ok, err := w.ViewConcat(ctx, refs)
	if err != nil {
		return false, fmt.Errorf("%s: %w", n, err)
	}
	if !ok {
		return false, nil
	}
	if t.DType != outs[0].DType || !slices.Equal(t.Shape, outs[0].Shape) {
		return false, fmt.Errorf("%s: the weights' view of its params is %s%v, its output %s%v", n, t.DType, t.Shape, outs[0].DType, outs[0].Shape)
	}
	for _, in := range n.Inputs {
		uses[slot[in]]--
	}
	p.params += len(refs)
	p.paramBytes += t.Numel() * t.DType.Size()
	p.fixed[slot[n.Out()]] = t
	p.folded++
	return true, nil
}
