//go:build ignore

// kernels_avx512_gen writes kernels_avx512_amd64.s, the AVX512-BF16 micro-kernels of the
// avx512bf16 kernel set (see kernels_avx512_amd64.go): go run kernels_avx512_gen.go.
//
// Go's assembler has no AVX512-BF16 mnemonics, so VDPBF16PS and VCVTNEPS2BF16 are written
// as the bytes of their register forms (EVEX.512.F3.0F38.W0 52 /r and 72 /r), each with the
// instruction in Go's operand order as its comment; everything else is ordinary Go assembly.
package main

import (
	"bytes"
	"fmt"
	"os"
)

// evex returns the bytes of a register-register EVEX.512 instruction of map 0F38, W0, with
// prefix pp (2: F3), opcode op, ModRM.reg d, EVEX.vvvv v and ModRM.rm rm (register numbers
// 0-31; the high bits go to R, R', V', B and X, inverted, as EVEX wants them).
func evex(pp, op, d, v, rm int) []byte {
	inv := func(b int) int { return ^b & 1 }
	p0 := inv(d>>3)<<7 | inv(rm>>4)<<6 | inv(rm>>3)<<5 | inv(d>>4)<<4 | 2 // map 0F38
	p1 := (^v&0xF)<<3 | 1<<2 | pp                                         // W0
	p2 := 2<<5 | inv(v>>4)<<3                                             // L'L = 512, no mask
	return []byte{0x62, byte(p0), byte(p1), byte(p2), byte(op), byte(0xC0 | (d&7)<<3 | rm&7)}
}

var out bytes.Buffer

func p(format string, args ...any) { fmt.Fprintf(&out, format+"\n", args...) }

func raw(b []byte, comment string) {
	s := ""
	for i, x := range b {
		if i > 0 {
			s += "; "
		}
		s += fmt.Sprintf("BYTE $0x%02x", x)
	}
	p("\t%s // %s", s, comment)
}

// dp: acc (Z) += the bf16 pair products of a and b (Z), lane by lane.
func dp(acc, a, b int) {
	raw(evex(2, 0x52, acc, a, b), fmt.Sprintf("VDPBF16PS Z%d, Z%d, Z%d", b, a, acc))
}

// cvt: Y dst = the 16 floats of Z src rounded to bf16.
func cvt(dst, src int) {
	raw(evex(2, 0x72, dst, 0, src), fmt.Sprintf("VCVTNEPS2BF16 Z%d, Y%d", src, dst))
}

var xRegs = []string{"SI", "DX", "R12", "R13"}
var wRegs = []string{"R8", "R9", "R10", "R11"}

// reduce sums the 16 lanes of each accumulator Z0..Z(n-1) (n = 4 or 16) pairwise,
// v8[i] = l[i]+l[i+8], v4[i] = v8[i]+v8[i+4], v2[i] = v4[i]+v4[i+2], s = v2[0]+v2[1], and
// leaves in Z16 element 4q+e the sum of accumulator 4e+q (n = 16), or of accumulator q for
// every e (n = 4).
func reduce(n int) {
	p("\t// v8: accumulator pairs (a, b) -> [a.lo+a.hi | b.lo+b.hi]")
	c := []int{}
	for a := 0; a < n; a += 2 {
		d := 16 + a/2 // C registers Z16.. (n/2 of them)
		p("\tVSHUFF32X4 $0x44, Z%d, Z%d, Z30", a+1, a)
		p("\tVSHUFF32X4 $0xEE, Z%d, Z%d, Z31", a+1, a)
		p("\tVADDPS Z31, Z30, Z%d", d)
		c = append(c, d)
	}
	p("\t// v4: C pairs -> one 128-bit lane per accumulator")
	g := []int{}
	for i := 0; i < len(c); i += 2 {
		d := 24 + i/2 // G registers Z24..
		p("\tVSHUFF32X4 $0x88, Z%d, Z%d, Z30", c[i+1], c[i])
		p("\tVSHUFF32X4 $0xDD, Z%d, Z%d, Z31", c[i+1], c[i])
		p("\tVADDPS Z31, Z30, Z%d", d)
		g = append(g, d)
	}
	for len(g) < 4 {
		g = append(g, g[0])
	}
	p("\t// v2 and s within each 128-bit lane")
	p("\tVSHUFPS $0x44, Z%d, Z%d, Z30", g[1], g[0])
	p("\tVSHUFPS $0xEE, Z%d, Z%d, Z31", g[1], g[0])
	p("\tVADDPS Z31, Z30, Z20")
	p("\tVSHUFPS $0x44, Z%d, Z%d, Z30", g[3], g[2])
	p("\tVSHUFPS $0xEE, Z%d, Z%d, Z31", g[3], g[2])
	p("\tVADDPS Z31, Z30, Z21")
	p("\tVSHUFPS $0x88, Z21, Z20, Z30")
	p("\tVSHUFPS $0xDD, Z21, Z20, Z31")
	p("\tVADDPS Z31, Z30, Z16")
}

