//go:build amd64 && !purego

package cpu

import (
	"unsafe"

	"golang.org/x/sys/cpu"
)

//go:generate go run kernels_avx512_gen.go

// The avx512bf16 kernel set, for CPUs with AVX-512F, AVX-512BW and AVX512_BF16 (Cooper Lake,
// Sapphire Rapids and later Xeons, AMD Zen 4 and later): linear's products of bf16 weights
// with VDPBF16PS (kernels_avx512_amd64.s), which multiplies pairs of bf16 numbers and adds
// both products to an f32 lane.
//
// Numerics: this set rounds x to bf16 (round to nearest even, VCVTNEPS2BF16, denormals to
// zero) once per row of x and call, into a scratch buffer, as llama.cpp's and PyTorch's bf16
// matrix products do; the weights are read as stored. The products of two bf16 numbers are
// exact in f32; each output keeps one 16-lane accumulator, lane l adding the products of the
// pair (2l+1, 2l) of every block of 32 elements in that order, block after block (on Intel,
// as two fused multiply-adds rounded to nearest even, denormal inputs and results taken as
// zero: VDPBF16PS's definition), the last block padded with zeros; the lanes are then added
// pairwise (v8[i] = l[i]+l[i+8], v4[i] = v8[i]+v8[i+4], v2[i] = v4[i]+v4[i+2], v2[0]+v2[1]).
// Every output is computed this way whichever micro-kernel computes it, so the results do
// not depend on the batch or the split over workers. They differ from the f32 sets' by x's
// rounding: a relative error of at most 2^-9 per product (bf16linearRelErr bounds it for
// the tests), what a bf16 model computes anyway. f32 and f16 weights run the avx2 kernels.
// That rounding moves the logits of the tiny HF parity fixtures by 2-10e-2 (engine tests,
// Xeon with AVX512_BF16, session 10), far past their 1e-4 tolerance, so the set never runs by
// default: LOOM_CPU_KERNELS=avx512bf16 selects it.
//
// Blocking: the weight rows are split over the workers in groups of four; each group meets
// the rows of x four at a time (4x4 kernel, 16 accumulators) and then one at a time (1x4
// kernel: decode), x in blocks of rows that fit in the L2 cache, each call prefetching the
// next group's weight rows.

// hasAVX512BF16 reports whether the CPU has AVX-512F, AVX-512BW and AVX512_BF16 (and the OS
// saves the ZMM registers and mask registers: x/sys/cpu checks that).
var hasAVX512BF16 = cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512BF16

var avx512bf16Kernels = kernelSet{
	name:      "avx512bf16",
	groupBF16: avx512bf16Group,
	groupF32:  avx2GroupF32,
	bf16:      &bf16Path{round: roundRowsBF16, rows: avx512bf16Rows, relErr: bf16linearRelErr},
	features:  "avx512f,avx512bw,avx512_bf16",
}

// bf16linearRelErr bounds the error the avx512bf16 set adds to an output over f32
// arithmetic, relative to the sum of the absolute products behind it: x's rounding to bf16
// (2^-9 per product) with room for the f32 sums.
const bf16linearRelErr = 1.0 / 256

// avx512Sets lists the AVX-512 sets this CPU can run that should run before avx2 (first:
// avx512, the default where the CPU has AVX-512F and AVX-512BW) and those only
// LOOM_CPU_KERNELS selects (second: avx512bf16, whose rounding of x moves the HF parity
// fixtures' logits by 2-10e-2, past their 1e-4 tolerance), and notes why a set is missing.
func avx512Sets() (before, after []kernelSet) {
	switch {
	case cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW: // VPMOVZXWD and VMOVDQU16 on ZMM are AVX-512BW
		before = append(before, avx512Kernels)
	case !cpu.X86.HasAVX512F:
		kernelNotes = append(kernelNotes, "avx512 needs AVX-512F")
	default:
		kernelNotes = append(kernelNotes, "avx512 needs AVX-512BW")
	}
	switch {
	case hasAVX512BF16:
		after = append(after, avx512bf16Kernels)
	case !cpu.X86.HasAVX512F:
		kernelNotes = append(kernelNotes, "avx512bf16 needs AVX-512F")
	case !cpu.X86.HasAVX512BW:
		kernelNotes = append(kernelNotes, "avx512bf16 needs AVX-512BW")
	default:
		kernelNotes = append(kernelNotes, "avx512bf16 needs AVX512_BF16")
	}
	return before, after
}

