package graph

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/loom-ml/loom/tensor"
)

// ParamRef describes the checkpoint data a param node reads: the tensor Key, its stored
// DType and full Shape, and optionally one slice of it. With SliceDim >= 0, dimension
// SliceDim is cut into SliceCount equal parts and part SliceIndex is read.
//
// A stacked param (Stack > 0) is Stack checkpoint tensors of one dtype and shape stacked
// along a new dimension 0, as a mixture-of-experts op reads its experts' weights: Key holds
// one StackWildcard, and member i is the tensor whose name replaces it with i (Keys).
// Shape is the stacked shape [Stack, member shape...]. A slice along dimension 0 selects
// whole members (each expert-parallel rank reads only its experts); a slice along another
// dimension cuts every member along the same dimension of its own (dimension d-1). The
// members are read one by one at load time (LoadStack); nothing but the members the slice
// selects, and only their part, is read.
//
// MemberParts > 1 also selects members of a stacked param, run MemberPart of MemberParts
// equal runs, on top of a slice along another dimension: an expert-parallel rank's experts,
// each cut by tensor parallelism. The zero values (and MemberParts 1) read every member.
type ParamRef struct {
	Key         string
	DType       tensor.DType
	Shape       []int
	SliceDim    int
	SliceIndex  int
	SliceCount  int
	Stack       int
	MemberPart  int
	MemberParts int
}

// StackWildcard marks, in the key of a stacked param, where each member's index goes.
const StackWildcard = "*"

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
		Stack: n.Attrs.Int("stack"), MemberPart: n.Attrs.Int("member_part"), MemberParts: n.Attrs.Int("member_parts"),
	}, nil
}

// sliced reports the slice the reference reads, if any: a SliceDim < 0, or a SliceCount of
// 0 (the zero ParamRef), reads the whole tensor.
func (r ParamRef) sliced() (dim, index, count int, ok bool) {
	if r.SliceDim < 0 || r.SliceCount == 0 {
		return 0, 0, 1, false
	}
	return r.SliceDim, r.SliceIndex, r.SliceCount, true
}

// LocalShape is the shape of the part this reference reads.
func (r ParamRef) LocalShape() []int {
	s := append([]int(nil), r.Shape...)
	if dim, _, count, ok := r.sliced(); ok && dim < len(s) && count > 0 {
		s[dim] /= count
	}
	if r.Stack > 0 && r.MemberParts > 1 && len(s) > 0 {
		s[0] /= r.MemberParts
	}
	return s
}

// Keys lists the checkpoint tensors a reference reads: its Key, or for a stacked param the
// key of every member, in order (all of them, whatever the slice).
func (r ParamRef) Keys() []string {
	if r.Stack <= 0 {
		return []string{r.Key}
	}
	keys := make([]string, r.Stack)
	for i := range keys {
		keys[i] = strings.Replace(r.Key, StackWildcard, strconv.Itoa(i), 1)
	}
	return keys
}

// CheckStack checks a stacked reference: one wildcard in the key and a shape [Stack, ...].
func (r ParamRef) CheckStack() error {
	switch {
	case r.Stack < 0:
		return fmt.Errorf("param %q: stack %d is negative", r.Key, r.Stack)
	case r.Stack == 0:
		return nil
	case strings.Count(r.Key, StackWildcard) != 1:
		return fmt.Errorf("stacked param %q: the key needs exactly one %s where each member's index goes", r.Key, StackWildcard)
	case len(r.Shape) < 1 || r.Shape[0] != r.Stack:
		return fmt.Errorf("stacked param %q: shape %v does not start with the %d stacked members", r.Key, r.Shape, r.Stack)
	}
	return nil
}

