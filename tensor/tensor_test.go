package tensor

import "testing"

// CopyRange copies the named elements of every dtype and leaves the others.
func TestCopyRange(t *testing.T) {
	for _, dt := range []DType{F32, BF16, F16, I32, I64, Bool} {
		src, dst := New(dt, 6), New(dt, 6)
		for i := range 6 {
			switch dt {
			case F32:
				src.F32[i] = float32(i + 1)
			case BF16, F16:
				src.Half[i] = uint16(i + 1)
			case I32:
				src.I32[i] = int32(i + 1)
			case I64:
				src.I64[i] = int64(i + 1)
			case Bool:
				src.Bool[i] = true
			}
		}
		CopyRange(dst, 1, src, 3, 2)
		for i := range 6 {
			want := 0.0
			if i == 1 || i == 2 {
				want = src.At(i + 2)
			}
			if got := dst.At(i); got != want {
				t.Errorf("%s: element %d = %v, want %v", dt, i, got, want)
			}
		}
	}
}
