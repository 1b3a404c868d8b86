package pattern

import (
	"errors"
	"fmt"
	"maps"
	"sort"

	"github.com/loom-ml/loom/graph"
)

// ErrNoPlace reports a joint replacement that cannot be placed: the new nodes read a value
// defined after a node that keeps reading a replaced value. The graph is left as it was.
var ErrNoPlace = errors.New("no place for the replacement")

// BuildFunc appends replacement nodes with b and returns the values that replace the old
// ones, in order and of the same types.
type BuildFunc func(b *graph.Builder) ([]*graph.Value, error)

// ReplaceJointly swaps several matches for one set of new nodes, such as the two rotary
// applications of a layer (q and k) for one rope node with two outputs. build returns the
// values that replace the roots' outputs: those of ms[0]'s root first, then ms[1]'s, and so
// on. Everything else is as in Replace, except where the new nodes go: at the first root
// when every value they read is defined there, otherwise as early as possible after those
// values, and always before the first node that keeps reading an old value. Constants and
// params the new nodes read are moved up when they come later. When no place fits (the error
// is then ErrNoPlace), or on any other error, the graph is left as it was.
func ReplaceJointly(ms []*Match, build BuildFunc) error {
	if len(ms) == 0 {
		return errors.New("pattern: ReplaceJointly needs at least one match")
	}
	g := ms[0].g
	var olds []*graph.Value
	var candidates []*graph.Node
	seen := map[*Match]bool{}
	for _, m := range ms {
		switch {
		case m == nil:
			return errors.New("pattern: ReplaceJointly: nil match")
		case seen[m]:
			return fmt.Errorf("pattern %s: ReplaceJointly: the same match given twice", m.Pattern.name)
		case m.g != g:
			return fmt.Errorf("pattern %s: ReplaceJointly: the matches are in different graphs", m.Pattern.name)
		case m.done:
			return fmt.Errorf("pattern %s: the match was already replaced", m.Pattern.name)
		case g.IndexOf(m.Root) < 0:
			return fmt.Errorf("pattern %s: %w", m.Pattern.name, errStale)
		}
		seen[m] = true
		olds = append(olds, m.Root.Outputs...)
		candidates = append(candidates, m.order...)
	}
	if err := rewrite(g, olds, candidates, ms[0].Root.Scope, build); err != nil {
		return fmt.Errorf("pattern %s: replace jointly at %s: %w", ms[0].Pattern.name, ms[0].Root.Out(), err)
	}
	for _, m := range ms {
		m.done = true
	}
	return nil
}

// ReplaceValues swaps matched values for new ones: pvs are values of the pattern computed by
// its ops (the root's or inner ones, typically of a MatchShared match), and build returns
// their replacements in the same order. It serves replacements with several outputs, such as
// add + rmsnorm becoming one add_rmsnorm that returns both the norm and the sum. Placement,
// naming and clean-up are as in ReplaceJointly; the match cannot be replaced again.
func (m *Match) ReplaceValues(pvs []*graph.Value, build BuildFunc) error {
	if m.done {
		return fmt.Errorf("pattern %s: the match was already replaced", m.Pattern.name)
	}
	if m.g.IndexOf(m.Root) < 0 {
		return fmt.Errorf("pattern %s: %w", m.Pattern.name, errStale)
	}
	olds := make([]*graph.Value, len(pvs))
	for i, pv := range pvs {
		v := m.Get(pv)
		if v == nil || v.Producer == nil || m.Node(pv) != v.Producer {
			return fmt.Errorf("pattern %s: ReplaceValues: %s is not computed by a matched node", m.Pattern.name, pv)
		}
		olds[i] = v
	}
	if err := rewrite(m.g, olds, m.order, m.Root.Scope, build); err != nil {
		return fmt.Errorf("pattern %s: replace values at %s: %w", m.Pattern.name, m.Root.Out(), err)
	}
	m.done = true
	return nil
}

// Rewrite replaces values of g outside of any pattern: build appends the new nodes and
// returns one value per old value, of the same type. Uses of each old value move to its
// replacement, an old value's producer that nothing uses any more is removed, and a new value
// takes the name of the old value it replaces. The new nodes are placed as in ReplaceJointly,
// with the scope of the first old value's producer. On an error the graph is left as it was.
func Rewrite(g *graph.Graph, olds []*graph.Value, build BuildFunc) error {
	if g == nil || len(olds) == 0 {
		return errors.New("pattern: Rewrite needs a graph and at least one value")
	}
	var candidates []*graph.Node
	for _, o := range olds {
		if o == nil || o.Producer == nil {
			return fmt.Errorf("pattern: Rewrite: %s is not computed by a node", o)
		}
		candidates = append(candidates, o.Producer)
	}
	if err := rewrite(g, olds, candidates, olds[0].Producer.Scope, build); err != nil {
		return fmt.Errorf("pattern: rewrite %s: %w", olds[0], err)
	}
	return nil
}

