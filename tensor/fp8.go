package tensor

import "math"

// The 8-bit float formats of FP8 checkpoints (the OCP 8-bit floating point specification, as
// PyTorch's float8_e4m3fn and float8_e5m2 implement it):
//
//	e4m3fn  sign, 4 exponent bits (bias 7), 3 mantissa bits; subnormals; no infinities; the
//	        all-ones pattern S.1111.111 is NaN, so the largest finite value is 448
//	e5m2    sign, 5 exponent bits (bias 15), 2 mantissa bits; IEEE-like: infinities and NaNs
//	        at exponent 31; the largest finite value is 57344
//
// Decoding is exact (a table of the 256 values). Encoding rounds to the nearest
// representable value, ties to even, and saturates: magnitudes beyond the largest finite
// value (infinities included) become it, as quantizers clamp before they cast; NaN stays NaN.

// F8E4M3Max and F8E5M2Max are the largest finite values of the two formats.
const (
	F8E4M3Max = 448
	F8E5M2Max = 57344
)

var e4m3Table, e5m2Table [256]float32

func init() {
	for i := range 256 {
		e4m3Table[i] = decodeF8(uint8(i), 3, 7, false)
		e5m2Table[i] = decodeF8(uint8(i), 2, 15, true)
	}
}

// decodeF8 decodes an 8-bit float with mbits mantissa bits and the given exponent bias;
// ieee selects e5m2's infinities and NaNs (exponent all ones) over e4m3fn's single NaN.
func decodeF8(b uint8, mbits int, bias int, ieee bool) float32 {
	ebits := 7 - mbits
	sign := 1.0
	if b&0x80 != 0 {
		sign = -1
	}
	e := int(b>>mbits) & (1<<ebits - 1)
	m := int(b) & (1<<mbits - 1)
	switch {
	case ieee && e == 1<<ebits-1:
		if m == 0 {
			return float32(math.Inf(int(sign)))
		}
		return float32(math.NaN())
	case !ieee && e == 1<<ebits-1 && m == 1<<mbits-1:
		return float32(math.NaN())
	case e == 0:
		return float32(sign * math.Ldexp(float64(m), 1-bias-mbits))
	}
	return float32(sign * math.Ldexp(float64(m+1<<mbits), e-bias-mbits))
}

// F8E4M3ToF32 widens a float8_e4m3fn bit pattern to float32 exactly.
func F8E4M3ToF32(b uint8) float32 { return e4m3Table[b] }

// F8E5M2ToF32 widens a float8_e5m2 bit pattern to float32 exactly.
func F8E5M2ToF32(b uint8) float32 { return e5m2Table[b] }

// F8E4M3Table returns the 256 float32 values of the float8_e4m3fn bit patterns (shared; do
// not modify), for kernels that decode by table.
func F8E4M3Table() *[256]float32 { return &e4m3Table }

// F8E5M2Table is F8E4M3Table for float8_e5m2.
func F8E5M2Table() *[256]float32 { return &e5m2Table }

// F32ToF8E4M3 rounds a float32 to the nearest float8_e4m3fn, ties to even, saturating at ±448.
func F32ToF8E4M3(f float32) uint8 { return encodeF8(f, 3, 7, F8E4M3Max, 0x7F) }

// F32ToF8E5M2 rounds a float32 to the nearest float8_e5m2, ties to even, saturating at
// ±57344.
func F32ToF8E5M2(f float32) uint8 { return encodeF8(f, 2, 15, F8E5M2Max, 0x7F) }

// encodeF8 rounds f to the nearest value of the format (mbits mantissa bits, exponent bias),
// ties to even, saturating at max; nan is the format's NaN pattern. The arithmetic is exact
// in float64: every step scales by a power of two.
func encodeF8(f float32, mbits, bias int, maxVal float64, nan uint8) uint8 {
	if f != f {
		return nan
	}
	var sign uint8
	if math.Signbit(float64(f)) {
		sign = 0x80
	}
	a := math.Abs(float64(f))
	if a >= maxVal {
		return sign | encodeF8Finite(maxVal, mbits, bias)
	}
	return sign | encodeF8Finite(a, mbits, bias)
}

// encodeF8Finite encodes a magnitude 0 <= a < max (or max itself).
func encodeF8Finite(a float64, mbits, bias int) uint8 {
	minNormal := math.Ldexp(1, 1-bias)
	if a < minNormal {
		// Subnormal (or zero): units of 2^(1-bias-mbits); rounding up to 1<<mbits units gives
		// exactly the smallest normal's pattern.
		return uint8(math.RoundToEven(math.Ldexp(a, bias+mbits-1)))
	}
	_, exp := math.Frexp(a) // a = frac * 2^exp, frac in [0.5, 1)
	e := exp - 1            // a in [2^e, 2^(e+1))
	q := math.RoundToEven(math.Ldexp(a, mbits-e))
	if q == float64(int(1)<<(mbits+1)) {
		q /= 2
		e++
	}
	return uint8(e+bias)<<mbits | uint8(int(q)-1<<mbits)
}
