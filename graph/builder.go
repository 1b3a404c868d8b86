package graph

import (
	"fmt"

	"github.com/loom-ml/loom/tensor"
)

// Builder appends nodes to a graph. Errors are sticky: after the first one every call is a
// no-op that returns a placeholder value, and Build reports that first error. This keeps
// frontends readable: a whole layer is written without an error check per op.
type Builder struct {
	g     *Graph
	err   error
	scope string
}

// NewBuilder starts a new graph.
func NewBuilder(name string) *Builder { return &Builder{g: New(name)} }

// BuilderFor appends to an existing graph (used by transforms and decompositions).
func BuilderFor(g *Graph) *Builder { return &Builder{g: g} }

// Graph returns the graph under construction.
func (b *Builder) Graph() *Graph { return b.g }

// Err returns the first error, if any.
func (b *Builder) Err() error { return b.err }

// SetScope sets the provenance recorded on new nodes and returns the previous one.
func (b *Builder) SetScope(scope string) (prev string) {
	prev, b.scope = b.scope, scope
	return prev
}

// Scope returns the current provenance scope.
func (b *Builder) Scope() string { return b.scope }

// Fail records an error (the first one wins).
func (b *Builder) Fail(err error) {
	if b.err == nil && err != nil {
		b.err = err
	}
}

func (b *Builder) placeholder() *Value { return &Value{Name: "invalid"} }

// Input declares a graph input.
func (b *Builder) Input(name string, dt tensor.DType, shape Shape) *Value {
	if b.err != nil {
		return b.placeholder()
	}
	v, err := b.g.AddInput(name, Type{dt, shape})
	if err != nil {
		b.Fail(err)
		return b.placeholder()
	}
	return v
}

// Apply appends a node and returns all its outputs.
func (b *Builder) Apply(op string, attrs Attrs, inputs ...*Value) []*Value {
	if b.err != nil {
		return []*Value{b.placeholder(), b.placeholder(), b.placeholder(), b.placeholder()}
	}
	n, err := b.g.Append(op, attrs, inputs, b.scope)
	if err != nil {
		where := ""
		if b.scope != "" {
			where = " in " + b.scope
		}
		b.Fail(fmt.Errorf("build %s%s: %w", op, where, err))
		return b.Apply(op, attrs, inputs...)
	}
	return n.Outputs
}

// Op appends a single-output node and returns its output.
func (b *Builder) Op(op string, attrs Attrs, inputs ...*Value) *Value {
	return b.Apply(op, attrs, inputs...)[0]
}

// Named appends a single-output node whose output gets the given name (if free).
func (b *Builder) Named(name, op string, attrs Attrs, inputs ...*Value) *Value {
	if b.err != nil {
		return b.placeholder()
	}
	n, err := b.g.Append(op, attrs, inputs, b.scope, name)
	if err != nil {
		b.Fail(fmt.Errorf("build %s: %w", op, err))
		return b.placeholder()
	}
	return n.Out()
}

// Output marks values as graph outputs.
func (b *Builder) Output(vs ...*Value) {
	if b.err != nil {
		return
	}
	b.g.Outputs = append(b.g.Outputs, vs...)
}

// Build verifies and returns the graph.
func (b *Builder) Build() (*Graph, error) {
	if b.err != nil {
		return nil, b.err
	}
	if err := Verify(b.g); err != nil {
		return nil, err
	}
	return b.g, nil
}
