package cpu

import (
	"runtime"

	"github.com/loom-ml/loom/tensor"
)

// The local experts of one batch in two parallel regions: one parallel loop over (expert,
// block of output rows) work items for the gate and up projections with the silu(g)*u
// epilogue, then one over (expert, block of output rows) for the down projection; two
// forks and joins per layer instead of three per chosen expert. Each output row is computed
// by the dense linear kernel's per-row kernels (gemmRange, the body of gemmRows), so the
// results are gemmRows' bits whatever the split.

// moeGroup is one local expert's share of a batch: expert l of the stacked weights, its m
// rows from row off of the gathered rows on.
type moeGroup struct{ l, m, off int }

// moeItem is one work item: output rows [lo, hi) of group g's projection.
type moeItem struct{ g, lo, hi int }

// moeItems splits N output rows of every group into blocks (multiples of 4 rows) of about
// equal work, cost multiply-adds per row and token: about four items per core in all, none
// under the worker pool's minimum chunk of work.
func moeItems(groups []moeGroup, N, cost int) []moeItem {
	const minWork = 1 << 15
	total := 0
	for _, g := range groups {
		total += g.m * N * cost
	}
	target := max(total/(4*runtime.GOMAXPROCS(0)), minWork)
	var items []moeItem
	for i, g := range groups {
		per := max(g.m*cost, 1)
		block := min(max((target+per-1)/per, 4), N)
		block = (block + 3) &^ 3
		for lo := 0; lo < N; lo += block {
			items = append(items, moeItem{g: i, lo: lo, hi: min(lo+block, N)})
		}
	}
	return items
}

// expertsOut runs each group's expert of the stacked weights gate and up [L,I,H], down
// [L,H,I] on its rows of xe[rows*H], rounding as the decomposition's nodes round (each
// projection and silu(g)*u to act), and returns the outputs y[rows*H] in a pooled buffer,
// not yet rounded to act.
func expertsOut(xe []float32, rows int, groups []moeGroup, gate, up, down *tensor.Tensor, act tensor.DType) *[]float32 {
	I, H := gate.Shape[1], gate.Shape[2]
	gv, uv, dv := make([]*tensor.Tensor, len(groups)), make([]*tensor.Tensor, len(groups)), make([]*tensor.Tensor, len(groups))
	for i, g := range groups {
		gv[i], uv[i], dv[i] = expertView(gate, g.l), expertView(up, g.l), expertView(down, g.l)
	}
	h, u := getF32(rows*I), getF32(rows*I)
	items := moeItems(groups, I, 2*H)
	parallel(len(items), 1, func(lo, hi int) {
		for _, it := range items[lo:hi] {
			g := groups[it.g]
			x := xe[g.off*H : (g.off+g.m)*H]
			hg, ug := (*h)[g.off*I:(g.off+g.m)*I], (*u)[g.off*I:(g.off+g.m)*I]
			gemmRange(hg, x, gv[it.g], g.m, I, H, it.lo, it.hi)
			gemmRange(ug, x, uv[it.g], g.m, I, H, it.lo, it.hi)
			for i := range g.m {
				hr, ur := hg[i*I+it.lo:i*I+it.hi], ug[i*I+it.lo:i*I+it.hi]
				roundAll(act, hr)
				roundAll(act, ur)
				swigluRow(hr, hr, ur, act) // h = silu(g)*u, over g
				roundAll(act, hr)
			}
		}
	})
	putF32(u)
	y := getF32(rows * H)
	items = moeItems(groups, H, I)
	parallel(len(items), 1, func(lo, hi int) {
		for _, it := range items[lo:hi] {
			g := groups[it.g]
			gemmRange((*y)[g.off*H:(g.off+g.m)*H], (*h)[g.off*I:(g.off+g.m)*I], dv[it.g], g.m, H, I, it.lo, it.hi)
		}
	})
	putF32(h)
	return y
}
