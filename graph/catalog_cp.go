package graph

import (
	"fmt"
	"math"
	"slices"

	"github.com/loom-ml/loom/tensor"
)

// Ops of context parallelism: attention over blocks of keys held by other ranks, the merge
// of partial attention results by their log-sum-exp, and the ring exchange of blocks.
//
// Ring attention computes, on each rank of a cp group, attention_partial of its queries
// against one block of keys and values at a time (its own, then each block received by
// ring_shift), and attention_merge folds each partial result into the running one. The
// all-to-all strategy exchanges q, k and v into head groups and runs one attention_partial
// over every sequence block at once.

func init() {
	Register(&OpSpec{
		Name: "attention_partial",
		Doc: "Causal attention of blocks of queries against blocks of keys placed by explicit positions: q[NQ,B,H,Sq,D], " +
			"k,v[NK,B,KV,Sk,D] (H a multiple of KV), q_pos[NQ,B,Sq], k_pos[NK,B,Sk] (integers). Query (i of block a) sees key " +
			"(j of block c) of the same batch row when k_pos <= q_pos, and k_pos > q_pos - window when window > 0. Returns " +
			"o f32[NQ,B,H,Sq,D], softmax(q·kᵀ·scale)·v over the keys it sees, and lse f32[NQ,B,H,Sq], the log-sum-exp of " +
			"those scores; a query that sees no key gets o = 0 and lse = -inf (the identity of attention_merge).",
		Inputs: []string{"q", "k", "v", "q_pos", "k_pos"},
		Attrs: []AttrSpec{
			{Name: "scale", Type: AttrFloat},
			{Name: "window", Type: AttrInt, Default: 0, Doc: "sliding window; 0 means none"},
		},
		Infer: inferAttentionPartial,
	})
	Register(&OpSpec{
		Name: "paged_attention_partial",
		Doc: "Context parallelism on the paged KV cache: one cp rank's part of the attention of a step's queries, over the " +
			"keys this rank caches (B is 1: the step's flattened tokens). First every token t of k, v[B,KV,Sk,D] (the rank's " +
			"own tokens of the step) is written to " +
			"k_cache, v_cache[NB,BS,KV,D] at slot slot_mapping[t] (block slot/BS, offset slot%BS; a slot < 0 is not written). " +
			"Then query i of block a of q[NQ,B,H,Sq,D] (blocks of queries of any rank), of sequence q_seq[a,i] at position " +
			"q_pos[a,0,i], attends to the entries j of that sequence's row of kv_pos[N,L] (the position of the sequence's j-th " +
			"token cached on this rank, -1 for none), entry j living in block block_tables[seq, j/BS] at offset j%BS, whose " +
			"position is <= q_pos (and > q_pos - window when window > 0). Returns o f32[NQ,B,H,Sq,D] and lse f32[NQ,B,H,Sq] as " +
			"attention_partial: a query that sees no key (or whose q_seq is < 0) gets o = 0 and lse = -inf. Writing the " +
			"same keys again is harmless, so a rank may run it for several blocks of queries with its own k, v and slots.",
		Inputs: []string{"q", "k", "v", "q_pos", "k_cache", "v_cache", "slot_mapping", "q_seq", "block_tables", "kv_pos"},
		Attrs: []AttrSpec{
			{Name: "scale", Type: AttrFloat},
			{Name: "window", Type: AttrInt, Default: 0, Doc: "sliding window; 0 means none"},
		},
		Infer: inferPagedAttentionPartial,
	})
	Register(&OpSpec{
		Name: "attention_merge",
		Doc: "Merges two partial attention results over disjoint sets of keys by their log-sum-exp: o1, o2 f32[...,D], " +
			"lse1, lse2 f32[...]. With m = max(lse1, lse2), w = exp(lse - m): o = (o1*w1 + o2*w2)/(w1 + w2) and lse = " +
			"m + log(w1 + w2). A side with lse = -inf (no key) contributes nothing; both -inf give o = 0, lse = -inf. " +
			"Returns (o, lse).",
		Inputs:      []string{"o1", "lse1", "o2", "lse2"},
		Commutative: false,
		Infer: func(n *Node) ([]Type, error) {
			o1, l1, o2, l2 := inType(n, 0), inType(n, 1), inType(n, 2), inType(n, 3)
			for _, t := range []Type{o1, l1, o2, l2} {
				if t.DType != tensor.F32 {
					return nil, fmt.Errorf("attention_merge works on f32 partial results, got %s, %s, %s, %s", o1, l1, o2, l2)
				}
			}
			if !o1.Shape.Equal(o2.Shape) || !l1.Shape.Equal(l2.Shape) || len(o1.Shape) != len(l1.Shape)+1 ||
				!o1.Shape[:len(l1.Shape)].Equal(l1.Shape) {
				return nil, fmt.Errorf("attention_merge needs o1, o2 [...,D] and lse1, lse2 [...], got %s, %s, %s, %s", o1.Shape, l1.Shape, o2.Shape, l2.Shape)
			}
			return []Type{o1, l1}, nil
		},
		Decompose: func(b *Builder, n *Node) ([]*Value, error) {
			o, lse := DecomposeAttentionMerge(b, n.Inputs[0], n.Inputs[1], n.Inputs[2], n.Inputs[3])
			return []*Value{o, lse}, b.Err()
		},
	})
	Register(&OpSpec{
		Name: "ring_shift",
		Doc: "Passes x one step around a ring of the ranks of a group: rank i of the group sends its x to rank i+1 and " +
			"returns the x of rank i-1 (mod group_size). Same type as x, any dtype; every rank's x must have one shape.",
		Inputs:     []string{"x"},
		Attrs:      groupAttrs(),
		Collective: true,
		Infer: func(n *Node) ([]Type, error) {
			if _, err := checkGroup(n); err != nil {
				return nil, err
			}
			t := inType(n, 0)
			return one(Type{t.DType, t.Shape.Clone()}), nil
		},
	})
}

