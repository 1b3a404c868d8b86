package graph

import "github.com/loom-ml/loom/tensor"

// cpInferCases are the inference cases of the context-parallel ops (catalog_cp.go).
func cpInferCases() []inferCase {
	cp2 := Attrs{"group": "cp", "group_size": 2}
	return []inferCase{
		{op: "attention_partial", in: []Type{ty(bf16, 1, "B", 4, "S", 16), ty(bf16, 1, "B", 2, "S", 16), ty(bf16, 1, "B", 2, "S", 16), ty(i32, 1, "B", "S"), ty(i32, 1, "B", "S")},
			attrs: Attrs{"scale": 0.25}, want: []Type{ty(f32t, 1, "B", 4, "S", 16), ty(f32t, 1, "B", 4, "S")}},
		{op: "attention_partial", in: []Type{ty(f32t, 2, "B", 4, "S", 8), ty(f32t, 2, "B", 4, "S", 8), ty(f32t, 2, "B", 4, "S", 8), ty(i64, 2, "B", "S"), ty(i64, 2, "B", "S")},
			attrs: Attrs{"scale": 0.5, "window": 8}, want: []Type{ty(f32t, 2, "B", 4, "S", 8), ty(f32t, 2, "B", 4, "S")}},
		{op: "attention_partial", in: []Type{ty(f32t, 1, "B", 3, "S", 8), ty(f32t, 1, "B", 2, "S", 8), ty(f32t, 1, "B", 2, "S", 8), ty(i32, 1, "B", "S"), ty(i32, 1, "B", "S")},
			attrs: Attrs{"scale": 0.5}, err: "query heads 3 are not a multiple of KV heads 2"},
		{op: "attention_partial", in: []Type{ty(f32t, 1, "B", 4, "S", 8), ty(f32t, 1, "B", 2, "S", 8), ty(f32t, 1, "B", 2, "S", 8), ty(f32t, 1, "B", "S"), ty(i32, 1, "B", "S")},
			attrs: Attrs{"scale": 0.5}, err: "q_pos must be integer [NQ,B,Sq]"},
		{op: "attention_partial", in: []Type{ty(f32t, "B", 4, "S", 8), ty(f32t, "B", 2, "S", 8), ty(f32t, "B", 2, "S", 8), ty(i32, "B", "S"), ty(i32, "B", "S")},
			attrs: Attrs{"scale": 0.5}, err: "want q [NQ,B,H,Sq,D]"},
		{op: "paged_attention_partial", in: pagedPartialIn(ty(f32t, 2, "B", 4, "Q", 16), ty(i32, 2, "B", "Q")),
			attrs: Attrs{"scale": 0.25}, want: []Type{ty(f32t, 2, "B", 4, "Q", 16), ty(f32t, 2, "B", 4, "Q")}},
		{op: "paged_attention_partial", in: pagedPartialIn(ty(f32t, 1, "B", 4, "Q", 16), ty(i32, 1, "B", "S")),
			attrs: Attrs{"scale": 0.25}, err: "q_pos must be integer [NQ,B,Sq]"},
		{op: "paged_attention_partial", in: pagedPartialIn(ty(f32t, 1, "B", 3, "Q", 16), ty(i32, 1, "B", "Q")),
			attrs: Attrs{"scale": 0.25}, err: "query heads 3 are not a multiple of KV heads 2"},
		{op: "attention_merge", in: []Type{ty(f32t, 1, "B", 4, "S", 8), ty(f32t, 1, "B", 4, "S"), ty(f32t, 1, "B", 4, "S", 8), ty(f32t, 1, "B", 4, "S")},
			want: []Type{ty(f32t, 1, "B", 4, "S", 8), ty(f32t, 1, "B", 4, "S")}},
		{op: "attention_merge", in: []Type{ty(f32t, "B", 4, 8), ty(f32t, "B", 4), ty(f32t, "B", 4, 8), ty(f32t, "B", 3)},
			err: "attention_merge needs o1, o2 [...,D] and lse1, lse2 [...]"},
		{op: "attention_merge", in: []Type{ty(bf16, 4, 8), ty(f32t, 4), ty(f32t, 4, 8), ty(f32t, 4)},
			err: "attention_merge works on f32 partial results"},
		{op: "ring_shift", in: []Type{ty(i32, 1, "B", "S")}, attrs: cp2, want: []Type{ty(i32, 1, "B", "S")}},
		{op: "ring_shift", in: []Type{ty(bf16, 1, "B", 2, "S", 16)}, attrs: cp2, want: []Type{ty(bf16, 1, "B", 2, "S", 16)}},
		{op: "ring_shift", in: []Type{ty(f32t, 4)}, attrs: Attrs{"group": "cp", "group_size": 0}, err: "group_size must be >= 1, got 0"},
	}
}

