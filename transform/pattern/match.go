package pattern

import (
	"fmt"
	"sort"

	"github.com/loom-ml/loom/graph"
)

// Match is one place a pattern matched.
type Match struct {
	Pattern *Pattern
	// Root is the graph node matched by the pattern's root.
	Root *graph.Node

	g     *graph.Graph
	nodes map[*graph.Node]*graph.Node // pattern node -> graph node
	vals  map[*graph.Value]binding    // pattern value -> where its graph value is
	order []*graph.Node               // matched graph nodes in graph order
	done  bool
}

// binding locates a pattern value's graph value. Wildcards are read from the input slot of
// the matched node that consumes them, so that a replacement made earlier (which may have
// replaced the value that slot held) is seen.
type binding struct {
	v    *graph.Value
	node *graph.Node // consumer, or nil for the root
	slot int
}

func (b binding) value() *graph.Value {
	if b.node != nil {
		return b.node.Inputs[b.slot]
	}
	return b.v
}

// Get returns the graph value matched by pattern value pv, or nil when pv is not part of the
// match (an optional node that was absent is matched to its input's value).
func (m *Match) Get(pv *graph.Value) *graph.Value {
	b, ok := m.vals[pv]
	if !ok {
		return nil
	}
	return b.value()
}

// Value returns the graph value captured by the wildcard or constant called name.
func (m *Match) Value(name string) *graph.Value { return m.Get(m.Pattern.byName[name]) }

// Node returns the graph node matched by the pattern node computing pv, or nil.
func (m *Match) Node(pv *graph.Value) *graph.Node {
	if pv == nil || pv.Producer == nil {
		return nil
	}
	return m.nodes[pv.Producer]
}

// Const returns the values of the const node matched by pv (a captured or literal constant).
func (m *Match) Const(pv *graph.Value) ([]float64, bool) {
	v := m.Get(pv)
	if v == nil || v.Producer == nil || v.Producer.Op != graph.OpConst {
		return nil, false
	}
	return v.Producer.Attrs.Floats("values"), true
}

// Scalar returns the value of a constant matched by pv whose elements are all equal.
func (m *Match) Scalar(pv *graph.Value) (float64, bool) {
	vals, ok := m.Const(pv)
	if !ok || len(vals) == 0 {
		return 0, false
	}
	for _, x := range vals[1:] {
		if x != vals[0] {
			return 0, false
		}
	}
	return vals[0], true
}

// Nodes returns every matched graph node in graph order, the root last.
func (m *Match) Nodes() []*graph.Node { return append([]*graph.Node(nil), m.order...) }

// Inner returns the matched nodes whose outputs only the match uses: all but the root and
// the input-less nodes (constants, params) that may be shared.
func (m *Match) Inner() []*graph.Node {
	var out []*graph.Node
	for _, n := range m.order {
		if n != m.Root && len(n.Inputs) > 0 {
			out = append(out, n)
		}
	}
	return out
}

// Match tries the pattern with its root at node n of g. It computes g's users on every call;
// to scan a whole graph use FindAll.
func (p *Pattern) Match(g *graph.Graph, n *graph.Node) (*Match, bool) {
	return p.matchAt(g, n, false)
}

// MatchShared is Match without the refusal of values used outside the match: the matched
// nodes may feed other nodes of the graph too. Use it to recognise and read a producer chain
// that several consumers share, such as rotary tables or an attention mask computed once for
// every layer, without replacing it. Replacing a shared match (Replace, ReplaceValues) is
// still safe: matched nodes that something else uses stay in the graph.
func (p *Pattern) MatchShared(g *graph.Graph, n *graph.Node) (*Match, bool) {
	return p.matchAt(g, n, true)
}

func (p *Pattern) matchAt(g *graph.Graph, n *graph.Node, shared bool) (*Match, bool) {
	if p.Err() != nil || n == nil {
		return nil, false
	}
	return newScan(g).matchAt(p, n, shared)
}

// Scanner matches patterns at single nodes of one graph, as Match and MatchShared do, with
// the index of the graph (users, positions) they build on every call built once: for many
// matches on a graph that does not change while the Scanner is in use (replace only after).
type Scanner struct{ s *scan }

// NewScanner indexes g for matching.
func NewScanner(g *graph.Graph) *Scanner { return &Scanner{s: newScan(g)} }

