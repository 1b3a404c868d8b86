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
}

// loadBF16 widens the eight bf16 values at p.
func loadBF16(p unsafe.Pointer) archsimd.Float32x8 {
	return archsimd.LoadUint16x8((*[8]uint16)(p)).ExtendToUint32().ShiftAllLeft(16).AsFloat32x8()
}

// loadF32 loads the eight float32 values at p.
func loadF32(p unsafe.Pointer) archsimd.Float32x8 {
	return archsimd.LoadFloat32x8((*[8]float32)(p))
}

// hsum adds the eight lanes of v, pairwise.
func hsum(v archsimd.Float32x8) float32 {
	var a [8]float32
	v.Store(&a)
	return ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}

// The kernels below read n elements (a multiple of 8) from each pointer: x rows hold
// float32s, weight rows bf16 (the BF16 kernels) or float32 (the F32 ones). The caller makes
// sure that n elements are there.

func bf16x4x2(x0, x1, x2, x3, w0, w1 unsafe.Pointer, n int) [8]float32 {
	var a0, a1, a2, a3, b0, b1, b2, b3 archsimd.Float32x8
	for k := 0; k < n; k += 8 {
		u, v := loadBF16(unsafe.Add(w0, 2*k)), loadBF16(unsafe.Add(w1, 2*k))
		y := loadF32(unsafe.Add(x0, 4*k))
		a0, b0 = u.MulAdd(y, a0), v.MulAdd(y, b0)
		y = loadF32(unsafe.Add(x1, 4*k))
		a1, b1 = u.MulAdd(y, a1), v.MulAdd(y, b1)
		y = loadF32(unsafe.Add(x2, 4*k))
		a2, b2 = u.MulAdd(y, a2), v.MulAdd(y, b2)
		y = loadF32(unsafe.Add(x3, 4*k))
		a3, b3 = u.MulAdd(y, a3), v.MulAdd(y, b3)
	}
	return [8]float32{hsum(a0), hsum(a1), hsum(a2), hsum(a3), hsum(b0), hsum(b1), hsum(b2), hsum(b3)}
}

func bf16x4x1(x0, x1, x2, x3, w0 unsafe.Pointer, n int) [4]float32 {
	var a0, a1, a2, a3 archsimd.Float32x8
	for k := 0; k < n; k += 8 {
		u := loadBF16(unsafe.Add(w0, 2*k))
		a0 = u.MulAdd(loadF32(unsafe.Add(x0, 4*k)), a0)
		a1 = u.MulAdd(loadF32(unsafe.Add(x1, 4*k)), a1)
		a2 = u.MulAdd(loadF32(unsafe.Add(x2, 4*k)), a2)
		a3 = u.MulAdd(loadF32(unsafe.Add(x3, 4*k)), a3)
	}
	return [4]float32{hsum(a0), hsum(a1), hsum(a2), hsum(a3)}
}

func bf16x1x4(x, w0, w1, w2, w3 unsafe.Pointer, n int) [4]float32 {
	var a0, a1, a2, a3 archsimd.Float32x8
	for k := 0; k < n; k += 8 {
		y := loadF32(unsafe.Add(x, 4*k))
		a0 = loadBF16(unsafe.Add(w0, 2*k)).MulAdd(y, a0)
		a1 = loadBF16(unsafe.Add(w1, 2*k)).MulAdd(y, a1)
		a2 = loadBF16(unsafe.Add(w2, 2*k)).MulAdd(y, a2)
		a3 = loadBF16(unsafe.Add(w3, 2*k)).MulAdd(y, a3)
	}
	return [4]float32{hsum(a0), hsum(a1), hsum(a2), hsum(a3)}
}

func bf16x1x1(x, w unsafe.Pointer, n int) float32 {
	var a archsimd.Float32x8
	for k := 0; k < n; k += 8 {
		a = loadBF16(unsafe.Add(w, 2*k)).MulAdd(loadF32(unsafe.Add(x, 4*k)), a)
	}
	return hsum(a)
}

func f32x4x2(x0, x1, x2, x3, w0, w1 unsafe.Pointer, n int) [8]float32 {
	var a0, a1, a2, a3, b0, b1, b2, b3 archsimd.Float32x8
	for k := 0; k < n; k += 8 {
		u, v := loadF32(unsafe.Add(w0, 4*k)), loadF32(unsafe.Add(w1, 4*k))
		y := loadF32(unsafe.Add(x0, 4*k))
		a0, b0 = u.MulAdd(y, a0), v.MulAdd(y, b0)
		y = loadF32(unsafe.Add(x1, 4*k))
		a1, b1 = u.MulAdd(y, a1), v.MulAdd(y, b1)
		y = loadF32(unsafe.Add(x2, 4*k))
		a2, b2 = u.MulAdd(y, a2), v.MulAdd(y, b2)
		y = loadF32(unsafe.Add(x3, 4*k))
		a3, b3 = u.MulAdd(y, a3), v.MulAdd(y, b3)
	}
	return [8]float32{hsum(a0), hsum(a1), hsum(a2), hsum(a3), hsum(b0), hsum(b1), hsum(b2), hsum(b3)}
}