// kernel writes the rows x cols micro-kernel (rows of x: 4 or 1; weight rows: 4).
func kernel(rows int) {
	name := fmt.Sprintf("bf16dp%dx4", rows)
	nacc := 4 * rows
	if rows == 4 {
		p("// func %s(x0, x1, x2, x3, w0, w1, w2, w3 unsafe.Pointer, pf uintptr, n int, out *[16]float32)", name)
		p("TEXT ·%s(SB), NOSPLIT, $0-88", name)
		for i, r := range xRegs {
			p("\tMOVQ x%d+%d(FP), %s", i, 8*i, r)
		}
		for i, r := range wRegs {
			p("\tMOVQ w%d+%d(FP), %s", i, 32+8*i, r)
		}
		p("\tMOVQ n+72(FP), DI")
	} else {
		p("// func %s(x, w0, w1, w2, w3 unsafe.Pointer, pf uintptr, n int, out *[16]float32)", name)
		p("TEXT ·%s(SB), NOSPLIT, $0-64", name)
		p("\tMOVQ x+0(FP), SI")
		for i, r := range wRegs {
			p("\tMOVQ w%d+%d(FP), %s", i, 8+8*i, r)
		}
		p("\tMOVQ n+48(FP), DI")
	}
	pfOff := 64
	if rows == 1 {
		pfOff = 40
	}
	p("\t// K1: the n%%32 elements of the last block")
	p("\tMOVQ DI, CX")
	p("\tANDQ $31, CX")
	p("\tMOVL $1, BX")
	p("\tSHLL CX, BX")
	p("\tDECL BX")
	p("\tKMOVD BX, K1")
	p("\tMOVQ DI, BX")
	p("\tANDQ $-32, BX")
	p("\tMOVQ pf+%d(FP), CX", pfOff)
	for a := range nacc {
		p("\tVPXORD Z%d, Z%d, Z%d", a, a, a)
	}
	p("\tXORQ AX, AX")
	body := func(masked bool) {
		for r, reg := range wRegs {
			if masked {
				p("\tVMOVDQU16.Z 0(%s)(AX*2), K1, Z%d", reg, 16+r)
			} else {
				p("\tVMOVDQU16 0(%s)(AX*2), Z%d", reg, 16+r)
			}
		}
		if rows == 1 {
			p("\tVMOVDQU16 0(SI)(AX*2), Z20")
			for r := range 4 {
				dp(r, 20, 16+r)
			}
			return
		}
		for i, reg := range xRegs {
			p("\tVMOVDQU16 0(%s)(AX*2), Z%d", reg, 20+i)
		}
		for r := range 4 {
			for i := range 4 {
				dp(4*r+i, 20+i, 16+r)
			}
		}
	}
	p("%s_loop:", name)
	p("\tCMPQ AX, BX")
	p("\tJGE %s_tail", name)
	for l := range 4 {
		p("\tPREFETCHT0 %d(CX)(AX*8)", 64*l)
	}
	body(false)
	p("\tADDQ $32, AX")
	p("\tJMP %s_loop", name)
	p("%s_tail:", name)
	p("\tCMPQ AX, DI")
	p("\tJGE %s_done", name)
	body(true)
	p("%s_done:", name)
	reduce(nacc)
	p("\tMOVQ out+%d(FP), DI", pfOff+16)
	p("\tVMOVUPS Z16, 0(DI)")
	p("\tVZEROUPPER")
	p("\tRET")
	p("")
}

