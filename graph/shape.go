package graph

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/loom-ml/loom/tensor"
)

// Dim is one dimension of a shape: a constant size, or a symbol such as "B" (batch) or "S"
// (sequence) that is bound to a size when the graph runs.
type Dim struct {
	Sym  string // symbol name; empty for a constant dimension
	Size int    // the size when Sym is empty
}

// D returns a constant dimension.
func D(n int) Dim { return Dim{Size: n} }

// Sym returns a symbolic dimension.
func Sym(name string) Dim { return Dim{Sym: name} }

// IsSym reports whether d is symbolic.
func (d Dim) IsSym() bool { return d.Sym != "" }

func (d Dim) String() string {
	if d.Sym != "" {
		return d.Sym
	}
	return strconv.Itoa(d.Size)
}

// Shape is an ordered list of dimensions; the empty shape is a scalar.
type Shape []Dim

// Dims builds a constant shape.
func Dims(ns ...int) Shape {
	s := make(Shape, len(ns))
	for i, n := range ns {
		s[i] = D(n)
	}
	return s
}

// Rank is the number of dimensions.
func (s Shape) Rank() int { return len(s) }

// Equal reports whether two shapes have the same dimensions.
func (s Shape) Equal(o Shape) bool {
	if len(s) != len(o) {
		return false
	}
	for i := range s {
		if s[i] != o[i] {
			return false
		}
	}
	return true
}

// IsConst reports whether no dimension is symbolic.
func (s Shape) IsConst() bool {
	for _, d := range s {
		if d.IsSym() {
			return false
		}
	}
	return true
}

// Clone returns a copy.
func (s Shape) Clone() Shape { return append(Shape(nil), s...) }

func (s Shape) String() string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = d.String()
	}
	return "[" + strings.Join(parts, ",") + "]"
}

// Resolve substitutes bound symbols, giving concrete sizes.
func (s Shape) Resolve(env map[string]int) ([]int, error) {
	out := make([]int, len(s))
	for i, d := range s {
		if !d.IsSym() {
			out[i] = d.Size
			continue
		}
		v, ok := env[d.Sym]
		if !ok {
			return nil, fmt.Errorf("shape %s: symbol %s is not bound", s, d.Sym)
		}
		out[i] = v
	}
	return out, nil
}

// Type is the static type of a value: element type and shape.
type Type struct {
	DType tensor.DType
	Shape Shape
}

func (t Type) String() string { return t.DType.String() + t.Shape.String() }

// Equal reports whether dtype and shape agree.
func (t Type) Equal(o Type) bool { return t.DType == o.DType && t.Shape.Equal(o.Shape) }

// normAxis maps a possibly negative axis into [0, rank).
func normAxis(axis, rank int) (int, error) {
	a := axis
	if a < 0 {
		a += rank
	}
	if a < 0 || a >= rank {
		return 0, fmt.Errorf("axis %d out of range for rank %d", axis, rank)
	}
	return a, nil
}

// NormAxis maps a possibly negative axis into [0, rank), or fails if it is out of range.
func NormAxis(axis, rank int) (int, error) { return normAxis(axis, rank) }
