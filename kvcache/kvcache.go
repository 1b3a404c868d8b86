// Package kvcache is the paged KV cache of the runtime: the cache tensors of one rank, and
// the allocator that hands out their fixed-size blocks to sequences.
//
// A cache holds, per attention layer, one K and one V tensor [NB, BlockSize, KV, D]: NB
// blocks of BlockSize token slots, each slot the KV heads' keys (or values) of one token.
// Token position j of a sequence lives in the sequence's block j/BlockSize, at offset
// j%BlockSize; slot numbers count over the whole cache (block*BlockSize + offset). The
// graph's paged_attention op (see package graph) writes and reads the tensors in place; the
// engine allocates them once and passes them as graph inputs at every step.
//
// Block ids are shared by every layer and, when a model is sharded over heads (tp, dp), by
// every rank: a sequence's block table is the same everywhere, and only the KV heads in a
// slot differ. With context parallelism each cp index has an Allocator of its own and caches
// its own tokens of every sequence (see engine/cp_cache.go). Full blocks can be shared by
// sequences whose tokens start alike, and stay cached after them (prefix caching, prefix.go).
package kvcache

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/loom-ml/loom/tensor"
)

// LayerSpec describes one attention layer's cache tensors.
type LayerSpec struct {
	// K and V name the graph inputs the tensors bind to, such as "kv_cache.0.k".
	K, V string
	// KVHeads and HeadDim are the slot's dimensions: KV heads of HeadDim elements each.
	KVHeads, HeadDim int
	DType            tensor.DType
}

// Spec describes one rank's cache: its layers and the block size they share.
type Spec struct {
	BlockSize int
	Layers    []LayerSpec
}

// Validate checks that every dimension is positive and every dtype a float type.
func (s Spec) Validate() error {
	if s.BlockSize < 1 {
		return fmt.Errorf("kvcache: block size must be >= 1, got %d", s.BlockSize)
	}
	if len(s.Layers) == 0 {
		return errors.New("kvcache: no layers")
	}
	for i, l := range s.Layers {
		if l.KVHeads < 1 || l.HeadDim < 1 || !l.DType.IsFloat() || l.K == "" || l.V == "" || l.K == l.V {
			return fmt.Errorf("kvcache: layer %d: want named K and V inputs, positive KV heads and head size and a float dtype, got %+v", i, l)
		}
	}
	return nil
}

// BlockBytes is the memory of one block over all layers, K and V:
// sum over layers of 2·BlockSize·KV·D·(dtype size).
func (s Spec) BlockBytes() int64 {
	var n int64
	for _, l := range s.Layers {
		n += 2 * int64(s.BlockSize) * int64(l.KVHeads) * int64(l.HeadDim) * int64(l.DType.Size())
	}
	return n
}

// NumBlocks is how many blocks of blockBytes fit in a budget of budgetBytes (0 when either
// is not positive).
func NumBlocks(budgetBytes, blockBytes int64) int {
	if budgetBytes <= 0 || blockBytes <= 0 {
		return 0
	}
	return int(budgetBytes / blockBytes)
}

// Cache is one rank's cache tensors: K[l] and V[l] are layer l's, each [NB, BlockSize, KV, D].
type Cache struct {
	Spec      Spec
	NumBlocks int
	K, V      []*tensor.Tensor
}

// NewCache allocates zeroed cache tensors of numBlocks blocks.
func NewCache(spec Spec, numBlocks int) (*Cache, error) {
	return newCache(spec, numBlocks, func(dt tensor.DType, shape []int) *tensor.Tensor { return tensor.New(dt, shape...) })
}

// NewCacheShapes describes cache tensors of numBlocks blocks without allocating them: each
// has its dtype and shape but no elements. It is for executables that keep the caches
// themselves (the Resident option of backend/cuda, on the device, and of backend/cpu, in
// memory outside the Go heap), where host copies would only waste memory.
func NewCacheShapes(spec Spec, numBlocks int) (*Cache, error) {
	return newCache(spec, numBlocks, func(dt tensor.DType, shape []int) *tensor.Tensor { return &tensor.Tensor{DType: dt, Shape: shape} })
}