func f32x4x1(x0, x1, x2, x3, w0 unsafe.Pointer, n int) [4]float32 {
	var a0, a1, a2, a3 archsimd.Float32x8
	for k := 0; k < n; k += 8 {
		u := loadF32(unsafe.Add(w0, 4*k))
		a0 = u.MulAdd(loadF32(unsafe.Add(x0, 4*k)), a0)
		a1 = u.MulAdd(loadF32(unsafe.Add(x1, 4*k)), a1)
		a2 = u.MulAdd(loadF32(unsafe.Add(x2, 4*k)), a2)
		a3 = u.MulAdd(loadF32(unsafe.Add(x3, 4*k)), a3)
	}
	return [4]float32{hsum(a0), hsum(a1), hsum(a2), hsum(a3)}
}

func f32x1x4(x, w0, w1, w2, w3 unsafe.Pointer, n int) [4]float32 {
	var a0, a1, a2, a3 archsimd.Float32x8
	for k := 0; k < n; k += 8 {
		y := loadF32(unsafe.Add(x, 4*k))
		a0 = loadF32(unsafe.Add(w0, 4*k)).MulAdd(y, a0)
		a1 = loadF32(unsafe.Add(w1, 4*k)).MulAdd(y, a1)
		a2 = loadF32(unsafe.Add(w2, 4*k)).MulAdd(y, a2)
		a3 = loadF32(unsafe.Add(w3, 4*k)).MulAdd(y, a3)
	}
	return [4]float32{hsum(a0), hsum(a1), hsum(a2), hsum(a3)}
}

func f32x1x1(x, w unsafe.Pointer, n int) float32 {
	var a archsimd.Float32x8
	for k := 0; k < n; k += 8 {
		a = loadF32(unsafe.Add(w, 4*k)).MulAdd(loadF32(unsafe.Add(x, 4*k)), a)
	}
	return hsum(a)
}

// simdGroupBF16 is gemmGroupBF16 with the AVX2 kernels; the last K%8 products of each
// output are added one by one.
func simdGroupBF16(res, xs []float32, rows [][]uint16, M, N, K, j int) {
	kv := K &^ 7
	xp := func(m int) unsafe.Pointer { return unsafe.Pointer(&xs[m*K]) }
	wp := func(r int) unsafe.Pointer { return unsafe.Pointer(&rows[r][0]) }
	tail := func(m, r int) float32 {
		var s float32
		x, w := xs[m*K+kv:(m+1)*K], rows[r][kv:K]
		for k, v := range x {
			s += v * bf16(w[k])
		}
		return s
	}
	m := 0
	for ; m+4 <= M; m += 4 {
		r := 0
		for ; r+2 <= len(rows); r += 2 {
			s := bf16x4x2(xp(m), xp(m+1), xp(m+2), xp(m+3), wp(r), wp(r+1), kv)
			for i := range 4 {
				res[(m+i)*N+j+r] = s[i] + tail(m+i, r)
				res[(m+i)*N+j+r+1] = s[4+i] + tail(m+i, r+1)
			}
		}
		if r < len(rows) {
			s := bf16x4x1(xp(m), xp(m+1), xp(m+2), xp(m+3), wp(r), kv)
			for i := range 4 {
				res[(m+i)*N+j+r] = s[i] + tail(m+i, r)
			}
		}
	}
	for ; m < M; m++ {
		if len(rows) == 4 {
			s := bf16x1x4(xp(m), wp(0), wp(1), wp(2), wp(3), kv)
			for r := range 4 {
				res[m*N+j+r] = s[r] + tail(m, r)
			}
			continue
		}
		for r := range rows {
			res[m*N+j+r] = bf16x1x1(xp(m), wp(r), kv) + tail(m, r)
		}
	}
}

// simdGroupF32 is gemmGroupF32 with the AVX2 kernels.
func simdGroupF32(res, xs []float32, rows [][]float32, M, N, K, j int) {
	kv := K &^ 7
	xp := func(m int) unsafe.Pointer { return unsafe.Pointer(&xs[m*K]) }
	wp := func(r int) unsafe.Pointer { return unsafe.Pointer(&rows[r][0]) }
	tail := func(m, r int) float32 {
		var s float32
		x, w := xs[m*K+kv:(m+1)*K], rows[r][kv:K]
		for k, v := range x {
			s += v * w[k]
		}
		return s
	}
	m := 0
	for ; m+4 <= M; m += 4 {
		r := 0
		for ; r+2 <= len(rows); r += 2 {
			s := f32x4x2(xp(m), xp(m+1), xp(m+2), xp(m+3), wp(r), wp(r+1), kv)
			for i := range 4 {
				res[(m+i)*N+j+r] = s[i] + tail(m+i, r)
				res[(m+i)*N+j+r+1] = s[4+i] + tail(m+i, r+1)
			}
		}
		if r < len(rows) {
			s := f32x4x1(xp(m), xp(m+1), xp(m+2), xp(m+3), wp(r), kv)
			for i := range 4 {
				res[(m+i)*N+j+r] = s[i] + tail(m+i, r)
			}
		}
	}
	for ; m < M; m++ {
		if len(rows) == 4 {
			s := f32x1x4(xp(m), wp(0), wp(1), wp(2), wp(3), kv)
			for r := range 4 {
				res[m*N+j+r] = s[r] + tail(m, r)
			}
			continue
		}
		for r := range rows {
			res[m*N+j+r] = f32x1x1(xp(m), wp(r), kv) + tail(m, r)
		}
	}
}
