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

// View shares the storage of its range, for every dtype.
func TestView(t *testing.T) {
	for _, dt := range []DType{F32, BF16, F16, I32, I64, Bool, F8E4M3, F8E5M2} {
		x := New(dt, 3, 4)
		v := x.View(4, 2, 2)
		if v.DType != dt || v.Numel() != 4 || v.Len() != 4 {
			t.Fatalf("%s: view %s%v of %d elements", dt, v.DType, v.Shape, v.Len())
		}
		other := FromF32([]float32{0, 0, 0, 1}, 4).Cast(dt)
		CopyRange(v, 0, other, 0, 4) // writes x's elements 4..7
		if got, want := x.At(7), other.At(3); got != want || x.At(8) != 0 {
			t.Errorf("%s: x[7] = %v after writing through the view, want %v (x[8] %v)", dt, got, want, x.At(8))
		}
	}
}
