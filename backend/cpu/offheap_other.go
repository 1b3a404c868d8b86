//go:build !unix

package cpu

import "unsafe"

// mapZeroed allocates n zeroed bytes in the Go heap where anonymous mappings are not at hand.
func mapZeroed(n int) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	// float32-aligned: allocate words, view them as bytes.
	w := make([]uint64, (n+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), n), nil
}

// unmap leaves the memory to the collector.
func unmap([]byte) error { return nil }

// bytesAsF32 views the first 4n bytes of b as n float32s.
func bytesAsF32(b []byte, n int) []float32 {
	if n == 0 {
		return []float32{}
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n)
}

// bytesAsU16 views the first 2n bytes of b as n uint16s.
func bytesAsU16(b []byte, n int) []uint16 {
	if n == 0 {
		return []uint16{}
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), n)
}
