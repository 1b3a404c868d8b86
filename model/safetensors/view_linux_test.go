//go:build linux

package safetensors

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/loom-ml/loom/tensor"
)

// populateSupported reports whether the kernel has MADV_POPULATE_READ (an old one answers
// EINVAL).
func populateSupported(t *testing.T) bool {
	t.Helper()
	b, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_READ, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(b)
	_, _, e := syscall.Syscall(syscall.SYS_MADVISE, uintptr(unsafe.Pointer(&b[0])), 4096, madvPopulateRead)
	return e != syscall.EINVAL
}

// TestTruncatedAfterOpen: a file cut short after Open gives errors that name the file and the
// tensor, from View (its pages are populated before it returns, so no SIGBUS) and from reads,
// never a fault.
func TestTruncatedAfterOpen(t *testing.T) {
	big := tensor.New(tensor.F32, 5<<10) // 20 KiB: five pages
	small := tensor.FromF32([]float32{1, 2}, 2)
	path := filepath.Join(t.TempDir(), "t.safetensors")
	if err := Write(path, map[string]*tensor.Tensor{"big": big, "small": small}); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.fd == nil {
		t.Skip("the file is not memory-mapped here")
	}
	ti, _ := f.Info("big")
	// Keep the header and the first page of data: the rest of "big" is gone.
	if err := os.Truncate(path, f.dataOff+min(ti.Begin, ti.End-4096)+1); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Tensor("big"); err == nil || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), `"big"`) {
		t.Errorf("reading a truncated tensor: %v, want an error naming the file and the tensor", err)
	}
	if !populateSupported(t) {
		t.Skip("the kernel does not populate mappings (MADV_POPULATE_READ, Linux 5.14): a view of the cut pages would fault when read")
	}
	_, _, err = f.View("big", -1, 0, 1)
	if !errors.Is(err, ErrShrunk) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), `"big"`) {
		t.Errorf("View of a truncated tensor: %v, want ErrShrunk naming the file and the tensor", err)
	}
}
