package cpu

import (
	"fmt"
	"math"
	"slices"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// The reference kernel of paged_attention_partial (graph/catalog_cp.go): one cp rank's part
// of a step's attention over the keys it caches. Like paged_attention it writes the rank's
// own keys and values into the caches (after checking every index, so a bad one leaves the
// caches untouched); then each query row attends to its sequence's entries of kv_pos that
// it may see, in f32 as attention_partial, giving o and the log-sum-exp.

func init() { registerReference("paged_attention_partial", pagedAttentionPartial) }

func pagedAttentionPartial(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 10, 2); err != nil {
		return nil, err
	}
	q, k, v, qpT := in[0], in[1], in[2], in[3]
	kc, vc, slotsT, qseqT, tablesT, kvpT := in[4], in[5], in[6], in[7], in[8], in[9]
	fail := func(format string, args ...any) ([]*tensor.Tensor, error) {
		return nil, fmt.Errorf("paged_attention_partial: "+format, args...)
	}
	shapes := make([][]int, len(in))
	for i, t := range in {
		shapes[i] = t.Shape
	}
	dims, err := graph.PagedPartialShapes(shapes, kc.DType, vc.DType)
	if err != nil {
		return fail("%w", err)
	}
	NQ, H, Sq, D, KV, Sk := dims.NQ, dims.H, dims.Sq, dims.D, dims.KV, dims.Sk
	NB, BS, N, M, L := dims.NB, dims.BS, dims.N, dims.M, dims.L
	if err := checkShape(q.Shape, out[0]); err != nil {
		return nil, err
	}
	qp, slots, qseq, tables, kvp := qpT.Int64s(), slotsT.Int64s(), qseqT.Int64s(), tablesT.Int64s(), kvpT.Int64s()
	nslots := int64(NB) * int64(BS)
	for t, s := range slots {
		if s >= nslots {
			return fail("token %d: slot %d is outside the cache's %d slots", t, s, nslots)
		}
	}
	rowUsed := make([]bool, N)
	for i, s := range qseq {
		if s >= int64(N) {
			return fail("query %d: sequence %d is outside block_tables' %d rows", i, s, N)
		}
		if s >= 0 {
			rowUsed[s] = true
		}
	}
	for s, used := range rowUsed {
		if !used {
			continue
		}
		for j := range L {
			if kvp[s*L+j] < 0 {
				continue
			}
			if id := tables[s*M+j/BS]; id < 0 || id >= int64(NB) {
				return fail("sequence %d: entry %d is in block %d, outside the cache's %d blocks", s, j, id, NB)
			}
		}
	}
	// Write the rank's own keys and values.
	ks, vs := k.Float32s(), v.Float32s()
	for t, s := range slots {
		if s < 0 {
			continue
		}
		for g := range KV {
			src := (g*Sk + t) * D
			dst := (int(s)*KV + g) * D
			storeRow(kc, dst, ks[src:src+D])
			storeRow(vc, dst, vs[src:src+D])
		}
	}
	qs := q.Float32s()
	scale := float32(n.Attrs.Float("scale"))
	window := int64(n.Attrs.Int("window"))
	o := tensor.New(tensor.F32, NQ, 1, H, Sq, D)
	lse := tensor.New(tensor.F32, NQ, 1, H, Sq)
	for i := range lse.F32 {
		lse.F32[i] = float32(math.Inf(-1))
	}
	rep := H / KV
	parallel(NQ*Sq*KV, 1, func(lo, hi int) {
		var keys, vals, scores []float32
		var idx []int
		for u := lo; u < hi; u++ {
			i, g := u/KV, u%KV // i: query i%Sq of block i/Sq
			a := i / Sq
			s := qseq[i]
			if s < 0 {
				continue
			}
			pq := qp[i]
			// The entries query i sees, gathered once for the rep heads of KV head g.
			idx = idx[:0]
			for j := range L {
				pk := kvp[int(s)*L+j]
				if pk < 0 || pk > pq || window > 0 && pk <= pq-window {
					continue
				}
				idx = append(idx, int(tables[int(s)*M+j/BS])*BS+j%BS)
			}
			if len(idx) == 0 {
				continue
			}
			keys, vals = slices.Grow(keys[:0], len(idx)*D)[:len(idx)*D], slices.Grow(vals[:0], len(idx)*D)[:len(idx)*D]
			scores = slices.Grow(scores[:0], len(idx))[:len(idx)]
			for j, slot := range idx {
				off := (slot*KV + g) * D
				widen(keys[j*D:(j+1)*D], kc, off)
				widen(vals[j*D:(j+1)*D], vc, off)
			}
			for h := g * rep; h < (g+1)*rep; h++ {
				row := (a*H+h)*Sq + i%Sq
				qRow := qs[row*D:][:D]
				mx := float32(math.Inf(-1))
				for j := range idx {
					var dot float32
					for d, x := range qRow {
						dot += x * keys[j*D+d]
					}
					scores[j] = dot * scale
					mx = max(mx, scores[j])
				}
				var sum float32
				for j := range scores {
					scores[j] = float32(math.Exp(float64(scores[j] - mx)))
					sum += scores[j]
				}
				inv := 1 / sum
				oRow := o.F32[row*D:][:D]
				for j, p := range scores {
					p *= inv
					for d, x := range vals[j*D : (j+1)*D] {
						oRow[d] += p * x
					}
				}
				lse.F32[row] = mx + float32(math.Log(float64(sum)))
			}
		}
	})
	return []*tensor.Tensor{o, lse}, nil
}
