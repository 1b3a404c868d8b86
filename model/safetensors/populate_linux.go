//go:build linux

package safetensors

import (
	"errors"
	"syscall"
	"unsafe"
)

// madvPopulateRead is MADV_POPULATE_READ (Linux 5.14): fault in the pages of a range for
// reading, failing with EFAULT where a read would raise SIGBUS (past the end of the file).
const madvPopulateRead = 22

// populateRange maps the pages under b, a slice of a file mapping. A kernel without
// MADV_POPULATE_READ (EINVAL) leaves them to be faulted in at the first read.
func populateRange(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	page := uintptr(syscall.Getpagesize())
	start := uintptr(unsafe.Pointer(&b[0]))
	lo := start &^ (page - 1)
	for {
		_, _, e := syscall.Syscall(syscall.SYS_MADVISE, lo, start+uintptr(len(b))-lo, madvPopulateRead)
		switch {
		case e == 0, e == syscall.EINVAL:
			return nil
		case e == syscall.EINTR:
			continue
		case e == syscall.EFAULT:
			return ErrShrunk
		default:
			return errors.New(e.Error())
		}
	}
}
