//go:build !(goexperiment.simd && amd64)

package cpu

// clearVectorState is a no-op without the AVX kernels of GOEXPERIMENT=simd builds (see
// fast_linear_simd.go): nothing here dirties the upper halves of the vector registers.
func clearVectorState() {}