// fmaKernel writes an AVX-512F micro-kernel of the avx512 set: rows (4 or 1) rows of f32 x
// against 4 weight rows, bf16 (half) or f32, 16 lanes a output of fused multiply-adds over
// blocks of 16 elements, the last block read with zero-masking loads.
func fmaKernel(rows int, half bool) {
	w := "F32"
	if half {
		w = "BF16"
	}
	name := fmt.Sprintf("avx512%sx%dx4", w, rows)
	nacc := 4 * rows
	if rows == 4 {
		p("// func %s(x0, x1, x2, x3, w0, w1, w2, w3 unsafe.Pointer, pf uintptr, n int, out *[16]float32)", name)
		p("TEXT ·%s(SB), NOSPLIT, $0-88", name)
		for i, r := range xRegs {
			p("\tMOVQ x%d+%d(FP), %s", i, 8*i, r)
		}
		for i, r := range wRegs {
			p("\tMOVQ w%d+%d(FP), %s", i, 32+8*i, r)
		}
		p("\tMOVQ n+72(FP), DI")
	} else {
		p("// func %s(x, w0, w1, w2, w3 unsafe.Pointer, pf uintptr, n int, out *[16]float32)", name)
		p("TEXT ·%s(SB), NOSPLIT, $0-64", name)
		p("\tMOVQ x+0(FP), SI")
		for i, r := range wRegs {
			p("\tMOVQ w%d+%d(FP), %s", i, 8+8*i, r)
		}
		p("\tMOVQ n+48(FP), DI")
	}
	pfOff := 64
	if rows == 1 {
		pfOff = 40
	}
	p("\t// K1: the n%%16 elements of the last block")
	p("\tMOVQ DI, CX")
	p("\tANDQ $15, CX")
	p("\tMOVL $1, BX")
	p("\tSHLL CX, BX")
	p("\tDECL BX")
	p("\tKMOVW BX, K1")
	p("\tMOVQ DI, BX")
	p("\tANDQ $-16, BX")
	p("\tMOVQ pf+%d(FP), CX", pfOff)
	for a := range nacc {
		p("\tVPXORD Z%d, Z%d, Z%d", a, a, a)
	}
	p("\tXORQ AX, AX")
	xr := xRegs[:rows]
	body := func(masked bool) {
		mask := ""
		if masked {
			mask = ".Z"
		}
		k := ""
		if masked {
			k = " K1,"
		}
		for r, reg := range wRegs {
			if half {
				p("\tVPMOVZXWD%s 0(%s)(AX*2),%s Z%d", mask, reg, k, 16+r)
				p("\tVPSLLD $16, Z%d, Z%d", 16+r, 16+r)
			} else {
				p("\tVMOVUPS%s 0(%s)(AX*4),%s Z%d", mask, reg, k, 16+r)
			}
		}
		for i, reg := range xr {
			p("\tVMOVUPS%s 0(%s)(AX*4),%s Z%d", mask, reg, k, 20+i)
		}
		for r := range 4 {
			for i := range xr {
				p("\tVFMADD231PS Z%d, Z%d, Z%d", 16+r, 20+i, rows*r+i)
			}
		}
	}
	p("%s_loop:", name)
	p("\tCMPQ AX, BX")
	p("\tJGE %s_tail", name)
	size := 4
	if half {
		size = 2
	}
	// 4 rows x 16 elements x size bytes a block: size cache lines, CX moving on.
	for l := range size {
		p("\tPREFETCHT0 %d(CX)", 64*l)
	}
	body(false)
	p("\tADDQ $%d, CX", 64*size)
	p("\tADDQ $16, AX")
	p("\tJMP %s_loop", name)
	p("%s_tail:", name)
	p("\tCMPQ AX, DI")
	p("\tJGE %s_done", name)
	body(true)
	p("%s_done:", name)
	reduce(nacc)
	p("\tMOVQ out+%d(FP), DI", pfOff+16)
	p("\tVMOVUPS Z16, 0(DI)")
	p("\tVZEROUPPER")
	p("\tRET")
	p("")
}

