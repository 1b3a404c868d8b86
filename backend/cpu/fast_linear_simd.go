//go:build goexperiment.simd && amd64

package cpu

import (
	"simd/archsimd"
	"unsafe"
)

// AVX2 micro-kernels for linear, built with GOEXPERIMENT=simd and used when the CPU has AVX2
// and FMA. They replace the portable group kernels of fast_linear.go: the same blocking (a
// group of up to four weight rows meets four rows of x at a time), but eight k at a time with
// fused multiply-adds into eight-lane accumulators, bf16 widened by zero-extension and a
// shift. Each output keeps its own accumulator whichever kernel computes it, so the results
// do not depend on the split over workers; they differ from the reference kernel's in
// rounding only (eight partial sums, fused multiply-adds).

func init() {
	if archsimd.X86.AVX2() && archsimd.X86.FMA() {
		groupBF16, groupF32 = simdGroupBF16, simdGroupF32
	}
	hasAVX = archsimd.X86.AVX()
}

// hasAVX reports whether VZEROUPPER may be executed.
var hasAVX bool

// clearVectorState clears the upper halves of the vector registers (VZEROUPPER), so that the
// SSE instructions of scalar float code that follows run at full speed. Besides the kernels
// here, something else leaves them dirty: with GOEXPERIMENT=simd the runtime's asynchronous
// preemption restores the full YMM/ZMM registers without clearing them afterwards, and on
// the Xeon we measured the scalar code of a preempted goroutine then ran up to 20x slower
// (math.Exp in silu, softmax) until the next VZEROUPPER. The executor calls this before
// every kernel and the worker pool before every chunk.
func clearVectorState() {
	if hasAVX {
		archsimd.ClearAVXUpperBits()
	}
}

// simdLoadBF16 widens the eight bf16 values at p.
func simdLoadBF16(p unsafe.Pointer) archsimd.Float32x8 {
	return archsimd.LoadUint16x8((*[8]uint16)(p)).ExtendToUint32().ShiftAllLeft(16).AsFloat32x8()
}

// simdLoadF32 loads the eight float32 values at p.
func simdLoadF32(p unsafe.Pointer) archsimd.Float32x8 {
	return archsimd.LoadFloat32x8((*[8]float32)(p))
}

// simdLanes holds the eight lanes of up to eight accumulators.
type simdLanes = [8][8]float32

// simdHsum adds the eight lanes of an accumulator, pairwise.
func simdHsum(a *[8]float32) float32 {
	return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}

// The kernels below read n elements (a multiple of 8) from each pointer: x rows hold
// float32s, weight rows bf16 (the BF16 kernels) or float32 (the F32 ones); the caller makes
// sure that n elements are there. They store their accumulators in acc and leave the upper
// halves of the vector registers dirty: the caller runs archsimd.ClearAVXUpperBits before
// any scalar float code (the SSE instructions Go emits for it would otherwise pay for every
// AVX-to-SSE transition).

func bf16x4x2(x0, x1, x2, x3, w0, w1 unsafe.Pointer, n int, acc *simdLanes) {
	var a0, a1, a2, a3, b0, b1, b2, b3 archsimd.Float32x8
	for k := 0; k < n; k += 8 {
		u, v := simdLoadBF16(unsafe.Add(w0, 2*k)), simdLoadBF16(unsafe.Add(w1, 2*k))
		y := simdLoadF32(unsafe.Add(x0, 4*k))
		a0, b0 = u.MulAdd(y, a0), v.MulAdd(y, b0)
		y = simdLoadF32(unsafe.Add(x1, 4*k))
		a1, b1 = u.MulAdd(y, a1), v.MulAdd(y, b1)
		y = simdLoadF32(unsafe.Add(x2, 4*k))
		a2, b2 = u.MulAdd(y, a2), v.MulAdd(y, b2)
		y = simdLoadF32(unsafe.Add(x3, 4*k))
		a3, b3 = u.MulAdd(y, a3), v.MulAdd(y, b3)
	}
	a0.Store(&acc[0])
	a1.Store(&acc[1])
	a2.Store(&acc[2])
	a3.Store(&acc[3])
	b0.Store(&acc[4])
	b1.Store(&acc[5])
	b2.Store(&acc[6])
	b3.Store(&acc[7])
}

