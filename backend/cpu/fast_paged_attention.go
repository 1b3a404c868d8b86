package cpu

import (
	"math"
	"runtime"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// The fast kernel of paged_attention (see the op's doc in graph/catalog_cache.go and the
// reference kernel in paged_attention.go).
//
// It checks every index with the reference's pagedArgs.check before anything is written, so
// a bad slot, block, sequence or position is the same error and leaves the caches untouched,
// then writes the step's keys and values into the caches with the reference's write (rounded
// to the cache's dtype). Attention then reads the keys and values in place through the block
// table: no per-token gathered copy of the sequence, and no repeated K/V for GQA. One unit of
// work is a token, a KV head and a group of the query heads sharing that KV head; each key
// and value row is read (and widened from bf16 or f16, four rows at a time) once per unit
// and serves all the unit's heads. Units are split over the shared worker pool. On CPUs
// with AVX2 the dot products and the sums of values run in assembly (attention_amd64.s):
// eight heads or eight dimensions a vector, each lane summed in the same order, products
// and sums rounded as the Go loops round them (no fused multiply-add).
//
// The numerics are the reference's, operation for operation: raw scores q·k summed in d
// order in float32 and rounded to promote(q, cache), scaled in float32, softmax in float64
// over the visible positions, probabilities rounded to q's dtype and the values summed in
// position order in float32; so outputs equal the reference's bit for bit, barring a
// compiler's fused multiply-add.

// fastPagedAttention reads the caches in place (fastAttend).
var fastPagedAttention = pagedAttentionKernel((*pagedArgs).fastAttend)

func init() { Register("paged_attention", fastPagedAttention) }

// fastAttend computes the output [1,H,S,D] of every query row, reading the caches in place.
func (a *pagedArgs) fastAttend(o Out) *tensor.Tensor {
	res := newOut(o)
	if a.S == 0 || a.H == 0 || a.D == 0 {
		return res
	}
	sdt, err := graph.Promote(a.q.DType, a.kc.DType) // dtype of the raw scores, as the reference
	if err != nil {
		sdt = tensor.F32
	}
	pdt := a.q.DType
	rep := a.H / a.KV
	maxLen := 0
	for t := range a.S {
		lo, hi := a.visible(t)
		maxLen = max(maxLen, int(hi-lo+1))
	}
	// Heads per unit: all rep heads of a KV head share its rows, unless that leaves too few
	// units to keep the workers busy; then the largest divisor of rep that gives enough.
	procs := runtime.GOMAXPROCS(0)
	hs := rep
	for hs > 1 && a.S*a.KV*(rep/hs) < 4*procs {
		hs--
		for rep%hs != 0 {
			hs--
		}
	}
	groups := rep / hs
	units := a.S * a.KV * groups
	qs, qbuf := widenInto(a.q)
	if qbuf != nil {
		defer putF32(qbuf)
	}
	half := a.kc.DType != tensor.F32
	parallel(units, grainFor(units, 2*maxLen*a.D*(hs+1), 1), func(first, last int) {
		rowBuf := 0
		if half {
			rowBuf = 4 * a.D
		}
		buf := getF32(hs*maxLen + hs*a.D + rowBuf + 8*a.D)
		defer putF32(buf)
		sc := (*buf)[:hs*maxLen]
		acc := (*buf)[hs*maxLen : hs*maxLen+hs*a.D]
		rows := (*buf)[hs*maxLen+hs*a.D : hs*maxLen+hs*a.D+rowBuf]
		qT := (*buf)[hs*maxLen+hs*a.D+rowBuf:]
		e := make([]float64, maxLen)
		offs := make([]int, maxLen)
		for u := first; u < last; u++ {
			t, g, grp := u/(a.KV*groups), u/groups%a.KV, u%groups
			h0 := g*rep + grp*hs
			lo, hi := a.visible(t)
			L := int(hi - lo + 1)
			// Flat cache offsets of the visible rows of KV head g, in position order.
			row := a.tables[a.seqs[t]*int64(a.M):]
			bs := int64(a.BS)
			for j := range L {
				p := lo + int64(j)
				slot := int(row[p/bs])*a.BS + int(p%bs)
				offs[j] = (slot*a.KV + g) * a.D
			}
			a.scores(sc, qs, t, h0, hs, offs[:L], rows, qT)
			for r := range hs {
				softmaxRow(sc[r*maxLen:r*maxLen+L], e[:L], a.scale, sdt, pdt)
			}
			a.sumValues(acc, sc, maxLen, hs, offs[:L], rows)
			for r := range hs {
				storeRow(res, ((h0+r)*a.S+t)*a.D, acc[r*a.D:(r+1)*a.D])
			}
		}
	})
	return res
}

// cacheRows returns the four cache rows of t at flat offsets o0..o3 as float32: t's own
// storage for f32, else widened into buf [4*D].
func cacheRows(t *tensor.Tensor, D, o0, o1, o2, o3 int, buf []float32) (r0, r1, r2, r3 []float32) {
	if t.DType == tensor.F32 {
		f := t.F32
		return f[o0 : o0+D], f[o1 : o1+D], f[o2 : o2+D], f[o3 : o3+D]
	}
	r0, r1, r2, r3 = buf[:D], buf[D:2*D], buf[2*D:3*D], buf[3*D:4*D]
	widen(r0, t, o0)
	widen(r1, t, o1)
	widen(r2, t, o2)
	widen(r3, t, o3)
	return
}

// scores sets sc[r*stride+j], for the hs query heads h0.. of token t, to the raw dot
// product of the query row with the key row at offs[j], each summed in d order. With the
// AVX kernels, four keys at a time meet up to eight heads, one head a lane (qT [8*D] is
// scratch for the heads' rows, transposed).
func (a *pagedArgs) scores(sc, qs []float32, t, h0, hs int, offs []int, rows, qT []float32) {
	D, S := a.D, a.S
	stride := len(sc) / hs
	j := 0
	if haveAttnKernels && len(offs) >= 4 && D > 0 {
		var out [32]float32
		qT = qT[:8*D]
		for r0 := 0; r0 < hs; r0 += 8 {
			lanes := min(8, hs-r0)
			clear(qT)
			for l := range lanes {
				for e, x := range qs[((h0+r0+l)*S+t)*D : ((h0+r0+l)*S+t+1)*D] {
					qT[e*8+l] = x
				}
			}
			for j = 0; j+4 <= len(offs); j += 4 {
				k0, k1, k2, k3 := cacheRows(a.kc, D, offs[j], offs[j+1], offs[j+2], offs[j+3], rows)
				attnScores4(&qT[0], &k0[0], &k1[0], &k2[0], &k3[0], D, &out)
				for l := range lanes {
					s := sc[(r0+l)*stride+j : (r0+l)*stride+j+4]
					s[0], s[1], s[2], s[3] = out[l], out[8+l], out[16+l], out[24+l]
				}
			}
		}
	}
	for ; j+4 <= len(offs); j += 4 {
		k0, k1, k2, k3 := cacheRows(a.kc, D, offs[j], offs[j+1], offs[j+2], offs[j+3], rows)
		r := 0
		for ; r+2 <= hs; r += 2 {
			q0 := qs[((h0+r)*S+t)*D : ((h0+r)*S+t+1)*D]
			q1 := qs[((h0+r+1)*S+t)*D : ((h0+r+1)*S+t+1)*D]
			s, s1 := sc[r*stride+j:r*stride+j+4], sc[(r+1)*stride+j:(r+1)*stride+j+4]
			s[0], s[1], s[2], s[3], s1[0], s1[1], s1[2], s1[3] = dot2x4F32(q0, q1, k0, k1, k2, k3)
		}
		for ; r < hs; r++ {
			qr := qs[((h0+r)*S+t)*D : ((h0+r)*S+t+1)*D]
			s := sc[r*stride+j : r*stride+j+4]
			s[0], s[1], s[2], s[3] = dot1x4F32(qr, k0, k1, k2, k3)
		}
	}
	for ; j < len(offs); j++ {
		kr := rowF32(a.kc, offs[j], D, rows)
		for r := range hs {
			sc[r*stride+j] = dot(qs[((h0+r)*S+t)*D:((h0+r)*S+t+1)*D], kr)
		}
	}
}

// softmaxRow turns raw scores into probabilities as the reference does: round to sdt, times
// scale, float64 softmax (e is scratch), rounded to pdt.
func softmaxRow(sc []float32, e []float64, scale float32, sdt, pdt tensor.DType) {
	m := math.Inf(-1)
	for j, s := range sc {
		s = roundF32(sdt, s) * scale
		sc[j] = s
		m = max(m, float64(s))
	}
	var x [64]float64 // float64(s) - m, a chunk at a time for expF64 (math.Exp's bits)
	var sum float64
	e = e[:len(sc)]
	for c := 0; c < len(sc); c += len(x) {
		xs := x[:min(len(x), len(sc)-c)]
		for j := range xs {
			xs[j] = float64(sc[c+j]) - m
		}
		expF64(e[c:c+len(xs)], xs)
	}
	for _, v := range e {
		sum += v
	}
	for j := range sc {
		sc[j] = roundF32(pdt, float32(e[j]/sum))
	}
}

// sumValues sets acc[r*D:(r+1)*D], for each of the hs heads, to the sum over j of
// p[r*stride+j] times the value row at offs[j], added in position order.
func (a *pagedArgs) sumValues(acc, p []float32, stride, hs int, offs []int, rows []float32) {
	D := a.D
	clear(acc)
	j := 0
	if haveAttnKernels && D > 0 && D%8 == 0 {
		for ; j+4 <= len(offs); j += 4 {
			v0, v1, v2, v3 := cacheRows(a.vc, D, offs[j], offs[j+1], offs[j+2], offs[j+3], rows)
			attnSumValues4(&acc[0], &p[j], stride, hs, &v0[0], &v1[0], &v2[0], &v3[0], D)
		}
	}
	for ; j+4 <= len(offs); j += 4 {
		v0, v1, v2, v3 := cacheRows(a.vc, D, offs[j], offs[j+1], offs[j+2], offs[j+3], rows)
		v1, v2, v3 = v1[:len(v0)], v2[:len(v0)], v3[:len(v0)]
		r := 0
		for ; r+2 <= hs; r += 2 {
			pr, qr := p[r*stride+j:r*stride+j+4], p[(r+1)*stride+j:(r+1)*stride+j+4]
			p0, p1, p2, p3 := pr[0], pr[1], pr[2], pr[3]
			q0, q1, q2, q3 := qr[0], qr[1], qr[2], qr[3]
			ar, br := acc[r*D:(r+1)*D], acc[(r+1)*D:(r+2)*D]
			ar, br = ar[:len(v0)], br[:len(v0)]
			for d, x := range v0 {
				y, z, w := v1[d], v2[d], v3[d]
				ar[d] = ar[d] + p0*x + p1*y + p2*z + p3*w
				br[d] = br[d] + q0*x + q1*y + q2*z + q3*w
			}
		}
		for ; r < hs; r++ {
			pr := p[r*stride+j : r*stride+j+4]
			p0, p1, p2, p3 := pr[0], pr[1], pr[2], pr[3]
			ar := acc[r*D : (r+1)*D]
			ar = ar[:len(v0)]
			for d, x := range v0 {
				ar[d] = ar[d] + p0*x + p1*v1[d] + p2*v2[d] + p3*v3[d]
			}
		}
	}
	for ; j < len(offs); j++ {
		vr := rowF32(a.vc, offs[j], D, rows)
		for r := range hs {
			pj := p[r*stride+j]
			ar := acc[r*D : (r+1)*D]
			ar = ar[:len(vr)]
			for d, x := range vr {
				ar[d] += pj * x
			}
		}
	}
}

// dot2x4F32 returns the dot products of the query rows x0 and x1 with the four rows w0..w3,
// each summed in order like dot: the same bits as dot1x4F32 on each query, with every row
// of w loaded once for both.
func dot2x4F32(x0, x1, w0, w1, w2, w3 []float32) (s0, s1, s2, s3, t0, t1, t2, t3 float32) {
	n := len(x0)
	x1, w0, w1, w2, w3 = x1[:n], w0[:n], w1[:n], w2[:n], w3[:n]
	for k, a := range x0 {
		b := x1[k]
		c0, c1, c2, c3 := w0[k], w1[k], w2[k], w3[k]
		s0 += a * c0
		s1 += a * c1
		s2 += a * c2
		s3 += a * c3
		t0 += b * c0
		t1 += b * c1
		t2 += b * c2
		t3 += b * c3
	}
	return
}
