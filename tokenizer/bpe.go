package tokenizer

import (
	"encoding/json"
	"fmt"
	"hash/maphash"
	"strings"
	"sync"
	"unicode/utf8"
)

// bpe is the byte-pair-encoding model of tokenizer.json: a vocabulary, ranked merges and the
// handling of characters that are not in the vocabulary (byte fallback, unk token).
type bpe struct {
	vocab  *vocabTable
	merges mergeTable // key: left id << 32 | right id (pairKey)

	unkToken     string // "" if none
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	prefix       string // continuing_subword_prefix
	suffix       string // end_of_word_suffix
	byteIDs      [256]int

	cache *wordCache

	// byteLevelIDs maps each byte to the id of its ByteLevel character, if every byte has
	// one (byteLevelOK); rawCache caches words given as raw bytes.
	byteLevelIDs [256]int32
	byteLevelOK  bool
	rawCache     *wordCache
}

type bpeMerge struct{ rank, id int32 }

func pairKey(a, b int32) uint64 { return uint64(uint32(a))<<32 | uint64(uint32(b)) }

type bpeConfig struct {
	Type         string            `json:"type"`
	Dropout      *float64          `json:"dropout"`
	UnkToken     *string           `json:"unk_token"`
	Prefix       *string           `json:"continuing_subword_prefix"`
	Suffix       *string           `json:"end_of_word_suffix"`
	FuseUnk      bool              `json:"fuse_unk"`
	ByteFallback bool              `json:"byte_fallback"`
	IgnoreMerges bool              `json:"ignore_merges"`
	Vocab        map[string]int    `json:"vocab"`
	Merges       []json.RawMessage `json:"merges"`
}

// parseModel builds the model section. Only BPE is supported.
func parseModel(raw json.RawMessage) (*bpe, error) {
	if isNull(raw) {
		return nil, fmt.Errorf("model: missing")
	}
	var head struct {
		Type   string          `json:"type"`
		Merges json.RawMessage `json:"merges"`
	}
	if err := decodeAt(raw, "model", &head); err != nil {
		return nil, err
	}
	if head.Type == "" && head.Merges != nil {
		head.Type = "BPE" // files written by old versions of tokenizers omit the type
	}
	if head.Type != "BPE" {
		return nil, fmt.Errorf("model: unsupported model type %q (only BPE is supported)", head.Type)
	}
	var cfg bpeConfig
	if err := decodeAt(raw, "model", &cfg); err != nil {
		return nil, err
	}
	if cfg.Vocab == nil {
		return nil, fmt.Errorf("model: missing vocab")
	}
	for tok, id := range cfg.Vocab {
		if id < 0 || id > maxTokenID {
			return nil, fmt.Errorf("model: vocab: token %q has invalid id %d (ids go from 0 to %d)", tok, id, maxTokenID)
		}
	}
	m := newBPE(&cfg, vocabFromMap(cfg.Vocab), len(cfg.Merges))
	for rank, r := range cfg.Merges {
		a, b, err := parseMerge(r)
		if err != nil {
			return nil, fmt.Errorf("model: merges[%d]: %w", rank, err)
		}
		ida, ok := m.vocab.get(a)
		if !ok {
			return nil, fmt.Errorf("model: merges[%d]: token %q is not in the vocabulary", rank, a)
		}
		idb, ok := m.vocab.get(b)
		if !ok {
			return nil, fmt.Errorf("model: merges[%d]: token %q is not in the vocabulary", rank, b)
		}
		merged := a + strings.TrimPrefix(b, m.prefix)
		id, ok := m.vocab.get(merged)
		if !ok {
			return nil, fmt.Errorf("model: merges[%d]: merged token %q is not in the vocabulary", rank, merged)
		}
		// A repeated merge keeps its last rank, as in Hugging Face's map built from the list.
		m.merges.put(pairKey(int32(ida), int32(idb)), bpeMerge{int32(rank), int32(id)})
	}
	return m, nil
}

