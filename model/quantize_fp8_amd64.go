//go:build amd64 && !purego

package model

import "golang.org/x/sys/cpu"

// fp8AVX2 reports whether the AVX2 kernels of quantize_fp8_amd64.s run (a variable for
// tests, which compare them with the portable loops).
var fp8AVX2 = cpu.X86.HasAVX2

// fp8EncodeBF16AVX2 writes q[i] = tensor.F32ToF8E4M3Fast(bf16(row[i]) / s) for i < n, n a
// positive multiple of 16.
//
//go:noescape
func fp8EncodeBF16AVX2(q *uint8, row *uint16, n int, s float32)

// fp8MaxBF16AVX2 writes into out 16 maxima of row[:n] with the sign bits cleared (lane i holds
// that of the elements at i mod 16), n a positive multiple of 32.
//
//go:noescape
func fp8MaxBF16AVX2(row *uint16, n int, out *[16]uint16)

// encodeBF16Fast converts the longest prefix of row that the AVX2 kernel takes (a multiple of
// 16 elements) into q and returns its length; 0 without AVX2.
func encodeBF16Fast(q []uint8, row []uint16, s float32) int {
	n := len(row) &^ 15
	if !fp8AVX2 || n == 0 {
		return 0
	}
	fp8EncodeBF16AVX2(&q[0], &row[0], n, s)
	return n
}

// maxMagnitudeBF16Fast returns the largest magnitude pattern of the longest prefix of row
// that the AVX2 kernel takes (a multiple of 32 elements) and its length; 0, 0 without AVX2.
func maxMagnitudeBF16Fast(row []uint16) (uint16, int) {
	n := len(row) &^ 31
	if !fp8AVX2 || n == 0 {
		return 0, 0
	}
	var lanes [16]uint16
	fp8MaxBF16AVX2(&row[0], n, &lanes)
	var m uint16
	for _, v := range lanes {
		m = max(m, v)
	}
	return m, n
}