func bf16x4x1(x0, x1, x2, x3, w0 unsafe.Pointer, n int, acc *simdLanes) {
	var a0, a1, a2, a3 archsimd.Float32x8
	for k := 0; k < n; k += 8 {
		u := simdLoadBF16(unsafe.Add(w0, 2*k))
		a0 = u.MulAdd(simdLoadF32(unsafe.Add(x0, 4*k)), a0)
		a1 = u.MulAdd(simdLoadF32(unsafe.Add(x1, 4*k)), a1)
		a2 = u.MulAdd(simdLoadF32(unsafe.Add(x2, 4*k)), a2)
		a3 = u.MulAdd(simdLoadF32(unsafe.Add(x3, 4*k)), a3)
	}
	a0.Store(&acc[0])
	a1.Store(&acc[1])
	a2.Store(&acc[2])
	a3.Store(&acc[3])
}

func bf16x1x4(x, w0, w1, w2, w3 unsafe.Pointer, n int, acc *simdLanes) {
	var a0, a1, a2, a3 archsimd.Float32x8
	for k := 0; k < n; k += 8 {
		y := simdLoadF32(unsafe.Add(x, 4*k))
		a0 = simdLoadBF16(unsafe.Add(w0, 2*k)).MulAdd(y, a0)
		a1 = simdLoadBF16(unsafe.Add(w1, 2*k)).MulAdd(y, a1)
		a2 = simdLoadBF16(unsafe.Add(w2, 2*k)).MulAdd(y, a2)
		a3 = simdLoadBF16(unsafe.Add(w3, 2*k)).MulAdd(y, a3)
	}
	a0.Store(&acc[0])
	a1.Store(&acc[1])
	a2.Store(&acc[2])
	a3.Store(&acc[3])
}

func bf16x1x1(x, w unsafe.Pointer, n int, acc *simdLanes) {
	var a archsimd.Float32x8
	for k := 0; k < n; k += 8 {
		a = simdLoadBF16(unsafe.Add(w, 2*k)).MulAdd(simdLoadF32(unsafe.Add(x, 4*k)), a)
	}
	a.Store(&acc[0])
}

func f32x4x2(x0, x1, x2, x3, w0, w1 unsafe.Pointer, n int, acc *simdLanes) {
	var a0, a1, a2, a3, b0, b1, b2, b3 archsimd.Float32x8
	for k := 0; k < n; k += 8 {
		u, v := simdLoadF32(unsafe.Add(w0, 4*k)), simdLoadF32(unsafe.Add(w1, 4*k))
		y := simdLoadF32(unsafe.Add(x0, 4*k))
		a0, b0 = u.MulAdd(y, a0), v.MulAdd(y, b0)
		y = simdLoadF32(unsafe.Add(x1, 4*k))
		a1, b1 = u.MulAdd(y, a1), v.MulAdd(y, b1)
		y = simdLoadF32(unsafe.Add(x2, 4*k))
		a2, b2 = u.MulAdd(y, a2), v.MulAdd(y, b2)
		y = simdLoadF32(unsafe.Add(x3, 4*k))
		a3, b3 = u.MulAdd(y, a3), v.MulAdd(y, b3)
	}
	a0.Store(&acc[0])
	a1.Store(&acc[1])
	a2.Store(&acc[2])
	a3.Store(&acc[3])
	b0.Store(&acc[4])
	b1.Store(&acc[5])
	b2.Store(&acc[6])
	b3.Store(&acc[7])
}

func f32x4x1(x0, x1, x2, x3, w0 unsafe.Pointer, n int, acc *simdLanes) {
	var a0, a1, a2, a3 archsimd.Float32x8
	for k := 0; k < n; k += 8 {
		u := simdLoadF32(unsafe.Add(w0, 4*k))
		a0 = u.MulAdd(simdLoadF32(unsafe.Add(x0, 4*k)), a0)
		a1 = u.MulAdd(simdLoadF32(unsafe.Add(x1, 4*k)), a1)
		a2 = u.MulAdd(simdLoadF32(unsafe.Add(x2, 4*k)), a2)
		a3 = u.MulAdd(simdLoadF32(unsafe.Add(x3, 4*k)), a3)
	}
	a0.Store(&acc[0])
	a1.Store(&acc[1])
	a2.Store(&acc[2])
	a3.Store(&acc[3])
}

func f32x1x4(x, w0, w1, w2, w3 unsafe.Pointer, n int, acc *simdLanes) {
	var a0, a1, a2, a3 archsimd.Float32x8
	for k := 0; k < n; k += 8 {
		y := simdLoadF32(unsafe.Add(x, 4*k))
		a0 = simdLoadF32(unsafe.Add(w0, 4*k)).MulAdd(y, a0)
		a1 = simdLoadF32(unsafe.Add(w1, 4*k)).MulAdd(y, a1)
		a2 = simdLoadF32(unsafe.Add(w2, 4*k)).MulAdd(y, a2)
		a3 = simdLoadF32(unsafe.Add(w3, 4*k)).MulAdd(y, a3)
	}
	a0.Store(&acc[0])
	a1.Store(&acc[1])
	a2.Store(&acc[2])
	a3.Store(&acc[3])
}

