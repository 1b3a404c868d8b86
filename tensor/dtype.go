// Package tensor holds dense host tensors and their element types. It is the data side of Loom:
// the graph IR (package graph) refers to dtypes from here, and the CPU backend computes on
// Tensor values.
package tensor

import "fmt"

// DType is an element type.
type DType uint8

// The element types Loom knows. Float16 and BFloat16 are stored as their raw 16-bit patterns.
const (
	Invalid DType = iota
	BF16
	F16
	F32
	I32
	I64
	Bool
)

var dtypeNames = [...]string{Invalid: "invalid", BF16: "bf16", F16: "f16", F32: "f32", I32: "i32", I64: "i64", Bool: "bool"}

// String returns the short name used in graph text: bf16, f16, f32, i32, i64, bool.
func (d DType) String() string {
	if int(d) < len(dtypeNames) {
		return dtypeNames[d]
	}
	return fmt.Sprintf("dtype(%d)", uint8(d))
}

// ParseDType reads a short dtype name as printed by String.
func ParseDType(s string) (DType, error) {
	for i, n := range dtypeNames {
		if n == s && DType(i) != Invalid {
			return DType(i), nil
		}
	}
	return Invalid, fmt.Errorf("unknown dtype %q (want bf16, f16, f32, i32, i64 or bool)", s)
}

// Size is the number of bytes one element takes.
func (d DType) Size() int {
	switch d {
	case BF16, F16:
		return 2
	case F32, I32:
		return 4
	case I64:
		return 8
	case Bool:
		return 1
	}
	return 0
}

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool { return d == BF16 || d == F16 || d == F32 }

// IsInt reports whether d is an integer type.
func (d DType) IsInt() bool { return d == I32 || d == I64 }
