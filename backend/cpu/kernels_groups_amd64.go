//go:build amd64 && !purego

package cpu

import "unsafe"

// avx2BF16Groups4x2 is the bf16 4x2 micro-kernel over whole groups of four weight rows and
// blocks of four rows of x in one assembly call (kernels_groups_amd64.s): for each of groups
// groups (weight rows 4g..4g+3, wstride bytes apart from w), for each of mblocks blocks of x
// (rows 4b..4b+3, xstride bytes apart from x), res[(4b+i)*rstride/4 + 4g+r] = the vector part
// of x row 4b+i · weight row 4g+r (its first n products, n a multiple of 8) plus +0: the calls
// and stores avx2Group makes for such groups, without Go between them (10-15% of a batch
// linear's time at K=896 on the development machine).
//
//go:noescape
func avx2BF16Groups4x2(x unsafe.Pointer, xstride, mblocks int, w unsafe.Pointer, wstride, groups, n int, res unsafe.Pointer, rstride int)

// avx2BlockBF16 sets res[m*N+j] = x[m,:]·w[j,:] for every m < M and lo <= j < hi (lo a
// multiple of 4), x f32 [M,K], w bf16 [N,K]: the whole groups of four weight rows meet the
// blocks of four rows of x in avx2BF16Groups4x2, the rest (a last group of fewer rows, the
// last M%4 rows of x) in avx2GroupBF16; each output gets the bits avx2GroupBF16 gives it.
func avx2BlockBF16(res, xs []float32, w []uint16, M, N, K, lo, hi int) {
	groups, m4, kv := (hi-lo)/4, M&^3, K&^7
	var rows [4][]uint16
	group := func(res, xs []float32, M, j int) {
		n := min(4, hi-j)
		for r := range n {
			rows[r] = w[(j+r)*K : (j+r+1)*K]
		}
		avx2GroupBF16(res, xs, rows[:n], M, N, K, j)
	}
	done := lo // weight rows whose outputs for x rows < m4 are done
	if groups > 0 && m4 > 0 && kv > 0 {
		end := lo + 4*groups
		_, _, _ = xs[m4*K-1], w[end*K-1], res[(m4-1)*N+end-1] // the extent the assembly reads and writes
		avx2BF16Groups4x2(unsafe.Pointer(&xs[0]), 4*K, m4/4, unsafe.Pointer(&w[lo*K]), 2*K, groups, kv, unsafe.Pointer(&res[lo]), 4*N)
		if kv < K { // the last K%8 products in order, as avx2GroupBF16 adds them
			for m := range m4 {
				x := xs[m*K+kv : (m+1)*K]
				for j := lo; j < end; j++ {
					row := w[j*K+kv : (j+1)*K]
					var s float32
					for k, v := range x {
						s += v * bf16(row[k])
					}
					res[m*N+j] += s
				}
			}
		}
		done = end
	}
	for j := done; m4 > 0 && j < hi; j += 4 {
		group(res, xs[:m4*K], m4, j)
	}
	if m4 < M {
		for j := lo; j < hi; j += 4 {
			group(res[m4*N:], xs[m4*K:M*K], M-m4, j)
		}
	}
}