// newBPE returns the model of cfg's settings over vocab, whose ids the caller has checked,
// with room for merges merges, which the caller adds.
func newBPE(cfg *bpeConfig, vocab *vocabTable, merges int) *bpe {
	m := &bpe{
		vocab:        vocab,
		merges:       newMergeTable(merges),
		fuseUnk:      cfg.FuseUnk,
		byteFallback: cfg.ByteFallback,
		ignoreMerges: cfg.IgnoreMerges,
		cache:        newWordCache(cacheWords),
		rawCache:     newWordCache(cacheWords),
	}
	if cfg.UnkToken != nil {
		m.unkToken = *cfg.UnkToken
	}
	if cfg.Prefix != nil {
		m.prefix = *cfg.Prefix
	}
	if cfg.Suffix != nil {
		m.suffix = *cfg.Suffix
	}
	for b := range m.byteIDs {
		m.byteIDs[b] = -1
		if id, ok := m.vocab.get(fmt.Sprintf("<0x%02X>", b)); ok {
			m.byteIDs[b] = id
		}
	}
	m.byteLevelOK = m.prefix == "" && m.suffix == ""
	for b := range m.byteLevelIDs {
		id, ok := m.vocab.get(byteToStr[b])
		m.byteLevelIDs[b] = int32(id)
		m.byteLevelOK = m.byteLevelOK && ok
	}
	return m
}

// parseMerge reads one merge, either "a b" or ["a", "b"].
func parseMerge(r json.RawMessage) (string, string, error) {
	var s string
	if err := json.Unmarshal(r, &s); err == nil {
		a, b, ok := strings.Cut(s, " ")
		if !ok || a == "" || b == "" {
			return "", "", fmt.Errorf("want \"left right\", got %q", s)
		}
		return a, b, nil
	}
	var pair []string
	if err := json.Unmarshal(r, &pair); err != nil || len(pair) != 2 {
		return "", "", fmt.Errorf("want a string \"left right\" or a list [left, right], got %s", truncate(string(r), 60))
	}
	return pair[0], pair[1], nil
}

// tokenize appends the ids of word to dst.
func (m *bpe) tokenize(word string, dst []int) ([]int, error) {
	if m.ignoreMerges {
		if id, ok := m.vocab.get(word); ok {
			return append(dst, id), nil
		}
	}
	if ids, ok := m.cache.get(word); ok {
		return append(dst, ids...), nil
	}
	start := len(dst)
	dst, err := m.mergeWord(word, dst)
	if err != nil {
		return dst, err
	}
	m.cache.put(word, dst[start:])
	return dst, nil
}

// tokenizeByteLevel appends the ids of a word given as raw bytes, each standing for its
// ByteLevel character. It gives the same ids as tokenize(byteLevelEncode(word)).
func (m *bpe) tokenizeByteLevel(word string, dst []int) ([]int, error) {
	if !m.byteLevelOK {
		return m.tokenize(byteLevelEncode(word), dst)
	}
	if ids, ok := m.rawCache.get(word); ok {
		return append(dst, ids...), nil
	}
	start := len(dst)
	if m.ignoreMerges {
		if id, ok := m.vocab.get(byteLevelEncode(word)); ok {
			dst = append(dst, id)
			m.rawCache.put(word, dst[start:])
			return dst, nil
		}
	}
	sc := scratchPool.Get().(*bpeScratch)
	syms := sc.syms[:0]
	for i := 0; i < len(word); i++ {
		syms = append(syms, bpeSymbol{id: m.byteLevelIDs[word[i]], prev: int32(i - 1), next: int32(i + 1)})
	}
	dst = m.merge(sc, syms, dst)
	scratchPool.Put(sc)
	m.rawCache.put(word, dst[start:])
	return dst, nil
}

type bpeSymbol struct {
	id         int32
	prev, next int32
	dead       bool
}

type bpeScratch struct {
	syms []bpeSymbol
	heap []uint64
}

var scratchPool = sync.Pool{New: func() any { return new(bpeScratch) }}

// mergeWord splits word into characters, maps them to ids (with byte fallback or unk for
// characters outside the vocabulary) and applies the merges.
func (m *bpe) mergeWord(word string, dst []int) ([]int, error) {
	sc := scratchPool.Get().(*bpeScratch)
	defer scratchPool.Put(sc)
	syms := sc.syms[:0]
	add := func(id int) {
		syms = append(syms, bpeSymbol{id: int32(id), prev: int32(len(syms) - 1), next: int32(len(syms) + 1)})
	}
	unkID, unkPending := -1, false
	flushUnk := func() {
		if unkPending {
			add(unkID)
			unkPending = false
		}
	}
	for i := 0; i < len(word); {
		_, n := utf8.DecodeRuneInString(word[i:])
		s := word[i : i+n]
		if m.prefix != "" && i > 0 {
			s = m.prefix + s
		}
		if m.suffix != "" && i+n == len(word) {
			s += m.suffix
		}
		i += n
		if id, ok := m.vocab.get(s); ok {
			flushUnk()
			add(id)
			continue
		}
		if m.byteFallback && m.hasBytes(s) {
			for j := 0; j < len(s); j++ {
				add(m.byteIDs[s[j]])
			}
			continue
		}
		if m.unkToken == "" {
			continue // Hugging Face drops the character
		}
		if unkID < 0 {
			id, ok := m.vocab.get(m.unkToken)
			if !ok {
				sc.syms = syms
				return dst, fmt.Errorf("unk_token %q is not in the vocabulary", m.unkToken)
			}
			unkID = id
		}
		if unkPending && !m.fuseUnk {
			add(unkID)
		}
		unkPending = true
	}
	flushUnk()
	return m.merge(sc, syms, dst), nil
}

