//go:build goexperiment.simd && amd64

package cpu

import (
	"os"
	"reflect"
	"simd/archsimd"
	"strings"
	"testing"
)

// TestSIMDKernelsSelected holds the GOEXPERIMENT=simd build (CI's SIMD step) to what it is
// for: on a CPU with AVX2 and FMA, linear's group kernels are the AVX2 ones of
// fast_linear_simd.go, so that the step's tests run them rather than the portable kernels.
// Without AVX2 or FMA the portable kernels stay, and the test says so in a skip.
func TestSIMDKernelsSelected(t *testing.T) {
	same := func(a, b any) bool { return reflect.ValueOf(a).Pointer() == reflect.ValueOf(b).Pointer() }
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
		if !same(groupBF16, gemmGroupBF16) || !same(groupF32, gemmGroupF32) {
			t.Error("the AVX2 kernels are selected on a CPU without AVX2 and FMA")
		}
		t.Skipf("the CPU lacks AVX2 (%v) or FMA (%v): the portable kernels run", archsimd.X86.AVX2(), archsimd.X86.FMA())
	}
	if !same(groupBF16, simdGroupBF16) {
		t.Error("groupBF16 is not simdGroupBF16: linear runs the portable bf16 kernel on a CPU with AVX2 and FMA")
	}
	if !same(groupF32, simdGroupF32) {
		t.Error("groupF32 is not simdGroupF32: linear runs the portable f32 kernel on a CPU with AVX2 and FMA")
	}
}

// cpuinfoFlags returns the flags of the first processor in /proc/cpuinfo, or nil where
// there is no such file.
func cpuinfoFlags(t *testing.T) map[string]bool {
	data, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Logf("no /proc/cpuinfo (%v): CPU features as archsimd detects them", err)
		return nil
	}
	for line := range strings.Lines(string(data)) {
		key, val, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(key) != "flags" {
			continue
		}
		flags := map[string]bool{}
		for _, f := range strings.Fields(val) {
			flags[f] = true
		}
		return flags
	}
	t.Log("/proc/cpuinfo has no flags line: CPU features as archsimd detects them")
	return nil
}
