package tensor

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestF32ToF8E4M3FastMatchesReference compares the bit-manipulation encoder with
// F32ToF8E4M3 (float64 arithmetic, the reference) byte for byte on every bf16 bit pattern, on
// a stride through all float32 patterns, on the float32 neighbours of every e4m3 value and of
// every midpoint between two (where ties to even decide), and on quotients w/s as quantizing
// a row computes them.
func TestF32ToF8E4M3FastMatchesReference(t *testing.T) {
	check := func(t *testing.T, f float32) bool {
		t.Helper()
		if got, want := F32ToF8E4M3Fast(f), F32ToF8E4M3(f); got != want {
			t.Errorf("F32ToF8E4M3Fast(%g = %#08x) = %#02x, F32ToF8E4M3 gives %#02x", f, math.Float32bits(f), got, want)
			return false
		}
		return true
	}
	neighbours := func(t *testing.T, f float32) {
		t.Helper()
		b := math.Float32bits(f)
		for d := uint32(0); d <= 3; d++ {
			if !check(t, math.Float32frombits(b+d)) || !check(t, math.Float32frombits(b-d)) ||
				!check(t, -math.Float32frombits(b+d)) || !check(t, -math.Float32frombits(b-d)) {
				return
			}
		}
	}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"all bf16 patterns", func(t *testing.T) {
			for h := range 1 << 16 {
				if !check(t, BF16ToF32(uint16(h))) {
					return
				}
			}
		}},
		{"float32 patterns, stride 4093", func(t *testing.T) {
			for b := uint64(0); b < 1<<32; b += 4093 {
				if !check(t, math.Float32frombits(uint32(b))) {
					return
				}
			}
		}},
		{"e4m3 values and midpoints", func(t *testing.T) {
			for i := range 0x7F { // the finite non-negative patterns
				v := F8E4M3ToF32(uint8(i))
				neighbours(t, v)
				next := float32(F8E4M3Max) * 1.0625 // past the largest: what would be 464, the tie
				if i < 0x7E {
					next = F8E4M3ToF32(uint8(i + 1))
				}
				neighbours(t, (v+next)/2) // exact in float32
			}
			for _, f := range []float32{0, float32(math.Inf(1)), math.MaxFloat32, math.SmallestNonzeroFloat32, 1.0 / 1024, 3.0 / 1024, 1.0 / 64} {
				neighbours(t, f)
			}
			check(t, float32(math.NaN()))
			check(t, math.Float32frombits(0xFFC00001)) // a negative NaN
		}},
		{"quotients of random bf16 rows", func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, 2))
			for range 200 {
				s := float32(math.Ldexp(1+rng.Float64(), rng.IntN(40)-30)) / F8E4M3Max
				for range 1000 {
					w := BF16ToF32(F32ToBF16(float32(rng.NormFloat64()) * s * 150))
					if !check(t, w/s) {
						return
					}
				}
			}
		}},
	} {
		t.Run(tc.name, tc.run)
	}
}

// BenchmarkF32ToF8E4M3 times the reference encoder against the bit-manipulation one on values
// of a weight row's range.
func BenchmarkF32ToF8E4M3(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	vals := make([]float32, 4096)
	for i := range vals {
		vals[i] = float32(rng.NormFloat64() * 100)
	}
	out := make([]uint8, len(vals))
	b.Run("reference", func(b *testing.B) {
		for b.Loop() {
			for i, v := range vals {
				out[i] = F32ToF8E4M3(v)
			}
		}
		b.SetBytes(int64(len(vals)))
	})
	b.Run("fast", func(b *testing.B) {
		for b.Loop() {
			for i, v := range vals {
				out[i] = F32ToF8E4M3Fast(v)
			}
		}
		b.SetBytes(int64(len(vals)))
	})
}
