//go:build unix

package cpu

import (
	"fmt"
	"syscall"
)

// mapZeroed maps n bytes of private anonymous memory: zero pages until written, outside the
// Go heap (the collector neither scans nor counts it). n == 0 maps nothing.
func mapZeroed(n int) ([]byte, error) {
	if n == 0 {
		return nil, nil
	}
	b, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return nil, fmt.Errorf("mmap %d bytes: %w", n, err)
	}
	return b, nil
}

// unmap releases a mapping of mapZeroed.
func unmap(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if err := syscall.Munmap(b); err != nil {
		return fmt.Errorf("munmap %d bytes: %w", len(b), err)
	}
	return nil
}