func inferAttentionPartial(n *Node) ([]Type, error) {
	q, k, v, qp, kp := inType(n, 0), inType(n, 1), inType(n, 2), inType(n, 3), inType(n, 4)
	if len(q.Shape) != 5 || len(k.Shape) != 5 || !k.Shape.Equal(v.Shape) {
		return nil, fmt.Errorf("want q [NQ,B,H,Sq,D] and k, v [NK,B,KV,Sk,D], got %s, %s, %s", q.Shape, k.Shape, v.Shape)
	}
	if !q.DType.IsFloat() || !k.DType.IsFloat() || !v.DType.IsFloat() {
		return nil, fmt.Errorf("q, k and v must be floats, got %s, %s, %s", q.DType, k.DType, v.DType)
	}
	H, KV := q.Shape[2], k.Shape[2]
	if H.IsSym() || KV.IsSym() || KV.Size == 0 || H.Size%KV.Size != 0 {
		return nil, fmt.Errorf("query heads %s are not a multiple of KV heads %s", H, KV)
	}
	if q.Shape[1] != k.Shape[1] || q.Shape[4] != k.Shape[4] {
		return nil, fmt.Errorf("q %s and k %s disagree on batch or head size", q.Shape, k.Shape)
	}
	if len(qp.Shape) != 3 || !qp.DType.IsInt() || qp.Shape[0] != q.Shape[0] || qp.Shape[1] != q.Shape[1] || qp.Shape[2] != q.Shape[3] {
		return nil, fmt.Errorf("q_pos must be integer [NQ,B,Sq] matching q %s, got %s", q.Shape, qp)
	}
	if len(kp.Shape) != 3 || !kp.DType.IsInt() || kp.Shape[0] != k.Shape[0] || kp.Shape[1] != k.Shape[1] || kp.Shape[2] != k.Shape[3] {
		return nil, fmt.Errorf("k_pos must be integer [NK,B,Sk] matching k %s, got %s", k.Shape, kp)
	}
	if n.Attrs.Int("window") < 0 {
		return nil, fmt.Errorf("window must be >= 0, got %d", n.Attrs.Int("window"))
	}
	return []Type{{tensor.F32, q.Shape.Clone()}, {tensor.F32, q.Shape[:4].Clone()}}, nil
}

