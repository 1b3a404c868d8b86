//go:build !(goexperiment.simd && amd64)

package cpu

// clearVectorState is a no-op outside GOEXPERIMENT=simd builds (see fast_linear_simd.go):
// the assembly kernels run VZEROUPPER before they return, and the runtime does not restore
// the upper halves of the vector registers.
func clearVectorState() {}
