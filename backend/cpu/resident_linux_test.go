//go:build linux

package cpu

import (
	"syscall"
	"unsafe"
)

// residentPages returns the bytes of b's pages that are in memory (mincore), and whether
// the call worked.
func residentPages(b []byte) (int64, bool) {
	if len(b) == 0 {
		return 0, true
	}
	page := syscall.Getpagesize()
	vec := make([]byte, (len(b)+page-1)/page)
	if _, _, e := syscall.Syscall(syscall.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		return 0, false
	}
	var n int64
	for _, v := range vec {
		if v&1 != 0 {
			n += int64(page)
		}
	}
	return n, true
}