func main() {
	p("// Code generated by kernels_avx512_gen.go; DO NOT EDIT.")
	p("")
	p("//go:build amd64 && !purego")
	p("")
	p(`#include "textflag.h"`)
	p("")
	p("// AVX512-BF16 micro-kernels of the avx512bf16 kernel set (see kernels_avx512_amd64.go).")
	p("// x rows are bf16 with zeros after the first n elements up to a multiple of 32 (the")
	p("// rounded scratch rows); weight rows are bf16 and read only up to n (the last block with")
	p("// a zero-masking load). Accumulator a (16 f32 lanes; lane l sums the pairs 2l, 2l+1 of")
	p("// each block of 32 with VDPBF16PS, block after block) of the 4x4 kernel is x_i·w_r with")
	p("// a = 4r+i, of the 1x4 kernel x·w_a; each is summed pairwise (see reduce in the")
	p("// generator) and out[4i+r] = x_i·w_r (4x4), out[4r+e] = x·w_r for every e (1x4). Both")
	p("// prefetch from pf on as many bytes as the four weight rows hold (the next group's rows).")
	p("")
	kernel(4)
	kernel(1)
	p("// AVX-512F micro-kernels of the avx512 kernel set: x rows f32, weight rows bf16 (widened")
	p("// exactly) or f32, n elements each, the last n%16 read with zero-masking loads. Accumulator")
	p("// a (16 lanes; lane l sums the products of k = l mod 16 in k order with fused multiply-adds)")
	p("// is x_i·w_r with a = 4r+i (4x4) or x·w_a (1x4), summed pairwise and stored as the bf16")
	p("// kernels store theirs; the prefetches likewise.")
	p("")
	for _, half := range []bool{true, false} {
		fmaKernel(4, half)
		fmaKernel(1, half)
	}
	p("// func bf16Round(dst *uint16, src *float32, n int)")
	p("// dst[i] = src[i] rounded to bf16 by VCVTNEPS2BF16 (nearest even; denormals to zero) for")
	p("// i < n; the last block of 16 is stored whole, zeros after n (dst must have room).")
	p("TEXT ·bf16Round(SB), NOSPLIT, $0-24")
	p("\tMOVQ dst+0(FP), DI")
	p("\tMOVQ src+8(FP), SI")
	p("\tMOVQ n+16(FP), DX")
	p("\tMOVQ DX, CX")
	p("\tANDQ $15, CX")
	p("\tMOVL $1, BX")
	p("\tSHLL CX, BX")
	p("\tDECL BX")
	p("\tKMOVW BX, K1")
	p("\tMOVQ DX, BX")
	p("\tANDQ $-16, BX")
	p("\tXORQ AX, AX")
	p("bf16Round_loop:")
	p("\tCMPQ AX, BX")
	p("\tJGE bf16Round_tail")
	p("\tVMOVUPS 0(SI)(AX*4), Z1")
	cvt(2, 1)
	p("\tVMOVDQU Y2, 0(DI)(AX*2)")
	p("\tADDQ $16, AX")
	p("\tJMP bf16Round_loop")
	p("bf16Round_tail:")
	p("\tCMPQ AX, DX")
	p("\tJGE bf16Round_done")
	p("\tVMOVUPS.Z 0(SI)(AX*4), K1, Z1")
	cvt(2, 1)
	p("\tVMOVDQU Y2, 0(DI)(AX*2)")
	p("bf16Round_done:")
	p("\tVZEROUPPER")
	p("\tRET")
	if err := os.WriteFile("kernels_avx512_amd64.s", out.Bytes(), 0o644); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
