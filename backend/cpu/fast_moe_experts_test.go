package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/loom-ml/loom/tensor"
)

// expertsOutSerial is what expertsOut computes, one expert after another with gemmRows (a
// fork and join per projection): the kernel's results before the experts ran in one pass.
func expertsOutSerial(xe []float32, rows int, groups []moeGroup, gate, up, down *tensor.Tensor, act tensor.DType) []float32 {
	I, H := gate.Shape[1], gate.Shape[2]
	y := make([]float32, rows*H)
	for _, g := range groups {
		x := xe[g.off*H : (g.off+g.m)*H]
		gv, uv := make([]float32, g.m*I), make([]float32, g.m*I)
		gemmRows(gv, x, expertView(gate, g.l), g.m, I, H)
		gemmRows(uv, x, expertView(up, g.l), g.m, I, H)
		roundAll(act, gv)
		roundAll(act, uv)
		swigluRow(gv, gv, uv, act)
		roundAll(act, gv)
		gemmRows(y[g.off*H:(g.off+g.m)*H], gv, expertView(down, g.l), g.m, H, I)
	}
	return y
}

// expertsOut against the experts run one after another through gemmRows: bit for bit, on
// every kernel set, weight dtype, one row per expert (decode) and many, at several
// GOMAXPROCS (so several work splits).
func TestExpertsOutBits(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, s := range kernelSets {
		for _, wdt := range []tensor.DType{tensor.BF16, tensor.F16, tensor.F32} {
			for _, ms := range [][]int{{1, 1, 1, 1, 1, 1, 1, 1}, {5, 0, 1, 9, 2}} {
				const L, I, H = 8, 302, 132 // not multiples of 4 or 8
				act := tensor.BF16
				gate, up := randTensor(rng, wdt, []int{L, I, H}, -0.5, 0.5), randTensor(rng, wdt, []int{L, I, H}, -0.5, 0.5)
				down := randTensor(rng, wdt, []int{L, H, I}, -0.5, 0.5)
				var groups []moeGroup
				rows := 0
				for l, m := range ms {
					if m > 0 {
						groups = append(groups, moeGroup{l: l, m: m, off: rows})
						rows += m
					}
				}
				xe := make([]float32, rows*H)
				for i := range xe {
					xe[i] = roundF32(act, float32(rng.Float64()*4-2))
				}
				for _, procs := range []int{1, 2, 7} {
					runtime.GOMAXPROCS(procs)
					t.Run(fmt.Sprintf("%s/%s/rows=%d/procs=%d", s.name, wdt, rows, procs), func(t *testing.T) {
						withKernelSet(s, func() {
							want := expertsOutSerial(xe, rows, groups, gate, up, down, act)
							got := expertsOut(xe, rows, groups, gate, up, down, act)
							defer putF32(got)
							for i, w := range want {
								if math.Float32bits((*got)[i]) != math.Float32bits(w) {
									t.Fatalf("y[%d] = %v, want %v", i, (*got)[i], w)
								}
							}
						})
					})
				}
			}
		}
	}
}

// BenchmarkExpertsOut: one decode token's 8 experts of Qwen3-30B-A3B's shape (I 768, H 2048,
// bf16 weights, 75 MB: past the caches), run in one pass (expertsOut) and one expert and
// projection after another through gemmRows (serial: 24 forks and joins).
func BenchmarkExpertsOut(b *testing.B) {
	const L, I, H = 8, 768, 2048
	rng := rand.New(rand.NewPCG(1, 2))
	gate, up := randTensor(rng, tensor.BF16, []int{L, I, H}, -0.5, 0.5), randTensor(rng, tensor.BF16, []int{L, I, H}, -0.5, 0.5)
	down := randTensor(rng, tensor.BF16, []int{L, H, I}, -0.5, 0.5)
	groups := make([]moeGroup, L)
	for l := range groups {
		groups[l] = moeGroup{l: l, m: 1, off: l}
	}
	xe := make([]float32, L*H)
	for i := range xe {
		xe[i] = float32(rng.Float64()*4 - 2)
	}
	b.Run("fused", func(b *testing.B) {
		for b.Loop() {
			putF32(expertsOut(xe, L, groups, gate, up, down, tensor.F32))
		}
	})
	b.Run("serial", func(b *testing.B) {
		for b.Loop() {
			expertsOutSerial(xe, L, groups, gate, up, down, tensor.F32)
		}
	})
}
