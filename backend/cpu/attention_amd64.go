//go:build amd64 && !purego

package cpu

// The AVX kernels of attention_amd64.s, used by fast_paged_attention.go where the CPU has
// AVX2 (hasAVX2FMA; they use no fused multiply-add).

//go:noescape
func attnScores4(qT *float32, k0, k1, k2, k3 *float32, d int, out *[32]float32)

//go:noescape
func attnSumValues4(acc, p *float32, pstride, hs int, v0, v1, v2, v3 *float32, d int)

// haveAttnKernels reports whether attnScores4 and attnSumValues4 may be called.
var haveAttnKernels = hasAVX2FMA
