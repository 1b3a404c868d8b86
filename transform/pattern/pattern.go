// Package pattern finds small subgraphs in a graph and replaces them.
//
// A pattern is a graph built with the same builder the frontends use. Its inputs are
// wildcards that match any value and capture it; its nodes match nodes of the same op, and
// the pattern's root (its output) is where matching starts:
//
//	p := pattern.New("rmsnorm")
//	x := p.Any("x", tensor.F32, graph.Shape{graph.Sym("B"), graph.Sym("S"), graph.D(64)})
//	w := p.Any("w", tensor.F32, graph.Shape{graph.D(64)})
//	eps := p.Const("eps", tensor.F32)
//	b := p.Builder()
//	v := b.Reduce("mean", b.Mul(x, x), true, -1)
//	out := b.Mul(w, b.Mul(x, b.Unary("rsqrt", b.Add(v, eps))))
//	p.Root(out)
//
//	matches, err := p.FindAll(g)
//	for _, m := range matches {
//		e, _ := m.Scalar(eps)
//		err := m.Replace(func(b *graph.Builder) ([]*graph.Value, error) {
//			return []*graph.Value{b.Op("rmsnorm", graph.Attrs{"eps": e}, m.Get(x), m.Get(w))}, nil
//		})
//		...
//	}
//
// The types given to wildcards only let the builder infer the pattern's own types; matching
// ignores types (constrain them with Where). Attributes must be equal unless IgnoreAttrs or
// Attr relaxes them; a literal constant in the pattern (b.Scalar(tensor.F32, 1)) matches a
// const node holding the same values in any dtype and shape, and Const matches any const and
// captures it. Commutative ops (graph.OpSpec.Commutative) are tried with their inputs in both
// orders, and OpIn and Optional make a pattern node match one of several ops or no node at
// all. A match is refused when a value computed inside it (other than the root's) is used
// outside it or is a graph output, since replacing the match would then change or lose it;
// nodes without inputs (constants, params) may be shared with the rest of the graph.
//
// MatchShared and FindAllShared lift that refusal, to read a producer chain that several
// consumers share (rotary tables, an attention mask computed once for every layer) or to
// replace values of a match that stay in use. Replacements come in three sizes: Replace
// swaps one match's root; ReplaceValues swaps chosen values of a match, such as a residual
// add and the norm of its sum for a fused op with both outputs; ReplaceJointly swaps the
// roots of several matches for one set of nodes, such as the q and k rotary applications of
// a layer for one rope node. Rewrite does the same for values found without a pattern.
package pattern