func newCache(spec Spec, numBlocks int, newTensor func(tensor.DType, []int) *tensor.Tensor) (*Cache, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	if numBlocks < 1 {
		return nil, fmt.Errorf("kvcache: need at least one block, got %d", numBlocks)
	}
	c := &Cache{Spec: spec, NumBlocks: numBlocks}
	for _, l := range spec.Layers {
		c.K = append(c.K, newTensor(l.DType, []int{numBlocks, spec.BlockSize, l.KVHeads, l.HeadDim}))
		c.V = append(c.V, newTensor(l.DType, []int{numBlocks, spec.BlockSize, l.KVHeads, l.HeadDim}))
	}
	return c, nil
}

// Bytes is the memory the cache tensors hold.
func (c *Cache) Bytes() int64 { return int64(c.NumBlocks) * c.Spec.BlockBytes() }

// Bind adds the cache tensors to a graph's inputs, under their layers' names.
func (c *Cache) Bind(inputs map[string]*tensor.Tensor) {
	for i, l := range c.Spec.Layers {
		inputs[l.K], inputs[l.V] = c.K[i], c.V[i]
	}
}

// SeqID identifies a sequence to the allocator.
type SeqID uint64

// ErrOutOfBlocks reports that the cache has too few free blocks for a request.
var ErrOutOfBlocks = errors.New("kvcache: out of blocks")

// Allocator hands out a cache's blocks to sequences. It is safe for concurrent use.
//
// Blocks are refcounted: a full block that holds a known prefix can be held by several
// sequences at once, and stays cached when the last one frees it, until the allocator needs
// the space (automatic prefix caching, see prefix.go).
type Allocator struct {
	blockSize int

	mu    sync.Mutex
	total int
	free  []int32 // blocks holding nothing: a stack, the next block handed out is the last one
	seqs  map[SeqID][]int32
	ref   []int32 // per block: the sequences holding it
	peak  int
	pc    prefixCache
}

// NewAllocator manages numBlocks blocks of blockSize token slots.
func NewAllocator(numBlocks, blockSize int) (*Allocator, error) {
	if numBlocks < 1 || blockSize < 1 {
		return nil, fmt.Errorf("kvcache: allocator needs at least one block and a block size >= 1, got %d blocks of %d", numBlocks, blockSize)
	}
	if numBlocks > 1<<31-1 {
		return nil, fmt.Errorf("kvcache: %d blocks do not fit int32 block ids", numBlocks)
	}
	a := &Allocator{blockSize: blockSize, total: numBlocks, free: make([]int32, numBlocks), seqs: map[SeqID][]int32{},
		ref: make([]int32, numBlocks)}
	for i := range a.free {
		a.free[i] = int32(numBlocks - 1 - i) // block 0 is handed out first
	}
	a.pc.init(numBlocks)
	return a, nil
}

// BlockSize is the number of token slots per block.
func (a *Allocator) BlockSize() int { return a.blockSize }

// NumBlocks is the number of blocks managed.
func (a *Allocator) NumBlocks() int { return a.total }

// BlocksFor is the number of blocks that hold tokens tokens.
func (a *Allocator) BlocksFor(tokens int) int {
	return (max(tokens, 0) + a.blockSize - 1) / a.blockSize
}

// Reserve makes sure seq owns blocks for its first tokens tokens, taking free blocks as
// needed (blocks that hold nothing first, then the least recently used cached ones). It
// takes all it needs or nothing: with too few free blocks it returns an error wrapping
// ErrOutOfBlocks and seq keeps what it had. A sequence the allocator does not know yet
// starts with no blocks.
func (a *Allocator) Reserve(seq SeqID, tokens int) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	have := a.seqs[seq]
	need := a.BlocksFor(tokens) - len(have)
	if need <= 0 {
		if _, ok := a.seqs[seq]; !ok {
			a.seqs[seq] = nil
		}
		return nil
	}
	if need > a.available() {
		return fmt.Errorf("%w: sequence %d needs %d more blocks for %d tokens, %d of %d are free",
			ErrOutOfBlocks, seq, need, tokens, a.available(), a.total)
	}
	a.seqs[seq] = a.take(have, need)
	return nil
}

