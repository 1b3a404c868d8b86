package kvcache

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// Automatic prefix caching, after vLLM's.
//
// A full block holds the keys and values of BlockSize tokens at fixed positions, and those
// depend only on the tokens up to the block's end. So a full block is named by a hash chain:
// the hash of block k is SHA-256(hash of block k-1, block k's token ids), block 0's parent the
// zero hash (BlockHashes). Once a sequence has computed a full block, the engine commits it
// (Commit): the block is registered under its hash. A later sequence whose tokens start with
// the same full blocks takes them (ReserveCached) instead of computing them again; a block
// is then held by several sequences (refcounted). A block no sequence holds keeps its
// contents and its hash, on a least-recently-used list of cached blocks, and is evicted
// (handed out for other contents) only when no block that holds nothing is left.
//
// A sequence never writes into a block another may hold: only full, computed blocks are
// registered, and a sequence writes only past its computed tokens. The engine keeps the
// last block of a prompt its own (it takes at most (tokens-1)/BlockSize cached blocks), so
// that the last token is computed and gives its logits.

// BlockHash names the contents of a full block: a hash of every token up to its end.
type BlockHash [sha256.Size]byte

// BlockHashes appends to dst the hashes of the full blocks of tokens past the len(dst)
// already there (dst must be the chain of tokens' first len(dst) blocks) and returns it.
func BlockHashes(dst []BlockHash, tokens []int, blockSize int) []BlockHash {
	var buf []byte
	for k := len(dst); (k+1)*blockSize <= len(tokens); k++ {
		var parent BlockHash
		if k > 0 {
			parent = dst[k-1]
		}
		buf = append(buf[:0], parent[:]...)
		for _, t := range tokens[k*blockSize : (k+1)*blockSize] {
			buf = binary.LittleEndian.AppendUint64(buf, uint64(int64(t)))
		}
		dst = append(dst, sha256.Sum256(buf))
	}
	return dst
}

// prefixCache is the allocator's index of cached blocks. Its fields are guarded by
// Allocator.mu.
type prefixCache struct {
	hash   []BlockHash // per block, when has is set
	has    []bool
	byHash map[BlockHash]int32
	// The least-recently-used list of cached blocks no sequence holds: a ring through
	// prev/next, index len(has) the head sentinel (next: the oldest).
	prev, next []int32
	lruLen     int
	// committed is, per sequence, the number of its first blocks already registered or
	// taken from the cache.
	committed                map[SeqID]int
	queries, hits, evictions int64
}

func (c *prefixCache) init(n int) {
	c.hash, c.has = make([]BlockHash, n), make([]bool, n)
	c.byHash = map[BlockHash]int32{}
	c.prev, c.next = make([]int32, n+1), make([]int32, n+1)
	c.prev[n], c.next[n] = int32(n), int32(n)
	c.committed = map[SeqID]int{}
}

func (c *prefixCache) cached(b int32) bool { return c.has[b] }

func (c *prefixCache) sentinel() int32 { return int32(len(c.has)) }

// pushLRU puts a cached block no sequence holds at the end of the list (most recent).
func (c *prefixCache) pushLRU(b int32) {
	s := c.sentinel()
	last := c.prev[s]
	c.prev[b], c.next[b] = last, s
	c.next[last], c.prev[s] = b, b
	c.lruLen++
}

// removeLRU takes block b off the list (a sequence holds it again).
func (c *prefixCache) removeLRU(b int32) {
	p, n := c.prev[b], c.next[b]
	c.next[p], c.prev[n] = n, p
	c.prev[b], c.next[b] = b, b
	c.lruLen--
}

// evict takes the least recently used cached block off the list and forgets its hash. The
// caller has checked that the list is not empty.
func (c *prefixCache) evict() int32 {
	b := c.next[c.sentinel()]
	c.removeLRU(b)
	delete(c.byHash, c.hash[b])
	c.has[b] = false
	c.evictions++
	return b
}

// CachedBlocks is the number of leading hashes whose blocks are cached (held by sequences
// or not).
func (a *Allocator) CachedBlocks(hashes []BlockHash) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cachedLocked(hashes)
}

func (a *Allocator) cachedLocked(hashes []BlockHash) int {
	for k, h := range hashes {
		if _, ok := a.pc.byHash[h]; !ok {
			return k
		}
	}
	return len(hashes)
}

// freshNeed is how many blocks ReserveCached(seq, hashes, tokens) takes from the available
// ones: the blocks of tokens beyond the cached ones, and each cached block no sequence
// holds. hit is the number of cached leading hashes.
func (a *Allocator) freshNeed(hashes []BlockHash, tokens int) (need, hit int) {
	hit = a.cachedLocked(hashes)
	need = max(a.BlocksFor(tokens), hit) - hit
	for _, h := range hashes[:hit] {
		if a.ref[a.pc.byHash[h]] == 0 {
			need++
		}
	}
	return need, hit
}

// CanReserveCached reports whether ReserveCached(seq, hashes, tokens) would succeed now.
func (a *Allocator) CanReserveCached(seq SeqID, hashes []BlockHash, tokens int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.seqs[seq]) > 0 {
		return false
	}
	need, _ := a.freshNeed(hashes, tokens)
	return need <= a.available()
}

