//go:build amd64 && !purego

#include "textflag.h"

// AVX2 kernels of quantize_fp8_amd64.go: bf16 rows to f8e4m3, the same bits as
// tensor.F32ToF8E4M3Fast(bf16/s) element by element, and a bf16 row's largest magnitude.

// ENCODE8 converts the 8 bf16 at off(SI) into 8 codes (one per 32-bit lane) in dst, with the
// constants Y6-Y15 set by fp8EncodeBF16AVX2; it clobbers Y0, Y1, Y3, Y4.
#define ENCODE8(off, dst) \
	VPMOVZXWD  off(SI), Y0      \ // 8 patterns, widened
	VPSLLD     $16, Y0, Y0      \ // as float32
	VDIVPS     Y15, Y0, Y0      \ // f = w / s
	VPAND      Y14, Y0, Y1      \ // a = |f| bits
	VPSRLD     $20, Y1, dst     \
	VPAND      Y12, dst, dst    \ // the lowest kept mantissa bit
	VPADDD     Y1, dst, dst     \
	VPADDD     Y13, dst, dst    \ // + 0x7FFFF - 120<<23: round to nearest even, rebias
	VPSRLD     $20, dst, dst    \
	VPMINUD    Y11, dst, dst    \ // saturate at 0x7E (also what a subnormal wraps to)
	VADDPS     Y8, Y1, Y3       \ // a + 2^14: rounds to a multiple of 2^-9
	VPSUBD     Y8, Y3, Y3       \ // its units: the subnormal code
	VPCMPGTD   Y1, Y9, Y4       \ // a < 2^-6
	VPBLENDVB  Y4, Y3, dst, dst \
	VPSRLD     $24, Y0, Y3      \
	VPAND      Y7, Y3, Y3       \ // sign
	VPOR       Y3, dst, dst     \
	VPCMPGTD   Y6, Y1, Y4       \ // NaN
	VPBLENDVB  Y4, Y10, dst, dst

// func fp8EncodeBF16AVX2(q *uint8, row *uint16, n int, s float32)
// n is a positive multiple of 16.
TEXT ·fp8EncodeBF16AVX2(SB), NOSPLIT, $0-28
	MOVQ q+0(FP), DI
	MOVQ row+8(FP), SI
	MOVQ n+16(FP), CX
	VBROADCASTSS s+24(FP), Y15
	MOVL $0x7FFFFFFF, AX
	MOVD AX, X14
	VPBROADCASTD X14, Y14
	MOVL $0xC407FFFF, AX
	MOVD AX, X13
	VPBROADCASTD X13, Y13
	MOVL $1, AX
	MOVD AX, X12
	VPBROADCASTD X12, Y12
	MOVL $0x7E, AX
	MOVD AX, X11
	VPBROADCASTD X11, Y11
	MOVL $0x7F, AX
	MOVD AX, X10
	VPBROADCASTD X10, Y10
	MOVL $0x3C800000, AX
	MOVD AX, X9
	VPBROADCASTD X9, Y9
	MOVL $0x46800000, AX
	MOVD AX, X8
	VPBROADCASTD X8, Y8
	MOVL $0x80, AX
	MOVD AX, X7
	VPBROADCASTD X7, Y7
	MOVL $0x7F800000, AX
	MOVD AX, X6
	VPBROADCASTD X6, Y6

loop:
	ENCODE8(0, Y2)
	ENCODE8(16, Y5)
	VPACKUSDW    Y5, Y2, Y2 // per lane: Y2's 4, Y5's 4
	VPERMQ       $0xD8, Y2, Y2 // Y2's 8, then Y5's 8
	VEXTRACTI128 $1, Y2, X5
	VPACKUSWB    X5, X2, X2
	VMOVDQU      X2, (DI)
	ADDQ $32, SI
	ADDQ $16, DI
	SUBQ $16, CX
	JNZ  loop
	VZEROUPPER
	RET

// func fp8MaxBF16AVX2(row *uint16, n int, out *[16]uint16)
// n is a positive multiple of 32; out gets 16 lane maxima of the patterns with the sign cleared.
TEXT ·fp8MaxBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ row+0(FP), SI
	MOVQ n+8(FP), CX
	MOVQ out+16(FP), DI
	MOVL $0x7FFF, AX
	MOVD AX, X3
	VPBROADCASTW X3, Y3
	VPXOR Y0, Y0, Y0
	VPXOR Y1, Y1, Y1

maxloop:
	VPAND   (SI), Y3, Y4
	VPMAXUW Y4, Y0, Y0
	VPAND   32(SI), Y3, Y5
	VPMAXUW Y5, Y1, Y1
	ADDQ $64, SI
	SUBQ $32, CX
	JNZ  maxloop
	VPMAXUW Y1, Y0, Y0
	VMOVDQU Y0, (DI)
	VZEROUPPER
	RET
