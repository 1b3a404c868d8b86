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
