//go:build !amd64 || purego

package cpu

// siluF32 sets dst[i] = siluScalar(src[i]) (dst and src of one length).
func siluF32(dst, src []float32) {
	dst = dst[:len(src)]
	for i, x := range src {
		dst[i] = siluScalar(x)
	}
}