import (
	"errors"
	"fmt"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Pattern is a subgraph to find. Build it with Any, Const and Builder, finish it with Root,
// and constrain it with IgnoreAttrs, Attr, OpIn, Optional and Where. Misuse is recorded and
// reported by Err and FindAll; a pattern with an error matches nothing.
type Pattern struct {
	name string
	b    *graph.Builder
	root *graph.Value
	err  error

	wild      map[*graph.Value]string // wildcard inputs
	consts    map[*graph.Node]string  // captured constants: match any const
	byName    map[string]*graph.Value // wildcards and captured constants by name
	ignore    map[*graph.Node]map[string]bool
	ignoreAll map[*graph.Node]bool
	preds     map[*graph.Node]map[string]func(any) bool
	ops       map[*graph.Node][]string // OpIn: the ops a node may match (empty: any)
	optional  map[*graph.Node]bool
	where     []func(*Match) bool
}

// New starts an empty pattern; name appears in errors and in String.
func New(name string) *Pattern {
	return &Pattern{
		name:      name,
		b:         graph.NewBuilder("pattern_" + name),
		wild:      map[*graph.Value]string{},
		consts:    map[*graph.Node]string{},
		byName:    map[string]*graph.Value{},
		ignore:    map[*graph.Node]map[string]bool{},
		ignoreAll: map[*graph.Node]bool{},
		preds:     map[*graph.Node]map[string]func(any) bool{},
		ops:       map[*graph.Node][]string{},
		optional:  map[*graph.Node]bool{},
	}
}

// Name returns the pattern's name.
func (p *Pattern) Name() string { return p.name }

// Builder returns the builder that appends the pattern's ops. Its errors become the
// pattern's.
func (p *Pattern) Builder() *graph.Builder { return p.b }

// Err returns the first error made while building the pattern.
func (p *Pattern) Err() error {
	if p.err != nil {
		return p.err
	}
	if err := p.b.Err(); err != nil {
		return fmt.Errorf("pattern %s: %w", p.name, err)
	}
	if p.root == nil {
		return fmt.Errorf("pattern %s has no root (call Root)", p.name)
	}
	return nil
}

func (p *Pattern) fail(format string, args ...any) {
	if p.err == nil {
		p.err = fmt.Errorf("pattern %s: %s", p.name, fmt.Sprintf(format, args...))
	}
}

// Any declares a wildcard: a value that matches any graph value and is captured under name.
// dt and shape are an example type for the builder's inference; matching ignores them.
func (p *Pattern) Any(name string, dt tensor.DType, shape graph.Shape) *graph.Value {
	if _, dup := p.byName[name]; dup {
		p.fail("capture name %q used twice", name)
	}
	v := p.b.Input(name, dt, shape)
	p.wild[v] = name
	p.byName[name] = v
	return v
}

// Const declares a captured constant: a scalar in the pattern that matches any const node,
// whatever its values, dtype and shape. Read it with Match.Const or Match.Scalar.
func (p *Pattern) Const(name string, dt tensor.DType) *graph.Value {
	if _, dup := p.byName[name]; dup {
		p.fail("capture name %q used twice", name)
	}
	v := p.b.Named(name, graph.OpConst, graph.Attrs{"dtype": dt, "shape": graph.Shape{}, "values": []float64{0}})
	if v.Producer != nil {
		p.consts[v.Producer] = name
	}
	p.byName[name] = v
	return v
}

// Root sets the pattern's output, where matching starts. It must be computed by an op of the
// pattern (not a wildcard, a captured constant or an optional node).
func (p *Pattern) Root(v *graph.Value) {
	n := p.node(v, "Root")
	switch {
	case n == nil:
	case p.consts[n] != "":
		p.fail("the root cannot be the captured constant %s", v)
	case p.optional[n]:
		p.fail("the root cannot be optional")
	default:
		p.root = v
	}
}

// IgnoreAttrs makes the node computing v match whatever the named attributes hold; with no
// names, whatever all of them hold.
func (p *Pattern) IgnoreAttrs(v *graph.Value, names ...string) {
	n := p.node(v, "IgnoreAttrs")
	if n == nil {
		return
	}
	if len(names) == 0 {
		p.ignoreAll[n] = true
		return
	}
	if p.ignore[n] == nil {
		p.ignore[n] = map[string]bool{}
	}
	for _, a := range names {
		p.ignore[n][a] = true
	}
}

// Attr replaces the equality test of attribute name on the node computing v by ok, which is
// given the graph node's attribute value (nil if it has none).
func (p *Pattern) Attr(v *graph.Value, name string, ok func(value any) bool) {
	n := p.node(v, "Attr")
	if n == nil {
		return
	}
	if ok == nil {
		p.fail("Attr %s: nil predicate", name)
		return
	}
	if p.preds[n] == nil {
		p.preds[n] = map[string]func(any) bool{}
	}
	p.preds[n][name] = ok
}

// OpIn lets the node computing v match a node of any of the given ops with as many inputs
// (its own op included or not); with no ops, a node of any op with as many inputs. Attributes
// are compared only where the ops are the same; Attr predicates always apply.
func (p *Pattern) OpIn(v *graph.Value, ops ...string) {
	n := p.node(v, "OpIn")
	if n == nil {
		return
	}
	for _, op := range ops {
		if _, ok := graph.Lookup(op); !ok {
			p.fail("OpIn: unknown op %q", op)
		}
	}
	p.ops[n] = append([]string{}, ops...)
}

// Optional lets the node computing v, which must have one input, be absent from the graph:
// then v matches what its input matches. Typical use: a cast that a frontend may or may not
// emit.
func (p *Pattern) Optional(v *graph.Value) {
	n := p.node(v, "Optional")
	if n == nil {
		return
	}
	if len(n.Inputs) != 1 || len(n.Outputs) != 1 {
		p.fail("Optional: %s has %d inputs and %d outputs, want one of each", n.Op, len(n.Inputs), len(n.Outputs))
		return
	}
	if v == p.root {
		p.fail("the root cannot be optional")
		return
	}
	p.optional[n] = true
}

// Where adds a constraint that a candidate match must satisfy.
func (p *Pattern) Where(ok func(m *Match) bool) {
	if ok == nil {
		p.fail("Where: nil constraint")
		return
	}
	p.where = append(p.where, ok)
}

// node returns the pattern node computing v, recording an error if v is not one.
func (p *Pattern) node(v *graph.Value, what string) *graph.Node {
	if p.b.Err() != nil {
		return nil
	}
	if v == nil || v.Producer == nil {
		if _, ok := p.wild[v]; ok {
			p.fail("%s: %s is a wildcard, not an op of the pattern", what, v)
		} else {
			p.fail("%s: %s is not computed by an op of the pattern", what, v)
		}
		return nil
	}
	if p.b.Graph().IndexOf(v.Producer) < 0 {
		p.fail("%s: %s belongs to another graph", what, v)
		return nil
	}
	return v.Producer
}

// String prints the pattern as graph text.
func (p *Pattern) String() string {
	g := p.b.Graph()
	saved := g.Outputs
	if p.root != nil {
		g.Outputs = []*graph.Value{p.root}
	}
	s := g.String()
	g.Outputs = saved
	return s
}

// errStale reports a match whose nodes a previous replacement changed.
var errStale = errors.New("the match is stale: its root is no longer in the graph")
