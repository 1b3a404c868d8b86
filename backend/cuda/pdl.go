package cuda

import "os"

// pdlFiles are the kernel files whose every kernel calls pdl_wait (common.cuh) before it
// touches memory another kernel uses, so that they can be launched with programmatic
// dependent launch (cubind.LaunchKernelPDL): each may start while the kernel before it is
// finishing, which hides most of a small kernel's launch and ramp-up inside a CUDA graph.
// Only weights, which no kernel writes, may be read before the wait, with
// ld.global.nc.L1::no_allocate (gemv_load_w). TestPDLKernelsWait checks the rule on every
// path through the PTX of every kernel listed (with NVRTC); TestPDLFilesWait, on the
// sources, that each kernel calls the wait.
var pdlFiles = map[string]bool{
	"allreduce.cu":   true,
	"elementwise.cu": true,
	"flash.cu":       true,
	"norm.cu":        true,
	"paged.cu":       true,
	"embedding.cu":   true,
	"gemv.cu":        true,
	"fp8.cu":         true,
	"moe.cu":         true,
	"packed.cu":      true,
	"rope.cu":        true,
}

// usePDL reports whether a device of compute capability major launches the kernels of
// pdlFiles with programmatic dependent launch: on sm_90 and later, when the driver has
// cuLaunchKernelEx, unless LOOM_CUDA_PDL=0.
func usePDL(major int, driverHas bool) bool {
	return major >= 9 && driverHas && os.Getenv("LOOM_CUDA_PDL") != "0"
}