// buildCP uses the context-parallel ops as the ring strategy leaves them on a cp=2 rank: the
// local block, one block received around the ring, and their merge.
// pagedPartialIn are paged_attention_partial's inputs around q and q_pos: the rank's S
// tokens' k, v (bf16, 2 KV heads), bf16 caches of blocks of 8, and N sequences' tables.
func pagedPartialIn(q, qPos Type) []Type {
	return []Type{q, ty(bf16, "B", 2, "S", 16), ty(bf16, "B", 2, "S", 16), qPos, ty(bf16, "NB", 8, 2, 16), ty(bf16, "NB", 8, 2, 16),
		ty(i32, "S"), ty(i32, q.Shape[0].Size, "Q"), ty(i32, "N", "M"), ty(i32, "N", "L")}
}

func buildCP() (*Graph, error) {
	b := NewBuilder("context parallel (cp=2)")
	q := b.Input("q", tensor.F32, Shape{D(1), symB, D(4), Sym("S"), D(16)})
	k := b.Input("k", tensor.BF16, Shape{D(1), symB, D(2), Sym("S"), D(16)})
	pos := b.Input("pos", tensor.I32, Shape{D(1), symB, Sym("S")})
	b.SetScope("model.layers.0.self_attn")
	part := b.Apply("attention_partial", Attrs{"scale": 0.25, "window": 4}, q, k, k, pos, pos)
	k2 := b.Op("ring_shift", Attrs{"group": "cp", "group_size": 2}, k)
	p2 := b.Op("ring_shift", Attrs{"group": "cp", "group_size": 2}, pos)
	part2 := b.Apply("attention_partial", Attrs{"scale": 0.25}, q, k2, k2, pos, p2)
	m := b.Apply("attention_merge", nil, part[0], part[1], part2[0], part2[1])
	// The paged form: the step's tokens [1,H,S,D], the rank's cache and the other blocks'
	// queries gathered.
	qt := b.Input("q_tokens", tensor.F32, Shape{D(1), D(1), D(4), Sym("T"), D(16)})
	kt := b.Input("k_tokens", tensor.BF16, Shape{D(1), D(2), Sym("T"), D(16)})
	tpos := b.Input("positions", tensor.I32, Shape{D(1), D(1), Sym("T")})
	kc := b.Input("kv_cache.0.k", tensor.BF16, Shape{Sym("NB"), D(8), D(2), D(16)})
	vc := b.Input("kv_cache.0.v", tensor.BF16, Shape{Sym("NB"), D(8), D(2), D(16)})
	slots := b.Input("slot_mapping", tensor.I32, Shape{Sym("T")})
	seqs := b.Input("token_seq", tensor.I32, Shape{D(1), Sym("T")})
	tables := b.Input("block_tables", tensor.I32, Shape{Sym("N"), Sym("M")})
	kvp := b.Input("kv_positions", tensor.I32, Shape{Sym("N"), Sym("L")})
	pp := b.Apply("paged_attention_partial", Attrs{"scale": 0.25, "window": 4}, qt, kt, kt, tpos, kc, vc, slots, seqs, tables, kvp)
	b.Output(m[0], m[1], pp[0], pp[1])
	return b.Build()
}
