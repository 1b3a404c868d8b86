//go:build amd64 && !purego

#include "textflag.h"
#include "bf16_4x2_amd64.h"

// avx2BF16Groups4x2 runs the bf16 4x2 micro-kernel of kernels_amd64.s over whole groups
// of four weight rows and blocks of four rows of x, in the order avx2Group calls it (for
// each group: for each block of x: the group's two pairs), with the same prefetches (the
// next pair's rows), and stores each sum plus +0 straight into res: no Go between calls.
// Arguments: x, xstride (bytes between rows of x), mblocks (blocks of four rows), w (the
// first group's first row), wstride (bytes between weight rows), groups, n (elements of
// each row to read, a multiple of 8), res (the output of x row 0 and weight row 0), rstride
// (bytes between rows of res).
//
// Locals: groups left 0(SP), m-blocks left 8(SP), group's w 16(SP), group's res 24(SP),
// block's x 32(SP), block's res 40(SP), pairs left 48(SP).

// func avx2BF16Groups4x2(x unsafe.Pointer, xstride, mblocks int, w unsafe.Pointer, wstride, groups, n int, res unsafe.Pointer, rstride int)
TEXT ·avx2BF16Groups4x2(SB), NOSPLIT, $56-72
	VXORPS X14, X14, X14
	MOVQ groups+40(FP), AX
	MOVQ AX, 0(SP)
	MOVQ w+24(FP), AX
	MOVQ AX, 16(SP)
	MOVQ res+56(FP), AX
	MOVQ AX, 24(SP)
g4x2_group:
	CMPQ 0(SP), $0
	JEQ g4x2_end
	MOVQ mblocks+16(FP), AX
	MOVQ AX, 8(SP)
	MOVQ x+0(FP), AX
	MOVQ AX, 32(SP)
	MOVQ 24(SP), AX
	MOVQ AX, 40(SP)
g4x2_block:
	CMPQ 8(SP), $0
	JEQ g4x2_nextgroup
	MOVQ 32(SP), SI
	MOVQ xstride+8(FP), BX
	LEAQ (SI)(BX*1), DX
	LEAQ (DX)(BX*1), R12
	LEAQ (R12)(BX*1), R13
	MOVQ 16(SP), R8
	MOVQ 40(SP), DI
	MOVQ $2, AX
	MOVQ AX, 48(SP)
g4x2_pair:
	MOVQ wstride+32(FP), BX
	LEAQ (R8)(BX*1), R9
	LEAQ (R9)(BX*1), R10
	MOVQ n+48(FP), CX
	BF16_4X2_ZERO
	XORQ AX, AX
	MOVQ CX, BX
	ANDQ $-16, BX
	CMPQ BX, $0
	JEQ g4x2k_tail
g4x2k_loop16:
	PREFETCHT0 0(R10)(AX*4)
	BF16_4X2_K8(0, 0)
	BF16_4X2_K8(16, 32)
	ADDQ $16, AX
	CMPQ AX, BX
	JLT g4x2k_loop16
g4x2k_tail:
	CMPQ AX, CX
	JGE g4x2k_done
	PREFETCHT0 0(R10)(AX*4)
	BF16_4X2_K8(0, 0)
g4x2k_done:
	VHADDPS Y1, Y0, Y12
	VHADDPS Y3, Y2, Y13
	VHADDPS Y13, Y12, Y12
	VEXTRACTF128 $1, Y12, X13
	VADDPS X13, X12, X12
	VHADDPS Y5, Y4, Y10
	VHADDPS Y7, Y6, Y11
	VHADDPS Y11, Y10, Y10
	VEXTRACTF128 $1, Y10, X11
	VADDPS X11, X10, X10
	VADDPS X14, X12, X12
	VADDPS X14, X10, X10
	VUNPCKLPS X10, X12, X8
	VUNPCKHPS X10, X12, X9
	MOVQ rstride+64(FP), BX
	VMOVQ X8, 0(DI)
	VMOVHPS X8, 0(DI)(BX*1)
	LEAQ (DI)(BX*2), R11
	VMOVQ X9, 0(R11)
	VMOVHPS X9, 0(R11)(BX*1)
	MOVQ R10, R8
	ADDQ $8, DI
	DECQ 48(SP)
	JNE g4x2_pair
	MOVQ xstride+8(FP), BX
	SHLQ $2, BX
	ADDQ BX, 32(SP)
	MOVQ rstride+64(FP), BX
	SHLQ $2, BX
	ADDQ BX, 40(SP)
	DECQ 8(SP)
	JMP g4x2_block
g4x2_nextgroup:
	MOVQ wstride+32(FP), BX
	SHLQ $2, BX
	ADDQ BX, 16(SP)
	ADDQ $16, 24(SP)
	DECQ 0(SP)
	JMP g4x2_group
g4x2_end:
	VZEROUPPER
	RET