// Match is p.Match(g, n) for the Scanner's graph g.
func (sc *Scanner) Match(p *Pattern, n *graph.Node) (*Match, bool) { return sc.s.matchAt(p, n, false) }

// MatchShared is p.MatchShared(g, n) for the Scanner's graph g.
func (sc *Scanner) MatchShared(p *Pattern, n *graph.Node) (*Match, bool) {
	return sc.s.matchAt(p, n, true)
}

func (s *scan) matchAt(p *Pattern, n *graph.Node, shared bool) (*Match, bool) {
	if p.Err() != nil || n == nil || s.pos[n] == 0 {
		return nil, false
	}
	return s.match(p, n, shared)
}

// FindAll returns the pattern's matches in g in graph order (by root). Matches do not
// overlap: a node belongs to one match at most, except the input-less nodes they may share.
// Replacing the matches in the order returned is safe.
func (p *Pattern) FindAll(g *graph.Graph) ([]*Match, error) {
	return p.findAll(g, false)
}

// FindAllShared is FindAll with the matches of MatchShared: matched values may also be used
// outside the match. Matches still do not overlap.
func (p *Pattern) FindAllShared(g *graph.Graph) ([]*Match, error) {
	return p.findAll(g, true)
}

func (p *Pattern) findAll(g *graph.Graph, shared bool) ([]*Match, error) {
	if err := p.Err(); err != nil {
		return nil, err
	}
	s := newScan(g)
	claimed := map[*graph.Node]bool{}
	var out []*Match
	for _, n := range g.Nodes {
		if claimed[n] {
			continue
		}
		m, ok := s.match(p, n, shared)
		if !ok {
			continue
		}
		overlap := false
		for _, mn := range m.order {
			overlap = overlap || len(mn.Inputs) > 0 && claimed[mn]
		}
		if overlap {
			continue
		}
		for _, mn := range m.order {
			if len(mn.Inputs) > 0 {
				claimed[mn] = true
			}
		}
		out = append(out, m)
	}
	return out, nil
}

// scan holds what matching needs to know about the graph.
type scan struct {
	g       *graph.Graph
	users   map[*graph.Value][]*graph.Node
	outputs map[*graph.Value]bool
	pos     map[*graph.Node]int // 1-based position
}

func newScan(g *graph.Graph) *scan {
	s := &scan{g: g, users: g.Users(), outputs: map[*graph.Value]bool{}, pos: make(map[*graph.Node]int, len(g.Nodes))}
	for _, o := range g.Outputs {
		s.outputs[o] = true
	}
	for i, n := range g.Nodes {
		s.pos[n] = i + 1
	}
	return s
}

// matcher is one matching attempt: bindings with an undo trail for backtracking.
type matcher struct {
	p     *Pattern
	s     *scan
	nodes map[*graph.Node]*graph.Node
	vals  map[*graph.Value]binding
	trail []any // *graph.Node or *graph.Value keys bound, in order
}

func (s *scan) match(p *Pattern, n *graph.Node, shared bool) (*Match, bool) {
	if p.root.Index >= len(n.Outputs) {
		return nil, false
	}
	mt := &matcher{p: p, s: s, nodes: map[*graph.Node]*graph.Node{}, vals: map[*graph.Value]binding{}}
	var found *Match
	mt.value(p.root, n.Outputs[p.root.Index], binding{v: n.Outputs[p.root.Index]}, func() bool {
		m := mt.snapshot(n)
		if !shared && !mt.selfContained(m) {
			return false
		}
		for _, ok := range p.where {
			if !ok(m) {
				return false
			}
		}
		found = m
		return true
	})
	return found, found != nil
}

func (mt *matcher) mark() int { return len(mt.trail) }

func (mt *matcher) undo(mark int) {
	for _, k := range mt.trail[mark:] {
		switch k := k.(type) {
		case *graph.Node:
			delete(mt.nodes, k)
		case *graph.Value:
			delete(mt.vals, k)
		}
	}
	mt.trail = mt.trail[:mark]
}

func (mt *matcher) bindValue(pv *graph.Value, b binding) {
	mt.vals[pv] = b
	mt.trail = append(mt.trail, pv)
}

func (mt *matcher) bindNode(pn, gn *graph.Node) {
	mt.nodes[pn] = gn
	mt.trail = append(mt.trail, pn)
}

