//go:build goexperiment.simd && amd64

package cpu

import (
	"simd/archsimd"
	"testing"
)

// TestSIMDKernelsSelected holds the GOEXPERIMENT=simd build (CI's SIMD step) to the same
// kernels as the default build: on a CPU with AVX2 and FMA, linear runs the assembly set;
// archsimd's feature detection agrees with the kernel's, and VZEROUPPER (clearVectorState)
// runs where the CPU has AVX.
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
	if _, ok := kernelSetNamed("avx2"); !ok && !purego {
		t.Errorf("sets %v: avx2 missing on a CPU with AVX2 and FMA", kernelSetNames())
	}
}
