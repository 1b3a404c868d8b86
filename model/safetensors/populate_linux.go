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

// madvHugePage is MADV_HUGEPAGE.
const madvHugePage = 14

// adviseHugePages asks the kernel to map b, a whole file mapping, with 2 MiB pages where it
// can (MADV_HUGEPAGE). A read that misses the page cache through such a mapping then reads the
// file ahead in 2 MiB folios (Linux 6.x, on file systems with large folios such as ext4 and
// xfs), and a later mapping of those folios at a 2 MiB-aligned address (file systems align file
// mappings of 2 MiB and more) maps each with one page-table entry: populating the 0.99 GB of a
// Qwen2.5-0.5B checkpoint took 1-3 ms instead of 94-150 ms, and unmapping it 0.3 ms instead of
// 40 (docs/PERFORMANCE.md, Session 12). Pages already cached in small folios stay as they are.
// A kernel without transparent huge pages refuses the advice, which is then ignored: it is a
// hint.
func adviseHugePages(b []byte) {
	if len(b) < 2<<20 {
		return
	}
	_, _, _ = syscall.Syscall(syscall.SYS_MADVISE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), madvHugePage)
}
