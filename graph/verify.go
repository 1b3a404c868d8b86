package graph

import (
	"errors"
	"fmt"
)

// Verify checks that a graph is well formed: every value is defined once before it is used,
// names are unique and valid, every type is well formed (a known dtype; dimensions that are
// non-negative sizes or valid symbols), every op is known with valid attributes, and every
// recorded output type equals what inference gives now, and no fused op hides a collective
// (CheckFusedCollectives). It returns all problems found (up to 20), each naming the node.
func Verify(g *Graph) error {
	if g == nil {
		return errors.New("graph is nil")
	}
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
		if err := checkType(v.Type); err != nil {
			add("%s: value %%%s has a bad type %s: %v", where, v.Name, v.Type, err)
		}
		names[v.Name] = true
		defined[v] = true
	}
	for i, in := range g.Inputs {
		if in == nil {
			add("input %d is nil", i)
			continue
		}
		if in.Producer != nil {
			add("input %%%s has a producer", in.Name)
		}
		define(in, "input %"+in.Name)
	}
	for i, n := range g.Nodes {
		if n == nil {
			add("node %d is nil", i)
			continue
		}
		where := fmt.Sprintf("node %d (%s)", i, n.Op)
		if len(n.Outputs) > 0 && n.Outputs[0] != nil {
			where = fmt.Sprintf("node %d (%%%s = %s)", i, n.Outputs[0].Name, n.Op)
		}
		ok := true // inputs and outputs are all present, so inference can run
		for j, in := range n.Inputs {
			switch {
			case in == nil:
				add("%s: input %d is nil", where, j)
				ok = false
			case !defined[in]:
				add("%s: input %d (%%%s) is used before it is defined or is not in the graph", where, j, in.Name)
			}
		}
		// Define the outputs before checking the op, so that a bad node does not also make
		// every later use of its outputs an error.
		for j, o := range n.Outputs {
			if o == nil {
				add("%s: output %d is nil", where, j)
				ok = false
				continue
			}
			if o.Producer != n || o.Index != j {
				add("%s: output %d (%%%s) does not point back to its node", where, j, o.Name)
			}
			define(o, where)
		}
		spec, known := Lookup(n.Op)
		if !known {
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
		var missing []string
		for _, a := range spec.Attrs {
			if _, has := n.Attrs[a.Name]; !has {
				missing = append(missing, a.Name)
			}
		}
		if len(missing) > 0 {
			add("%s: attributes %v are missing; nodes carry every attribute, defaults included (see OpSpec.NormalizeAttrs)", where, missing)
			continue
		}
		for _, a := range spec.Attrs {
			var err error
			switch a.Type {
			case AttrShape:
				err = checkShape(norm.Shape(a.Name))
			case AttrDType:
				err = checkDType(norm.DType(a.Name))
			}
			if err != nil {
				add("%s: attribute %s: %v", where, a.Name, err)
				ok = false
			}
		}
		if !ok {
			continue
		}
		types, err := inferTypes(spec, n)
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
	if len(errs) == 0 {
		if err := CheckFusedCollectives(g); err != nil {
			add("%v", err)
		}
	}
	if len(g.Outputs) == 0 {
		add("graph %s has no outputs", g.Name)
	}
	for i, o := range g.Outputs {
		if o == nil || !defined[o] {
			add("output %d (%s) is not defined in the graph", i, o)
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
		if n == nil {
			return fmt.Errorf("node %d is nil", i)
		}
		spec, ok := Lookup(n.Op)
		if !ok {
			return fmt.Errorf("node %d: unknown op %q", i, n.Op)
		}
		if err := spec.checkArity(len(n.Inputs)); err != nil {
			return fmt.Errorf("node %d (%s): %w", i, n.Op, err)
		}
		for j, in := range n.Inputs {
			if in == nil {
				return fmt.Errorf("node %d (%s): input %d is nil", i, n.Op, j)
			}
		}
		for j, o := range n.Outputs {
			if o == nil {
				return fmt.Errorf("node %d (%s): output %d is nil", i, n.Op, j)
			}
		}
		types, err := inferTypes(spec, n)
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

// CheckSymbolsBound makes sure every symbol in a node's output shape is bound by some graph
// input, so that an executor can resolve every shape from the inputs it is given.
func CheckSymbolsBound(g *Graph) error {
	bound := map[string]bool{}
	for _, in := range g.Inputs {
		for _, d := range in.Type.Shape {
			if d.IsSym() {
				bound[d.Sym] = true
			}
		}
	}
	for _, n := range g.Nodes {
		for _, o := range n.Outputs {
			for _, d := range o.Type.Shape {
				if d.IsSym() && !bound[d.Sym] {
					return fmt.Errorf("node %s: symbol %s is not bound by any graph input", n, d.Sym)
				}
			}
		}
	}
	return nil
}