// Members returns the plain references a stacked reference reads, in order, and the index
// of the first among all members (nonzero when a slice along dimension 0 selects some).
// Each member reference has the member shape (Shape without its first dimension) and, for a
// slice along another dimension, that slice of the member.
func (r ParamRef) Members() (refs []ParamRef, first int, err error) {
	if r.Stack <= 0 {
		return nil, 0, fmt.Errorf("param %q is not stacked", r.Key)
	}
	if err := r.CheckStack(); err != nil {
		return nil, 0, err
	}
	keys := r.Keys()
	lo, hi := 0, r.Stack
	member := ParamRef{DType: r.DType, Shape: slices.Clone(r.Shape[1:]), SliceDim: -1, SliceCount: 1}
	if dim, index, count, ok := r.sliced(); ok {
		switch {
		case dim >= len(r.Shape) || count < 1 || index < 0 || index >= count || r.Shape[dim]%count != 0:
			return nil, 0, fmt.Errorf("stacked param %q: slice %d of %d along dimension %d does not fit shape %v", r.Key, index, count, dim, r.Shape)
		case dim == 0:
			part := r.Stack / count
			lo, hi = index*part, (index+1)*part
		default:
			member.SliceDim, member.SliceIndex, member.SliceCount = dim-1, index, count
		}
	}
	if r.MemberParts > 1 || r.MemberPart != 0 {
		if r.MemberParts < 1 || r.MemberPart < 0 || r.MemberPart >= r.MemberParts || r.Stack%r.MemberParts != 0 || hi-lo != r.Stack {
			return nil, 0, fmt.Errorf("stacked param %q: member run %d of %d does not fit its %d members (or a slice along dimension 0 selects them too)", r.Key, r.MemberPart, r.MemberParts, r.Stack)
		}
		part := r.Stack / r.MemberParts
		lo, hi = r.MemberPart*part, (r.MemberPart+1)*part
	}
	for i := lo; i < hi; i++ {
		m := member
		m.Key, m.Shape = keys[i], slices.Clone(member.Shape)
		refs = append(refs, m)
	}
	return refs, lo, nil
}

// LoadStack reads a stacked reference through load, one member at a time (each as its
// plain reference, see Members), into one tensor of r.LocalShape(). An error names the
// member that failed and which it is.
func LoadStack(ctx context.Context, r ParamRef, load func(context.Context, ParamRef) (*tensor.Tensor, error)) (*tensor.Tensor, error) {
	out := tensor.New(r.DType, r.LocalShape()...)
	err := LoadStackInto(ctx, r, out, func(ctx context.Context, m ParamRef, dst *tensor.Tensor) error {
		t, err := load(ctx, m)
		if err != nil {
			return err
		}
		if t.DType != dst.DType || !slices.Equal(t.Shape, dst.Shape) || t.Len() != dst.Len() {
			return fmt.Errorf("got %s%v, want %s%v", t.DType, t.Shape, dst.DType, dst.Shape)
		}
		tensor.CopyRange(dst, 0, t, 0, dst.Len())
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// LoadStackInto reads a stacked reference into dst (of r's dtype and r.LocalShape()), each
// member through loadInto straight into its own rows of dst (a view of them, of the member's
// local shape), so that no member is held apart. An error names the member that failed and
// which it is.
func LoadStackInto(ctx context.Context, r ParamRef, dst *tensor.Tensor, loadInto func(context.Context, ParamRef, *tensor.Tensor) error) error {
	members, first, err := r.Members()
	if err != nil {
		return err
	}
	if want := r.LocalShape(); dst.DType != r.DType || !slices.Equal(dst.Shape, want) || dst.Len() != tensor.Numel(want) {
		return fmt.Errorf("stacked param %q: destination is %s%v, want %s%v", r.Key, dst.DType, dst.Shape, r.DType, want)
	}
	size := dst.Numel() / max(len(members), 1)
	for i, m := range members {
		shape := m.LocalShape()
		if tensor.Numel(shape) != size {
			return fmt.Errorf("stacked param %q, member %d of %d (%q): %v does not hold %d elements", r.Key, first+i, r.Stack, m.Key, shape, size)
		}
		if err := loadInto(ctx, m, dst.View(i*size, shape...)); err != nil {
			return fmt.Errorf("stacked param %q, member %d of %d: %w", r.Key, first+i, r.Stack, err)
		}
	}
	return nil
}

func (r ParamRef) String() string {
	s := fmt.Sprintf("%q %s%v", r.Key, r.DType, r.Shape)
	if r.Stack > 0 {
		s += fmt.Sprintf(" stack of %d", r.Stack)
	}
	if r.MemberParts > 1 {
		s += fmt.Sprintf(" members %d/%d", r.MemberPart, r.MemberParts)
	}
	if dim, index, count, ok := r.sliced(); ok {
		s += fmt.Sprintf(" slice %d/%d of dim %d", index, count, dim)
	}
	return s
}
