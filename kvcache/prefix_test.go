package kvcache

import (
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

func TestBlockHashes(t *testing.T) {
	a := []int{1, 2, 3, 4, 5, 6, 7, 8, 9}
	h := BlockHashes(nil, a, 4)
	if len(h) != 2 {
		t.Fatalf("%d hashes of 9 tokens in blocks of 4, want 2", len(h))
	}
	// Extending a chain gives the chain of the whole.
	if got := BlockHashes(BlockHashes(nil, a[:5], 4), a, 4); !slices.Equal(got, h) {
		t.Error("an extended chain differs from the whole chain")
	}
	b := slices.Clone(a)
	b[1] = 99 // block 0 differs, and so every later block's hash, though its tokens agree
	hb := BlockHashes(nil, b, 4)
	if hb[0] == h[0] || hb[1] == h[1] {
		t.Error("a change in block 0 left a hash unchanged")
	}
	c := slices.Clone(a)
	c[6] = 99
	if hc := BlockHashes(nil, c, 4); hc[0] != h[0] || hc[1] == h[1] {
		t.Error("a change in block 1 must change its hash only")
	}
	if BlockHashes(nil, []int{1, 2, 3}, 4) != nil {
		t.Error("a partial block has a hash")
	}
}

func mustCheck(t *testing.T, a *Allocator, at string) {
	t.Helper()
	if err := a.Check(); err != nil {
		t.Fatalf("%s: %v", at, err)
	}
}

// TestPrefixSharing walks through sharing, caching after free, the last block kept apart,
// and eviction order.
func TestPrefixSharing(t *testing.T) {
	const bs = 4
	a, _ := NewAllocator(8, bs)
	prompt := []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14}
	h := BlockHashes(nil, prompt, bs) // 3 full blocks
	// Sequence 1 computes everything: nothing is cached yet.
	hit, err := a.ReserveCached(1, h, len(prompt))
	if err != nil || hit != 0 {
		t.Fatalf("first reserve: hit %d, %v", hit, err)
	}
	mustCheck(t, a, "first reserve")
	if err := a.Commit(1, h[:2]); err != nil { // two blocks computed
		t.Fatal(err)
	}
	// Sequence 2 shares the two committed blocks and owns the rest.
	hit, err = a.ReserveCached(2, h, len(prompt))
	if err != nil || hit != 2 {
		t.Fatalf("second reserve: hit %d, %v", hit, err)
	}
	b1, b2 := a.Blocks(1), a.Blocks(2)
	if !slices.Equal(b1[:2], b2[:2]) || b1[2] == b2[2] || b1[3] == b2[3] {
		t.Fatalf("tables %v and %v: want the first two blocks shared, the rest apart", b1, b2)
	}
	if st := a.Stats(); st.Used != 6 || st.Free != 2 || st.PrefixHitBlocks != 2 || st.PrefixQueryBlocks != 6 {
		t.Fatalf("stats %+v", st)
	}
	mustCheck(t, a, "shared")
	// Both commit block 2: sequence 1 first, so sequence 2's copy stays its own.
	if err := a.Commit(1, h); err != nil {
		t.Fatal(err)
	}
	if err := a.Commit(2, h); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, a, "commits")
	if err := a.Commit(2, BlockHashes(nil, make([]int, 5*bs), bs)); err == nil {
		t.Error("Commit beyond the sequence's blocks succeeded")
	}
	// Freeing both keeps sequence 1's three blocks cached; the rest are free.
	a.Free(1)
	if st := a.Stats(); st.Used != 4 {
		t.Fatalf("after freeing 1 of 2 sharers: %+v", st)
	}
	a.Free(2)
	if st := a.Stats(); st.Used != 0 || st.Free != 8 || st.Cached != 3 {
		t.Fatalf("after freeing both: %+v", st)
	}
	mustCheck(t, a, "freed")
	if got := a.CachedBlocks(h); got != 3 {
		t.Fatalf("%d blocks cached, want 3", got)
	}
	// A sequence may take fewer than all: the engine keeps the last block of a prompt of
	// whole blocks its own.
	p12 := prompt[:12]
	h12 := BlockHashes(nil, p12, bs)
	hit, err = a.ReserveCached(3, h12[:(len(p12)-1)/bs], len(p12))
	if err != nil || hit != 2 {
		t.Fatalf("prompt of whole blocks: hit %d, %v", hit, err)
	}
	if bl := a.Blocks(3); len(bl) != 3 || bl[2] == b1[2] {
		t.Fatalf("table %v: want 3 blocks, the last not the cached %d", bl, b1[2])
	}
	mustCheck(t, a, "whole blocks")
	a.Free(3)
	// Cached blocks are evicted only when the free blocks run out, the least recently
	// used first, and of one sequence its last block first.
	if err := a.Reserve(4, 5*bs); err != nil {
		t.Fatal(err)
	}
	if st := a.Stats(); st.Cached != 3 || st.Evictions != 0 {
		t.Fatalf("5 blocks of 8 with 3 cached: %+v", st)
	}
	if err := a.Reserve(4, 6*bs); err != nil {
		t.Fatal(err)
	}
	if st := a.Stats(); st.Cached != 2 || st.Evictions != 1 || a.CachedBlocks(h) != 2 {
		t.Fatalf("one eviction: %+v, %d cached of the prompt", st, a.CachedBlocks(h))
	}
	mustCheck(t, a, "evicted")
	// A sequence reserving cached blocks no one holds needs them counted as taken.
	if a.CanReserveCached(5, h[:2], 3*bs) {
		t.Error("CanReserveCached: 2 cached blocks and 1 more fit in 2 available blocks")
	}
	if _, err := a.ReserveCached(5, h[:2], 3*bs); !errors.Is(err, ErrOutOfBlocks) {
		t.Errorf("ReserveCached past the free blocks: %v", err)
	}
	if !a.CanReserveCached(5, h[:2], 2*bs) {
		t.Error("CanReserveCached: 2 cached blocks fit")
	}
	if hit, err := a.ReserveCached(5, h[:2], 2*bs); err != nil || hit != 2 {
		t.Errorf("ReserveCached of the cached blocks: hit %d, %v", hit, err)
	}
	if _, err := a.ReserveCached(5, h[:2], 2*bs); err == nil {
		t.Error("ReserveCached of a sequence holding blocks succeeded")
	}
	mustCheck(t, a, "full")
	a.Free(4)
	a.Free(5)
	if st := a.Stats(); st.Used != 0 || st.Free != 8 || st.Sequences != 0 {
		t.Fatalf("at the end: %+v", st)
	}
	mustCheck(t, a, "end")
}

