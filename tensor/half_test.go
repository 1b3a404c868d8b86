package tensor

import (
	"math"
	"testing"
)

func TestBF16RoundTrip(t *testing.T) {
	for _, tc := range []struct {
		in   float32
		want float32
	}{
		{1, 1},
		{-2.5, -2.5},
		{0, 0},
		{1.00390625, 1.0},      // exactly half an ulp above 1: ties to even (down)
		{1.01171875, 1.015625}, // 1.5 ulp: ties to even (up)
		{3.14159265, 3.140625}, // ordinary rounding
		{float32(math.Inf(1)), float32(math.Inf(1))},
	} {
		if got := BF16ToF32(F32ToBF16(tc.in)); got != tc.want {
			t.Errorf("bf16(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
	if nan := BF16ToF32(F32ToBF16(float32(math.NaN()))); !math.IsNaN(float64(nan)) {
		t.Errorf("bf16(NaN) = %v, want NaN", nan)
	}
}

func TestF16RoundTrip(t *testing.T) {
	for _, tc := range []struct {
		in   float32
		want float32
	}{
		{1, 1},
		{-2.5, -2.5},
		{65504, 65504},
		{70000, float32(math.Inf(1))},
		{1.0 / (1 << 24), 1.0 / (1 << 24)}, // smallest subnormal
		{1.0 / (1 << 26), 0},
		{0.1, 0.0999755859375},
		{1 + 1.0/2048, 1}, // tie, rounds to even
	} {
		if got := F16ToF32(F32ToF16(tc.in)); got != tc.want {
			t.Errorf("f16(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
	// Every f16 bit pattern that is not NaN survives widening and narrowing unchanged.
	for h := 0; h < 1<<16; h++ {
		f := F16ToF32(uint16(h))
		if math.IsNaN(float64(f)) {
			continue
		}
		if back := F32ToF16(f); back != uint16(h) {
			t.Fatalf("f16 %#04x -> %v -> %#04x", h, f, back)
		}
	}
}

func TestCast(t *testing.T) {
	x := FromF32([]float32{1.5, -2.7, 0}, 3)
	if got := x.Cast(I32).I32; got[0] != 1 || got[1] != -2 || got[2] != 0 {
		t.Errorf("cast to i32 = %v", got)
	}
	if got := x.Cast(Bool).Bool; !got[0] || !got[1] || got[2] {
		t.Errorf("cast to bool = %v", got)
	}
	if got := x.Cast(BF16).Float32s(); got[0] != 1.5 || got[1] != -2.703125 {
		t.Errorf("cast to bf16 = %v", got)
	}
	if x.Cast(F32) != x {
		t.Errorf("cast to the same dtype should return the tensor itself")
	}
}
