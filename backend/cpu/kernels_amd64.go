//go:build amd64 && !purego

package cpu

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

// The avx2 kernel set: linear's group kernels with the Go assembly micro-kernels of
// kernels_amd64.s, for CPUs with AVX2 and FMA, in every amd64 build. The blocking is that
// of the portable kernels (a group of up to four weight rows meets four rows of x at a
// time); each output keeps one eight-lane accumulator of fused multiply-adds over the first
// K&^7 elements, its lanes added pairwise, then the last K%8 products in order. Each output
// is computed the same way whichever kernel computes it, so the results do not depend on
// the split over workers or on the batch; they differ from the reference kernel's in
// rounding only (and equal the bits of the simd/archsimd kernels that GOEXPERIMENT=simd
// builds ran before session 8).

// hasAVX2FMA reports whether the CPU has AVX2 and FMA (and the OS saves the YMM registers:
// x/sys/cpu checks that).
var hasAVX2FMA = cpu.X86.HasAVX2 && cpu.X86.HasFMA

var avx2Kernels = kernelSet{name: "avx2", groupBF16: avx2GroupBF16, groupF32: avx2GroupF32, gemvBF16: avx2GemvBF16,
	blockBF16: avx2BlockBF16, features: "avx2,fma"}

// platformKernels lists the kernel sets of this build besides the portable one, best first.
func platformKernels() []kernelSet {
	sets, after := avx512Sets()
	if hasAVX2FMA {
		sets = append(sets, avx2Kernels)
	} else {
		kernelNotes = append(kernelNotes, "avx2 needs AVX2 and FMA")
	}
	return append(sets, after...)
}

// The micro-kernels (kernels_amd64.s): n is a multiple of 8; out receives the sums of the
// first n products of each output, its eight lanes added pairwise,
// ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)) (4x2 and 4x1: out[i] = x_i·w0, out[4+i] = x_i·w1;
// 1x4: out[r] = x·w_r). The 1x4 kernels and the bf16 4x2 prefetch from address pf on, as
// many bytes as their weight rows hold (prefetches do not fault: pf may be any address).

//go:noescape
func avx2BF16x4x2(x0, x1, x2, x3, w0, w1 unsafe.Pointer, pf uintptr, n int, out *[8]float32)

//go:noescape
func avx2BF16x4x1(x0, x1, x2, x3, w0 unsafe.Pointer, n int, out *[8]float32)

//go:noescape
func avx2BF16x1x4(x, w0, w1, w2, w3 unsafe.Pointer, pf uintptr, n int, out *[8]float32)

//go:noescape
func avx2BF16x1x1(x, w unsafe.Pointer, n int, out *[8]float32)

//go:noescape
func avx2F32x4x2(x0, x1, x2, x3, w0, w1 unsafe.Pointer, n int, out *[8]float32)

//go:noescape
func avx2F32x4x1(x0, x1, x2, x3, w0 unsafe.Pointer, n int, out *[8]float32)

//go:noescape
func avx2F32x1x4(x, w0, w1, w2, w3 unsafe.Pointer, pf uintptr, n int, out *[8]float32)

//go:noescape
func avx2F32x1x1(x, w unsafe.Pointer, n int, out *[8]float32)

// avx2BF16Gemv runs the 1x4 kernel over rows weight rows (a multiple of 4) stride bytes
// apart from w, one group of four after another, prefetching the next, and stores each
// row's sum plus +0 to out[0:rows].
//
//go:noescape
func avx2BF16Gemv(x, w unsafe.Pointer, rows, n, stride int, out *float32)

// avx2ReadBytes reads n bytes at p (n a multiple of 128) with 32-byte loads and returns
// their xor folded to 64 bits: the read-bandwidth probe of the benchmarks.
//
//go:noescape
func avx2ReadBytes(p unsafe.Pointer, n int) uint64

// purego reports whether the purego build tag is set (it is not in this file's builds).
const purego = false

// readHalf reads every element of h as fast as the CPU can and returns a fold of them (the
// read-bandwidth probe): 32-byte loads where the CPU has AVX2.
func readHalf(h []uint16) uint64 {
	n := len(h) &^ 63
	var s uint64
	if hasAVX2FMA && n > 0 {
		s = avx2ReadBytes(unsafe.Pointer(unsafe.SliceData(h)), 2*n)
	} else {
		n = 0
	}
	return s ^ readHalfGo(h[n:])
}

// avx2GroupBF16 is gemmGroupBF16 with the AVX2 micro-kernels.
func avx2GroupBF16(res, xs []float32, rows [][]uint16, M, N, K, j int) {
	var wp [4]unsafe.Pointer
	for r, row := range rows {
		wp[r] = unsafe.Pointer(unsafe.SliceData(row[:K]))
	}
	avx2Group(res, xs, wp[:len(rows)], true, M, N, K, j)
	if kv := K &^ 7; kv < K {
		for m := range M {
			x := xs[m*K+kv : (m+1)*K]
			for r, row := range rows {
				w := row[kv:K]
				var s float32
				for k, v := range x {
					s += v * bf16(w[k])
				}
				res[m*N+j+r] += s
			}
		}
	}
}

