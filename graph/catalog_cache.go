package graph

import "fmt"

// Ops of the paged KV cache. After the cache_init stage a graph runs on the flattened tokens
// of every sequence in a step (B = 1, S = the step's token count) and reads its per-sequence
// layout from extra inputs; see the paged_attention doc.

func init() {
	Register(&OpSpec{
		Name: "paged_attention",
		Doc: "Causal attention over a paged KV cache, for the flattened tokens of several sequences. " +
			"q[1,H,S,D], k,v[1,KV,S,D] are this step's tokens; first every token's k and v are written " +
			"to k_cache, v_cache[NB,BS,KV,D] at slot slot_mapping[t] (block slot/BS, offset slot%BS); then " +
			"token t, of sequence token_seq[t] at position positions[0,t], attends to that sequence's cached " +
			"positions 0..positions[0,t] (and > positions[0,t] - window when window > 0), position j living " +
			"in block block_tables[seq, j/BS] at offset j%BS. Returns [1,H,S,D], or with token_major=1 " +
			"[1,S,H,D] (the same values, as transpose(out){perm=[0,2,1,3]}). The caches are updated in place.",
		Inputs: []string{"q", "k", "v", "positions", "k_cache", "v_cache", "slot_mapping", "token_seq", "block_tables"},
		Attrs: []AttrSpec{
			{Name: "scale", Type: AttrFloat},
			{Name: "window", Type: AttrInt, Default: 0, Doc: "sliding window; 0 means none"},
			{Name: "token_major", Type: AttrInt, Default: 0, Doc: "1: the output is [1,S,H,D] instead of [1,H,S,D]"},
		},
		Infer: func(n *Node) ([]Type, error) {
			q, k, v, pos := inType(n, 0), inType(n, 1), inType(n, 2), inType(n, 3)
			kc, vc, slots, seqs, tables := inType(n, 4), inType(n, 5), inType(n, 6), inType(n, 7), inType(n, 8)
			if len(q.Shape) != 4 || len(k.Shape) != 4 || !k.Shape.Equal(v.Shape) {
				return nil, fmt.Errorf("want q [B,H,S,D] and k, v [B,KV,S,D], got %s, %s, %s", q.Shape, k.Shape, v.Shape)
			}
			H, KV := q.Shape[1], k.Shape[1]
			if H.IsSym() || KV.IsSym() || KV.Size == 0 || H.Size%KV.Size != 0 {
				return nil, fmt.Errorf("query heads %s are not a multiple of KV heads %s", H, KV)
			}
			if len(pos.Shape) != 2 || !pos.DType.IsInt() || pos.Shape[1] != q.Shape[2] {
				return nil, fmt.Errorf("positions must be integer [B,S] matching q %s, got %s", q.Shape, pos)
			}
			if len(kc.Shape) != 4 || !kc.Shape.Equal(vc.Shape) || kc.Shape[2] != KV || kc.Shape[3] != q.Shape[3] || !kc.DType.IsFloat() {
				return nil, fmt.Errorf("caches must be float [NB,BS,%s,%s], got %s and %s", KV, q.Shape[3], kc, vc)
			}
			for _, t := range []Type{slots, seqs} {
				if len(t.Shape) != 1 || t.Shape[0] != q.Shape[2] || !t.DType.IsInt() {
					return nil, fmt.Errorf("slot_mapping and token_seq must be integer [S], got %s", t)
				}
			}
			if len(tables.Shape) != 2 || !tables.DType.IsInt() {
				return nil, fmt.Errorf("block_tables must be integer [N,M], got %s", tables)
			}
			switch n.Attrs.Int("token_major") {
			case 0:
				return one(q), nil
			case 1:
				return []Type{{DType: q.DType, Shape: Shape{q.Shape[0], q.Shape[2], q.Shape[1], q.Shape[3]}}}, nil
			}
			return nil, fmt.Errorf("token_major must be 0 or 1, got %d", n.Attrs.Int("token_major"))
		},
	})
}
