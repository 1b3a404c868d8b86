package tokenizer

import (
	"hash/maphash"
	"iter"
	"strings"
)

// vocabTable maps the BPE model's tokens to their ids. Its keys are substrings of one string
// and its index is an open-addressing table with linear probing, at most two-thirds full,
// whose slots hold the upper half of a key's hash beside the entry's index, so that a probe
// rarely touches a key that does not match. Built from Qwen2.5's 151,643 tokens it takes a
// fifth of the time that filling a Go map does, and it answers lookups as fast.
type vocabTable struct {
	keys  string
	koff  []int32 // entry i's key is keys[koff[i]:koff[i+1]]
	ids   []int32 // entry i's id
	slots []uint64
	mask  uint64
	seed  maphash.Seed
	// dup: some key has more than one entry; the table holds the last, as a Go map filled
	// in entry order would.
	dup bool
}

// newVocabTable indexes the entries whose keys koff cuts from keys and whose ids are ids.
func newVocabTable(keys string, koff, ids []int32) *vocabTable {
	n := len(ids)
	size := 8
	for size < n+n/2 {
		size *= 2
	}
	v := &vocabTable{keys: keys, koff: koff, ids: ids, slots: make([]uint64, size), mask: uint64(size - 1), seed: maphash.MakeSeed()}
	for i := range n {
		k := v.key(i)
		h := maphash.String(v.seed, k)
		for j := h & v.mask; ; j = (j + 1) & v.mask {
			s := v.slots[j]
			if s == 0 {
				v.slots[j] = h>>32<<32 | uint64(i+1)
				break
			}
			if s>>32 == h>>32 && v.key(int(uint32(s))-1) == k {
				v.slots[j], v.dup = h>>32<<32|uint64(i+1), true
				break
			}
		}
	}
	return v
}

// vocabFromMap returns the table of m's tokens, whose ids the caller has checked.
func vocabFromMap(m map[string]int) *vocabTable {
	var sb strings.Builder
	koff := make([]int32, 1, len(m)+1)
	ids := make([]int32, 0, len(m))
	for k, id := range m {
		sb.WriteString(k)
		koff = append(koff, int32(sb.Len()))
		ids = append(ids, int32(id))
	}
	return newVocabTable(sb.String(), koff, ids)
}

// key returns entry i's key.
func (v *vocabTable) key(i int) string { return v.keys[v.koff[i]:v.koff[i+1]] }

// find returns the index of the entry whose key is k.
func (v *vocabTable) find(k string) (int, bool) {
	h := maphash.String(v.seed, k)
	for j := h & v.mask; ; j = (j + 1) & v.mask {
		s := v.slots[j]
		if s == 0 {
			return 0, false
		}
		if s>>32 == h>>32 && v.key(int(uint32(s))-1) == k {
			return int(uint32(s)) - 1, true
		}
	}
}

// get returns the id of token s.
func (v *vocabTable) get(s string) (int, bool) {
	i, ok := v.find(s)
	if !ok {
		return 0, false
	}
	return int(v.ids[i]), true
}

// getBytes is get for a token given as bytes.
func (v *vocabTable) getBytes(b []byte) (int, bool) {
	h := maphash.Bytes(v.seed, b)
	for j := h & v.mask; ; j = (j + 1) & v.mask {
		s := v.slots[j]
		if s == 0 {
			return 0, false
		}
		if i := int(uint32(s)) - 1; s>>32 == h>>32 && v.key(i) == string(b) {
			return int(v.ids[i]), true
		}
	}
}

// all yields each token and its id: in entry order, or, when keys repeat, in table order.
func (v *vocabTable) all() iter.Seq2[string, int] {
	return func(yield func(string, int) bool) {
		if !v.dup {
			for i, id := range v.ids {
				if !yield(v.key(i), int(id)) {
					return
				}
			}
			return
		}
		for _, s := range v.slots {
			if s != 0 {
				if i := int(uint32(s)) - 1; !yield(v.key(i), int(v.ids[i])) {
					return
				}
			}
		}
	}
}
