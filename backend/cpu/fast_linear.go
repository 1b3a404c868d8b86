package cpu

import (
	"math"
	"sync"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Fast matrix products. Both sum every output in float32 in the order of the inner index
// with one accumulator, like the reference kernels; the speed comes from computing several
// outputs at once (independent accumulators that share their loads), widening bf16 inline
// and splitting the work over the shared worker pool. Without fused multiply-add (the
// default GOAMD64=v1 build) they give the reference kernels' bits.

// f32Pool recycles float32 scratch buffers (widened activations, weight rows).
var f32Pool sync.Pool

// getF32 returns a scratch slice of n float32s (contents undefined); give it back with putF32.
func getF32(n int) *[]float32 {
	if p, ok := f32Pool.Get().(*[]float32); ok && cap(*p) >= n {
		*p = (*p)[:n]
		return p
	}
	s := make([]float32, n)
	return &s
}

func putF32(p *[]float32) { f32Pool.Put(p) }

// widenInto returns t's elements as float32: t's storage for f32, else t widened into a
// pooled buffer, returned as the second result (nil when nothing was borrowed).
func widenInto(t *tensor.Tensor) ([]float32, *[]float32) {
	if t.DType == tensor.F32 {
		return t.F32, nil
	}
	p := getF32(t.Numel())
	widen(*p, t, 0)
	return *p, p
}

// widen writes len(dst) elements of the float tensor t, from flat offset off, to dst.
func widen(dst []float32, t *tensor.Tensor, off int) {
	switch t.DType {
	case tensor.F32:
		copy(dst, t.F32[off:off+len(dst)])
	case tensor.BF16:
		src := t.Half[off : off+len(dst)]
		for i, h := range src {
			dst[i] = math.Float32frombits(uint32(h) << 16)
		}
	case tensor.F16:
		src := t.Half[off : off+len(dst)]
		for i, h := range src {
			dst[i] = tensor.F16ToF32(h)
		}
	}
}

// fastLinear: x[...,K] (f32, bf16 or f16) @ w[N,K]^T (bf16, f16 or f32) -> out[...,N] in x's
// dtype. The weight rows are split over the worker pool in groups of four; each group is read
// from memory once and kept in cache while it meets every row of x, four rows of x at a time
// (or, for the last M%4 rows, four weight rows at a time). bf16 weights are widened inline
// with a shift; f16 weights are widened one group at a time into a per-worker buffer.
func fastLinear(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	M, N, K, err := linearDims(n, in, out)
	if err != nil {
		return nil, err
	}
	x, w, o := in[0], in[1], out[0]
	res := linearProduct(x, o, M, N, K, func(res, xs []float32) { gemmRows(res, xs, w, M, N, K) })
	return []*tensor.Tensor{res}, nil
}

// linearProduct returns out o = x[M,K] times a weight of N rows, computed by gemm into
// res[M*N] (every element written) from x widened to f32 (xs); zeros when a dimension is 0.
func linearProduct(x *tensor.Tensor, o Out, M, N, K int, gemm func(res, xs []float32)) *tensor.Tensor {
	if M == 0 || N == 0 || K == 0 {
		return fromF32(newShaped(o.arena, tensor.F32, []int{M * N}, true).F32, o)
	}
	res := o.scratchF32(M * N)
	xs, buf := widenInto(x)
	gemm(res, xs)
	if buf != nil {
		putF32(buf)
	}
	return fromF32(res, o)
}

// groupBF16 and groupF32 compute the outputs of a group of up to four weight rows (see
// gemmGroupBF16): those of the kernel set in use (kernels.go), the portable ones below or the
// assembly of kernels_amd64.s.
// gemvBF16, if not nil, replaces the groups for one row of x and bf16 weights (decode).
// bf16Rows, if not nil, replaces both for bf16 weights (it converts x first: see bf16Path).
// blockBF16, if not nil, replaces groupBF16 for a block of weight rows (gemmGroups).
var (
	groupBF16 = gemmGroupBF16
	groupF32  = gemmGroupF32
	gemvBF16  func(res, x []float32, w []uint16, N, K, lo, hi int)
	bf16Rows  *bf16Path
	blockBF16 func(res, xs []float32, w []uint16, M, N, K, lo, hi int)
)

// gemmRows computes res[m*N+j] = x[m,:]·w[j,:] for every m < M and j < N over the worker
// pool, in groups of four weight rows: x is f32 [M,K], w a float tensor [N,K].
func gemmRows(res, xs []float32, w *tensor.Tensor, M, N, K int) {
	if p := bf16Rows; p != nil && w.DType == tensor.BF16 {
		xb := p.round(xs, M, K) // once for every chunk
		parallel(N, grainFor(N, M*K, 4), func(lo, hi int) { p.rows(res, *xb, w.Half, M, N, K, lo, hi) })
		putU16(xb)
		return
	}
	parallel(N, grainFor(N, M*K, 4), func(lo, hi int) { gemmRange(res, xs, w, M, N, K, lo, hi) })
}

// gemmRange computes res[m*N+j] = x[m,:]·w[j,:] for every m < M and lo <= j < hi on the
// calling goroutine, as one chunk of gemmRows computes them (lo a multiple of 4): x is f32
// [M,K], w a float tensor [N,K].
func gemmRange(res, xs []float32, w *tensor.Tensor, M, N, K, lo, hi int) {
	if p := bf16Rows; p != nil && w.DType == tensor.BF16 {
		xb := p.round(xs, M, K)
		p.rows(res, *xb, w.Half, M, N, K, lo, hi)
		putU16(xb)
		return
	}
	if M == 1 && w.DType == tensor.BF16 && gemvBF16 != nil {
		gemvBF16(res, xs, w.Half, N, K, lo, hi)
		return
	}
	var wbuf *[]float32
	if w.DType == tensor.F16 {
		wbuf = getF32(4 * K)
		defer putF32(wbuf)
	}
	// Many rows of x: in blocks of mb rows of x and jb weight rows that stay in the core's L2
	// cache together (see cacheBlocks), rather than all of x read again for every group of
	// four weight rows. Each output is computed as before (the kernels' bits do not depend
	// on which rows of x share a call).
	mb, jb := cacheBlocks(M, K, w.DType.Size())
	if wbuf != nil {
		jb = 4 // f16 widens one group at a time into wbuf
	}
	for j0 := lo; j0 < hi; j0 += jb {
		j1 := min(j0+jb, hi)
		for m0 := 0; m0 < M; m0 += mb {
			m := min(mb, M-m0)
			gemmGroups(res[m0*N:], xs[m0*K:(m0+m)*K], w, wbuf, m, N, K, j0, j1)
		}
	}
}

// l2X and l2W are the bytes of x, and of weights, that a block of gemmRange keeps in a core's
// L2 cache (512 KiB a core on the development machine's EPYC, 1-2 MiB on newer cores; the
// rest is left to the other data of a step). With all of x read for every group of four
// weight rows, a 225-row prefill linear (x 806 KB at K=896) read x from L3; in blocks it ran
// 1.2-1.3x faster on one core (docs/PERFORMANCE.md).
const l2X, l2W = 96 << 10, 64 << 10

// cacheBlocks returns the rows of x (mb) and of the weights (jb, a multiple of 4) that
// gemmRange computes together: about l2X bytes of x and l2W of weights. mb is M when x fits whole.
func cacheBlocks(M, K, wsize int) (mb, jb int) {
	mb = max(4, l2X/(4*K)&^3)
	if mb >= M {
		mb = M
	}
	jb = max(4, l2W/(wsize*K)&^3)
	return mb, jb
}

// gemmGroups computes res[m*N+j] = x[m,:]·w[j,:] for every m < M and lo <= j < hi, in
// groups of four weight rows (lo a multiple of 4); wbuf is the widening buffer of f16
// weights (4K elements).
func gemmGroups(res, xs []float32, w *tensor.Tensor, wbuf *[]float32, M, N, K, lo, hi int) {
	if blockBF16 != nil && w.DType == tensor.BF16 {
		blockBF16(res, xs, w.Half, M, N, K, lo, hi)
		return
	}
	var halfRows [4][]uint16
	var rows [4][]float32
	for j := lo; j < hi; j += 4 {
		jb := min(4, hi-j)
		switch w.DType {
		case tensor.BF16:
			for r := range jb {
				halfRows[r] = w.Half[(j+r)*K : (j+r+1)*K]
			}
			groupBF16(res, xs, halfRows[:jb], M, N, K, j)
		case tensor.F32:
			for r := range jb {
				rows[r] = w.F32[(j+r)*K : (j+r+1)*K]
			}
			groupF32(res, xs, rows[:jb], M, N, K, j)
		default: // f16: widen the group once
			for r := range jb {
				rows[r] = (*wbuf)[r*K : (r+1)*K]
				widen(rows[r], w, (j+r)*K)
			}
			groupF32(res, xs, rows[:jb], M, N, K, j)
		}
	}
}

// gemmGroupBF16 computes the outputs of up to four consecutive bf16 weight rows, the first
// being row j, for every row of x.
func gemmGroupBF16(res, xs []float32, rows [][]uint16, M, N, K, j int) {
	m := 0
	for ; m+4 <= M; m += 4 {
		x0, x1, x2, x3 := xs[m*K:(m+1)*K], xs[(m+1)*K:(m+2)*K], xs[(m+2)*K:(m+3)*K], xs[(m+3)*K:(m+4)*K]
		for r, wr := range rows {
			s0, s1, s2, s3 := dot4x1BF16(x0, x1, x2, x3, wr)
			res[m*N+j+r], res[(m+1)*N+j+r], res[(m+2)*N+j+r], res[(m+3)*N+j+r] = s0, s1, s2, s3
		}
	}
	for ; m < M; m++ {
		xr := xs[m*K : (m+1)*K]
		if len(rows) == 4 {
			s0, s1, s2, s3 := dot1x4BF16(xr, rows[0], rows[1], rows[2], rows[3])
			res[m*N+j], res[m*N+j+1], res[m*N+j+2], res[m*N+j+3] = s0, s1, s2, s3
			continue
		}
		for r, wr := range rows {
			res[m*N+j+r] = dot1x1BF16(xr, wr)
		}
	}
}

// gemmGroupF32 is gemmGroupBF16 for f32 weight rows.
func gemmGroupF32(res, xs []float32, rows [][]float32, M, N, K, j int) {
	m := 0
	for ; m+4 <= M; m += 4 {
		x0, x1, x2, x3 := xs[m*K:(m+1)*K], xs[(m+1)*K:(m+2)*K], xs[(m+2)*K:(m+3)*K], xs[(m+3)*K:(m+4)*K]
		for r, wr := range rows {
			s0, s1, s2, s3 := dot4x1F32(x0, x1, x2, x3, wr)
			res[m*N+j+r], res[(m+1)*N+j+r], res[(m+2)*N+j+r], res[(m+3)*N+j+r] = s0, s1, s2, s3
		}
	}
	for ; m < M; m++ {
		xr := xs[m*K : (m+1)*K]
		if len(rows) == 4 {
			s0, s1, s2, s3 := dot1x4F32(xr, rows[0], rows[1], rows[2], rows[3])
			res[m*N+j], res[m*N+j+1], res[m*N+j+2], res[m*N+j+3] = s0, s1, s2, s3
			continue
		}
		for r, wr := range rows {
			res[m*N+j+r] = dot(xr, wr)
		}
	}
}

// bf16 widens a bfloat16 bit pattern: the 16 bits are the top half of the float32.
func bf16(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// The micro-kernels below keep one float32 accumulator per output (summing in k order) and
// at most about ten live floats, which is what the Go compiler keeps in registers.

// dot4x1BF16 returns x0·w, x1·w, x2·w, x3·w for four f32 rows and one bf16 row of one length.
func dot4x1BF16(x0, x1, x2, x3 []float32, w []uint16) (s0, s1, s2, s3 float32) {
	n := len(w)
	x0, x1, x2, x3 = x0[:n], x1[:n], x2[:n], x3[:n]
	for k, h := range w {
		u := bf16(h)
		s0 += x0[k] * u
		s1 += x1[k] * u
		s2 += x2[k] * u
		s3 += x3[k] * u
	}
	return
}

// dot1x4BF16 returns x·w0, x·w1, x·w2, x·w3 for one f32 row and four bf16 rows.
func dot1x4BF16(x []float32, w0, w1, w2, w3 []uint16) (s0, s1, s2, s3 float32) {
	n := len(x)
	w0, w1, w2, w3 = w0[:n], w1[:n], w2[:n], w3[:n]
	for k, v := range x {
		s0 += v * bf16(w0[k])
		s1 += v * bf16(w1[k])
		s2 += v * bf16(w2[k])
		s3 += v * bf16(w3[k])
	}
	return
}

// dot1x1BF16 returns x·w for an f32 row and a bf16 row.
func dot1x1BF16(x []float32, w []uint16) (s float32) {
	w = w[:len(x)]
	for k, v := range x {
		s += v * bf16(w[k])
	}
	return
}

// dot4x1F32 is dot4x1BF16 for an f32 weight row.
func dot4x1F32(x0, x1, x2, x3, w []float32) (s0, s1, s2, s3 float32) {
	n := len(w)
	x0, x1, x2, x3 = x0[:n], x1[:n], x2[:n], x3[:n]
	for k, u := range w {
		s0 += x0[k] * u
		s1 += x1[k] * u
		s2 += x2[k] * u
		s3 += x3[k] * u
	}
	return
}

// dot1x4F32 is dot1x4BF16 for f32 weight rows.
func dot1x4F32(x, w0, w1, w2, w3 []float32) (s0, s1, s2, s3 float32) {
	n := len(x)
	w0, w1, w2, w3 = w0[:n], w1[:n], w2[:n], w3[:n]
	for k, v := range x {
		s0 += v * w0[k]
		s1 += v * w1[k]
		s2 += v * w2[k]
		s3 += v * w3[k]
	}
	return
}

// fastMatmul: a[...,M,K] @ b[...,K,N] -> out[...,M,N], batch dimensions broadcast. Floats:
// both operands are widened to float32 once (f32 storage is used as is) and every output row
// is computed eight columns at a time with register accumulators, summing in k order; rows
// are split over the worker pool. Integer products go to the reference kernel.
func fastMatmul(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 2, 1); err != nil {
		return nil, err
	}
	a, b, o := in[0], in[1], out[0]
	if !o.DType.IsFloat() || !a.DType.IsFloat() || !b.DType.IsFloat() {
		return matmul(n, in, out)
	}
	l, err := matmulLayoutOf(a, b, o)
	if err != nil {
		return nil, err
	}
	M, K, N, aOff, bOff, nb := l.M, l.K, l.N, l.aOff, l.bOff, len(l.aOff)
	rows := nb * M
	res := make([]float32, rows*N)
	if rows == 0 || N == 0 || K == 0 {
		return []*tensor.Tensor{fromF32(res, o)}, nil
	}
	av, abuf := widenInto(a)
	bv, bbuf := widenInto(b)
	parallel(rows, grainFor(rows, K*N, 1), func(lo, hi int) {
		for r := lo; r < hi; r++ {
			bi, m := r/M, r%M
			matmulRow(res[r*N:(r+1)*N], av[aOff[bi]+m*K:aOff[bi]+(m+1)*K], bv[bOff[bi]:bOff[bi]+K*N])
		}
	})
	if abuf != nil {
		putF32(abuf)
	}
	if bbuf != nil {
		putF32(bbuf)
	}
	return []*tensor.Tensor{fromF32(res, o)}, nil
}

// matmulRow sets dst[j] = sum over k of x[k]*b[k*N+j], for b [K,N] with N = len(dst).
func matmulRow(dst, x, b []float32) {
	N := len(dst)
	j := 0
	for ; j+8 <= N; j += 8 {
		var s0, s1, s2, s3, s4, s5, s6, s7 float32
		for k, v := range x {
			br := b[k*N+j : k*N+j+8]
			s0 += v * br[0]
			s1 += v * br[1]
			s2 += v * br[2]
			s3 += v * br[3]
			s4 += v * br[4]
			s5 += v * br[5]
			s6 += v * br[6]
			s7 += v * br[7]
		}
		d := dst[j : j+8]
		d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7] = s0, s1, s2, s3, s4, s5, s6, s7
	}
	for ; j < N; j++ {
		var s float32
		for k, v := range x {
			s += v * b[k*N+j]
		}
		dst[j] = s
	}
}
