//go:build amd64 && !purego

#include "textflag.h"

// AVX kernels of the CPU paged attention (fast_paged_attention.go). Both keep the reference's
// arithmetic: every product rounded to float32, then added (VMULPS, VADDPS: no fused
// multiply-add), each output summed in the reference's order; the lanes are independent
// outputs, so the vectors change which outputs are computed together, never how one is.

// func attnScores4(qT *float32, k0, k1, k2, k3 *float32, d int, out *[32]float32)
// out[i*8+l] = sum over e in order of qT[e*8+l] * k_i[e] (qT: [d][8], one lane per head).
TEXT ·attnScores4(SB), NOSPLIT, $0-56
	MOVQ qT+0(FP), SI
	MOVQ k0+8(FP), R8
	MOVQ k1+16(FP), R9
	MOVQ k2+24(FP), R10
	MOVQ k3+32(FP), R11
	MOVQ d+40(FP), CX
	MOVQ out+48(FP), DI
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	XORQ AX, AX
sloop:
	CMPQ AX, CX
	JGE sdone
	VMOVUPS (SI), Y8
	VBROADCASTSS (R8)(AX*4), Y4
	VBROADCASTSS (R9)(AX*4), Y5
	VBROADCASTSS (R10)(AX*4), Y6
	VBROADCASTSS (R11)(AX*4), Y7
	VMULPS Y8, Y4, Y4
	VMULPS Y8, Y5, Y5
	VMULPS Y8, Y6, Y6
	VMULPS Y8, Y7, Y7
	VADDPS Y4, Y0, Y0
	VADDPS Y5, Y1, Y1
	VADDPS Y6, Y2, Y2
	VADDPS Y7, Y3, Y3
	ADDQ $32, SI
	INCQ AX
	JMP sloop
sdone:
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	VZEROUPPER
	RET

// func attnSumValues4(acc, p *float32, pstride, hs int, v0, v1, v2, v3 *float32, d int)
// For r < hs, with pr = p[r*pstride:] and ar = acc[r*d:], and every e < d (a multiple of 8):
// ar[e] = (((ar[e] + pr[0]*v0[e]) + pr[1]*v1[e]) + pr[2]*v2[e]) + pr[3]*v3[e].
TEXT ·attnSumValues4(SB), NOSPLIT, $0-72
	MOVQ acc+0(FP), DI
	MOVQ p+8(FP), SI
	MOVQ pstride+16(FP), BX
	SHLQ $2, BX
	MOVQ hs+24(FP), DX
	MOVQ v0+32(FP), R8
	MOVQ v1+40(FP), R9
	MOVQ v2+48(FP), R10
	MOVQ v3+56(FP), R11
	MOVQ d+64(FP), CX
head:
	TESTQ DX, DX
	JLE vdone
	VBROADCASTSS (SI), Y12
	VBROADCASTSS 4(SI), Y13
	VBROADCASTSS 8(SI), Y14
	VBROADCASTSS 12(SI), Y15
	XORQ AX, AX
vloop:
	CMPQ AX, CX
	JGE vnext
	VMOVUPS (DI)(AX*4), Y0
	VMULPS (R8)(AX*4), Y12, Y4
	VMULPS (R9)(AX*4), Y13, Y5
	VMULPS (R10)(AX*4), Y14, Y6
	VMULPS (R11)(AX*4), Y15, Y7
	VADDPS Y4, Y0, Y0
	VADDPS Y5, Y0, Y0
	VADDPS Y6, Y0, Y0
	VADDPS Y7, Y0, Y0
	VMOVUPS Y0, (DI)(AX*4)
	ADDQ $8, AX
	JMP vloop
vnext:
	LEAQ (DI)(CX*4), DI
	ADDQ BX, SI
	DECQ DX
	JMP head
vdone:
	VZEROUPPER
	RET
