//go:build goexperiment.simd && amd64

package cpu

import (
	"math/rand/v2"
	"os"
	"simd/archsimd"
	"testing"

	"github.com/loom-ml/loom/tensor"
)

// TestSIMDKernelsSelected holds the GOEXPERIMENT=simd build (CI's SIMD step) to the same
// kernels as the default build: on a CPU with AVX2 and FMA, linear runs the assembly set (the
// set chosen at start-up is a vector set, and linear's bits are its bits, not the portable
// loops'); archsimd's feature detection agrees with the kernel's, and VZEROUPPER
// (clearVectorState) runs where the CPU has AVX.
func TestSIMDKernelsSelected(t *testing.T) {
	if flags := cpuinfoFlags(t); flags != nil {
		// archsimd's detection agrees with what the kernel reports.
		for _, f := range []struct {
			name string
			has  bool
		}{{"avx", archsimd.X86.AVX()}, {"avx2", archsimd.X86.AVX2()}, {"fma", archsimd.X86.FMA()}} {
			if flags[f.name] != f.has {
				t.Errorf("/proc/cpuinfo lists %s: %v; archsimd detects it: %v", f.name, flags[f.name], f.has)
			}
		}
	}
	if hasAVX != archsimd.X86.AVX() {
		t.Errorf("hasAVX = %v, the CPU has AVX: %v (VZEROUPPER would be skipped or fault)", hasAVX, archsimd.X86.AVX())
	}
	if !archsimd.X86.AVX2() || !archsimd.X86.FMA() {
		t.Skipf("the CPU lacks AVX2 (%v) or FMA (%v): the portable kernels run", archsimd.X86.AVX2(), archsimd.X86.FMA())
	}
	if purego {
		t.Skip("the purego tag leaves the portable kernels")
	}
	if _, ok := kernelSetNamed("avx2"); !ok {
		t.Errorf("sets %v: avx2 missing on a CPU with AVX2 and FMA", kernelSetNames())
	}
	// The set chosen at start-up, which linear runs unless LOOM_CPU_KERNELS names another, is
	// a vector set, and linear's output has its bits: not the portable loops' (no fused
	// multiply-add), which a selection that fell back to them would give.
	if forced := os.Getenv(kernelEnv); forced != "" {
		t.Skipf("%s=%s forces the set", kernelEnv, forced)
	}
	if activeKernels.name != kernelSets[0].name || activeKernels.name == "portable" {
		t.Fatalf("linear runs the %q kernels; sets %v, the default %q", activeKernels.name, kernelSetNames(), kernelSets[0].name)
	}
	rng := rand.New(rand.NewPCG(91, 92))
	for _, dw := range []tensor.DType{tensor.BF16, tensor.F32} {
		x, w := linearInputs(rng, 9, 29, 896, dw)
		got := runLinear(t, fastLinear, x, w)
		var vec, portable []float32
		withKernelSet(kernelSets[0], func() { vec = runLinear(t, fastLinear, x, w) })
		withKernelSet(portableKernels, func() { portable = runLinear(t, fastLinear, x, w) })
		if i := firstF32BitDiff(got, vec); i >= 0 {
			t.Errorf("%s weights: linear's element %d is %v, the %s set's %v", dw, i, got[i], kernelSets[0].name, vec[i])
		}
		if firstF32BitDiff(got, portable) < 0 {
			t.Errorf("%s weights: linear gives the portable kernels' bits on all %d outputs: the vector kernels did not run", dw, len(got))
		}
	}
}
