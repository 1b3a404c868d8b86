package tokenizer

import (
	"strings"
	"sync"
)

// indexVocab returns a function that indexes the vocabulary read so far, whose escaped keys
// are in extra (the side buffer at the time: the merges read meanwhile only append to it):
// it copies the keys into one string, builds the vocabTable, and maps ids to entries.
func (r *modelReader) indexVocab(extra []byte) func() {
	return func() {
		n := len(r.vocab)
		koff := make([]int32, n+1)
		ids := make([]int32, n)
		maxID := int32(-1)
		for i, v := range r.vocab {
			koff[i+1] = koff[i] + v.key.n
			ids[i] = v.id
			maxID = max(maxID, v.id)
		}
		var arena strings.Builder // its String does not copy
		arena.Grow(int(koff[n]))
		for _, v := range r.vocab {
			arena.Write(refBytes(r.data, extra, v.key))
		}
		r.table = newVocabTable(arena.String(), koff, ids)
		if r.table.dup {
			return // with a repeated key, an entry's key may map to another id: no byID
		}
		r.byID = make([]int32, maxID+1)
		for i := range r.byID {
			r.byID[i] = -1
		}
		for i, id := range ids {
			r.byID[id] = int32(i)
		}
	}
}

// build makes the BPE model of what fastModel read, once indexVocab has run.
func (r *modelReader) build(cfg *bpeConfig) (*bpe, bool) {
	nm := len(r.merges) / 2
	m := newBPE(cfg, r.table, nm)
	keys := make([]uint64, nm) // pairKey of each merge
	ids := make([]int32, nm)   // the id of the token it makes
	if !r.resolveMerges(m, keys, ids) {
		return nil, false
	}
	for rank, k := range keys {
		m.merges.put(k, bpeMerge{int32(rank), ids[rank]}) // a repeated merge keeps its last rank
	}
	return m, true
}

// resolveMerges finds the ids of each merge's two tokens and of the token they make, a + b
// without the continuing-subword prefix, as parseModel finds them, and stores the pair's
// key in keys and the made token's id in ids, in rank order. It reports false if a token is
// not in the vocabulary (parseModel then gives the error). Two goroutines take half of the
// merges each.
func (r *modelReader) resolveMerges(m *bpe, keys []uint64, ids []int32) bool {
	nm := len(keys)
	if nm < 1<<14 {
		return r.resolveRange(m, keys, ids, 0, nm)
	}
	var wg sync.WaitGroup
	var ok1 bool
	wg.Go(func() { ok1 = r.resolveRange(m, keys, ids, nm/2, nm) })
	ok0 := r.resolveRange(m, keys, ids, 0, nm/2)
	wg.Wait()
	return ok0 && ok1
}

// resolveRange is resolveMerges for the merges of ranks lo to hi-1.
//
// Trained vocabularies give the tokens that merges make consecutive ids in rank order
// (Qwen2.5: id = 256 + rank), so the made token is first looked for at the id after the
// previous merge's, which is cheaper than a lookup.
func (r *modelReader) resolveRange(m *bpe, keys []uint64, ids []int32, lo, hi int) bool {
	v := m.vocab
	delta := 0 // made id - rank of the previous merge
	var buf []byte
	for rank := lo; rank < hi; rank++ {
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
		if id < 0 || id >= len(r.byID) || r.byID[id] < 0 || v.key(int(r.byID[id])) != string(buf) {
			var ok bool
			if id, ok = v.getBytes(buf); !ok {
				return false
			}
		}
		delta = id - rank
		keys[rank], ids[rank] = pairKey(int32(ida), int32(idb)), int32(id)
	}
	return true
}
