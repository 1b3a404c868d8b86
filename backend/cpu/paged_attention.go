package cpu

import (
	"fmt"
	"math"
	"slices"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// The reference kernel of paged_attention: causal attention over a paged KV cache for the
// flattened tokens of several sequences (see the op's doc in graph/catalog_cache.go).
//
// It is the one kernel that modifies inputs: it writes this step's keys and values into
// k_cache and v_cache, which the engine allocates once and passes to every step. Everything
// is checked before the first write, so a bad slot, block or sequence index is an error and
// leaves the caches untouched.
//
// The numerics follow sdpa's decomposition, like the fast sdpa kernel: raw scores q·k are
// rounded to the dtype q·kᵀ has (q's and the cache's promoted), scaled in f32, softmaxed in
// float64, rounded to q's dtype and used to sum the values in position order in f32. Each
// output row depends only on its own query and its sequence's cached keys and values, so a
// token gets the same bits whatever else is in the batch.

func init() { registerReference("paged_attention", pagedAttentionKernel((*pagedArgs).attend)) }

// pagedAttentionKernel makes the paged_attention kernel with the given attention step:
// q[1,H,S,D], k,v[1,KV,S,D], positions[1,S], k_cache,v_cache[NB,BS,KV,D], slot_mapping[S],
// token_seq[S], block_tables[N,M] -> out[1,H,S,D] (or [1,S,H,D] with token_major=1). Every
// index is checked before the step's keys and values are written to the caches; then
// attend computes the output [1,H,S,D], transposed for token_major.
func pagedAttentionKernel(attend func(*pagedArgs, Out) *tensor.Tensor) Kernel {
	return func(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
		if err := checkArgs(n, in, out, 9, 1); err != nil {
			return nil, err
		}
		o, tokenMajor := out[0], n.Attrs.Int("token_major") == 1
		if tokenMajor {
			if len(o.Shape) != 4 || len(in[0].Shape) != 4 {
				return nil, fmt.Errorf("paged_attention: token-major output %v for q %v", o.Shape, in[0].Shape)
			}
			o = Out{DType: o.DType, Shape: []int{o.Shape[0], o.Shape[2], o.Shape[1], o.Shape[3]}, arena: o.arena}
		}
		pa, err := newPagedArgs(n, in, o)
		if err != nil {
			return nil, err
		}
		if err := pa.check(); err != nil {
			return nil, err
		}
		pa.write()
		res := attend(pa, o)
		if tokenMajor {
			sh, st := res.Shape, tensor.Strides(res.Shape)
			res = gatherIn(o.arena, res, []int{sh[0], sh[2], sh[1], sh[3]}, []int{st[0], st[2], st[1], st[3]}, 0)
		}
		return []*tensor.Tensor{res}, nil
	}
}

// pagedArgs holds the checked inputs of one paged_attention call.
type pagedArgs struct {
	q, k, v          *tensor.Tensor
	kc, vc           *tensor.Tensor
	H, KV, S, D      int
	NB, BS, N, M     int
	pos, slots, seqs []int64
	tables           []int64
	scale            float32
	window           int64
}

func newPagedArgs(n *graph.Node, in []*tensor.Tensor, o Out) (*pagedArgs, error) {
	q, k, v, pos := in[0], in[1], in[2], in[3]
	kc, vc, slots, seqs, tables := in[4], in[5], in[6], in[7], in[8]
	for i, t := range []*tensor.Tensor{q, k, v, kc, vc} {
		if !t.DType.IsFloat() {
			return nil, fmt.Errorf("paged_attention: input %d (%s) must be a float tensor, got %s", i, n.Spec().Inputs[i], t.DType)
		}
	}
	for i, t := range []*tensor.Tensor{pos, slots, seqs, tables} {
		if !t.DType.IsInt() {
			return nil, fmt.Errorf("paged_attention: %s must be an integer tensor, got %s", []string{"positions", "slot_mapping", "token_seq", "block_tables"}[i], t.DType)
		}
	}
	if !o.DType.IsFloat() {
		return nil, fmt.Errorf("paged_attention: output must be float, got %s", o.DType)
	}
	if len(q.Shape) != 4 || len(k.Shape) != 4 || !slices.Equal(k.Shape, v.Shape) {
		return nil, fmt.Errorf("paged_attention: want q [1,H,S,D] and k, v [1,KV,S,D], got %v, %v, %v", q.Shape, k.Shape, v.Shape)
	}
	if q.Shape[0] != 1 {
		return nil, fmt.Errorf("paged_attention runs on the flattened tokens of a step: batch must be 1, got %d", q.Shape[0])
	}
	a := &pagedArgs{q: q, k: k, v: v, kc: kc, vc: vc, H: q.Shape[1], S: q.Shape[2], D: q.Shape[3], KV: k.Shape[1]}
	if a.KV == 0 || a.H%a.KV != 0 {
		return nil, fmt.Errorf("paged_attention: query heads %d are not a multiple of KV heads %d", a.H, a.KV)
	}
	if k.Shape[0] != 1 || k.Shape[2] != a.S || k.Shape[3] != a.D {
		return nil, fmt.Errorf("paged_attention: q %v and k %v disagree on batch, tokens or head size", q.Shape, k.Shape)
	}
	if !slices.Equal(pos.Shape, []int{1, a.S}) {
		return nil, fmt.Errorf("paged_attention: positions must be [1,%d], got %v", a.S, pos.Shape)
	}
	if len(kc.Shape) != 4 || !slices.Equal(kc.Shape, vc.Shape) || kc.DType != vc.DType || kc.Shape[2] != a.KV || kc.Shape[3] != a.D {
		return nil, fmt.Errorf("paged_attention: caches must be [NB,BS,%d,%d] of one dtype, got %s%v and %s%v", a.KV, a.D, kc.DType, kc.Shape, vc.DType, vc.Shape)
	}
	a.NB, a.BS = kc.Shape[0], kc.Shape[1]
	if a.BS < 1 {
		return nil, fmt.Errorf("paged_attention: block size must be >= 1, got %d", a.BS)
	}
	if !slices.Equal(slots.Shape, []int{a.S}) || !slices.Equal(seqs.Shape, []int{a.S}) {
		return nil, fmt.Errorf("paged_attention: slot_mapping and token_seq must be [%d], got %v and %v", a.S, slots.Shape, seqs.Shape)
	}
	if len(tables.Shape) != 2 {
		return nil, fmt.Errorf("paged_attention: block_tables must be [N,M], got %v", tables.Shape)
	}
	a.N, a.M = tables.Shape[0], tables.Shape[1]
	if err := checkShape(q.Shape, o); err != nil {
		return nil, err
	}
	a.pos, a.slots, a.seqs, a.tables = pos.Int64s(), slots.Int64s(), seqs.Int64s(), tables.Int64s()
	a.scale = float32(n.Attrs.Float("scale"))
	a.window = int64(n.Attrs.Int("window"))
	return a, nil
}

// visible returns the first and last cached position token t attends to.
func (a *pagedArgs) visible(t int) (lo, hi int64) {
	hi = a.pos[t]
	if a.window > 0 {
		lo = max(0, hi-a.window+1)
	}
	return lo, hi
}

// check validates every index the call will use, before anything is written.
func (a *pagedArgs) check() error {
	nslots := int64(a.NB) * int64(a.BS)
	for t := range a.S {
		if s := a.slots[t]; s < 0 || s >= nslots {
			return fmt.Errorf("paged_attention: token %d: slot %d is outside the cache's %d slots (%d blocks of %d)", t, s, nslots, a.NB, a.BS)
		}
		seq := a.seqs[t]
		if seq < 0 || seq >= int64(a.N) {
			return fmt.Errorf("paged_attention: token %d: sequence %d is outside block_tables' %d rows", t, seq, a.N)
		}
		lo, hi := a.visible(t)
		if hi < 0 {
			return fmt.Errorf("paged_attention: token %d: negative position %d", t, hi)
		}
		if hi/int64(a.BS) >= int64(a.M) {
			return fmt.Errorf("paged_attention: token %d: position %d needs block %d of sequence %d, block_tables has %d columns", t, hi, hi/int64(a.BS), seq, a.M)
		}
		row := a.tables[seq*int64(a.M) : (seq+1)*int64(a.M)]
		for b := lo / int64(a.BS); b <= hi/int64(a.BS); b++ {
			if id := row[b]; id < 0 || id >= int64(a.NB) {
				return fmt.Errorf("paged_attention: token %d: sequence %d's block %d is %d, outside the cache's %d blocks", t, seq, b, id, a.NB)
			}
		}
	}
	return nil
}

// write stores every token's k and v rows at its slot, rounded to the cache's dtype.
func (a *pagedArgs) write() {
	ks, vs := a.k.Float32s(), a.v.Float32s()
	for t := range a.S {
		for g := range a.KV {
			src := (g*a.S + t) * a.D // k[0,g,t,:]
			dst := (int(a.slots[t])*a.KV + g) * a.D
			storeRow(a.kc, dst, ks[src:src+a.D])
			storeRow(a.vc, dst, vs[src:src+a.D])
		}
	}
}

// attend computes the output [1,H,S,D] of every query row over the caches.
func (a *pagedArgs) attend(o Out) *tensor.Tensor {
	qs := a.q.Float32s()
	sdt, err := graph.Promote(a.q.DType, a.kc.DType)
	if err != nil {
		sdt = tensor.F32
	}
	pdt := a.q.DType
	rep := a.H / a.KV
	res := make([]float32, a.H*a.S*a.D)
	// One unit is a token and a KV head: its keys and values are gathered once and serve
	// the rep query heads that share them.
	maxLen := 0
	for t := range a.S {
		lo, hi := a.visible(t)
		maxLen = max(maxLen, int(hi-lo+1))
	}
	work := max(maxLen*a.D*(2*rep+2), 1)
	parallelFor(a.S*a.KV, max(1, (1<<15)/work), func(first, last int) {
		keys := make([]float32, maxLen*a.D)
		vals := make([]float32, maxLen*a.D)
		scores := make([]float32, maxLen)
		e := make([]float64, maxLen)
		acc := make([]float32, a.D)
		for u := first; u < last; u++ {
			t, g := u/a.KV, u%a.KV
			lo, hi := a.visible(t)
			L := int(hi - lo + 1)
			row := a.tables[a.seqs[t]*int64(a.M):]
			for j := range L {
				p := lo + int64(j)
				slot := int(row[p/int64(a.BS)])*a.BS + int(p%int64(a.BS))
				off := (slot*a.KV + g) * a.D
				widen(keys[j*a.D:(j+1)*a.D], a.kc, off)
				widen(vals[j*a.D:(j+1)*a.D], a.vc, off)
			}
			for h := g * rep; h < (g+1)*rep; h++ {
				qr := qs[(h*a.S+t)*a.D : (h*a.S+t+1)*a.D]
				attendCached(acc, qr, keys[:L*a.D], vals[:L*a.D], scores[:L], e[:L], a.scale, sdt, pdt)
				copy(res[(h*a.S+t)*a.D:], acc)
			}
		}
	})
	return tensor.FromF32(res, o.Shape...).Cast(o.DType)
}

// attendCached sets acc[D] to softmax(round_sdt(q·kⱼ)·scale) · v over the L rows of keys
// and vals [L,D], with probabilities rounded to pdt and the sum taken in row order.
func attendCached(acc, q, keys, vals, scores []float32, e []float64, scale float32, sdt, pdt tensor.DType) {
	D := len(q)
	m := math.Inf(-1)
	for j := range scores {
		s := roundF32(sdt, dot(q, keys[j*D:(j+1)*D])) * scale
		scores[j] = s
		m = max(m, float64(s))
	}
	var sum float64
	for j, s := range scores {
		e[j] = math.Exp(float64(s) - m)
		sum += e[j]
	}
	clear(acc)
	for j := range scores {
		p := roundF32(pdt, float32(e[j]/sum))
		vr := vals[j*D : (j+1)*D]
		for d := range acc {
			acc[d] += p * vr[d]
		}
	}
}
