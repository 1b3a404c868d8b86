package cuda

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// nodeText is a node's text form for messages: "%out = op(%a, %b)".
func nodeText(n *graph.Node) string {
	s := ""
	for i, o := range n.Outputs {
		if i > 0 {
			s += ", "
		}
		s += o.String()
	}
	s += " = " + n.Op + "("
	for i, in := range n.Inputs {
		if i > 0 {
			s += ", "
		}
		s += in.String()
	}
	return s + ")"
}

// constTensor builds a const node's tensor on the host.
func constTensor(n *graph.Node) (*tensor.Tensor, error) {
	o := n.Out().Type
	shape, err := o.Shape.Resolve(nil)
	if err != nil {
		return nil, err
	}
	return backend.Const(n, o.DType, shape)
}

// bind checks the run's inputs against the graph inputs and returns the symbol bindings.
func (p *Program) bind(inputs map[string]*tensor.Tensor) (map[string]int, error) {
	var errs []error
	known := map[string]bool{}
	for _, s := range p.inputs {
		known[p.values[s].Name] = true
	}
	for _, name := range slices.Sorted(maps.Keys(inputs)) {
		if !known[name] {
			errs = append(errs, fmt.Errorf("unknown input %q", name))
		}
	}
	env := map[string]int{}
	for _, s := range p.inputs {
		v := p.values[s]
		t, ok := inputs[v.Name]
		if !ok {
			errs = append(errs, fmt.Errorf("missing input %q (%s)", v.Name, v.Type))
			continue
		}
		if err := t.Validate(); err != nil && !(p.isResident(s) && t.Len() == 0) {
			errs = append(errs, fmt.Errorf("input %q: %w", v.Name, err))
			continue
		}
		if t.DType != v.Type.DType || len(t.Shape) != len(v.Type.Shape) {
			errs = append(errs, fmt.Errorf("input %q is %s%v, want %s", v.Name, t.DType, t.Shape, v.Type))
			continue
		}
		for i, dim := range v.Type.Shape {
			size := t.Shape[i]
			switch {
			case !dim.IsSym():
				if size != dim.Size {
					errs = append(errs, fmt.Errorf("input %q has shape %v, want %s", v.Name, t.Shape, v.Type.Shape))
				}
			case env[dim.Sym] == 0 && !hasKey(env, dim.Sym):
				env[dim.Sym] = size
			case env[dim.Sym] != size:
				errs = append(errs, fmt.Errorf("symbol %s is %d elsewhere but %d in input %q", dim.Sym, env[dim.Sym], size, v.Name))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return env, nil
}

func hasKey(m map[string]int, k string) bool { _, ok := m[k]; return ok }

// copyIn queues the copy of a host input into its planned device tensor.
func copyIn(d *Device, dst *Tensor, h *tensor.Tensor) error {
	if h.Numel() == 0 {
		return nil
	}
	if h.DType.Size()*h.Numel() != dst.Bytes() {
		return fmt.Errorf("holds %d bytes, its slot %d", h.DType.Size()*h.Numel(), dst.Bytes())
	}
	return d.copyHtoD(dst.ptr, tensor.Bytes(h))
}

// isResident reports whether slot s is an input named by Options.Resident.
func (p *Program) isResident(s int) bool { return slices.Contains(p.resident, s) }
