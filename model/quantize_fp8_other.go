//go:build !amd64 || purego

package model

// fp8AVX2 is false where quantize_fp8_amd64.s is not built.
var fp8AVX2 = false

// encodeBF16Fast converts nothing here (see quantize_fp8_amd64.go).
func encodeBF16Fast(q []uint8, row []uint16, s float32) int { return 0 }

// maxMagnitudeBF16Fast finds nothing here (see quantize_fp8_amd64.go).
func maxMagnitudeBF16Fast(row []uint16) (uint16, int) { return 0, 0 }