func inferPagedAttentionPartial(n *Node) ([]Type, error) {
	q, k, v, qp := inType(n, 0), inType(n, 1), inType(n, 2), inType(n, 3)
	kc, vc, slots, qs, tables, kvp := inType(n, 4), inType(n, 5), inType(n, 6), inType(n, 7), inType(n, 8), inType(n, 9)
	if len(q.Shape) != 5 || len(k.Shape) != 4 || !k.Shape.Equal(v.Shape) || k.Shape[0] != q.Shape[1] {
		return nil, fmt.Errorf("want q [NQ,B,H,Sq,D] and k, v [B,KV,Sk,D], got %s, %s, %s", q.Shape, k.Shape, v.Shape)
	}
	if !q.DType.IsFloat() || !k.DType.IsFloat() || !v.DType.IsFloat() {
		return nil, fmt.Errorf("q, k and v must be floats, got %s, %s, %s", q.DType, k.DType, v.DType)
	}
	H, KV := q.Shape[2], k.Shape[1]
	if H.IsSym() || KV.IsSym() || KV.Size == 0 || H.Size%KV.Size != 0 {
		return nil, fmt.Errorf("query heads %s are not a multiple of KV heads %s", H, KV)
	}
	if q.Shape[4] != k.Shape[3] {
		return nil, fmt.Errorf("q %s and k %s disagree on the head size", q.Shape, k.Shape)
	}
	if len(qp.Shape) != 3 || !qp.DType.IsInt() || qp.Shape[0] != q.Shape[0] || qp.Shape[1] != q.Shape[1] || qp.Shape[2] != q.Shape[3] {
		return nil, fmt.Errorf("q_pos must be integer [NQ,B,Sq] matching q %s, got %s", q.Shape, qp)
	}
	if len(kc.Shape) != 4 || !kc.Equal(vc) || kc.Shape[2] != KV || kc.Shape[3] != q.Shape[4] || !kc.DType.IsFloat() {
		return nil, fmt.Errorf("caches must be float [NB,BS,%s,%s] of one type, got %s and %s", KV, q.Shape[4], kc, vc)
	}
	if len(slots.Shape) != 1 || slots.Shape[0] != k.Shape[2] || !slots.DType.IsInt() {
		return nil, fmt.Errorf("slot_mapping must be integer [Sk] matching k %s, got %s", k.Shape, slots)
	}
	if len(qs.Shape) != 2 || qs.Shape[0] != q.Shape[0] || qs.Shape[1] != q.Shape[3] || !qs.DType.IsInt() {
		return nil, fmt.Errorf("q_seq must be integer [NQ,Sq] matching q %s, got %s", q.Shape, qs)
	}
	if len(tables.Shape) != 2 || !tables.DType.IsInt() || len(kvp.Shape) != 2 || !kvp.DType.IsInt() || tables.Shape[0] != kvp.Shape[0] {
		return nil, fmt.Errorf("block_tables [N,M] and kv_pos [N,L] must be integer with one N, got %s and %s", tables, kvp)
	}
	if n.Attrs.Int("window") < 0 {
		return nil, fmt.Errorf("window must be >= 0, got %d", n.Attrs.Int("window"))
	}
	return []Type{{tensor.F32, q.Shape.Clone()}, {tensor.F32, q.Shape[:4].Clone()}}, nil
}

// PagedPartialDims are the sizes of one paged_attention_partial call on concrete tensors
// (B is 1): q [NQ,1,H,Sq,D], k and v [1,KV,Sk,D], caches [NB,BS,KV,D], block_tables [N,M],
// kv_pos [N,L].
type PagedPartialDims struct{ NQ, H, Sq, D, KV, Sk, NB, BS, N, M, L int }

