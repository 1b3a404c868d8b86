//go:build linux

package cpu

import (
	"syscall"
	"unsafe"

	"github.com/loom-ml/loom/tensor"
)

// hugePage is the size of a transparent huge page on the architectures Loom runs on.
const hugePage = 2 << 20

// madvHugePage is MADV_HUGEPAGE.
const madvHugePage = 14

// adviseHugePages asks the kernel to back the whole 2 MiB pages inside t's storage, not yet
// touched, with transparent huge pages (where they are enabled as "madvise" or "always"): a
// fused weight read at load then takes one fault per 2 MiB instead of per 4 KiB, about half
// the time of reading it on the 2-core development machine (docs/PERFORMANCE.md, Session 10).
// Storage under two huge pages, or a kernel that refuses, is left as it is: this is a hint.
func adviseHugePages(t *tensor.Tensor) {
	b := storageBytes(t)
	if len(b) < 2*hugePage {
		return
	}
	start := uintptr(unsafe.Pointer(&b[0]))
	lo := (start + hugePage - 1) &^ (hugePage - 1)
	hi := (start + uintptr(len(b))) &^ (hugePage - 1)
	if hi <= lo {
		return
	}
	_, _, _ = syscall.Syscall(syscall.SYS_MADVISE, lo, hi-lo, madvHugePage)
}

// storageBytes is t's storage viewed as bytes (nil for bool).
func storageBytes(t *tensor.Tensor) []byte {
	view := func(p unsafe.Pointer, n, size int) []byte {
		if n == 0 {
			return nil
		}
		return unsafe.Slice((*byte)(p), n*size)
	}
	switch t.DType {
	case tensor.F32:
		if len(t.F32) > 0 {
			return view(unsafe.Pointer(&t.F32[0]), len(t.F32), 4)
		}
	case tensor.BF16, tensor.F16:
		if len(t.Half) > 0 {
			return view(unsafe.Pointer(&t.Half[0]), len(t.Half), 2)
		}
	case tensor.I32:
		if len(t.I32) > 0 {
			return view(unsafe.Pointer(&t.I32[0]), len(t.I32), 4)
		}
	case tensor.I64:
		if len(t.I64) > 0 {
			return view(unsafe.Pointer(&t.I64[0]), len(t.I64), 8)
		}
	case tensor.F8E4M3, tensor.F8E5M2:
		return t.U8
	}
	return nil
}