// rewrite is the replacement that ReplaceJointly, ReplaceValues and Rewrite share. olds are
// the values to replace; candidates are the nodes that may be deleted once nothing uses
// them (the producers of olds are always candidates).
func rewrite(g *graph.Graph, olds []*graph.Value, candidates []*graph.Node, scope string, build BuildFunc) error {
	want := make(map[*graph.Node]bool, len(olds)+len(candidates))
	for _, o := range olds {
		if o != nil && o.Producer != nil {
			want[o.Producer] = true
		}
	}
	for _, n := range candidates {
		want[n] = true
	}
	pos := positions(g.Nodes, want)
	isOld := map[*graph.Value]bool{}
	for _, o := range olds {
		if o == nil || o.Producer == nil {
			return fmt.Errorf("%s is not computed by a node", o)
		}
		if _, ok := pos[o.Producer]; !ok {
			return errStale
		}
		if isOld[o] {
			return fmt.Errorf("%s is to be replaced twice", o)
		}
		isOld[o] = true
	}
	cand := map[*graph.Node]bool{}
	for _, n := range candidates {
		if _, ok := pos[n]; ok {
			cand[n] = true
		}
	}
	for _, o := range olds {
		cand[o.Producer] = true
	}

	start := len(g.Nodes)
	b := graph.BuilderFor(g)
	b.SetScope(scope)
	outs, err := build(b)
	if err == nil {
		err = b.Err()
	}
	added := append([]*graph.Node(nil), g.Nodes[start:]...)
	if err == nil {
		err = checkReplacements(olds, outs)
	}
	if err == nil { // where the values the new nodes read are defined
		clear(want)
		for _, n := range added {
			for _, in := range n.Inputs {
				if in != nil && in.Producer != nil {
					want[in.Producer] = true
				}
			}
		}
		maps.Copy(pos, positions(g.Nodes[:start], want))
	}
	var at int
	var hoist []*graph.Node
	if err == nil {
		at, hoist, err = place(g.Nodes[:start], pos, added, olds, isOld, dying(g, cand, isOld))
	}
	if err != nil {
		drop := map[*graph.Node]bool{}
		for _, n := range added {
			drop[n] = true
		}
		g.RemoveNodes(drop)
		return err
	}

	// Reorder: the nodes before at (less the hoisted ones), the hoisted constants and params,
	// the new nodes, then the rest.
	moved := map[*graph.Node]bool{}
	for _, n := range hoist {
		moved[n] = true
	}
	old := g.Nodes[:start]
	nodes := make([]*graph.Node, 0, len(g.Nodes))
	for _, n := range old[:at] {
		if !moved[n] {
			nodes = append(nodes, n)
		}
	}
	nodes = append(nodes, hoist...)
	nodes = append(nodes, added...)
	for _, n := range old[at:] {
		if !moved[n] {
			nodes = append(nodes, n)
		}
	}
	g.Nodes = nodes

	names := make([]string, len(olds))
	for i, o := range olds {
		names[i] = o.Name
		g.ReplaceUses(o, outs[i])
	}
	removeUnusedOf(g, cand)
	isNew := map[*graph.Node]bool{}
	for _, n := range added {
		isNew[n] = true
	}
	for i, o := range outs {
		if !isNew[o.Producer] || o.Name == names[i] || g.IndexOf(olds[i].Producer) >= 0 {
			continue
		}
		if err := g.Rename(o, names[i]); err != nil {
			return err
		}
	}
	return nil
}

// positions returns the index in nodes of each node of want that is there: one pass, with no
// map of the whole graph (built on every rewrite, that map was most of a rewrite's time).
func positions(nodes []*graph.Node, want map[*graph.Node]bool) map[*graph.Node]int {
	pos := make(map[*graph.Node]int, len(want))
	for i, n := range nodes {
		if want[n] {
			pos[n] = i
		}
	}
	return pos
}

// checkReplacements checks that outs can replace olds one for one.
func checkReplacements(olds, outs []*graph.Value) error {
	if len(outs) != len(olds) {
		return fmt.Errorf("the replacement has %d outputs for %d values", len(outs), len(olds))
	}
	for i, o := range outs {
		if o == nil {
			return fmt.Errorf("replacement output %d is nil", i)
		}
		if want := olds[i].Type; !o.Type.Equal(want) {
			return fmt.Errorf("replacement output %d is %s, the replaced value %s is %s", i, o.Type, olds[i], want)
		}
	}
	return nil
}

