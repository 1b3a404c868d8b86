package graph

import (
	"fmt"
	"math"

	"github.com/loom-ml/loom/tensor"
)

// Collective ops. Each names its group (a mesh axis such as "tp"; nothing defaults to the
// world) and the group's size, so that shapes infer statically. They know nothing of a
// backend: a backend binds them to a communicator (package dist) at compile time, and the
// sharding pass sets their attributes from plain strings without importing a backend.
//
// The attribute values mirror package dist, which graph cannot import (both sit on floor 1):
// reduce ops "sum" and "max"; all_reduce strategies "auto", "nccl", "oneshot", "twoshot".

// collectiveReduceOps are the values of the op attribute of all_reduce and reduce_scatter.
var collectiveReduceOps = []string{"sum", "max"}

// collectiveStrategies are the values of the strategy attribute of all_reduce.
var collectiveStrategies = []string{"auto", "nccl", "oneshot", "twoshot"}

func groupAttrs() []AttrSpec {
	return []AttrSpec{
		{Name: "group", Type: AttrString, Doc: "the mesh axis whose ranks take part, e.g. \"tp\""},
		{Name: "group_size", Type: AttrInt, Doc: "the number of ranks along that axis (>= 1)"},
	}
}

// checkGroup validates the group attributes and returns the group size.
func checkGroup(n *Node) (int, error) {
	g := n.Attrs.String("group")
	if !validAxisName(g) {
		return 0, fmt.Errorf("%s: group %q is not a mesh axis name (a letter, then letters, digits or _)", n.Op, g)
	}
	size := n.Attrs.Int("group_size")
	if size < 1 {
		return 0, fmt.Errorf("%s: group_size must be >= 1, got %d", n.Op, size)
	}
	return size, nil
}

// validAxisName is the rule of dist.ParseMesh for axis names.
func validAxisName(s string) bool {
	if s == "" {
		return false
	}
	for i, r := range s {
		letter := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
		if !letter && (i == 0 || !(r == '_' || r >= '0' && r <= '9')) {
			return false
		}
	}
	return true
}

func oneOf(op, attr, v string, allowed []string) error {
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return fmt.Errorf("%s: %s %q is not one of %q", op, attr, v, allowed)
}

// checkReducible accepts the dtypes a communicator reduces: f32, bf16, f16 and i32.
func checkReducible(n *Node, dt tensor.DType) error {
	switch dt {
	case tensor.F32, tensor.BF16, tensor.F16, tensor.I32:
		return nil
	}
	return fmt.Errorf("%s reduces f32, bf16, f16 or i32, got %s", n.Op, dt)
}

// constAxis normalises axis attr of x and requires a constant dimension there.
func constAxis(n *Node, attr string, s Shape) (int, error) {
	ax, err := normAxis(n.Attrs.Int(attr), len(s))
	if err != nil {
		return 0, fmt.Errorf("%s %s: %w", n.Op, attr, err)
	}
	if s[ax].IsSym() {
		return 0, fmt.Errorf("%s along symbolic dimension %s (axis %d of %s) is not supported", n.Op, s[ax], ax, s)
	}
	return ax, nil
}

// scaleAxis multiplies dimension ax by k, failing on overflow.
func scaleAxis(n *Node, s Shape, ax, k int) (Shape, error) {
	d := s[ax].Size
	if d != 0 && k > math.MaxInt/d {
		return nil, fmt.Errorf("%s: axis %d of %s times %d overflows", n.Op, ax, s, k)
	}
	out := s.Clone()
	out[ax] = D(d * k)
	return out, nil
}

// divideAxis divides dimension ax by k, which must divide it.
func divideAxis(n *Node, s Shape, ax, k int) (Shape, error) {
	if s[ax].Size%k != 0 {
		return nil, fmt.Errorf("%s: axis %d of %s is not divisible by group_size %d", n.Op, ax, s, k)
	}
	out := s.Clone()
	out[ax] = D(s[ax].Size / k)
	return out, nil
}

