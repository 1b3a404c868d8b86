//go:build amd64 && !purego

#include "textflag.h"

// siluAVX2: dst[i] = float32(float64(x)/(1+math.Exp(-float64(x)))) for x = src[i], four
// float64 lanes at a time, two groups of four per iteration. The exponential is math.Exp's
// amd64 code (GOROOT/src/math/exp_amd64.s, its FMA path: the one it takes on every CPU with
// AVX2 and FMA) with each scalar instruction replaced by its packed twin, in the same order
// and with the same constants, so every lane rounds as math.Exp does. Lanes whose |x| is not
// below 708 (or NaN) leave exp's normal range, where math.Exp branches (overflow,
// denormals, infinities): the kernel leaves x there and reports it in its result, a mask bit
// per lane position; the caller recomputes those elements with math.Exp.

#define LOG2E 1.4426950408889634073599246810018920
#define LN2U 0.69314718055966295651160180568695068359375
#define LN2L 0.28235290563031577122588448175013436025525412068e-12

#define BCAST(name, off, val) \
	DATA name+(off+0)(SB)/8, val; \
	DATA name+(off+8)(SB)/8, val; \
	DATA name+(off+16)(SB)/8, val; \
	DATA name+(off+24)(SB)/8, val

BCAST(siluconst<>, 0, $0.5)
BCAST(siluconst<>, 32, $1.0)
BCAST(siluconst<>, 64, $2.0)
BCAST(siluconst<>, 96, $1.6666666666666666667e-1)
BCAST(siluconst<>, 128, $4.1666666666666666667e-2)
BCAST(siluconst<>, 160, $8.3333333333333333333e-3)
BCAST(siluconst<>, 192, $1.3888888888888888889e-3)
BCAST(siluconst<>, 224, $1.9841269841269841270e-4)
BCAST(siluconst<>, 256, $2.4801587301587301587e-5)
BCAST(siluconst<>, 288, $LOG2E)
BCAST(siluconst<>, 320, $LN2U)
BCAST(siluconst<>, 352, $LN2L)
BCAST(siluconst<>, 384, $0.0625)
BCAST(siluconst<>, 416, $708.0)
BCAST(siluconst<>, 448, $0x8000000000000000)
BCAST(siluconst<>, 480, $0x7fffffffffffffff)
BCAST(siluconst<>, 512, $1023)
BCAST(siluconst<>, 544, $0x7fffffff7fffffff)
BCAST(siluconst<>, 576, $0x4431000044310000)
GLOBL siluconst<>(SB), RODATA, $608

#define C05 siluconst<>+0(SB)
#define C1 siluconst<>+32(SB)
#define C2 siluconst<>+64(SB)
#define C24 siluconst<>+96(SB)
#define C32 siluconst<>+128(SB)
#define C40 siluconst<>+160(SB)
#define C48 siluconst<>+192(SB)
#define C56 siluconst<>+224(SB)
#define C64 siluconst<>+256(SB)
#define CLOG2E siluconst<>+288(SB)
#define CLN2U siluconst<>+320(SB)
#define CLN2L siluconst<>+352(SB)
#define C0625 siluconst<>+384(SB)
#define CLIMIT siluconst<>+416(SB)
#define CSIGN siluconst<>+448(SB)
#define CABS siluconst<>+480(SB)
#define CBIAS siluconst<>+512(SB)
#define CABS32 siluconst<>+544(SB)
#define CLIMIT32 siluconst<>+576(SB)

// EXP4 sets XE (four float64 lanes) to math.Exp of itself, for lanes of |x| < 708 (math.Exp's
// FMA path, instruction for instruction), using XP (temporaries) and XK/XKS (the exponent:
// an xmm and its ymm).
#define EXP4(XE, XP, XK, XKS) \
	VMULPD CLOG2E, XE, XP; \
	VCVTPD2DQY XP, XK; \
	VCVTDQ2PD XK, XP; \
	VFNMADD231PD CLN2U, XP, XE; \
	VFNMADD231PD CLN2L, XP, XE; \
	VMULPD C0625, XE, XE; \
	VMOVUPD C64, XP; \
	VFMADD213PD C56, XE, XP; \
	VFMADD213PD C48, XE, XP; \
	VFMADD213PD C40, XE, XP; \
	VFMADD213PD C32, XE, XP; \
	VFMADD213PD C24, XE, XP; \
	VFMADD213PD C05, XE, XP; \
	VFMADD213PD C1, XE, XP; \
	VMULPD XP, XE, XE; \
	VADDPD C2, XE, XP; \
	VMULPD XP, XE, XE; \
	VADDPD C2, XE, XP; \
	VMULPD XP, XE, XE; \
	VADDPD C2, XE, XP; \
	VMULPD XP, XE, XE; \
	VADDPD C2, XE, XP; \
	VFMADD213PD C1, XP, XE; \
	VPMOVSXDQ XK, XKS; \
	VPADDQ CBIAS, XKS, XKS; \
	VPSLLQ $52, XKS, XKS; \
	VMULPD XKS, XE, XE

