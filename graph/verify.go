package graph

import (
	"errors"
	"fmt"
)

// Verify checks that a graph is well formed: every value is defined once before it is used,
// names are unique and valid, every op is known with valid attributes, and every recorded
// output type equals what inference gives now. It returns all problems found (up to 20),
// each naming the node.
func Verify(g *Graph) error {
	var errs []error
	add := func(format string, args ...any) {
		if len(errs) < 20 {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	defined := map[*Value]bool{}
	names := map[string]bool{}
	define := func(v *Value, where string) {
		if !validName(v.Name) {
			add("%s: invalid value name %q", where, v.Name)
		}
		if names[v.Name] {
			add("%s: value %%%s defined twice", where, v.Name)
		}
		names[v.Name] = true
		defined[v] = true
	}
	for _, in := range g.Inputs {
		if in.Producer != nil {
			add("input %%%s has a producer", in.Name)
		}
		define(in, "input %"+in.Name)
	}
	for i, n := range g.Nodes {
		where := fmt.Sprintf("node %d (%s)", i, n.Op)
		if len(n.Outputs) > 0 {
			where = fmt.Sprintf("node %d (%%%s = %s)", i, n.Outputs[0].Name, n.Op)
		}
		for j, in := range n.Inputs {
			switch {
			case in == nil:
				add("%s: input %d is nil", where, j)
			case !defined[in]:
				add("%s: input %d (%%%s) is used before it is defined or is not in the graph", where, j, in.Name)
			}
		}
		spec, ok := Lookup(n.Op)
		if !ok {
			add("%s: unknown op %q", where, n.Op)
			continue
		}
		if err := spec.checkArity(len(n.Inputs)); err != nil {
			add("%s: %v", where, err)
			continue
		}
		norm, err := spec.NormalizeAttrs(n.Attrs)
		if err != nil {
			add("%s: %v", where, err)
			continue
		}
		if len(norm) != len(n.Attrs) {
			add("%s: attributes %v lack defaults that the spec declares", where, keys(n.Attrs))
		}
		for j, o := range n.Outputs {
			if o.Producer != n || o.Index != j {
				add("%s: output %d (%%%s) does not point back to its node", where, j, o.Name)
			}
			define(o, where)
		}
		hasNil := false
		for _, in := range n.Inputs {
			hasNil = hasNil || in == nil
		}
		if hasNil {
			continue
		}
		types, err := spec.Infer(n)
		if err != nil {
			add("%s: %s%s: %v", where, n.Op, typeList(n.Inputs), err)
			continue
		}
		if len(types) != len(n.Outputs) {
			add("%s: has %d outputs, inference gives %d", where, len(n.Outputs), len(types))
			continue
		}
		for j, t := range types {
			if !t.Equal(n.Outputs[j].Type) {
				add("%s: output %%%s is recorded as %s but inference gives %s", where, n.Outputs[j].Name, n.Outputs[j].Type, t)
			}
		}
	}
	if len(g.Outputs) == 0 {
		add("graph %s has no outputs", g.Name)
	}
	for i, o := range g.Outputs {
		if o == nil || !defined[o] {
			name := "nil"
			if o != nil {
				name = "%" + o.Name
			}
			add("output %d (%s) is not defined in the graph", i, name)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("graph %s is invalid: %w", g.Name, errors.Join(errs...))
}

// ReinferTypes recomputes every node's output types in order, for transforms that change
// inputs or attributes. It stops at the first node whose inference fails.
func ReinferTypes(g *Graph) error {
	for i, n := range g.Nodes {
		spec, ok := Lookup(n.Op)
		if !ok {
			return fmt.Errorf("node %d: unknown op %q", i, n.Op)
		}
		types, err := spec.Infer(n)
		if err != nil {
			return fmt.Errorf("node %d (%s): %w", i, n.Op, err)
		}
		if len(types) != len(n.Outputs) {
			return fmt.Errorf("node %d (%s): %d outputs, inference gives %d", i, n.Op, len(n.Outputs), len(types))
		}
		for j, t := range types {
			n.Outputs[j].Type = t
		}
	}
	return nil
}

func keys(a Attrs) []string {
	out := make([]string, 0, len(a))
	for k := range a {
		out = append(out, k)
	}
	return out
}
