//go:build goexperiment.simd && amd64

package cpu

import "simd/archsimd"

// What GOEXPERIMENT=simd builds need beyond the default build. Linear's vector kernels are
// Go assembly in every amd64 build (kernels_amd64.s); the simd/archsimd versions this file
// held until session 8 gave the same bits and ran 1.3-2x slower, so they went.

// hasAVX reports whether VZEROUPPER may be executed.
var hasAVX = archsimd.X86.AVX()

// clearVectorState clears the upper halves of the vector registers (VZEROUPPER), so that the
// SSE instructions of scalar float code that follows run at full speed. The assembly kernels
// clear them before they return, but something else leaves them dirty: with
// GOEXPERIMENT=simd the runtime's asynchronous preemption restores the full YMM/ZMM registers without clearing them afterwards, and on
// the Xeon we measured the scalar code of a preempted goroutine then ran up to 20x slower
// (math.Exp in silu, softmax) until the next VZEROUPPER. The executor calls this before
// every kernel and the worker pool before every chunk.
func clearVectorState() {
	if hasAVX {
		archsimd.ClearAVXUpperBits()
	}
}
