package engine

import (
	"github.com/loom-ml/loom/kvcache"
)

// Automatic prefix caching (on unless Options.DisablePrefixCaching; not with context
// parallelism, whose tokens live on the cp index that computed them).
//
// The keys and values of a full block depend only on the tokens up to its end, so a
// sequence whose tokens start with full blocks some sequence has computed takes those blocks
// (kvcache.Allocator.ReserveCached) and computes only the rest: its positions start after the
// cached tokens and the attention reads the shared blocks through the block table. The
// blocks a step has computed are committed when the step is collected (commitPrefixes), so
// that no sequence reads a block before the step writing it has run; blocks of finished
// sequences stay cached until the allocator needs the space. A sequence takes at most
// (tokens-1)/BlockSize cached blocks: its last block is its own (no sequence writes into a
// block another holds), and its last token is computed, which gives the logits of its next
// token. On the CPU the cached keys and values are the bits the sequence would compute
// itself, so prefix caching leaves the outputs unchanged bit for bit.
//
// A queued sequence whose next uncached block a running sequence is prefilling now waits
// for it (the queue is first come, first served): requests that start alike, such as the n
// choices of one API request or prompts with one system prompt, compute the shared blocks
// once instead of each its own copy at the same time.

// prefixCaching reports whether the engine shares cached prefixes.
func (e *Engine) prefixCaching() bool { return e.alloc != nil && !e.opts.DisablePrefixCaching }

// blockHashes extends s's hash chain to the full blocks of its tokens and returns it.
func (e *Engine) blockHashes(s *sequence) []kvcache.BlockHash {
	s.hashes = kvcache.BlockHashes(s.hashes, s.tokens, e.alloc.BlockSize())
	return s.hashes
}

// shareable is the hashes of the blocks s may take from the cache: its full blocks before
// its last token.
func (e *Engine) shareable(s *sequence) []kvcache.BlockHash {
	return e.blockHashes(s)[:(len(s.tokens)-1)/e.alloc.BlockSize()]
}

// reserveAdmission reserves blocks for a queued sequence's first chunk of at most budget
// tokens, when the cache has room for its whole prompt (as far as it is not cached). It
// returns the chunk's size, 0 when s must wait. With prefix caching the chunk starts after
// the cached prefix (s.computed moves there). The caller holds e.mu.
func (e *Engine) reserveAdmission(s *sequence, budget int) int {
	if !e.prefixCaching() {
		if !e.kv.CanReserve(s.id, len(s.tokens)) {
			return 0 // first come, first served: wait for blocks
		}
		n := min(len(s.tokens)-s.computed, budget)
		if e.kv.Reserve(s.id, s.computed+n) != nil {
			return 0
		}
		return n
	}
	hashes := e.shareable(s)
	hit := e.alloc.CachedBlocks(hashes)
	if e.prefillingBlock(s, hashes, hit) || !e.alloc.CanReserveCached(s.id, hashes[:hit], len(s.tokens)) {
		return 0
	}
	from := hit * e.alloc.BlockSize()
	n := min(len(s.tokens)-from, budget)
	if _, err := e.alloc.ReserveCached(s.id, hashes[:hit], from+n); err != nil {
		return 0
	}
	s.computed = from
	e.counters.CachedTokensTotal += int64(from)
	return n
}

// prefillingBlock reports whether a running sequence is prefilling now the first block of
// s's that is not cached (hashes[hit]): s then waits for it to be cached.
func (e *Engine) prefillingBlock(s *sequence, hashes []kvcache.BlockHash, hit int) bool {
	if hit == len(hashes) {
		return false
	}
	end := (hit + 1) * e.alloc.BlockSize()
	for _, r := range e.running {
		if len(r.tokens)-r.computed <= 1 || r.computed >= end || len(r.tokens) < end {
			continue // decoding, past that block, or without it
		}
		if rh := e.blockHashes(r); rh[hit] == hashes[hit] {
			return true
		}
	}
	return false
}

// commitPrefixes registers the full blocks that a collected step has computed, of each
// sequence i of the step with done[i] set.
func (e *Engine) commitPrefixes(seqs []*sequence, done []bool) {
	if !e.prefixCaching() {
		return
	}
	for i, s := range seqs {
		if !done[i] {
			continue
		}
		full := s.computed / e.alloc.BlockSize()
		if err := e.alloc.Commit(s.id, e.blockHashes(s)[:full]); err != nil {
			e.log.Warn("prefix cache: commit", "id", s.req.ID, "error", err)
		}
	}
}
