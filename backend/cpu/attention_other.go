//go:build !amd64 || purego

package cpu

// haveAttnKernels: no attention kernels in this build (not amd64, or purego).
const haveAttnKernels = false

func attnScores4(qT *float32, k0, k1, k2, k3 *float32, d int, out *[32]float32) {
	panic("cpu: attnScores4 without AVX")
}

func attnSumValues4(acc, p *float32, pstride, hs int, v0, v1, v2, v3 *float32, d int) {
	panic("cpu: attnSumValues4 without AVX")
}
