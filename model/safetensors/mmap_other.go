//go:build !unix

package safetensors

import (
	"fmt"
	"io"
	"os"
)

// mapFile reads the whole file where memory mapping is not available, and returns false:
// reads copy from the buffer.
func mapFile(f *os.File, size int64) ([]byte, func([]byte) error, bool, error) {
	if int64(int(size)) != size {
		return nil, nil, false, fmt.Errorf("file of %d bytes is too large to read", size)
	}
	b := make([]byte, size)
	if _, err := io.ReadFull(f, b); err != nil {
		return nil, nil, false, err
	}
	return b, func([]byte) error { return nil }, false, nil
}