func f32x1x1(x, w unsafe.Pointer, n int, acc *simdLanes) {
	var a archsimd.Float32x8
	for k := 0; k < n; k += 8 {
		a = simdLoadF32(unsafe.Add(w, 4*k)).MulAdd(simdLoadF32(unsafe.Add(x, 4*k)), a)
	}
	a.Store(&acc[0])
}

// simdGroupBF16 is gemmGroupBF16 with the AVX2 kernels.
func simdGroupBF16(res, xs []float32, rows [][]uint16, M, N, K, j int) {
	var wp [4]unsafe.Pointer
	for r, row := range rows {
		wp[r] = unsafe.Pointer(unsafe.SliceData(row[:K]))
	}
	kv := K &^ 7
	simdGroup(res, xs, wp[:len(rows)], true, M, N, K, j, func(x []float32, r int) (s float32) {
		w := rows[r][kv:K]
		for k, v := range x {
			s += v * bf16(w[k])
		}
		return s
	})
}

// simdGroupF32 is gemmGroupF32 with the AVX2 kernels.
func simdGroupF32(res, xs []float32, rows [][]float32, M, N, K, j int) {
	var wp [4]unsafe.Pointer
	for r, row := range rows {
		wp[r] = unsafe.Pointer(unsafe.SliceData(row[:K]))
	}
	kv := K &^ 7
	simdGroup(res, xs, wp[:len(rows)], false, M, N, K, j, func(x []float32, r int) (s float32) {
		w := rows[r][kv:K]
		for k, v := range x {
			s += v * w[k]
		}
		return s
	})
}

// simdGroup computes res[m*N+j+r] = x[m,:]·w_r for every row m of xs [M,K] and the weight
// rows at wp (K > 0 elements each, bf16 when half, else float32): vector kernels over the
// first K&^7 elements, then tail(x[m, K&^7:], r) for the rest. The kernels are called
// directly, not through function values, so that acc stays on the stack.
func simdGroup(res, xs []float32, wp []unsafe.Pointer, half bool, M, N, K, j int, tail func(x []float32, r int) float32) {
	kv := K &^ 7
	xs = xs[:M*K]
	xp := func(m int) unsafe.Pointer { return unsafe.Pointer(&xs[m*K]) }
	put := func(m, r int, a *[8]float32) { res[m*N+j+r] = simdHsum(a) + tail(xs[m*K+kv:(m+1)*K], r) }
	var acc simdLanes
	m := 0
	for ; m+4 <= M; m += 4 {
		r := 0
		for ; r+2 <= len(wp); r += 2 {
			if half {
				bf16x4x2(xp(m), xp(m+1), xp(m+2), xp(m+3), wp[r], wp[r+1], kv, &acc)
			} else {
				f32x4x2(xp(m), xp(m+1), xp(m+2), xp(m+3), wp[r], wp[r+1], kv, &acc)
			}
			archsimd.ClearAVXUpperBits()
			for i := range 4 {
				put(m+i, r, &acc[i])
				put(m+i, r+1, &acc[4+i])
			}
		}
		if r < len(wp) {
			if half {
				bf16x4x1(xp(m), xp(m+1), xp(m+2), xp(m+3), wp[r], kv, &acc)
			} else {
				f32x4x1(xp(m), xp(m+1), xp(m+2), xp(m+3), wp[r], kv, &acc)
			}
			archsimd.ClearAVXUpperBits()
			for i := range 4 {
				put(m+i, r, &acc[i])
			}
		}
	}
	for ; m < M; m++ {
		if len(wp) == 4 {
			if half {
				bf16x1x4(xp(m), wp[0], wp[1], wp[2], wp[3], kv, &acc)
			} else {
				f32x1x4(xp(m), wp[0], wp[1], wp[2], wp[3], kv, &acc)
			}
			archsimd.ClearAVXUpperBits()
			for r := range 4 {
				put(m, r, &acc[r])
			}
			continue
		}
		for r := range wp {
			if half {
				bf16x1x1(xp(m), wp[r], kv, &acc)
			} else {
				f32x1x1(xp(m), wp[r], kv, &acc)
			}
			archsimd.ClearAVXUpperBits()
			put(m, r, &acc[0])
		}
	}
}