// ReserveCached gives seq, which must hold no blocks, blocks for its first tokens tokens:
// the cached blocks of the longest cached prefix of hashes (the block hashes of its tokens,
// BlockHashes, as many as it may share), shared with the sequences holding them, then
// blocks of its own as Reserve. It returns the number of cached blocks taken; seq's tokens
// before hit*BlockSize need not be computed. It takes all or nothing, as Reserve.
func (a *Allocator) ReserveCached(seq SeqID, hashes []BlockHash, tokens int) (hit int, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.seqs[seq]) > 0 {
		return 0, fmt.Errorf("kvcache: ReserveCached: sequence %d already holds %d blocks", seq, len(a.seqs[seq]))
	}
	need, hit := a.freshNeed(hashes, tokens)
	if need > a.available() {
		return 0, fmt.Errorf("%w: sequence %d needs %d blocks for %d tokens (%d of them cached), %d of %d are free",
			ErrOutOfBlocks, seq, max(a.BlocksFor(tokens), hit), tokens, hit, a.available(), a.total)
	}
	blocks := make([]int32, 0, max(a.BlocksFor(tokens), hit))
	for _, h := range hashes[:hit] {
		b := a.pc.byHash[h]
		if a.ref[b] == 0 {
			a.pc.removeLRU(b)
		}
		a.ref[b]++
		blocks = append(blocks, b)
	}
	a.seqs[seq] = a.take(blocks, max(a.BlocksFor(tokens), hit)-hit)
	a.pc.committed[seq] = hit
	a.pc.queries += int64(len(hashes))
	a.pc.hits += int64(hit)
	return hit, nil
}

// Commit registers seq's first len(hashes) blocks as holding the full blocks named by
// hashes (their keys and values computed), so that later sequences can share them. Blocks
// committed before are skipped; a block whose hash another block already holds stays seq's
// own. seq must hold at least len(hashes) blocks.
func (a *Allocator) Commit(seq SeqID, hashes []BlockHash) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	blocks := a.seqs[seq]
	if len(hashes) > len(blocks) {
		return fmt.Errorf("kvcache: Commit: sequence %d holds %d blocks, not the %d committed", seq, len(blocks), len(hashes))
	}
	for k := a.pc.committed[seq]; k < len(hashes); k++ {
		b := blocks[k]
		if a.pc.has[b] {
			continue
		}
		if _, dup := a.pc.byHash[hashes[k]]; dup {
			continue
		}
		a.pc.hash[b], a.pc.has[b] = hashes[k], true
		a.pc.byHash[hashes[k]] = b
	}
	a.pc.committed[seq] = max(a.pc.committed[seq], len(hashes))
	return nil
}

// Check verifies the allocator's invariants: each block is held by the sequences whose
// tables name it (refcount), or else exactly once on the free list (holding nothing) or on
// the list of cached blocks; the hash index and the blocks' hashes agree; no sequence names
// a block twice. It is for tests.
func (a *Allocator) Check() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	var errs []error
	refs := make([]int32, a.total)
	for seq, blocks := range a.seqs {
		seen := map[int32]bool{}
		for _, b := range blocks {
			if b < 0 || int(b) >= a.total || seen[b] {
				errs = append(errs, fmt.Errorf("sequence %d: block %d out of range or named twice in %v", seq, b, blocks))
				continue
			}
			seen[b] = true
			refs[b]++
		}
	}
	onFree, onList := make([]int, a.total), make([]int, a.total)
	for _, b := range a.free {
		onFree[b]++
		if a.pc.has[b] {
			errs = append(errs, fmt.Errorf("block %d is on the free list with a hash", b))
		}
	}
	n := 0
	for b := a.pc.next[a.pc.sentinel()]; b != a.pc.sentinel(); b = a.pc.next[b] {
		if n++; n > a.total {
			errs = append(errs, errors.New("the cached list has a cycle"))
			break
		}
		onList[b]++
		if !a.pc.has[b] {
			errs = append(errs, fmt.Errorf("block %d is on the cached list without a hash", b))
		}
	}
	if n != a.pc.lruLen {
		errs = append(errs, fmt.Errorf("the cached list holds %d blocks, its count says %d", n, a.pc.lruLen))
	}
	for b := range a.total {
		switch {
		case refs[b] != a.ref[b]:
			errs = append(errs, fmt.Errorf("block %d: refcount %d, held by %d sequences", b, a.ref[b], refs[b]))
		case refs[b] > 0 && onFree[b]+onList[b] != 0, refs[b] == 0 && onFree[b]+onList[b] != 1:
			errs = append(errs, fmt.Errorf("block %d: held by %d sequences, on the free list %d times and the cached list %d", b, refs[b], onFree[b], onList[b]))
		}
		if a.pc.has[b] && a.pc.byHash[a.pc.hash[b]] != int32(b) {
			errs = append(errs, fmt.Errorf("block %d: its hash names block %d", b, a.pc.byHash[a.pc.hash[b]]))
		}
	}
	for h, b := range a.pc.byHash {
		if !a.pc.has[b] || a.pc.hash[b] != h {
			errs = append(errs, fmt.Errorf("the hash index names block %d, which does not hold that hash", b))
		}
	}
	for seq := range a.pc.committed {
		if _, ok := a.seqs[seq]; !ok {
			errs = append(errs, fmt.Errorf("committed count of unknown sequence %d", seq))
		}
	}
	return errors.Join(errs...)
}
