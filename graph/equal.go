package graph

import "fmt"

// Equal compares two graphs structurally and returns nil if they are equal, or an error that
// describes the first difference. It compares the graph names, the inputs (names and types),
// then node by node the op, scope, attributes (with AttrEqual), input wiring and output
// types, and finally the graph outputs. Wiring is compared by position: the i-th value
// defined in a must be used wherever the i-th value defined in b is. The names of node
// outputs are not compared, so graphs that differ only in how their intermediate values are
// named are equal; String shows those names.
func Equal(a, b *Graph) error {
	switch {
	case a == nil && b == nil:
		return nil
	case a == nil || b == nil:
		return fmt.Errorf("one graph is nil")
	}
	if a.Name != b.Name {
		return fmt.Errorf("graph names differ: %q vs %q", a.Name, b.Name)
	}
	if len(a.Inputs) != len(b.Inputs) {
		return fmt.Errorf("graph %s: %d inputs vs %d", a.Name, len(a.Inputs), len(b.Inputs))
	}
	// match maps each value of a to the value of b defined at the same place.
	match := map[*Value]*Value{}
	for i, x := range a.Inputs {
		y := b.Inputs[i]
		if x == nil || y == nil {
			if x != y {
				return fmt.Errorf("input %d: %s vs %s", i, x, y)
			}
			continue
		}
		if x.Name != y.Name {
			return fmt.Errorf("input %d: named %s vs %s", i, x.Name, y.Name)
		}
		if !x.Type.Equal(y.Type) {
			return fmt.Errorf("input %s: type %s vs %s", x.Name, x.Type, y.Type)
		}
		match[x] = y
	}
	if len(a.Nodes) != len(b.Nodes) {
		return fmt.Errorf("graph %s: %d nodes vs %d", a.Name, len(a.Nodes), len(b.Nodes))
	}
	for i, x := range a.Nodes {
		y := b.Nodes[i]
		if x == nil || y == nil {
			if x != y {
				return fmt.Errorf("node %d: %s vs %s", i, x, y)
			}
			continue
		}
		if err := equalNode(x, y, match); err != nil {
			where := fmt.Sprintf("node %d (%s)", i, x.Op)
			if v := x.Out(); v != nil {
				where = fmt.Sprintf("node %d (%s = %s)", i, v, x.Op)
			}
			return fmt.Errorf("%s: %w", where, err)
		}
	}
	if len(a.Outputs) != len(b.Outputs) {
		return fmt.Errorf("graph %s: %d outputs vs %d", a.Name, len(a.Outputs), len(b.Outputs))
	}
	for i, x := range a.Outputs {
		if !sameValue(x, b.Outputs[i], match) {
			return fmt.Errorf("output %d: %s vs %s", i, x, b.Outputs[i])
		}
	}
	return nil
}

// equalNode compares two nodes at the same position and records their outputs in match.
func equalNode(x, y *Node, match map[*Value]*Value) error {
	if x.Op != y.Op {
		return fmt.Errorf("op %s vs %s", x.Op, y.Op)
	}
	if x.Scope != y.Scope {
		return fmt.Errorf("scope %q vs %q", x.Scope, y.Scope)
	}
	for _, k := range sortedKeys(x.Attrs) {
		yv, ok := y.Attrs[k]
		if !ok {
			return fmt.Errorf("attribute %s=%s vs absent", k, FormatAttr(x.Attrs[k]))
		}
		if !AttrEqual(x.Attrs[k], yv) {
			return fmt.Errorf("attribute %s=%s vs %s", k, FormatAttr(x.Attrs[k]), FormatAttr(yv))
		}
	}
	for _, k := range sortedKeys(y.Attrs) {
		if _, ok := x.Attrs[k]; !ok {
			return fmt.Errorf("attribute %s absent vs %s", k, FormatAttr(y.Attrs[k]))
		}
	}
	if len(x.Inputs) != len(y.Inputs) {
		return fmt.Errorf("%d inputs vs %d", len(x.Inputs), len(y.Inputs))
	}
	for j, in := range x.Inputs {
		if !sameValue(in, y.Inputs[j], match) {
			return fmt.Errorf("input %d is %s vs %s", j, in, y.Inputs[j])
		}
	}
	if len(x.Outputs) != len(y.Outputs) {
		return fmt.Errorf("%d outputs vs %d", len(x.Outputs), len(y.Outputs))
	}
	for j, o := range x.Outputs {
		p := y.Outputs[j]
		if o == nil || p == nil {
			if o != p {
				return fmt.Errorf("output %d is %s vs %s", j, o, p)
			}
			continue
		}
		if !o.Type.Equal(p.Type) {
			return fmt.Errorf("output %d has type %s vs %s", j, o.Type, p.Type)
		}
		match[o] = p
	}
	return nil
}

// sameValue reports whether x (of graph a) and y (of graph b) are defined at the same place.
// Values defined in neither graph (a malformed graph) are the same if they are named alike.
func sameValue(x, y *Value, match map[*Value]*Value) bool {
	if x == nil || y == nil {
		return x == y
	}
	if m, ok := match[x]; ok {
		return m == y
	}
	for _, m := range match {
		if m == y {
			return false // y is defined in b, x is not defined in a
		}
	}
	return x.Name == y.Name
}