// merge applies the merges to syms, lowest rank first and leftmost first among equal ranks,
// as Hugging Face's BPE does, and appends the resulting ids to dst. syms must be linked in
// order (prev = i-1, next = i+1).
func (m *bpe) merge(sc *bpeScratch, syms []bpeSymbol, dst []int) []int {
	sc.syms = syms
	if len(syms) == 0 {
		return dst
	}
	syms[len(syms)-1].next = -1
	if len(syms) == 1 {
		return append(dst, int(syms[0].id))
	}
	// Priority queue of candidate merges, keyed rank<<32 | position.
	h := sc.heap[:0]
	push := func(pos int32) {
		nx := syms[pos].next
		if nx < 0 {
			return
		}
		if mg, ok := m.merges.get(pairKey(syms[pos].id, syms[nx].id)); ok {
			h = heapPush(h, uint64(uint32(mg.rank))<<32|uint64(uint32(pos)))
		}
	}
	for i := range syms {
		push(int32(i))
	}
	for len(h) > 0 {
		var top uint64
		top, h = heapPop(h)
		rank, pos := int32(top>>32), int32(uint32(top))
		sym := &syms[pos]
		if sym.dead || sym.next < 0 {
			continue
		}
		nx := sym.next
		mg, ok := m.merges.get(pairKey(sym.id, syms[nx].id))
		if !ok || mg.rank != rank {
			continue // stale entry: one side changed since it was queued
		}
		sym.id = mg.id
		sym.next = syms[nx].next
		syms[nx].dead = true
		if sym.next >= 0 {
			syms[sym.next].prev = pos
		}
		if sym.prev >= 0 {
			push(sym.prev)
		}
		push(pos)
	}
	for i := int32(0); i >= 0; i = syms[i].next {
		dst = append(dst, int(syms[i].id))
	}
	sc.heap = h
	return dst
}

func (m *bpe) hasBytes(s string) bool {
	for i := 0; i < len(s); i++ {
		if m.byteIDs[s[i]] < 0 {
			return false
		}
	}
	return true
}

func heapPush(h []uint64, v uint64) []uint64 {
	h = append(h, v)
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if h[p] <= h[i] {
			break
		}
		h[p], h[i] = h[i], h[p]
		i = p
	}
	return h
}

func heapPop(h []uint64) (uint64, []uint64) {
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(h) && h[l] < h[m] {
			m = l
		}
		if r < len(h) && h[r] < h[m] {
			m = r
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	return top, h
}

// wordCache remembers the ids of recently tokenized words. It is safe for concurrent use and
// stops growing at a fixed size, as Hugging Face's BPE cache does.
type wordCache struct {
	seed     maphash.Seed
	shardCap int
	shards   [32]cacheShard
}

type cacheShard struct {
	mu sync.RWMutex
	m  map[string][]int
}

const (
	cacheWords   = 40000 // words kept in all
	cacheMaxWord = 256   // longer words are not cached
)

func newWordCache(words int) *wordCache {
	c := &wordCache{seed: maphash.MakeSeed(), shardCap: words / 32}
	for i := range c.shards {
		c.shards[i].m = make(map[string][]int)
	}
	return c
}

func (c *wordCache) shard(w string) *cacheShard {
	return &c.shards[maphash.String(c.seed, w)%uint64(len(c.shards))]
}

func (c *wordCache) get(w string) ([]int, bool) {
	if len(w) > cacheMaxWord {
		return nil, false
	}
	sh := c.shard(w)
	sh.mu.RLock()
	ids, ok := sh.m[w]
	sh.mu.RUnlock()
	return ids, ok
}

func (c *wordCache) put(w string, ids []int) {
	if len(w) > cacheMaxWord {
		return
	}
	sh := c.shard(w)
	sh.mu.Lock()
	if len(sh.m) < c.shardCap {
		sh.m[strings.Clone(w)] = append([]int(nil), ids...)
	}
	sh.mu.Unlock()
}