//go:noescape
func bf16dp4x4(x0, x1, x2, x3, w0, w1, w2, w3 unsafe.Pointer, pf uintptr, n int, out *[16]float32)

//go:noescape
func bf16dp1x4(x, w0, w1, w2, w3 unsafe.Pointer, pf uintptr, n int, out *[16]float32)

//go:noescape
func bf16Round(dst *uint16, src *float32, n int)

// roundRowsBF16 returns x f32 [M,K] rounded to bf16 in a pooled buffer [M, bf16Stride(K)],
// each row padded with zeros; give it back with putU16.
func roundRowsBF16(xs []float32, M, K int) *[]uint16 {
	kp := bf16Stride(K)
	p := getU16(M * kp)
	if K == 0 {
		return p
	}
	xb := *p
	for m := range M {
		row := xb[m*kp : (m+1)*kp]
		bf16Round(&row[0], &xs[m*K], K) // stores whole blocks of 16, zeros after K
		clear(row[(K+15)&^15:])
	}
	return p
}

// avx512bf16Rows sets res[m*N+j] = x[m,:]·w[j,:] for every m < M and lo <= j < hi, from x
// rounded by roundRowsBF16 (xb) and bf16 weights w [N,K].
func avx512bf16Rows(res []float32, xb, w []uint16, M, N, K, lo, hi int) {
	if K == 0 {
		for m := range M {
			clear(res[m*N+lo : m*N+hi])
		}
		return
	}
	kp := bf16Stride(K)
	xb, w, res = xb[:M*kp], w[:N*K], res[:M*N]
	// mb rows of x (a multiple of 4) fill about 512 KiB: they stay in L2 while the groups
	// of weight rows meet them.
	mb := max(4, (512<<10)/(2*kp)&^3)
	for m0 := 0; m0 < M; m0 += mb {
		m1 := min(M, m0+mb)
		for j := lo; j < hi; j += 4 {
			var wp [4]unsafe.Pointer
			jb := min(4, hi-j)
			for r := range 4 {
				wp[r] = unsafe.Pointer(&w[(j+min(r, jb-1))*K]) // short groups repeat their last row
			}
			avx512bf16Block(res, xb, wp, M, N, K, j, jb, m0, m1)
		}
	}
}

// avx512bf16Group is the set's groupBF16: the rows given (up to four, the first row j) for
// every row of x, rounding x itself (gemmRows and gemmRange round x once and call
// avx512bf16Rows instead).
func avx512bf16Group(res, xs []float32, rows [][]uint16, M, N, K, j int) {
	if K == 0 {
		for m := range M {
			clear(res[m*N+j : m*N+j+len(rows)])
		}
		return
	}
	xp := roundRowsBF16(xs, M, K)
	defer putU16(xp)
	var wp [4]unsafe.Pointer
	for r := range 4 {
		wp[r] = unsafe.Pointer(unsafe.SliceData(rows[min(r, len(rows)-1)][:K]))
	}
	avx512bf16Block(res, (*xp)[:M*bf16Stride(K)], wp, M, N, K, j, len(rows), 0, M)
}

// avx512bf16Block computes the outputs of weight rows wp[0:jb] (row j on) for rows m0 to m1
// of x (rounded, xb): four rows of x at a time, then one at a time.
func avx512bf16Block(res []float32, xb []uint16, wp [4]unsafe.Pointer, M, N, K, j, jb, m0, m1 int) {
	kp := bf16Stride(K)
	xp := func(m int) unsafe.Pointer { return unsafe.Pointer(&xb[m*kp]) }
	pf := uintptr(wp[jb-1]) + uintptr(2*K) // the next group's rows, if contiguous
	var out [16]float32
	m := m0
	for ; m+4 <= m1; m += 4 {
		bf16dp4x4(xp(m), xp(m+1), xp(m+2), xp(m+3), wp[0], wp[1], wp[2], wp[3], pf, K, &out)
		for i := range 4 {
			copy(res[(m+i)*N+j:(m+i)*N+j+jb], out[4*i:4*i+jb])
		}
	}
	for ; m < m1; m++ {
		bf16dp1x4(xp(m), wp[0], wp[1], wp[2], wp[3], pf, K, &out)
		o := res[m*N+j : m*N+j+jb]
		for r := range o {
			o[r] = out[4*r]
		}
	}
}

