package safetensors

import (
	"encoding/binary"
	"math"

	"github.com/loom-ml/loom/tensor"
)

// littleEndian reports whether the host stores integers little-endian, as safetensors does;
// then tensor storage can be filled and written as raw bytes.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// nativeBytes returns the storage of t viewed as bytes, when that view is the safetensors
// encoding (a little-endian host and a dtype other than bool).
func nativeBytes(t *tensor.Tensor) ([]byte, bool) {
	if !littleEndian || t.DType == tensor.Bool || t.DType.Size() == 0 {
		return nil, false
	}
	if b := tensor.Bytes(t); b != nil {
		return b, true
	}
	return []byte{}, true
}

// decodeLE fills t's storage from little-endian bytes.
func decodeLE(t *tensor.Tensor, b []byte) {
	le := binary.LittleEndian
	switch t.DType {
	case tensor.F32:
		for i := range t.F32 {
			t.F32[i] = math.Float32frombits(le.Uint32(b[4*i:]))
		}
	case tensor.BF16, tensor.F16:
		for i := range t.Half {
			t.Half[i] = le.Uint16(b[2*i:])
		}
	case tensor.I32:
		for i := range t.I32 {
			t.I32[i] = int32(le.Uint32(b[4*i:]))
		}
	case tensor.I64:
		for i := range t.I64 {
			t.I64[i] = int64(le.Uint64(b[8*i:]))
		}
	case tensor.Bool:
		for i := range t.Bool {
			t.Bool[i] = b[i] != 0
		}
	case tensor.F8E4M3, tensor.F8E5M2:
		copy(t.U8, b)
	}
}

// encodeLE returns t's elements as little-endian bytes (t's own storage when possible).
func encodeLE(t *tensor.Tensor) []byte {
	if b, ok := nativeBytes(t); ok {
		return b
	}
	b := make([]byte, t.Len()*t.DType.Size())
	le := binary.LittleEndian
	switch t.DType {
	case tensor.F32:
		for i, v := range t.F32 {
			le.PutUint32(b[4*i:], math.Float32bits(v))
		}
	case tensor.BF16, tensor.F16:
		for i, v := range t.Half {
			le.PutUint16(b[2*i:], v)
		}
	case tensor.I32:
		for i, v := range t.I32 {
			le.PutUint32(b[4*i:], uint32(v))
		}
	case tensor.I64:
		for i, v := range t.I64 {
			le.PutUint64(b[8*i:], uint64(v))
		}
	case tensor.Bool:
		for i, v := range t.Bool {
			if v {
				b[i] = 1
			}
		}
	case tensor.F8E4M3, tensor.F8E5M2:
		copy(b, t.U8)
	}
	return b
}