// TestPrefixRandom runs random reservations, commits and frees of sequences over a few
// shared prompts, checking the invariants after each and that a sequence's shared blocks are
// the blocks committed under the same hashes.
func TestPrefixRandom(t *testing.T) {
	const bs = 3
	rng := rand.New(rand.NewPCG(7, 8))
	a, _ := NewAllocator(20, bs)
	bases := [][]int{}
	for range 4 {
		p := make([]int, 12+rng.IntN(12))
		for j := range p {
			p[j] = rng.IntN(3) // few token values: chains that share blocks by tokens, not by hash
		}
		bases = append(bases, p)
	}
	type seq struct {
		tokens []int
		hashes []BlockHash
		done   int
	}
	live := map[SeqID]*seq{}
	owner := map[BlockHash][]int{} // the tokens a committed hash was made from
	for i := range 3000 {
		id := SeqID(rng.IntN(12))
		s := live[id]
		switch {
		case s == nil:
			base := bases[rng.IntN(len(bases))]
			toks := slices.Clone(base[:1+rng.IntN(len(base))])
			h := BlockHashes(nil, toks, bs)
			hit, err := a.ReserveCached(id, h[:(len(toks)-1)/bs], len(toks))
			if err != nil {
				if !errors.Is(err, ErrOutOfBlocks) {
					t.Fatal(err)
				}
				break
			}
			for k, hh := range h[:hit] {
				if want := owner[hh]; !slices.Equal(want, toks[:(k+1)*bs]) {
					t.Fatalf("op %d: block %d shared from tokens %v, sequence has %v", i, k, want, toks[:(k+1)*bs])
				}
			}
			live[id] = &seq{tokens: toks, hashes: h, done: hit * bs}
		case rng.IntN(4) == 0:
			a.Free(id)
			delete(live, id)
		default:
			// Compute some tokens, perhaps grow by a few.
			if rng.IntN(2) == 0 {
				if err := a.Reserve(id, len(s.tokens)+2); err == nil {
					s.tokens = append(s.tokens, rng.IntN(3), rng.IntN(3))
					s.hashes = BlockHashes(s.hashes, s.tokens, bs)
				}
			}
			s.done = min(len(s.tokens), s.done+1+rng.IntN(5))
			full := s.done / bs
			if err := a.Commit(id, s.hashes[:full]); err != nil {
				t.Fatal(err)
			}
			for k := range full {
				owner[s.hashes[k]] = s.tokens[:(k+1)*bs]
			}
		}
		if err := a.Check(); err != nil {
			t.Fatalf("op %d: %v", i, err)
		}
	}
	for id := range live {
		a.Free(id)
	}
	if st := a.Stats(); st.Used != 0 || st.Free != 20 || st.PrefixHitBlocks == 0 || st.Evictions == 0 {
		t.Fatalf("at the end: %+v (want hits and evictions)", st)
	}
	mustCheck(t, a, "end")
}

// TestPrefixConcurrent: with -race, the locking of the prefix cache's methods.
func TestPrefixConcurrent(t *testing.T) {
	const bs = 2
	a, _ := NewAllocator(64, bs)
	prompt := []int{1, 2, 3, 4, 5, 6, 7, 8, 9}
	h := BlockHashes(nil, prompt, bs)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				seq := SeqID(g*1000 + i)
				if _, err := a.ReserveCached(seq, h[:(len(prompt)-1)/bs], len(prompt)); err != nil {
					if !errors.Is(err, ErrOutOfBlocks) {
						t.Error(err)
					}
					continue
				}
				if err := a.Commit(seq, h); err != nil {
					t.Error(err)
				}
				_ = a.Stats()
				a.Free(seq)
			}
		})
	}
	wg.Wait()
	if st := a.Stats(); st.Used != 0 || st.Sequences != 0 || st.Cached != len(h) {
		t.Fatalf("after all frees: %+v", st)
	}
	mustCheck(t, a, "end")
}
