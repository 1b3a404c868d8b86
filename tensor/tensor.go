package tensor

import (
	"fmt"
	"strings"
)

// Tensor is a dense, row-major host tensor. Exactly one of the storage slices is set, the one
// that matches DType: F32 for f32, Half for bf16 and f16 (raw bit patterns), I32, I64, Bool, or
// U8 for the 8-bit floats f8e4m3 and f8e5m2 (raw bit patterns).
// Storage may alias memory that the tensor does not own (a memory-mapped checkpoint, say);
// such tensors are read-only by convention.
type Tensor struct {
	DType DType
	Shape []int

	F32  []float32
	Half []uint16
	I32  []int32
	I64  []int64
	Bool []bool
	U8   []uint8
}

// Numel is the number of elements of a shape; the empty shape (a scalar) has one.
func Numel(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// New allocates a zeroed tensor.
func New(dt DType, shape ...int) *Tensor {
	t := &Tensor{DType: dt, Shape: append([]int(nil), shape...)}
	n := Numel(shape)
	switch dt {
	case F32:
		t.F32 = make([]float32, n)
	case BF16, F16:
		t.Half = make([]uint16, n)
	case I32:
		t.I32 = make([]int32, n)
	case I64:
		t.I64 = make([]int64, n)
	case Bool:
		t.Bool = make([]bool, n)
	case F8E4M3, F8E5M2:
		t.U8 = make([]uint8, n)
	}
	return t
}

// FromF32 wraps data (not copied) as an f32 tensor of the given shape.
func FromF32(data []float32, shape ...int) *Tensor {
	return &Tensor{DType: F32, Shape: append([]int(nil), shape...), F32: data}
}

// FromI32 wraps data (not copied) as an i32 tensor of the given shape.
func FromI32(data []int32, shape ...int) *Tensor {
	return &Tensor{DType: I32, Shape: append([]int(nil), shape...), I32: data}
}

// Numel is the number of elements.
func (t *Tensor) Numel() int { return Numel(t.Shape) }

// View returns elements [off, off+Numel(shape)) of t's storage as a tensor of the given
// shape that shares t's memory (writes through either show in both). The range must lie
// within t's storage.
func (t *Tensor) View(off int, shape ...int) *Tensor {
	end := off + Numel(shape)
	v := &Tensor{DType: t.DType, Shape: shape}
	switch t.DType {
	case F32:
		v.F32 = t.F32[off:end:end]
	case BF16, F16:
		v.Half = t.Half[off:end:end]
	case I32:
		v.I32 = t.I32[off:end:end]
	case I64:
		v.I64 = t.I64[off:end:end]
	case Bool:
		v.Bool = t.Bool[off:end:end]
	case F8E4M3, F8E5M2:
		v.U8 = t.U8[off:end:end]
	}
	return v
}

// Len is the length of the populated storage slice.
func (t *Tensor) Len() int {
	switch t.DType {
	case F32:
		return len(t.F32)
	case BF16, F16:
		return len(t.Half)
	case I32:
		return len(t.I32)
	case I64:
		return len(t.I64)
	case Bool:
		return len(t.Bool)
	case F8E4M3, F8E5M2:
		return len(t.U8)
	}
	return 0
}

// Validate checks that the storage matches the dtype and shape.
func (t *Tensor) Validate() error {
	if t == nil {
		return fmt.Errorf("nil tensor")
	}
	for _, d := range t.Shape {
		if d < 0 {
			return fmt.Errorf("negative dimension in shape %v", t.Shape)
		}
	}
	if t.Len() != t.Numel() {
		return fmt.Errorf("%s%v tensor holds %d elements, shape needs %d", t.DType, t.Shape, t.Len(), t.Numel())
	}
	return nil
}

// At returns element i (row-major flat index) widened to float64. Integers and bools convert.
func (t *Tensor) At(i int) float64 {
	switch t.DType {
	case F32:
		return float64(t.F32[i])
	case BF16:
		return float64(BF16ToF32(t.Half[i]))
	case F16:
		return float64(F16ToF32(t.Half[i]))
	case I32:
		return float64(t.I32[i])
	case I64:
		return float64(t.I64[i])
	case Bool:
		if t.Bool[i] {
			return 1
		}
	case F8E4M3:
		return float64(F8E4M3ToF32(t.U8[i]))
	case F8E5M2:
		return float64(F8E5M2ToF32(t.U8[i]))
	}
	return 0
}

// Float32s returns the elements as float32: the storage itself for f32 (do not modify it),
// a widened copy otherwise.
func (t *Tensor) Float32s() []float32 {
	if t.DType == F32 {
		return t.F32
	}
	out := make([]float32, t.Numel())
	switch t.DType {
	case BF16:
		for i, h := range t.Half {
			out[i] = BF16ToF32(h)
		}
	case F16:
		for i, h := range t.Half {
			out[i] = F16ToF32(h)
		}
	default:
		for i := range out {
			out[i] = float32(t.At(i))
		}
	}
	return out
}

// Int64s returns the elements as int64 (a copy unless the tensor is i64).
func (t *Tensor) Int64s() []int64 {
	if t.DType == I64 {
		return t.I64
	}
	out := make([]int64, t.Numel())
	switch t.DType {
	case I32:
		for i, v := range t.I32 {
			out[i] = int64(v)
		}
	default:
		for i := range out {
			out[i] = int64(t.At(i))
		}
	}
	return out
}

// Cast converts to another dtype, rounding floats to nearest even and truncating floats to
// integers toward zero. Casting to the same dtype returns t itself.
func (t *Tensor) Cast(dt DType) *Tensor {
	if dt == t.DType {
		return t
	}
	out := New(dt, t.Shape...)
	n := t.Numel()
	switch dt {
	case F32:
		copy(out.F32, t.Float32s())
	case BF16:
		src := t.Float32s()
		for i := range n {
			out.Half[i] = F32ToBF16(src[i])
		}
	case F16:
		src := t.Float32s()
		for i := range n {
			out.Half[i] = F32ToF16(src[i])
		}
	case I32:
		for i := range n {
			out.I32[i] = int32(t.At(i))
		}
	case I64:
		for i := range n {
			out.I64[i] = int64(t.At(i))
		}
	case Bool:
		for i := range n {
			out.Bool[i] = t.At(i) != 0
		}
	case F8E4M3:
		src := t.Float32s()
		for i := range n {
			out.U8[i] = F32ToF8E4M3(src[i])
		}
	case F8E5M2:
		src := t.Float32s()
		for i := range n {
			out.U8[i] = F32ToF8E5M2(src[i])
		}
	}
	return out
}

// Clone returns a deep copy.
func (t *Tensor) Clone() *Tensor {
	c := &Tensor{DType: t.DType, Shape: append([]int(nil), t.Shape...)}
	c.F32 = append([]float32(nil), t.F32...)
	c.Half = append([]uint16(nil), t.Half...)
	c.I32 = append([]int32(nil), t.I32...)
	c.I64 = append([]int64(nil), t.I64...)
	c.Bool = append([]bool(nil), t.Bool...)
	c.U8 = append([]uint8(nil), t.U8...)
	return c
}

// String prints dtype, shape and up to 8 leading values.
func (t *Tensor) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s%v[", t.DType, t.Shape)
	n := min(t.Numel(), 8)
	for i := range n {
		if i > 0 {
			sb.WriteString(" ")
		}
		fmt.Fprintf(&sb, "%g", t.At(i))
	}
	if t.Numel() > n {
		sb.WriteString(" ...")
	}
	sb.WriteString("]")
	return sb.String()
}

// CopyRange copies n elements of src from flat index sOff to dst at dOff; both have the
// same dtype.
func CopyRange(dst *Tensor, dOff int, src *Tensor, sOff, n int) {
	switch src.DType {
	case F32:
		copy(dst.F32[dOff:dOff+n], src.F32[sOff:sOff+n])
	case BF16, F16:
		copy(dst.Half[dOff:dOff+n], src.Half[sOff:sOff+n])
	case I32:
		copy(dst.I32[dOff:dOff+n], src.I32[sOff:sOff+n])
	case I64:
		copy(dst.I64[dOff:dOff+n], src.I64[sOff:sOff+n])
	case Bool:
		copy(dst.Bool[dOff:dOff+n], src.Bool[sOff:sOff+n])
	case F8E4M3, F8E5M2:
		copy(dst.U8[dOff:dOff+n], src.U8[sOff:sOff+n])
	}
}

// Strides returns the row-major element strides of shape.
func Strides(shape []int) []int {
	st := make([]int, len(shape))
	s := 1
	for i := len(shape) - 1; i >= 0; i-- {
		st[i] = s
		s *= shape[i]
	}
	return st
}