// SILU4 computes four lanes: src (a memory operand of 4 float32) into dst (same), using
// XS (x as float32), XM (its range mask, ORed into X15), XD (x), XE (the exponential), XP
// (polynomial, temporaries), XK/XKS (the exponent: an xmm and its ymm) and XO (the result).
// Lanes outside the range store x itself, for the caller to recompute.
#define SILU4(src, dst, XS, XM, XD, XE, XP, XK, XKS, XO) \
	VMOVUPS src, XS; \
	VANDPS CABS32, XS, XM; \
	VCMPPS $5, CLIMIT32, XM, XM; \
	VORPS XM, X15, X15; \
	VCVTPS2PD XS, XD; \
	VXORPD CSIGN, XD, XE; \
	EXP4(XE, XP, XK, XKS); \
	VADDPD C1, XE, XE; \
	VDIVPD XE, XD, XE; \
	VCVTPD2PSY XE, XO; \
	VBLENDVPS XM, XS, XO, XO; \
	VMOVUPS XO, dst

// EXPPD4 sets dst (a memory operand of 4 float64) to math.Exp of src (same), with XM the
// range mask (ORed into Y15).
#define EXPPD4(src, dst, XE, XM, XP, XK, XKS) \
	VMOVUPD src, XE; \
	VANDPD CABS, XE, XM; \
	VCMPPD $5, CLIMIT, XM, XM; \
	VORPD XM, Y15, Y15; \
	EXP4(XE, XP, XK, XKS); \
	VMOVUPD XE, dst

// func expAVX2(dst, src *float64, n int) (outside int)
// dst[i] = math.Exp(src[i]) for i < n (a multiple of 4); dst and src must not overlap.
// outside has bit l set when some src at an index = l mod 4 has |x| >= 708 or is NaN: those
// dst elements are garbage.
TEXT ·expAVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VXORPD Y15, Y15, Y15
eloop8:
	CMPQ CX, $8
	JL etail4
	EXPPD4((SI), (DI), Y0, Y1, Y2, X3, Y3)
	EXPPD4(32(SI), 32(DI), Y5, Y6, Y7, X8, Y8)
	ADDQ $64, SI
	ADDQ $64, DI
	SUBQ $8, CX
	JMP eloop8
etail4:
	CMPQ CX, $4
	JL edone
	EXPPD4((SI), (DI), Y0, Y1, Y2, X3, Y3)
edone:
	VMOVMSKPD Y15, AX
	MOVQ AX, outside+24(FP)
	VZEROUPPER
	RET

// func siluAVX2(dst, src *float32, n int) (outside int)
// n is a multiple of 4; dst may be src. outside has bit l set when some element at an index
// = l mod 4 has |x| >= 708 or is NaN: those elements are left as x.
TEXT ·siluAVX2(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	VXORPS X15, X15, X15
loop8:
	CMPQ CX, $8
	JL tail4
	SILU4((SI), (DI), X10, X11, Y0, Y1, Y2, X3, Y3, X4)
	SILU4(16(SI), 16(DI), X12, X13, Y5, Y6, Y7, X8, Y8, X9)
	ADDQ $32, SI
	ADDQ $32, DI
	SUBQ $8, CX
	JMP loop8
tail4:
	CMPQ CX, $4
	JL done
	SILU4((SI), (DI), X10, X11, Y0, Y1, Y2, X3, Y3, X4)
done:
	VMOVMSKPS X15, AX
	MOVQ AX, outside+24(FP)
	VZEROUPPER
	RET
