package tensor

import (
	"math"
	"testing"
)

func TestF8E4M3Values(t *testing.T) {
	for _, tc := range []struct {
		b    uint8
		want float32
	}{
		{0x00, 0}, {0x01, 1.0 / 512}, {0x07, 7.0 / 512}, {0x08, 1.0 / 64}, {0x38, 1}, {0x3C, 1.5},
		{0x7E, 448}, {0xFE, -448}, {0x40, 2}, {0xB8, -1},
	} {
		if got := F8E4M3ToF32(tc.b); got != tc.want {
			t.Errorf("F8E4M3ToF32(%#x) = %g, want %g", tc.b, got, tc.want)
		}
	}
	if !math.IsNaN(float64(F8E4M3ToF32(0x7F))) || !math.IsNaN(float64(F8E4M3ToF32(0xFF))) {
		t.Error("0x7f and 0xff must decode to NaN")
	}
}

func TestF8RoundTripAndRounding(t *testing.T) {
	for _, f := range []struct {
		name   string
		dec    func(uint8) float32
		enc    func(float32) uint8
		max    float32
		isNaN  func(uint8) bool
		finite func(uint8) bool
	}{
		{"e4m3", F8E4M3ToF32, F32ToF8E4M3, F8E4M3Max, func(b uint8) bool { return b&0x7F == 0x7F }, func(b uint8) bool { return b&0x7F != 0x7F }},
		{"e5m2", F8E5M2ToF32, F32ToF8E5M2, F8E5M2Max, func(b uint8) bool { return b&0x7F > 0x7C }, func(b uint8) bool { return b&0x7C != 0x7C }},
	} {
		// Every finite pattern encodes back to itself (negative zero included).
		var vals []float32
		for i := range 256 {
			b := uint8(i)
			if !f.finite(b) {
				continue
			}
			if got := f.enc(f.dec(b)); got != b {
				t.Errorf("%s: pattern %#x decodes to %g, which encodes to %#x", f.name, b, f.dec(b), got)
			}
			if v := f.dec(b); v >= 0 && !math.Signbit(float64(v)) {
				vals = append(vals, v)
			}
		}
		// Midpoints round to the even neighbour; just off them, to the nearer one.
		for i := 0; i+1 < len(vals); i++ {
			lo, hi := vals[i], vals[i+1]
			mid := float32((float64(lo) + float64(hi)) / 2)
			want := f.enc(lo)
			if want&1 == 1 {
				want = f.enc(hi)
			}
			if got := f.enc(mid); got != want {
				t.Errorf("%s: midpoint %g of %g and %g encodes to %#x, want the even %#x", f.name, mid, lo, hi, got, want)
			}
			if got := f.enc(math.Nextafter32(mid, 0)); got != f.enc(lo) {
				t.Errorf("%s: just below the midpoint of %g and %g: %#x", f.name, lo, hi, got)
			}
			if got := f.enc(math.Nextafter32(mid, float32(math.Inf(1)))); got != f.enc(hi) {
				t.Errorf("%s: just above the midpoint of %g and %g: %#x", f.name, lo, hi, got)
			}
		}
		// Saturation, and NaN.
		for _, big := range []float32{f.max * 1.01, f.max * 4, float32(math.Inf(1))} {
			if got := f.dec(f.enc(big)); got != f.max {
				t.Errorf("%s: %g saturates to %g, want %g", f.name, big, got, f.max)
			}
			if got := f.dec(f.enc(-big)); got != -f.max {
				t.Errorf("%s: %g saturates to %g, want %g", f.name, -big, got, -f.max)
			}
		}
		if !f.isNaN(f.enc(float32(math.NaN()))) {
			t.Errorf("%s: NaN does not stay NaN", f.name)
		}
	}
}

func TestF8TensorCast(t *testing.T) {
	x := FromF32([]float32{1, -0.3, 500, 0.001}, 2, 2)
	q := x.Cast(F8E4M3)
	if q.DType != F8E4M3 || len(q.U8) != 4 || q.Validate() != nil {
		t.Fatalf("cast: %v", q)
	}
	got := q.Float32s()
	want := []float32{1, -0.3125, 448, 0.001953125}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("element %d: %g, want %g", i, got[i], want[i])
		}
	}
	if c := q.Clone(); c.U8[2] != q.U8[2] {
		t.Error("clone lost the bytes")
	}
	if F8E4M3.Size() != 1 || F8E4M3.IsFloat() || !F8E4M3.IsFloat8() {
		t.Error("f8e4m3: size 1, not IsFloat, IsFloat8")
	}
	if d, err := ParseDType("f8e5m2"); err != nil || d != F8E5M2 {
		t.Errorf("ParseDType(f8e5m2) = %v, %v", d, err)
	}
}