// The avx512 kernel set, for CPUs with AVX-512F and AVX-512BW (its bf16 loads and widening
// are BW instructions): the avx2 set's arithmetic with 16 lanes.
// x stays f32 and bf16 weights are widened exactly; each output keeps one 16-lane
// accumulator of fused multiply-adds, lane l summing the products of k = l mod 16 in k
// order, the last K%16 elements read with zero-masking loads (adding +0 products), the lanes
// then added pairwise as the avx512bf16 set adds them. The blocking is the avx512bf16 set's
// (4x4 and 1x4 micro-kernels, groups of four weight rows, short groups repeating their last
// row); each output is computed the same way whichever kernel computes it. The results
// differ from avx2's in rounding only (other lanes, another order), by as much as avx2's
// differ from the reference kernels. It is the default where the CPU has AVX-512F: on a
// Xeon with AVX-512 it ran the prefill products of Qwen2.5-0.5B 1.3-1.45x faster than avx2
// and decode at the same speed (docs/PERFORMANCE.md, session 10).
var avx512Kernels = kernelSet{name: "avx512", groupBF16: avx512GroupBF16, groupF32: avx512GroupF32, features: "avx512f,avx512bw"}

//go:noescape
func avx512BF16x4x4(x0, x1, x2, x3, w0, w1, w2, w3 unsafe.Pointer, pf uintptr, n int, out *[16]float32)

//go:noescape
func avx512BF16x1x4(x, w0, w1, w2, w3 unsafe.Pointer, pf uintptr, n int, out *[16]float32)

//go:noescape
func avx512F32x4x4(x0, x1, x2, x3, w0, w1, w2, w3 unsafe.Pointer, pf uintptr, n int, out *[16]float32)

//go:noescape
func avx512F32x1x4(x, w0, w1, w2, w3 unsafe.Pointer, pf uintptr, n int, out *[16]float32)

// avx512GroupBF16 is gemmGroupBF16 with the AVX-512F micro-kernels.
func avx512GroupBF16(res, xs []float32, rows [][]uint16, M, N, K, j int) {
	var wp [4]unsafe.Pointer
	for r := range 4 {
		wp[r] = unsafe.Pointer(unsafe.SliceData(rows[min(r, len(rows)-1)][:K]))
	}
	avx512Group(res, xs, wp, true, M, N, K, j, len(rows))
}

// avx512GroupF32 is gemmGroupF32 with the AVX-512F micro-kernels.
func avx512GroupF32(res, xs []float32, rows [][]float32, M, N, K, j int) {
	var wp [4]unsafe.Pointer
	for r := range 4 {
		wp[r] = unsafe.Pointer(unsafe.SliceData(rows[min(r, len(rows)-1)][:K]))
	}
	avx512Group(res, xs, wp, false, M, N, K, j, len(rows))
}

// avx512Group sets res[m*N+j+r] = x[m,:]·w_r for every row m of xs [M,K] and the weight rows
// wp[0:jb] (K elements each, bf16 when half, else f32; wp[jb:4] repeat the last): four rows
// of x at a time, then one at a time. The micro-kernels are called directly, not through
// function values, so that out stays on the stack.
func avx512Group(res, xs []float32, wp [4]unsafe.Pointer, half bool, M, N, K, j, jb int) {
	if K == 0 {
		for m := range M {
			clear(res[m*N+j : m*N+j+jb])
		}
		return
	}
	size := uintptr(4)
	if half {
		size = 2
	}
	pf := uintptr(wp[jb-1]) + uintptr(K)*size // the next group's rows, if contiguous
	xs = xs[:M*K]
	xp := func(m int) unsafe.Pointer { return unsafe.Pointer(&xs[m*K]) }
	var out [16]float32
	m := 0
	for ; m+4 <= M; m += 4 {
		if half {
			avx512BF16x4x4(xp(m), xp(m+1), xp(m+2), xp(m+3), wp[0], wp[1], wp[2], wp[3], pf, K, &out)
		} else {
			avx512F32x4x4(xp(m), xp(m+1), xp(m+2), xp(m+3), wp[0], wp[1], wp[2], wp[3], pf, K, &out)
		}
		for i := range 4 {
			copy(res[(m+i)*N+j:(m+i)*N+j+jb], out[4*i:4*i+jb])
		}
	}
	for ; m < M; m++ {
		if half {
			avx512BF16x1x4(xp(m), wp[0], wp[1], wp[2], wp[3], pf, K, &out)
		} else {
			avx512F32x1x4(xp(m), wp[0], wp[1], wp[2], wp[3], pf, K, &out)
		}
		o := res[m*N+j : m*N+j+jb]
		for r := range o {
			o[r] = out[4*r]
		}
	}
}
