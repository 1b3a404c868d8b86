//go:build amd64 && !purego

package cpu

import "math"

//go:noescape
func siluAVX2(dst, src *float32, n int) (outside int)

//go:noescape
func expAVX2(dst, src *float64, n int) (outside int)

// expF64 sets dst[i] = math.Exp(src[i]) (dst and src of one length, not overlapping), the
// same bits as math.Exp: four at a time on CPUs with AVX2 and FMA (math.Exp's amd64
// arithmetic in packed form), elements outside exp's normal range and the last len%4 by
// math.Exp itself.
func expF64(dst, src []float64) {
	dst = dst[:len(src)]
	n := 0
	if hasAVX2FMA && len(src) >= 4 {
		n = len(src) &^ 3
		if expAVX2(&dst[0], &src[0], n) != 0 {
			for i, x := range src[:n] {
				if !(math.Abs(x) < 708) {
					dst[i] = math.Exp(x)
				}
			}
		}
	}
	for i := n; i < len(src); i++ {
		dst[i] = math.Exp(src[i])
	}
}

// siluF32 sets dst[i] = float32(float64(x)/(1+math.Exp(-float64(x)))) for x = src[i] (dst
// and src of one length; dst may be src, or else must not overlap it): silu in float64,
// rounded to float32, the same bits as that expression. On CPUs with AVX2 and FMA four
// elements at a time (silu_amd64.s, math.Exp's own arithmetic in packed form); elements
// outside exp's normal range, and the last len%4, by the expression itself.
func siluF32(dst, src []float32) {
	dst = dst[:len(src)]
	n := 0
	if hasAVX2FMA && len(src) >= 4 {
		n = len(src) &^ 3
		if siluAVX2(&dst[0], &src[0], n) != 0 {
			// The kernel left x where |x| >= 708 or NaN; elsewhere |silu(x)| < 708.
			for i, x := range dst[:n] {
				if !(math.Abs(float64(x)) < 708) {
					dst[i] = siluScalar(x)
				}
			}
		}
	}
	for i := n; i < len(src); i++ {
		dst[i] = siluScalar(src[i])
	}
}
