package pattern

import (
	"errors"
	"fmt"

	"github.com/loom-ml/loom/graph"
)

// ReplaceAll replaces each match of ms, all from one FindAll (or FindAllShared) of one graph,
// with what build appends for it: the graph that results is the one Replace gives when called
// on each match in turn, in time linear in the graph. Replace costs a few passes over the
// graph, so replacing each of a mixture of experts' thousands of matches in turn is
// quadratic; ReplaceAll builds every replacement first, then splices the new nodes in before
// their roots, moves the uses of the roots' outputs and removes the matched nodes nothing
// uses any more, one pass each.
//
// build reads the match's values with m.Get as for Replace, with one difference: a value that
// another match of ms replaces is still the old value when build runs (Replace, called in
// turn, would already give the new one). It is rewired to its replacement afterwards, so
// build may use it as an input of the new nodes but must not look at its producer. When a
// replacement cannot be built, the graph is left as it was.
func ReplaceAll(ms []*Match, build func(m *Match, b *graph.Builder) ([]*graph.Value, error)) error {
	if len(ms) == 0 {
		return nil
	}
	g := ms[0].g
	in := make(map[*graph.Node]bool, len(g.Nodes))
	for _, n := range g.Nodes {
		in[n] = true
	}
	seen := make(map[*Match]bool, len(ms))
	for _, m := range ms {
		switch {
		case m == nil:
			return errors.New("pattern: ReplaceAll: nil match")
		case seen[m]:
			return fmt.Errorf("pattern %s: ReplaceAll: the same match given twice", m.Pattern.name)
		case m.g != g:
			return fmt.Errorf("pattern %s: ReplaceAll: the matches are in different graphs", m.Pattern.name)
		case m.done:
			return fmt.Errorf("pattern %s: the match was already replaced", m.Pattern.name)
		case !in[m.Root]:
			return fmt.Errorf("pattern %s: %w", m.Pattern.name, errStale)
		}
		seen[m] = true
	}

	// Build every replacement at the end of the graph.
	start := len(g.Nodes)
	added := make([][]*graph.Node, len(ms))
	outs := make([][]*graph.Value, len(ms))
	for i, m := range ms {
		from := len(g.Nodes)
		b := graph.BuilderFor(g)
		b.SetScope(m.Root.Scope)
		o, err := build(m, b)
		if err == nil {
			err = b.Err()
		}
		if err == nil {
			err = checkOutputs(m.Root, o)
		}
		if err != nil {
			drop := map[*graph.Node]bool{}
			for _, n := range g.Nodes[start:] {
				drop[n] = true
			}
			g.RemoveNodes(drop)
			return fmt.Errorf("pattern %s: replace the match at %s: %w", m.Pattern.name, m.Root.Out(), err)
		}
		added[i], outs[i] = g.Nodes[from:len(g.Nodes):len(g.Nodes)], o
	}

	// Splice each match's new nodes in before its root.
	before := make(map[*graph.Node][][]*graph.Node, len(ms))
	for i, m := range ms {
		before[m.Root] = append(before[m.Root], added[i])
	}
	nodes := make([]*graph.Node, 0, len(g.Nodes))
	for _, n := range g.Nodes[:start] {
		for _, a := range before[n] {
			nodes = append(nodes, a...)
		}
		nodes = append(nodes, n)
	}
	g.Nodes = nodes

	// Move the uses of the roots' outputs, following a replacement that is itself replaced.
	repl := map[*graph.Value]*graph.Value{}
	for i, m := range ms {
		m.done = true
		for j, o := range m.Root.Outputs {
			if outs[i][j] != o {
				repl[o] = outs[i][j]
			}
		}
	}
	resolve := func(v *graph.Value) *graph.Value {
		for range len(repl) {
			w, ok := repl[v]
			if !ok {
				break
			}
			v = w
		}
		return v
	}
	for _, n := range g.Nodes {
		for i, v := range n.Inputs {
			if _, ok := repl[v]; ok {
				n.Inputs[i] = resolve(v)
			}
		}
	}
	for i, v := range g.Outputs {
		if _, ok := repl[v]; ok {
			g.Outputs[i] = resolve(v)
		}
	}

	cand := map[*graph.Node]bool{}
	for _, m := range ms {
		for _, n := range m.order {
			cand[n] = true
		}
	}
	removeUnusedOf(g, cand)

	// A new value takes the name of the output it replaces once that output's node is gone.
	clear(in)
	for _, n := range g.Nodes {
		in[n] = true
	}
	for i, m := range ms {
		if in[m.Root] {
			continue
		}
		isNew := map[*graph.Node]bool{}
		for _, n := range added[i] {
			isNew[n] = true
		}
		for j, o := range outs[i] {
			if name := m.Root.Outputs[j].Name; isNew[o.Producer] && o.Name != name {
				if err := g.Rename(o, name); err != nil {
					return fmt.Errorf("pattern %s: %w", m.Pattern.name, err)
				}
			}
		}
	}
	return nil
}
