package tensor

import "math"

// F32ToF8E4M3Fast is F32ToF8E4M3 by bit manipulation instead of float64 arithmetic: the same
// byte for every float32 (round to nearest, ties to even; saturating at ±448; NaN -> 0x7F), a
// few integer operations instead of Frexp, Ldexp and RoundToEven. Quantizing while loading
// converts every weight with it.
//
// Normal results (|f| >= 2^-6, the smallest normal e4m3) keep the float32's top bits: the
// exponent rebiased from 127 to 7 is a subtraction of 120<<3 from bits>>20, and rounding the 20
// dropped mantissa bits to nearest even is an addition before the shift (a carry into the
// exponent is the correct next binade) and anything that rounds past 448, infinities included,
// saturates to 448's pattern. Subnormal results are multiples of 2^-9: adding 2^14,
// whose float32 unit in the last place is 2^-9, rounds |f| to that grid, ties to even, in one
// float32 addition, and the units are the low bits of the sum.
func F32ToF8E4M3Fast(f float32) uint8 {
	b := math.Float32bits(f)
	a := b & 0x7FFFFFFF
	if a > 0x7F800000 { // NaN
		return 0x7F
	}
	var r uint32
	if a >= 0x3C800000 { // >= 2^-6: normal, or saturated at 0x7E (448) from 464 up
		r = min((a+0x7FFFF+(a>>20)&1)>>20-120<<3, 0x7E)
	} else { // float32 addition rounds to a multiple of 2^-9
		r = math.Float32bits(math.Float32frombits(a)+(1<<14)) - 0x46800000
	}
	return uint8(b>>24)&0x80 | uint8(r)
}