// available is the number of blocks Reserve can hand out: those holding nothing and the
// cached blocks no sequence holds. The caller holds a.mu.
func (a *Allocator) available() int { return len(a.free) + a.pc.lruLen }

// take appends n blocks to dst, each held once: from the free stack first (pop order),
// then cached blocks evicted least recently used first. The caller holds a.mu and has
// checked that n blocks are available.
func (a *Allocator) take(dst []int32, n int) []int32 {
	k := min(n, len(a.free))
	at := len(a.free) - k
	taken := a.free[at:]
	slices.Reverse(taken) // pop order
	dst = append(dst, taken...)
	a.free = a.free[:at]
	for range n - k {
		dst = append(dst, a.pc.evict())
	}
	for _, b := range dst[len(dst)-n:] {
		a.ref[b] = 1
	}
	a.peak = max(a.peak, a.total-a.available())
	return dst
}

// CanReserve reports whether Reserve(seq, tokens) would succeed now.
func (a *Allocator) CanReserve(seq SeqID, tokens int) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.BlocksFor(tokens)-len(a.seqs[seq]) <= a.available()
}

// Free lets go of every block of seq and forgets seq. A block no other sequence holds goes
// back to the free list, or, when it holds a cached prefix (see Commit), stays cached until
// the allocator needs the space; the last blocks of seq are evicted first. It returns the
// number of blocks seq held (0 for an unknown sequence).
func (a *Allocator) Free(seq SeqID) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	blocks := a.seqs[seq]
	delete(a.seqs, seq)
	delete(a.pc.committed, seq)
	for i := len(blocks) - 1; i >= 0; i-- {
		b := blocks[i]
		if a.ref[b]--; a.ref[b] > 0 {
			continue
		}
		if a.pc.cached(b) {
			a.pc.pushLRU(b)
		} else {
			a.free = append(a.free, b)
		}
	}
	return len(blocks)
}

// Blocks returns a copy of seq's block table: block ids in position order.
func (a *Allocator) Blocks(seq SeqID) []int32 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.seqs[seq])
}

// AppendBlocks appends seq's block table to dst and returns the extended slice.
func (a *Allocator) AppendBlocks(dst []int32, seq SeqID) []int32 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append(dst, a.seqs[seq]...)
}

// Slot is the cache slot of seq's token at position pos: block*BlockSize + offset.
func (a *Allocator) Slot(seq SeqID, pos int) (int32, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	blocks := a.seqs[seq]
	if pos < 0 || pos/a.blockSize >= len(blocks) {
		return 0, fmt.Errorf("kvcache: sequence %d has %d blocks of %d slots, no slot for position %d", seq, len(blocks), a.blockSize, pos)
	}
	return blocks[pos/a.blockSize]*int32(a.blockSize) + int32(pos%a.blockSize), nil
}

// Stats is a snapshot of an allocator.
type Stats struct {
	// Used blocks are held by sequences; Free ones by none (Cached of them still hold a
	// prefix, evicted when the space is needed).
	Blocks, Used, Free int
	// Peak is the most blocks ever in use at once.
	Peak int
	// Sequences counts the sequences holding blocks (or reserved with none).
	Sequences int
	// Cached counts the free blocks that hold a cached prefix.
	Cached int
	// PrefixQueryBlocks counts the full blocks looked up by ReserveCached, PrefixHitBlocks
	// those found cached, Evictions the cached blocks handed out for other contents.
	PrefixQueryBlocks, PrefixHitBlocks, Evictions int64
}

// Stats returns a snapshot.
func (a *Allocator) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	free := a.available()
	return Stats{Blocks: a.total, Used: a.total - free, Free: free, Peak: a.peak, Sequences: len(a.seqs),
		Cached: a.pc.lruLen, PrefixQueryBlocks: a.pc.queries, PrefixHitBlocks: a.pc.hits, Evictions: a.pc.evictions}
}
