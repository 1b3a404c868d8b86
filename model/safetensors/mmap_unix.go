//go:build unix

package safetensors

import (
	"fmt"
	"os"
	"syscall"
)

// mapFile maps size bytes of f read-only and returns the mapping, its release function and
// true: the file is mapped, so reads of tensor data go through f (pread) rather than the
// mapping (see File.fd).
func mapFile(f *os.File, size int64) ([]byte, func([]byte) error, bool, error) {
	if int64(int(size)) != size {
		return nil, nil, false, fmt.Errorf("file of %d bytes is too large to map", size)
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, nil, false, err
	}
	adviseHugePages(b)
	return b, syscall.Munmap, true, nil
}
