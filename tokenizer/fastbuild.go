package tokenizer

import "strings"

// build makes the BPE model of what fastModel read: the vocabulary keys copied into one
// string and indexed by a vocabTable, then the merges.
func (r *modelReader) build(cfg *bpeConfig) (*bpe, bool) {
	n := len(r.vocab)
	koff := make([]int32, n+1)
	ids := make([]int32, n)
	for i, v := range r.vocab {
		koff[i+1] = koff[i] + v.key.n
		ids[i] = v.id
	}
	arena := make([]byte, 0, koff[n])
	for _, v := range r.vocab {
		arena = append(arena, r.bytes(v.key)...)
	}
	m := newBPE(cfg, newVocabTable(string(arena), koff, ids), len(r.merges)/2)
	if !r.resolveMerges(m) {
		return nil, false
	}
	return m, true
}

// resolveMerges fills m's merge table: the ids of each merge's two tokens and of the token
// they make, a + b without the continuing-subword prefix, as parseModel finds them. It
// reports false if a token is not in the vocabulary (parseModel then gives the error).
//
// Trained vocabularies give the tokens that merges make consecutive ids in rank order
// (Qwen2.5: id = 256 + rank), so the merged token is first looked for at the id after the
// previous merge's, which is cheaper than a lookup.
func (r *modelReader) resolveMerges(m *bpe) bool {
	v := m.vocab
	var byID []int32 // id -> the vocabulary entry with it, or -1
	if !v.dup {      // with a repeated key, an entry's key may map to another id
		maxID := int32(-1)
		for _, id := range v.ids {
			maxID = max(maxID, id)
		}
		byID = make([]int32, maxID+1)
		for i := range byID {
			byID[i] = -1
		}
		for i, id := range v.ids {
			byID[id] = int32(i)
		}
	}
	delta := 0 // merged id - rank of the previous merge
	var buf []byte
	for rank := range len(r.merges) / 2 {
		a, b := r.bytes(r.merges[2*rank]), r.bytes(r.merges[2*rank+1])
		ida, oka := v.getBytes(a)
		idb, okb := v.getBytes(b)
		if !oka || !okb {
			return false
		}
		buf = append(buf[:0], a...)
		if m.prefix != "" && strings.HasPrefix(string(b), m.prefix) {
			b = b[len(m.prefix):]
		}
		buf = append(buf, b...)
		id := rank + delta
		if id < 0 || id >= len(byID) || byID[id] < 0 || v.key(int(byID[id])) != string(buf) {
			var ok bool
			if id, ok = v.getBytes(buf); !ok {
				return false
			}
		}
		delta = id - rank
		m.merges.put(pairKey(int32(ida), int32(idb)), bpeMerge{int32(rank), int32(id)})
	}
	return true
}
