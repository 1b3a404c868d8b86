package tensor

import (
	"fmt"
	"unsafe"
)

// Bytes is t's storage viewed as bytes, in the host's (little-endian) order, sharing t's
// memory; nil for an empty tensor.
func Bytes(t *Tensor) []byte {
	switch t.DType {
	case F32:
		return sliceBytes(t.F32)
	case BF16, F16:
		return sliceBytes(t.Half)
	case I32:
		return sliceBytes(t.I32)
	case I64:
		return sliceBytes(t.I64)
	case Bool:
		return sliceBytes(t.Bool)
	case F8E4M3, F8E5M2:
		return sliceBytes(t.U8)
	}
	return nil
}

func sliceBytes[E any](s []E) []byte {
	if len(s) == 0 {
		return nil
	}
	var e E
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(e)))
}

// FromBytes wraps b (not copied) as a tensor of dtype dt and the given shape: b must hold
// exactly its elements, aligned to the dtype's size. Bool is refused (a Go bool must be 0 or
// 1, which bytes from elsewhere need not be).
func FromBytes(dt DType, b []byte, shape ...int) (*Tensor, error) {
	n := Numel(shape)
	if dt == Bool || dt.Size() == 0 {
		return nil, fmt.Errorf("tensor of %s over bytes: unsupported dtype", dt)
	}
	if len(b) != n*dt.Size() {
		return nil, fmt.Errorf("%s%v tensor over %d bytes: needs %d", dt, shape, len(b), n*dt.Size())
	}
	if n == 0 {
		return New(dt, shape...), nil
	}
	t := &Tensor{DType: dt, Shape: append([]int(nil), shape...)}
	p := unsafe.Pointer(&b[0])
	if uintptr(p)%uintptr(dt.Size()) != 0 {
		return nil, fmt.Errorf("%s%v tensor over bytes at %#x: not aligned to %d", dt, shape, uintptr(p), dt.Size())
	}
	switch dt {
	case F32:
		t.F32 = unsafe.Slice((*float32)(p), n)
	case BF16, F16:
		t.Half = unsafe.Slice((*uint16)(p), n)
	case I32:
		t.I32 = unsafe.Slice((*int32)(p), n)
	case I64:
		t.I64 = unsafe.Slice((*int64)(p), n)
	case F8E4M3, F8E5M2:
		t.U8 = b
	}
	return t, nil
}