// value matches pattern value pv against graph value gv (found at b) and, if they match,
// calls k to match the rest; on failure it undoes its bindings and returns false.
func (mt *matcher) value(pv, gv *graph.Value, b binding, k func() bool) bool {
	if old, ok := mt.vals[pv]; ok {
		return old.value() == gv && k()
	}
	pn := pv.Producer
	if pn == nil { // wildcard
		m := mt.mark()
		mt.bindValue(pv, b)
		if k() {
			return true
		}
		mt.undo(m)
		return false
	}
	if mt.node(pv, gv, b, k) {
		return true
	}
	if mt.p.optional[pn] {
		m := mt.mark()
		mt.bindValue(pv, b)
		if mt.value(pn.Inputs[0], gv, b, k) {
			return true
		}
		mt.undo(m)
	}
	return false
}

// node matches the pattern node computing pv against the graph node computing gv.
func (mt *matcher) node(pv, gv *graph.Value, b binding, k func() bool) bool {
	pn, gn := pv.Producer, gv.Producer
	if gn == nil || gv.Index != pv.Index || len(gn.Outputs) != len(pn.Outputs) || mt.s.pos[gn] == 0 {
		return false
	}
	m := mt.mark()
	if bound, ok := mt.nodes[pn]; ok { // another output of a node already matched
		if bound != gn {
			return false
		}
		mt.bindValue(pv, b)
		if k() {
			return true
		}
		mt.undo(m)
		return false
	}
	if !mt.opMatches(pn, gn) {
		return false
	}
	mt.bindNode(pn, gn)
	mt.bindValue(pv, b)
	if _, captured := mt.p.consts[pn]; captured || len(pn.Inputs) == 0 {
		if k() {
			return true
		}
		mt.undo(m)
		return false
	}
	orders := [][]int{identity(len(pn.Inputs))}
	if spec := gn.Spec(); spec != nil && spec.Commutative && len(pn.Inputs) == 2 {
		orders = append(orders, []int{1, 0})
	}
	for _, order := range orders {
		if mt.inputs(pn, gn, order, 0, k) {
			return true
		}
	}
	mt.undo(m)
	return false
}

// inputs matches pattern input i onwards against the graph node's inputs in the given order.
func (mt *matcher) inputs(pn, gn *graph.Node, order []int, i int, k func() bool) bool {
	if i == len(order) {
		return k()
	}
	j := order[i]
	return mt.value(pn.Inputs[i], gn.Inputs[j], binding{node: gn, slot: j}, func() bool {
		return mt.inputs(pn, gn, order, i+1, k)
	})
}

// opMatches compares one pattern node with one graph node, inputs aside.
func (mt *matcher) opMatches(pn, gn *graph.Node) bool {
	if _, captured := mt.p.consts[pn]; captured {
		return gn.Op == graph.OpConst
	}
	if len(pn.Inputs) != len(gn.Inputs) {
		return false
	}
	if gn.Op != pn.Op {
		ops, ok := mt.p.ops[pn]
		if !ok || len(ops) > 0 && !contains(ops, gn.Op) {
			return false
		}
	} else if !mt.p.ignoreAll[pn] {
		if pn.Op == graph.OpConst {
			if !sameValues(pn.Attrs.Floats("values"), gn.Attrs.Floats("values")) {
				return false
			}
		} else {
			for name, want := range pn.Attrs {
				if mt.p.ignore[pn][name] || mt.p.preds[pn][name] != nil {
					continue
				}
				if got, ok := gn.Attrs[name]; !ok || !graph.AttrEqual(got, want) {
					return false
				}
			}
		}
	}
	for name, ok := range mt.p.preds[pn] {
		if !ok(gn.Attrs[name]) {
			return false
		}
	}
	return true
}

// sameValues compares constant values, where a single value stands for all elements.
func sameValues(pat, got []float64) bool {
	if len(pat) == 1 {
		for _, x := range got {
			if !graph.AttrEqual(x, pat[0]) {
				return false
			}
		}
		return len(got) > 0
	}
	return graph.AttrEqual(pat, got)
}