// PagedPartialShapes checks the concrete shapes of paged_attention_partial's ten inputs, in
// the order of its OpSpec, as a backend receives them (with the caches' dtypes, which must
// agree), and returns their sizes. The error names what does not fit.
func PagedPartialShapes(shapes [][]int, kcDType, vcDType tensor.DType) (PagedPartialDims, error) {
	var d PagedPartialDims
	if len(shapes) != 10 {
		return d, fmt.Errorf("want 10 inputs, got %d", len(shapes))
	}
	q, k, v, qp, kc, vc, slots, qseq, tables, kvp := shapes[0], shapes[1], shapes[2], shapes[3], shapes[4], shapes[5], shapes[6], shapes[7], shapes[8], shapes[9]
	if len(q) != 5 || len(k) != 4 || !slices.Equal(k, v) || k[0] != 1 || q[1] != 1 {
		return d, fmt.Errorf("want q [NQ,1,H,Sq,D] and k, v [1,KV,Sk,D] (a step's flattened tokens), got %v, %v, %v", q, k, v)
	}
	d.NQ, d.H, d.Sq, d.D = q[0], q[2], q[3], q[4]
	d.KV, d.Sk = k[1], k[2]
	if d.KV == 0 || d.H%d.KV != 0 || k[3] != d.D {
		return d, fmt.Errorf("q %v does not fit k %v", q, k)
	}
	if len(kc) != 4 || !slices.Equal(kc, vc) || kcDType != vcDType || kc[2] != d.KV || kc[3] != d.D || kc[1] < 1 {
		return d, fmt.Errorf("caches must be [NB,BS,%d,%d] of one dtype, got %s%v and %s%v", d.KV, d.D, kcDType, kc, vcDType, vc)
	}
	d.NB, d.BS = kc[0], kc[1]
	if !slices.Equal(qp, []int{d.NQ, 1, d.Sq}) || !slices.Equal(slots, []int{d.Sk}) || !slices.Equal(qseq, []int{d.NQ, d.Sq}) ||
		len(tables) != 2 || len(kvp) != 2 || tables[0] != kvp[0] {
		return d, fmt.Errorf("q_pos %v, slot_mapping %v, q_seq %v, block_tables %v, kv_pos %v do not fit q %v and k %v",
			qp, slots, qseq, tables, kvp, q, k)
	}
	d.N, d.M, d.L = tables[0], tables[1], kvp[1]
	if d.L > d.M*d.BS {
		return d, fmt.Errorf("kv_pos has %d entries per sequence, block_tables' %d blocks hold %d", d.L, d.M, d.M*d.BS)
	}
	return d, nil
}

// DecomposeAttentionMerge writes attention_merge in primitives: o1, o2 f32[...,D] and
// lse1, lse2 f32[...] -> (o f32[...,D], lse f32[...]). A maximum of -inf (neither side saw a
// key) is replaced by 0 so that no -inf - -inf appears; the weights are then 0 and the sum of
// weights, replaced by 1 in the division, gives o = 0 and lse = log 0 = -inf.
func DecomposeAttentionMerge(b *Builder, o1, lse1, o2, lse2 *Value) (o, lse *Value) {
	m := b.Maximum(lse1, lse2)
	some := b.Compare("gt", m, b.Scalar(tensor.F32, -math.MaxFloat32)) // false only for -inf
	zero, one := b.Scalar(tensor.F32, 0), b.Scalar(tensor.F32, 1)
	ms := b.Where(some, m, zero)
	w1 := b.Unary("exp", b.Sub(lse1, ms))
	w2 := b.Unary("exp", b.Sub(lse2, ms))
	sum := b.Add(w1, w2)
	lse = b.Add(ms, b.Unary("log", sum))
	col := func(x *Value) *Value { return b.Reshape(x, append(x.Type.Shape.Clone(), D(1))...) }
	num := b.Add(b.Mul(o1, col(w1)), b.Mul(o2, col(w2)))
	o = b.Div(num, col(b.Where(some, sum, one)))
	return o, lse
}
