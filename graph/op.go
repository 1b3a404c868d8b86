package graph

import (
	"fmt"
	"sort"
)

// OpSpec declares an op: its name, documentation, inputs, attributes and type inference.
// Every op is declared once, in this package's catalog (catalog_*.go); backends supply
// kernels keyed by Name.
type OpSpec struct {
	Name string
	Doc  string
	// Inputs names the inputs, for documentation and error messages. When Variadic is set the
	// last one may repeat (zero or more times beyond MinInputs).
	Inputs    []string
	Variadic  bool
	MinInputs int // with Variadic: the least number of inputs
	Attrs     []AttrSpec
	// Commutative ops give the same result with their two inputs swapped; the pattern matcher
	// tries both orders.
	Commutative bool
	// Infer computes the output types from the node's input types and attributes.
	Infer func(n *Node) ([]Type, error)
	// Decompose, set on fused ops, rebuilds the op from primitives, appending to b. Tests hold
	// every fused kernel equal to its decomposition.
	Decompose func(b *Builder, n *Node) ([]*Value, error)
	// Collective marks communication ops (all_reduce, ...); the verifier keeps them out of
	// fused regions.
	Collective bool
}

// AttrSpec declares one attribute of an op.
type AttrSpec struct {
	Name    string
	Type    AttrType
	Default any // nil: the attribute is required
	Doc     string
}

var registry = map[string]*OpSpec{}

// Register adds an op to the catalog. It panics on a duplicate or malformed declaration,
// which is a programming error found at init time.
func Register(s *OpSpec) {
	if s.Name == "" || s.Infer == nil {
		panic("graph.Register: op needs a name and an Infer function")
	}
	if _, dup := registry[s.Name]; dup {
		panic("graph.Register: duplicate op " + s.Name)
	}
	for _, a := range s.Attrs {
		if a.Default != nil && !checkAttrType(a.Type, a.Default) {
			panic(fmt.Sprintf("graph.Register: op %s attribute %s: default %v is not a %s", s.Name, a.Name, a.Default, a.Type))
		}
	}
	if !s.Variadic {
		s.MinInputs = len(s.Inputs)
	}
	registry[s.Name] = s
}

// Lookup finds an op by name.
func Lookup(name string) (*OpSpec, bool) {
	s, ok := registry[name]
	return s, ok
}

// Ops lists every registered op, sorted by name.
func Ops() []*OpSpec {
	out := make([]*OpSpec, 0, len(registry))
	for _, s := range registry {
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// Attr returns the declaration of the named attribute.
func (s *OpSpec) Attr(name string) (AttrSpec, bool) {
	for _, a := range s.Attrs {
		if a.Name == name {
			return a, true
		}
	}
	return AttrSpec{}, false
}

// checkArity verifies the number of inputs.
func (s *OpSpec) checkArity(n int) error {
	if s.Variadic {
		if n < s.MinInputs {
			return fmt.Errorf("%s takes at least %d inputs, got %d", s.Name, s.MinInputs, n)
		}
		return nil
	}
	if n != len(s.Inputs) {
		return fmt.Errorf("%s takes %d inputs (%v), got %d", s.Name, len(s.Inputs), s.Inputs, n)
	}
	return nil
}

// NormalizeAttrs checks attrs against the spec and returns a copy with defaults filled in.
// Unknown attributes, missing required ones and wrong types are errors naming the attribute.
func (s *OpSpec) NormalizeAttrs(attrs Attrs) (Attrs, error) {
	out := make(Attrs, len(s.Attrs))
	for _, k := range sortedKeys(attrs) { // sorted, so that the first error is always the same
		v := attrs[k]
		a, ok := s.Attr(k)
		if !ok {
			return nil, fmt.Errorf("%s has no attribute %q", s.Name, k)
		}
		// Accept untyped integers where a float is declared, for convenience of callers.
		if a.Type == AttrFloat {
			if i, ok := v.(int); ok {
				v = float64(i)
			}
		}
		if !checkAttrType(a.Type, v) {
			return nil, fmt.Errorf("%s attribute %s: want %s, got %T", s.Name, k, a.Type, v)
		}
		out[k] = v
	}
	for _, a := range s.Attrs {
		if _, ok := out[a.Name]; ok {
			continue
		}
		if a.Default == nil {
			return nil, fmt.Errorf("%s: missing required attribute %s (%s)", s.Name, a.Name, a.Type)
		}
		out[a.Name] = Attrs{"v": a.Default}.Clone()["v"]
	}
	return out, nil
}

// inferTypes runs the op's inference, turning a panic in it into an error so that no
// malformed node can crash a caller of this package.
func inferTypes(s *OpSpec, n *Node) (types []Type, err error) {
	defer func() {
		if r := recover(); r != nil {
			types, err = nil, fmt.Errorf("inference of %s panicked: %v", s.Name, r)
		}
	}()
	return s.Infer(n)
}