// snapshot copies the current bindings into a Match rooted at root.
func (mt *matcher) snapshot(root *graph.Node) *Match {
	m := &Match{Pattern: mt.p, Root: root, g: mt.s.g, nodes: make(map[*graph.Node]*graph.Node, len(mt.nodes)), vals: make(map[*graph.Value]binding, len(mt.vals))}
	seen := map[*graph.Node]bool{}
	for pn, gn := range mt.nodes {
		m.nodes[pn] = gn
		if !seen[gn] {
			seen[gn] = true
			m.order = append(m.order, gn)
		}
	}
	for pv, b := range mt.vals {
		m.vals[pv] = b
	}
	sort.Slice(m.order, func(i, j int) bool { return mt.s.pos[m.order[i]] < mt.s.pos[m.order[j]] })
	return m
}

// selfContained reports whether every value computed inside the match, other than the
// root's, is used only by nodes of the match and is no graph output.
func (mt *matcher) selfContained(m *Match) bool {
	in := make(map[*graph.Node]bool, len(m.order))
	for _, n := range m.order {
		in[n] = true
	}
	for _, n := range m.order {
		if n == m.Root || len(n.Inputs) == 0 {
			continue
		}
		for _, o := range n.Outputs {
			if mt.s.outputs[o] {
				return false
			}
			for _, u := range mt.s.users[o] {
				if !in[u] {
					return false
				}
			}
		}
	}
	return true
}

// Replace swaps the match for new nodes. build appends them with b, whose scope is the
// root's, and returns the values that replace the root's outputs, in order and of the same
// types. The new nodes go where the root was; every use of the root's outputs moves to
// them; matched nodes left unused are removed, and a new value takes the name of the root
// output it replaces, so the rest of the graph prints as before. On an error the graph is
// left as it was.
func (m *Match) Replace(build func(b *graph.Builder) ([]*graph.Value, error)) error {
	if m.done {
		return fmt.Errorf("pattern %s: the match was already replaced", m.Pattern.name)
	}
	g, root := m.g, m.Root
	if g.IndexOf(root) < 0 {
		return fmt.Errorf("pattern %s: %w", m.Pattern.name, errStale)
	}
	start := len(g.Nodes)
	b := graph.BuilderFor(g)
	b.SetScope(root.Scope)
	outs, err := build(b)
	if err == nil {
		err = b.Err()
	}
	added := append([]*graph.Node(nil), g.Nodes[start:]...)
	if err == nil {
		err = checkOutputs(root, outs)
	}
	if err != nil {
		drop := map[*graph.Node]bool{}
		for _, n := range added {
			drop[n] = true
		}
		g.RemoveNodes(drop)
		return fmt.Errorf("pattern %s: replace the match at %s: %w", m.Pattern.name, root.Out(), err)
	}
	g.Nodes = g.Nodes[:start]
	if err := g.InsertBefore(root, added...); err != nil {
		return fmt.Errorf("pattern %s: %w", m.Pattern.name, err)
	}
	m.done = true
	names := make([]string, len(root.Outputs))
	for i, o := range root.Outputs {
		names[i] = o.Name
		g.ReplaceUses(o, outs[i])
	}
	m.removeUnused()
	if g.IndexOf(root) >= 0 {
		return nil
	}
	isNew := map[*graph.Node]bool{}
	for _, n := range added {
		isNew[n] = true
	}
	for i, o := range outs {
		if isNew[o.Producer] && o.Name != names[i] {
			if err := g.Rename(o, names[i]); err != nil {
				return fmt.Errorf("pattern %s: %w", m.Pattern.name, err)
			}
		}
	}
	return nil
}

func checkOutputs(root *graph.Node, outs []*graph.Value) error {
	if len(outs) != len(root.Outputs) {
		return fmt.Errorf("the replacement has %d outputs, the matched %s has %d", len(outs), root.Op, len(root.Outputs))
	}
	for i, o := range outs {
		if o == nil {
			return fmt.Errorf("replacement output %d is nil", i)
		}
		if want := root.Outputs[i].Type; !o.Type.Equal(want) {
			return fmt.Errorf("replacement output %d is %s, the matched value %s is %s", i, o.Type, root.Outputs[i], want)
		}
	}
	return nil
}

// removeUnused deletes the matched nodes that nothing uses any more, last first.
func (m *Match) removeUnused() {
	cand := make(map[*graph.Node]bool, len(m.order))
	for _, n := range m.order {
		cand[n] = true
	}
	removeUnusedOf(m.g, cand)
}

func identity(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