// dying returns the candidates that nothing will use once the old values are replaced: every
// output of theirs is an old value, or no graph output and read only by dying nodes.
func dying(g *graph.Graph, cand map[*graph.Node]bool, isOld map[*graph.Value]bool) map[*graph.Node]bool {
	// The readers of the candidates' outputs: the only users asked about below (a graph-wide
	// g.Users() per rewrite made pattern rewrites quadratic in the graph's size).
	users := make(map[*graph.Value][]*graph.Node, 2*len(cand))
	for n := range cand {
		for _, o := range n.Outputs {
			users[o] = nil
		}
	}
	for _, n := range g.Nodes {
		for _, in := range n.Inputs {
			if us, ok := users[in]; ok {
				users[in] = append(us, n)
			}
		}
	}
	out := map[*graph.Node]bool{}
	for i := len(g.Nodes) - 1; i >= 0; i-- {
		n := g.Nodes[i]
		if !cand[n] {
			continue
		}
		dead := true
		for _, o := range n.Outputs {
			if isOld[o] {
				continue
			}
			if g.IsOutput(o) {
				dead = false
			}
			for _, u := range users[o] {
				dead = dead && out[u]
			}
		}
		if dead {
			out[n] = true
		}
	}
	return out
}

// place finds where the new nodes go among nodes: the position at which to insert them, and
// the constants and params they read that must move up to before them.
func place(nodes []*graph.Node, pos map[*graph.Node]int, added []*graph.Node, olds []*graph.Value, isOld map[*graph.Value]bool, dead map[*graph.Node]bool) (int, []*graph.Node, error) {
	isNew := map[*graph.Node]bool{}
	for _, n := range added {
		isNew[n] = true
	}
	lo := 0
	sources := map[*graph.Node]bool{}
	for _, n := range added {
		for _, in := range n.Inputs {
			p := in.Producer
			if p == nil || isNew[p] {
				continue
			}
			i, ok := pos[p]
			if !ok {
				return 0, nil, fmt.Errorf("the replacement reads %s, which is not in the graph", in)
			}
			if isOld[in] {
				return 0, nil, fmt.Errorf("the replacement reads %s, a value it replaces", in)
			}
			if len(p.Inputs) == 0 {
				sources[p] = true
				continue
			}
			lo = max(lo, i+1)
		}
	}
	at := len(nodes)
	for _, o := range olds {
		at = min(at, pos[o.Producer])
	}
	at = max(at, lo)
	hi := len(nodes)
	for i, n := range nodes {
		if dead[n] {
			continue
		}
		for _, in := range n.Inputs {
			if isOld[in] {
				hi = min(hi, i)
			}
		}
	}
	if at > hi {
		return 0, nil, fmt.Errorf("%w: it reads values defined after %s, which reads a replaced value", ErrNoPlace, nodes[hi].Out())
	}
	var hoist []*graph.Node
	for p := range sources {
		if pos[p] >= at {
			hoist = append(hoist, p)
		}
	}
	sort.Slice(hoist, func(i, j int) bool { return pos[hoist[i]] < pos[hoist[j]] })
	return at, hoist, nil
}

// removeUnusedOf deletes the candidate nodes that nothing uses, last first.
func removeUnusedOf(g *graph.Graph, cand map[*graph.Node]bool) {
	if len(cand) == 0 {
		return
	}
	// Uses of the candidates' outputs only: no other value's count is read below.
	uses := make(map[*graph.Value]int, 2*len(cand))
	for n := range cand {
		for _, o := range n.Outputs {
			uses[o] = 0
		}
	}
	for _, n := range g.Nodes {
		for _, in := range n.Inputs {
			if c, ok := uses[in]; ok {
				uses[in] = c + 1
			}
		}
	}
	for _, o := range g.Outputs {
		if c, ok := uses[o]; ok {
			uses[o] = c + 1
		}
	}
	dead := map[*graph.Node]bool{}
	for i := len(g.Nodes) - 1; i >= 0; i-- {
		n := g.Nodes[i]
		if !cand[n] {
			continue
		}
		used := false
		for _, o := range n.Outputs {
			used = used || uses[o] > 0
		}
		if used {
			continue
		}
		dead[n] = true
		for _, in := range n.Inputs {
			if c, ok := uses[in]; ok {
				uses[in] = c - 1
			}
		}
	}
	g.RemoveNodes(dead)
}
