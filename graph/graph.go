// Package graph is Loom's intermediate representation: a graph of primitive tensor ops with
// named inputs, parameters (lazy references to checkpoint tensors), nodes in topological
// order and outputs. Shapes may hold symbolic dimensions, so one graph serves every batch and
// sequence length. The package also declares the op catalog (catalog_*.go), the builder that
// frontends and transforms use, the verifier, and a text form that prints and parses back
// exactly.
package graph

import (
	"fmt"
	"strconv"
)

// Value is an SSA value: a graph input or one output of a node.
type Value struct {
	Name     string
	Type     Type
	Producer *Node // nil for graph inputs
	Index    int   // which output of Producer
}

func (v *Value) String() string {
	if v == nil {
		return "%<nil>"
	}
	return "%" + v.Name
}

// Node is one op application.
type Node struct {
	Op      string
	Inputs  []*Value
	Attrs   Attrs
	Outputs []*Value
	// Scope is the node's provenance: the module it came from, such as
	// "model.layers.0.self_attn". Transforms keep it on replacements.
	Scope string
}

// Out returns the node's first (usually only) output, or nil if it has none.
func (n *Node) Out() *Value {
	if len(n.Outputs) == 0 {
		return nil
	}
	return n.Outputs[0]
}

// Spec returns the node's op declaration, or nil if the op is unknown.
func (n *Node) Spec() *OpSpec { s, _ := Lookup(n.Op); return s }

// Graph is a model or a fragment of one.
type Graph struct {
	Name    string
	Inputs  []*Value
	Nodes   []*Node
	Outputs []*Value

	names  map[string]bool
	nextID int
}

// New returns an empty graph.
func New(name string) *Graph { return &Graph{Name: name, names: map[string]bool{}} }

// Params returns the param nodes in order.
func (g *Graph) Params() []*Node {
	var out []*Node
	for _, n := range g.Nodes {
		if n.Op == OpParam {
			out = append(out, n)
		}
	}
	return out
}

// Input returns the graph input with the given name, or nil.
func (g *Graph) Input(name string) *Value {
	for _, v := range g.Inputs {
		if v.Name == name {
			return v
		}
	}
	return nil
}

// freshName returns an unused value name: the hint if it is a valid name and free, else a
// number.
func (g *Graph) freshName(hint string) string {
	if g.names == nil {
		g.names = map[string]bool{}
		for _, v := range g.Inputs {
			g.names[v.Name] = true
		}
		for _, n := range g.Nodes {
			for _, o := range n.Outputs {
				g.names[o.Name] = true
			}
		}
	}
	if validName(hint) && !g.names[hint] {
		g.names[hint] = true
		return hint
	}
	for {
		name := strconv.Itoa(g.nextID)
		g.nextID++
		if !g.names[name] {
			g.names[name] = true
			return name
		}
	}
}

// AddInput declares a graph input.
func (g *Graph) AddInput(name string, t Type) (*Value, error) {
	if name == "" || !validName(name) {
		return nil, fmt.Errorf("invalid input name %q", name)
	}
	if g.freshName(name) != name {
		return nil, fmt.Errorf("duplicate value name %q", name)
	}
	v := &Value{Name: name, Type: t}
	g.Inputs = append(g.Inputs, v)
	return v, nil
}

// NewNode creates a node with checked attributes and inferred output types, but does not
// place it in the graph; use Insert or Append. nameHints, when given, name the outputs.
func (g *Graph) NewNode(op string, attrs Attrs, inputs []*Value, scope string, nameHints ...string) (*Node, error) {
	spec, ok := Lookup(op)
	if !ok {
		return nil, fmt.Errorf("unknown op %q", op)
	}
	if err := spec.checkArity(len(inputs)); err != nil {
		return nil, err
	}
	for i, in := range inputs {
		if in == nil {
			return nil, fmt.Errorf("%s: input %d is nil", op, i)
		}
	}
	a, err := spec.NormalizeAttrs(attrs)
	if err != nil {
		return nil, err
	}
	n := &Node{Op: op, Inputs: append([]*Value(nil), inputs...), Attrs: a, Scope: scope}
	types, err := inferTypes(spec, n)
	if err != nil {
		return nil, fmt.Errorf("%s%s: %w", op, typeList(inputs), err)
	}
	for i, t := range types {
		hint := ""
		if i < len(nameHints) {
			hint = nameHints[i]
		}
		n.Outputs = append(n.Outputs, &Value{Name: g.freshName(hint), Type: t, Producer: n, Index: i})
	}
	return n, nil
}

