package graph

import (
	"fmt"

	"github.com/loom-ml/loom/tensor"
)

// AttrType is the type of an op attribute.
type AttrType uint8

// Attribute types. Values in Attrs have these Go types: int, float64, string, bool, []int,
// []float64, Shape, tensor.DType.
const (
	AttrInt AttrType = iota + 1
	AttrFloat
	AttrString
	AttrBool
	AttrInts
	AttrFloats
	AttrShape
	AttrDType
)

func (t AttrType) String() string {
	switch t {
	case AttrInt:
		return "int"
	case AttrFloat:
		return "float"
	case AttrString:
		return "string"
	case AttrBool:
		return "bool"
	case AttrInts:
		return "ints"
	case AttrFloats:
		return "floats"
	case AttrShape:
		return "shape"
	case AttrDType:
		return "dtype"
	}
	return fmt.Sprintf("attrtype(%d)", uint8(t))
}

// Attrs holds a node's attributes by name.
type Attrs map[string]any

// Int returns an int attribute (0 if absent).
func (a Attrs) Int(name string) int { v, _ := a[name].(int); return v }

// Float returns a float attribute (0 if absent).
func (a Attrs) Float(name string) float64 { v, _ := a[name].(float64); return v }

// String returns a string attribute ("" if absent).
func (a Attrs) String(name string) string { v, _ := a[name].(string); return v }

// Bool returns a bool attribute (false if absent).
func (a Attrs) Bool(name string) bool { v, _ := a[name].(bool); return v }

// Ints returns an int-list attribute.
func (a Attrs) Ints(name string) []int { v, _ := a[name].([]int); return v }

// Floats returns a float-list attribute.
func (a Attrs) Floats(name string) []float64 { v, _ := a[name].([]float64); return v }

// Shape returns a shape attribute.
func (a Attrs) Shape(name string) Shape { v, _ := a[name].(Shape); return v }

// DType returns a dtype attribute.
func (a Attrs) DType(name string) tensor.DType { v, _ := a[name].(tensor.DType); return v }

// Clone returns a copy whose list values are copied too.
func (a Attrs) Clone() Attrs {
	c := make(Attrs, len(a))
	for k, v := range a {
		switch x := v.(type) {
		case []int:
			c[k] = append([]int(nil), x...)
		case []float64:
			c[k] = append([]float64(nil), x...)
		case Shape:
			c[k] = x.Clone()
		default:
			c[k] = v
		}
	}
	return c
}

// checkAttrType reports whether v has the Go type of t.
func checkAttrType(t AttrType, v any) bool {
	switch v.(type) {
	case int:
		return t == AttrInt
	case float64:
		return t == AttrFloat
	case string:
		return t == AttrString
	case bool:
		return t == AttrBool
	case []int:
		return t == AttrInts
	case []float64:
		return t == AttrFloats
	case Shape:
		return t == AttrShape
	case tensor.DType:
		return t == AttrDType
	}
	return false
}

// AttrEqual reports whether two attribute values are equal.
func AttrEqual(a, b any) bool {
	switch x := a.(type) {
	case []int:
		y, ok := b.([]int)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if x[i] != y[i] {
				return false
			}
		}
		return true
	case []float64:
		y, ok := b.([]float64)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if x[i] != y[i] && !(x[i] != x[i] && y[i] != y[i]) { // NaN equals NaN here
				return false
			}
		}
		return true
	case Shape:
		y, ok := b.(Shape)
		return ok && x.Equal(y)
	case float64:
		y, ok := b.(float64)
		return ok && (x == y || (x != x && y != y))
	}
	return a == b
}
