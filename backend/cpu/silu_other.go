//go:build !amd64 || purego

package cpu

import "math"

// siluF32 sets dst[i] = siluScalar(src[i]) (dst and src of one length).
func siluF32(dst, src []float32) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = siluScalar(x)
	}
}

// expF64 sets dst[i] = math.Exp(src[i]) (dst and src of one length).
func expF64(dst, src []float64) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = math.Exp(x)
	}
}
