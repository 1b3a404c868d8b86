package cpu

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestSiluF32Bits holds siluF32 (the AVX2 kernel where the CPU has it) to the scalar
// expression float32(float64(x)/(1+math.Exp(-float64(x)))) bit for bit, over ranges of
// magnitudes, exp's edges (|x| near 708, where math.Exp branches), specials and every
// length from 0 to 19 (the vector loop's 8 and 4, and the scalar tail); in place too.
func TestSiluF32Bits(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	uniform := func(lo, hi float64) func() float32 {
		return func() float32 { return float32(lo + (hi-lo)*rng.Float64()) }
	}
	specials := []float32{0, float32(math.Copysign(0, -1)), 1e-45, -1e-45, 1e-38, 707.9, -707.9, 708, -708,
		708.5, -708.5, 709.7, -709.7, 709.8, -709.8, 745, -745, 746, -746, 1e30, -1e30, math.MaxFloat32,
		-math.MaxFloat32, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())}
	for _, c := range []struct {
		name string
		gen  func() float32
	}{
		{"normal", func() float32 { return float32(rng.NormFloat64()) }},
		{"small", uniform(-1e-3, 1e-3)},
		{"wide", uniform(-100, 100)},
		{"edge", uniform(-720, 720)},
		{"huge", uniform(-1e6, 1e6)},
		{"specials", func() float32 { return specials[rng.IntN(len(specials))] }},
		{"bits", func() float32 { return math.Float32frombits(rng.Uint32()) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			for n := range 20 {
				for range 200 {
					src := make([]float32, n)
					for i := range src {
						src[i] = c.gen()
					}
					dst := make([]float32, n)
					siluF32(dst, src)
					inPlace := append([]float32(nil), src...)
					siluF32(inPlace, inPlace)
					for i, x := range src {
						if math.Float32bits(inPlace[i]) != math.Float32bits(dst[i]) {
							t.Fatalf("n=%d: silu(%v) in place = %v, out of place %v", n, x, inPlace[i], dst[i])
						}
						want := float32(float64(x) / (1 + math.Exp(-float64(x))))
						if math.Float32bits(dst[i]) != math.Float32bits(want) && !(want != want && dst[i] != dst[i]) {
							t.Fatalf("n=%d: silu(%v) [%#x] = %v [%#x], want %v [%#x]", n, x, math.Float32bits(x),
								dst[i], math.Float32bits(dst[i]), want, math.Float32bits(want))
						}
					}
				}
			}
		})
	}
}

func BenchmarkSilu(b *testing.B) {
	src := make([]float32, 4864)
	for i := range src {
		src[i] = float32(i%97)/10 - 5
	}
	dst := make([]float32, len(src))
	b.Run("kernel", func(b *testing.B) {
		for b.Loop() {
			siluF32(dst, src)
		}
	})
	b.Run("scalar", func(b *testing.B) {
		for b.Loop() {
			for i, x := range src {
				dst[i] = siluScalar(x)
			}
		}
	})
}

// TestExpF64Bits holds expF64 to math.Exp bit for bit: softmax's range (x <= 0, down past
// exp's normal range), both signs, exp's edges, specials, lengths 0 to 19.
func TestExpF64Bits(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	specials := []float64{0, math.Copysign(0, -1), 707.9, -707.9, 708, -708, 709.7, 709.8, -745, -746,
		1e300, -1e300, math.Inf(1), math.Inf(-1), math.NaN(), 5e-324}
	for _, c := range []struct {
		name string
		gen  func() float64
	}{
		{"softmax", func() float64 { return -30 * rng.Float64() }},
		{"wide", func() float64 { return 1400*rng.Float64() - 700 }},
		{"edge", func() float64 { return 1500*rng.Float64() - 750 }},
		{"specials", func() float64 { return specials[rng.IntN(len(specials))] }},
		{"bits", func() float64 { return math.Float64frombits(rng.Uint64()) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			for n := range 20 {
				for range 200 {
					src := make([]float64, n)
					for i := range src {
						src[i] = c.gen()
					}
					dst := make([]float64, n)
					expF64(dst, src)
					for i, x := range src {
						want := math.Exp(x)
						if math.Float64bits(dst[i]) != math.Float64bits(want) && !(want != want && dst[i] != dst[i]) {
							t.Fatalf("n=%d: exp(%v) = %v, want %v", n, x, dst[i], want)
						}
					}
				}
			}
		})
	}
}