// avx2GemvBF16 sets res[j] = x·w[j,:] for lo <= j < hi, x f32 [K], w bf16 [N,K]: the
// groups of four rows in one assembly call (no Go between groups), the rest as
// avx2GroupBF16 does them; the same bits as avx2GroupBF16.
func avx2GemvBF16(res, x []float32, w []uint16, N, K, lo, hi int) {
	x, w, res = x[:K], w[lo*K:hi*K], res[:hi]
	n4, kv := (hi-lo)&^3, K&^7
	if n4 > 0 {
		avx2BF16Gemv(unsafe.Pointer(&x[0]), unsafe.Pointer(&w[0]), n4, kv, 2*K, &res[lo])
		if kv < K {
			for r := range n4 {
				row := w[r*K+kv : (r+1)*K]
				var s float32
				for k, v := range x[kv:] {
					s += v * bf16(row[k])
				}
				res[lo+r] += s
			}
		}
	}
	if n4 < hi-lo {
		var rows [4][]uint16
		for r := range hi - lo - n4 {
			rows[r] = w[(n4+r)*K : (n4+r+1)*K]
		}
		avx2GroupBF16(res, x, rows[:hi-lo-n4], 1, N, K, lo+n4)
	}
}

// avx2GroupF32 is gemmGroupF32 with the AVX2 micro-kernels.
func avx2GroupF32(res, xs []float32, rows [][]float32, M, N, K, j int) {
	var wp [4]unsafe.Pointer
	for r, row := range rows {
		wp[r] = unsafe.Pointer(unsafe.SliceData(row[:K]))
	}
	avx2Group(res, xs, wp[:len(rows)], false, M, N, K, j)
	if kv := K &^ 7; kv < K {
		for m := range M {
			x := xs[m*K+kv : (m+1)*K]
			for r, row := range rows {
				w := row[kv:K]
				var s float32
				for k, v := range x {
					s += v * w[k]
				}
				res[m*N+j+r] += s
			}
		}
	}
}

// avx2Group sets res[m*N+j+r] to the vector part of x[m,:]·w_r (its first K&^7 products, see
// the micro-kernels) for every row m of xs [M,K] and the weight rows at wp (K > 0 elements
// each, bf16 when half, else float32), plus +0 (as the portable sum of an empty tail would:
// a -0 becomes +0); the caller adds the rest. The micro-kernels are called directly, not
// through function values, so that out stays on the stack.
func avx2Group(res, xs []float32, wp []unsafe.Pointer, half bool, M, N, K, j int) {
	kv := K &^ 7
	// next is where the rows after this group's start, if the rows are contiguous (the
	// weight matrix's): the 1x4 kernels prefetch from there.
	size := uintptr(4)
	if half {
		size = 2
	}
	next := uintptr(wp[len(wp)-1]) + uintptr(K)*size
	xs = xs[:M*K]
	res = res[:(M-1)*N+j+len(wp)]
	xp := func(m int) unsafe.Pointer { return unsafe.Pointer(&xs[m*K]) }
	var out [8]float32
	var zero float32 // a variable, so that s + zero is not folded away
	m := 0
	for ; m+4 <= M; m += 4 {
		r := 0
		for ; r+2 <= len(wp); r += 2 {
			if half {
				pf := next // the pair after this one: in this group, or the next group's first
				if r+2 < len(wp) {
					pf = uintptr(wp[r+2])
				}
				avx2BF16x4x2(xp(m), xp(m+1), xp(m+2), xp(m+3), wp[r], wp[r+1], pf, kv, &out)
			} else {
				avx2F32x4x2(xp(m), xp(m+1), xp(m+2), xp(m+3), wp[r], wp[r+1], kv, &out)
			}
			for i := range 4 {
				o := (m+i)*N + j + r
				res[o], res[o+1] = out[i]+zero, out[4+i]+zero
			}
		}
		if r < len(wp) {
			if half {
				avx2BF16x4x1(xp(m), xp(m+1), xp(m+2), xp(m+3), wp[r], kv, &out)
			} else {
				avx2F32x4x1(xp(m), xp(m+1), xp(m+2), xp(m+3), wp[r], kv, &out)
			}
			for i := range 4 {
				res[(m+i)*N+j+r] = out[i] + zero
			}
		}
	}
	for ; m < M; m++ {
		o := res[m*N+j : m*N+j+len(wp)]
		if len(wp) == 4 {
			if half {
				avx2BF16x1x4(xp(m), wp[0], wp[1], wp[2], wp[3], next, kv, &out)
			} else {
				avx2F32x1x4(xp(m), wp[0], wp[1], wp[2], wp[3], next, kv, &out)
			}
			o[0], o[1], o[2], o[3] = out[0]+zero, out[1]+zero, out[2]+zero, out[3]+zero
			continue
		}
		for r := range wp {
			if half {
				avx2BF16x1x1(xp(m), wp[r], kv, &out)
			} else {
				avx2F32x1x1(xp(m), wp[r], kv, &out)
			}
			o[r] = out[0] + zero
		}
	}
}