func init() {
	Register(&OpSpec{
		Name: "all_reduce", Doc: "Reduces x elementwise over the ranks of a group (sum or max) and gives every rank the result; same type as x. Floats reduce in f32 in group rank order, rounded once.",
		Inputs: []string{"x"},
		Attrs: append(groupAttrs(),
			AttrSpec{Name: "op", Type: AttrString, Default: "sum", Doc: "sum or max"},
			AttrSpec{Name: "strategy", Type: AttrString, Default: "auto", Doc: "auto, nccl, oneshot or twoshot; auto leaves the choice to the communicator"},
		),
		Collective: true,
		Infer: func(n *Node) ([]Type, error) {
			t := inType(n, 0)
			if _, err := checkGroup(n); err != nil {
				return nil, err
			}
			if err := oneOf(n.Op, "op", n.Attrs.String("op"), collectiveReduceOps); err != nil {
				return nil, err
			}
			if err := oneOf(n.Op, "strategy", n.Attrs.String("strategy"), collectiveStrategies); err != nil {
				return nil, err
			}
			if err := checkReducible(n, t.DType); err != nil {
				return nil, err
			}
			return one(Type{t.DType, t.Shape.Clone()}), nil
		},
	})
	Register(&OpSpec{
		Name: "all_gather", Doc: "Concatenates the x of every rank of a group along axis, in group rank order; the axis grows group_size times.",
		Inputs: []string{"x"},
		Attrs: append(groupAttrs(),
			AttrSpec{Name: "axis", Type: AttrInt, Doc: "the (constant) axis to gather along; negative counts from the end"},
		),
		Collective: true,
		Infer: func(n *Node) ([]Type, error) {
			t := inType(n, 0)
			size, err := checkGroup(n)
			if err != nil {
				return nil, err
			}
			ax, err := constAxis(n, "axis", t.Shape)
			if err != nil {
				return nil, err
			}
			s, err := scaleAxis(n, t.Shape, ax, size)
			if err != nil {
				return nil, err
			}
			return one(Type{t.DType, s}), nil
		},
	})
	Register(&OpSpec{
		Name: "reduce_scatter", Doc: "Reduces x elementwise over the ranks of a group and gives rank i of the group the i-th of group_size equal pieces along axis.",
		Inputs: []string{"x"},
		Attrs: append(groupAttrs(),
			AttrSpec{Name: "axis", Type: AttrInt, Doc: "the (constant) axis to scatter along; group_size must divide it"},
			AttrSpec{Name: "op", Type: AttrString, Default: "sum", Doc: "sum or max"},
		),
		Collective: true,
		Infer: func(n *Node) ([]Type, error) {
			t := inType(n, 0)
			size, err := checkGroup(n)
			if err != nil {
				return nil, err
			}
			if err := oneOf(n.Op, "op", n.Attrs.String("op"), collectiveReduceOps); err != nil {
				return nil, err
			}
			if err := checkReducible(n, t.DType); err != nil {
				return nil, err
			}
			ax, err := constAxis(n, "axis", t.Shape)
			if err != nil {
				return nil, err
			}
			s, err := divideAxis(n, t.Shape, ax, size)
			if err != nil {
				return nil, err
			}
			return one(Type{t.DType, s}), nil
		},
	})
	Register(&OpSpec{
		Name: "all_to_all", Doc: "Cuts x into group_size pieces along split_axis, sends piece j to rank j of the group, and concatenates the pieces received along concat_axis in group rank order.",
		Inputs: []string{"x"},
		Attrs: append(groupAttrs(),
			AttrSpec{Name: "split_axis", Type: AttrInt, Doc: "the (constant) axis cut into group_size pieces"},
			AttrSpec{Name: "concat_axis", Type: AttrInt, Doc: "the (constant) axis the received pieces join along"},
		),
		Collective: true,
		Infer: func(n *Node) ([]Type, error) {
			t := inType(n, 0)
			size, err := checkGroup(n)
			if err != nil {
				return nil, err
			}
			sa, err := constAxis(n, "split_axis", t.Shape)
			if err != nil {
				return nil, err
			}
			ca, err := constAxis(n, "concat_axis", t.Shape)
			if err != nil {
				return nil, err
			}
			s, err := divideAxis(n, t.Shape, sa, size)
			if err != nil {
				return nil, err
			}
			if s, err = scaleAxis(n, s, ca, size); err != nil {
				return nil, err
			}
			return one(Type{t.DType, s}), nil
		},
	})
}