// Append creates a node (see NewNode) and adds it at the end of the graph.
func (g *Graph) Append(op string, attrs Attrs, inputs []*Value, scope string, nameHints ...string) (*Node, error) {
	n, err := g.NewNode(op, attrs, inputs, scope, nameHints...)
	if err != nil {
		return nil, err
	}
	g.Nodes = append(g.Nodes, n)
	return n, nil
}

// InsertBefore places already-created nodes, in order, just before node at.
func (g *Graph) InsertBefore(at *Node, nodes ...*Node) error {
	i := -1
	if at != nil {
		i = g.IndexOf(at)
	}
	if i < 0 {
		return fmt.Errorf("insert before %s: node is not in the graph", at)
	}
	g.Nodes = append(g.Nodes[:i], append(append([]*Node(nil), nodes...), g.Nodes[i:]...)...)
	return nil
}

// IndexOf returns the node's position, or -1.
func (g *Graph) IndexOf(n *Node) int {
	for i, m := range g.Nodes {
		if m == n {
			return i
		}
	}
	return -1
}

// ReplaceUses makes every use of old (node inputs and graph outputs) refer to new instead.
// It returns the number of uses replaced.
func (g *Graph) ReplaceUses(old, new *Value) int {
	count := 0
	for _, n := range g.Nodes {
		for i, in := range n.Inputs {
			if in == old {
				n.Inputs[i] = new
				count++
			}
		}
	}
	for i, o := range g.Outputs {
		if o == old {
			g.Outputs[i] = new
			count++
		}
	}
	return count
}

// Users maps each value to the nodes that read it (a node appears once per input slot).
func (g *Graph) Users() map[*Value][]*Node {
	users := map[*Value][]*Node{}
	for _, n := range g.Nodes {
		for _, in := range n.Inputs {
			users[in] = append(users[in], n)
		}
	}
	return users
}

// IsOutput reports whether v is a graph output.
func (g *Graph) IsOutput(v *Value) bool {
	for _, o := range g.Outputs {
		if o == v {
			return true
		}
	}
	return false
}

// RemoveNodes deletes the given nodes; callers make sure their outputs are unused.
func (g *Graph) RemoveNodes(dead map[*Node]bool) {
	kept := g.Nodes[:0]
	for _, n := range g.Nodes {
		if !dead[n] {
			kept = append(kept, n)
		} else {
			for _, o := range n.Outputs {
				delete(g.names, o.Name)
			}
		}
	}
	for i := len(kept); i < len(g.Nodes); i++ {
		g.Nodes[i] = nil
	}
	g.Nodes = kept
}

// Clone returns a deep copy: new values and nodes with the same names, types and attributes.
// Even a malformed graph clones without panicking: nil entries stay nil, and a reference to
// a value that is not in the graph is kept as is.
func (g *Graph) Clone() *Graph {
	c := New(g.Name)
	c.nextID = g.nextID
	m := map[*Value]*Value{}
	cloneValue := func(v *Value, producer *Node) *Value {
		if v == nil {
			return nil
		}
		nv := &Value{Name: v.Name, Type: Type{v.Type.DType, v.Type.Shape.Clone()}, Producer: producer, Index: v.Index}
		m[v] = nv
		c.names[v.Name] = true
		return nv
	}
	mapped := func(v *Value) *Value {
		if nv, ok := m[v]; ok {
			return nv
		}
		return v // nil, or a dangling reference in a malformed graph
	}
	for _, v := range g.Inputs {
		c.Inputs = append(c.Inputs, cloneValue(v, nil))
	}
	// Values first, so that a use before the definition still maps to the copy.
	for _, n := range g.Nodes {
		if n == nil {
			c.Nodes = append(c.Nodes, nil)
			continue
		}
		nn := &Node{Op: n.Op, Attrs: n.Attrs.Clone(), Scope: n.Scope}
		for _, o := range n.Outputs {
			nn.Outputs = append(nn.Outputs, cloneValue(o, nn))
		}
		c.Nodes = append(c.Nodes, nn)
	}
	for i, n := range g.Nodes {
		if n == nil {
			continue
		}
		for _, in := range n.Inputs {
			c.Nodes[i].Inputs = append(c.Nodes[i].Inputs, mapped(in))
		}
	}
	for _, o := range g.Outputs {
		c.Outputs = append(c.Outputs, mapped(o))
	}
	return c
}

// validName reports whether s can be a value name in the text form: letters, digits, '_' and '.'.
func validName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !(r == '_' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return true
}

func typeList(vs []*Value) string {
	s := "("
	for i, v := range vs {
		if i > 0 {
			s += ", "
		}
		if v == nil {
			s += "nil"
		} else {
			s += v.Type.String()
		}
	}
	return s + ")"
}
