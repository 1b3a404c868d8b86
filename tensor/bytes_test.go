package tensor

import (
	"strings"
	"testing"
)

// FromBytes(Bytes(t)) is t, sharing its memory; bad lengths, misaligned bytes and bool are
// errors naming the problem.
func TestBytesRoundTrip(t *testing.T) {
	for _, src := range []*Tensor{
		FromF32([]float32{1.5, -2, 3}, 3),
		{DType: BF16, Shape: []int{2, 2}, Half: []uint16{0x3f80, 0x4000, 0xbf80, 0}},
		{DType: F16, Shape: []int{1}, Half: []uint16{0x3c00}},
		FromI32([]int32{7, -7}, 2, 1),
		{DType: I64, Shape: []int{2}, I64: []int64{1 << 40, -3}},
		{DType: F8E4M3, Shape: []int{3}, U8: []uint8{1, 2, 0x7e}},
	} {
		b := Bytes(src)
		if len(b) != src.Numel()*src.DType.Size() {
			t.Fatalf("%s: %d bytes, want %d", src, len(b), src.Numel()*src.DType.Size())
		}
		got, err := FromBytes(src.DType, b, src.Shape...)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		for i := range src.Numel() {
			if got.At(i) != src.At(i) {
				t.Fatalf("%s: element %d is %v, want %v", src, i, got.At(i), src.At(i))
			}
		}
		b[0] ^= 1 // shared memory: a write through the bytes shows in both
		if got.At(0) != src.At(0) || Bytes(got)[0] != b[0] {
			t.Errorf("%s: FromBytes copied the storage", src)
		}
	}
	if b := Bytes(New(F32, 0)); b != nil {
		t.Errorf("empty tensor: %d bytes", len(b))
	}
	if z, err := FromBytes(F32, nil, 0, 4); err != nil || z.Validate() != nil {
		t.Errorf("empty tensor over no bytes: %v", err)
	}
	buf := make([]int64, 2) // 8-aligned: bytes from offset 1 are not
	for _, c := range []struct {
		dt    DType
		b     []byte
		shape []int
		want  string
	}{
		{F32, Bytes(&Tensor{DType: I64, I64: buf})[:8], []int{3}, "f32[3] tensor over 8 bytes: needs 12"},
		{Bool, make([]byte, 2), []int{2}, "unsupported dtype"},
		{F32, Bytes(&Tensor{DType: I64, I64: buf})[1:9], []int{2}, "not aligned to 4"},
	} {
		_, err := FromBytes(c.dt, c.b, c.shape...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("FromBytes(%s, %d bytes, %v) = %v, want an error with %q", c.dt, len(c.b), c.shape, err, c.want)
		}
	}
}
