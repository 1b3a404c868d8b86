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
	// F8E4M3 is float8_e4m3fn (4 exponent bits, 3 mantissa bits, no infinities, max 448) and
	// F8E5M2 is float8_e5m2 (IEEE-like, max 57344): the stored dtypes of quantized weights,
	// held as raw bytes in Tensor.U8. They are not IsFloat: only the ops that declare FP8
	// inputs (dequantize_fp8, linear_fp8) read them; Float32s and Cast decode and encode them.
	F8E4M3
	F8E5M2
)

var dtypeNames = [...]string{Invalid: "invalid", BF16: "bf16", F16: "f16", F32: "f32", I32: "i32", I64: "i64", Bool: "bool", F8E4M3: "f8e4m3", F8E5M2: "f8e5m2"}

// String returns the short name used in graph text: bf16, f16, f32, i32, i64, bool, f8e4m3,
// f8e5m2.
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
	return Invalid, fmt.Errorf("unknown dtype %q (want bf16, f16, f32, i32, i64, bool, f8e4m3 or f8e5m2)", s)
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
	case Bool, F8E4M3, F8E5M2:
		return 1
	}
	return 0
}

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool { return d == BF16 || d == F16 || d == F32 }

// IsInt reports whether d is an integer type.
func (d DType) IsInt() bool { return d == I32 || d == I64 }

// IsFloat8 reports whether d is one of the 8-bit float types (F8E4M3, F8E5M2).
func (d DType) IsFloat8() bool { return d == F8E4M3 || d == F8E5M2 }
