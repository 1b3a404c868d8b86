package engine

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/loom-ml/loom/internal/parity"
	"github.com/loom-ml/loom/kvcache"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tensor"
)

// Prefix caching tests: on the CPU a sequence that takes cached blocks reads the bits it
// would have computed, so every output (tokens, log-probabilities) must equal the engine's
// without prefix caching, bit for bit.

// collectEvents reads a stream to its end.
func collectEvents(ctx context.Context, st *Stream) ([]Event, error) {
	var evs []Event
	for {
		ev, err := st.Recv(ctx)
		if err == io.EOF {
			return evs, nil
		}
		if err != nil {
			return evs, err
		}
		ev.Err = nil // compared by Finish
		evs = append(evs, ev)
	}
}

// runEvents runs reqs on e, one after another (each after the last has ended) or all
// submitted at once, and returns each request's events.
func runEvents(t *testing.T, e *Engine, reqs []Request, together bool) [][]Event {
	t.Helper()
	ctx := testCtx(t)
	out := make([][]Event, len(reqs))
	var wg sync.WaitGroup
	for i, r := range reqs {
		st, err := e.Submit(ctx, r)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		read := func() {
			evs, err := collectEvents(ctx, st)
			if err != nil || len(evs) == 0 || evs[len(evs)-1].Finish == FinishError {
				t.Errorf("request %d: %v %v", i, err, evs)
			}
			out[i] = evs
		}
		if together {
			wg.Go(read)
		} else {
			read()
		}
	}
	wg.Wait()
	return out
}

// sameEvents compares two runs' events: tokens, finish reasons, log-probabilities bit for
// bit.
func sameEvents(t *testing.T, what string, got, want [][]Event) {
	t.Helper()
	f32 := func(x float32) uint32 { return math.Float32bits(x) }
	for i := range want {
		eq := slices.EqualFunc(got[i], want[i], func(a, b Event) bool {
			return a.Token == b.Token && a.Finish == b.Finish && f32(a.Logprob) == f32(b.Logprob) &&
				a.PromptTokens == b.PromptTokens && a.GeneratedTokens == b.GeneratedTokens &&
				slices.EqualFunc(a.TopLogprobs, b.TopLogprobs, func(x, y sample.TokenLogprob) bool {
					return x.Token == y.Token && f32(x.Logprob) == f32(y.Logprob)
				})
		})
		if !eq {
			t.Errorf("%s: request %d: events %v, without prefix caching %v", what, i, tokensOf(got[i]), tokensOf(want[i]))
		}
	}
}

func tokensOf(evs []Event) []int {
	var ids []int
	for _, ev := range evs {
		ids = append(ids, ev.Token)
	}
	return ids
}

// checkBlocksReleased waits for the engine to hold no request, then checks that every
// block is free or cached (none held) and the allocator's invariants.
func checkBlocksReleased(t *testing.T, e *Engine) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for st := e.Stats(); st.Running+st.Waiting > 0; st = e.Stats() {
		if time.Now().After(deadline) {
			t.Fatalf("requests still in the engine: %+v", st)
		}
		time.Sleep(time.Millisecond)
	}
	if st := e.alloc.Stats(); st.Used != 0 || st.Sequences != 0 || st.Free != st.Blocks {
		t.Errorf("after all requests: allocator %+v", st)
	}
	if err := e.alloc.Check(); err != nil {
		t.Error(err)
	}
}

// prefixRequests builds requests over a vocabulary of 500: several that share a prefix of
// three blocks and a bit (16-token blocks), one whose prompt is exactly those three blocks,
// repeats (fully cached prompts), prompts shorter than a block, seeded sampling with
// log-probabilities.
func prefixRequests(rng *rand.Rand) []Request {
	toks := func(n int) []int {
		p := make([]int, n)
		for i := range p {
			p[i] = 5 + rng.IntN(495)
		}
		return p
	}
	shared := toks(3*16 + 5)
	seeded := sample.Params{Temperature: 1.3, TopP: 0.95, TopK: 50, RepetitionPenalty: 1.1, Seed: 77, HasSeed: true,
		Logprobs: true, TopLogprobs: 3}
	greedyLP := sample.Params{Logprobs: true, TopLogprobs: 2}
	a, b := slices.Concat(shared, toks(10)), slices.Concat(shared, toks(30))
	short := toks(5)
	reqs := []Request{
		{Prompt: a, MaxTokens: 12, Sampling: greedyLP},
		{Prompt: b, MaxTokens: 20},
		{Prompt: shared[:48], MaxTokens: 9, Sampling: greedyLP}, // whole blocks, all cached
		{Prompt: a, MaxTokens: 12, Sampling: greedyLP},          // repeated: all cached
		{Prompt: short, MaxTokens: 7},
		{Prompt: slices.Clone(short), MaxTokens: 7, Sampling: seeded},
		{Prompt: slices.Concat(shared, toks(2)), MaxTokens: 15, Sampling: seeded},
		{Prompt: slices.Concat(shared, toks(2)), MaxTokens: 15, Sampling: func() sample.Params { p := seeded; p.Seed = 78; return p }()},
		{Prompt: shared[:20], MaxTokens: 30}, // its generated tokens fill a block of its own
		{Prompt: toks(40), MaxTokens: 5},
	}
	for i := range reqs {
		reqs[i].IgnoreEOS = true
		reqs[i].ID = fmt.Sprint("p", i)
	}
	return reqs
}

// TestPrefixCachingSameOutputs: with and without prefix caching, the same requests give the
// same events bit for bit, run one after another (each finds the blocks of those before)
// and all at once (chunked prefills, sequences waiting for a block being prefilled), on
// several fixtures; the cached engine takes tokens from the cache and computes fewer.
func TestPrefixCachingSameOutputs(t *testing.T) {
	fixtures := []string{"tiny-llama", "tiny-mistral", "tiny-qwen3", "tiny-qwen2moe"}
	if testing.Short() {
		fixtures = fixtures[:2]
	}
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			reqs := prefixRequests(rand.New(rand.NewPCG(3, 4)))
			opts := Options{MaxTokensPerStep: 24, MaxBatch: 8}
			off := opts
			off.DisablePrefixCaching = true
			plain, cached := newEngine(t, name, off), newEngine(t, name, opts)
			for _, together := range []bool{false, true} {
				what := map[bool]string{false: "one at a time", true: "all at once"}[together]
				want := runEvents(t, plain, reqs, together)
				got := runEvents(t, cached, reqs, together)
				sameEvents(t, what, got, want)
				checkBlocksReleased(t, cached)
				checkBlocksReleased(t, plain)
			}
			p, c := plain.Stats(), cached.Stats()
			t.Logf("computed tokens %d cached, %d without (%d taken from the cache, %d blocks)",
				c.ComputedTokensTotal, p.ComputedTokensTotal, c.CachedTokensTotal, c.PrefixCacheHitBlocks)
			if c.CachedTokensTotal == 0 || c.ComputedTokensTotal+c.CachedTokensTotal != p.ComputedTokensTotal || p.CachedTokensTotal != 0 {
				t.Errorf("cached engine %+v, plain %+v: want tokens taken from the cache, computed + cached = plain's computed", c, p)
			}
		})
	}
}

// TestPrefixCachingEviction: a cache of few blocks evicts cached blocks for new ones; the
// outputs stay those of the engine without prefix caching, hits and evictions both happen.
func TestPrefixCachingEviction(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	var reqs []Request
	var families [][]int
	for range 3 {
		p := make([]int, 40)
		for i := range p {
			p[i] = 5 + rng.IntN(495)
		}
		families = append(families, p)
	}
	for range 14 {
		f := families[rng.IntN(len(families))]
		prompt := slices.Clone(f[:16+rng.IntN(len(f)-16)])
		for range rng.IntN(12) {
			prompt = append(prompt, 5+rng.IntN(495))
		}
		reqs = append(reqs, Request{Prompt: prompt, MaxTokens: 3 + rng.IntN(10), IgnoreEOS: true})
	}
	opts := Options{KVBlocks: 9, MaxBatch: 4, MaxTokensPerStep: 32, QueueOnFull: true}
	off := opts
	off.DisablePrefixCaching = true
	plain, cached := newEngine(t, "tiny-llama", off), newEngine(t, "tiny-llama", opts)
	for _, together := range []bool{false, true} {
		sameEvents(t, fmt.Sprint("together ", together), runEvents(t, cached, reqs, together), runEvents(t, plain, reqs, together))
		checkBlocksReleased(t, cached)
	}
	if st := cached.alloc.Stats(); st.PrefixHitBlocks == 0 || st.Evictions == 0 {
		t.Errorf("allocator %+v: want hits and evictions", st)
	}
}

// TestPrefixCachingPreemption: sequences sharing a prefix on a cache too small for all of
// them are preempted and recomputed (from their cached blocks when these survive); the
// tokens equal those of each request alone without prefix caching.
func TestPrefixCachingPreemption(t *testing.T) {
	shared := []int{11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28}
	var reqs []Request
	for i := range 6 {
		reqs = append(reqs, Request{Prompt: append(slices.Clone(shared), 30+i, 40+i), MaxTokens: 30, IgnoreEOS: true})
	}
	alone := newEngine(t, "tiny-llama", Options{MaxBatch: 1, DisablePrefixCaching: true})
	want := runEvents(t, alone, reqs, false)
	// 50 tokens take 4 blocks, the first shared: 8 blocks hold two sequences and a bit.
	small := newEngine(t, "tiny-llama", Options{KVBlocks: 8, QueueOnFull: true})
	sameEvents(t, "preempted", runEvents(t, small, reqs, true), want)
	st := small.Stats()
	if st.PreemptionsTotal == 0 || st.CachedTokensTotal == 0 {
		t.Errorf("want preemptions and cache hits: %+v", st)
	}
	checkBlocksReleased(t, small)
}

// TestPrefixCachingCancel: requests sharing a prefix cancelled before they start, while
// another prefills the shared blocks, and while decoding leave no block held; the others
// give the tokens of the engine without prefix caching.
func TestPrefixCachingCancel(t *testing.T) {
	reqs := prefixRequests(rand.New(rand.NewPCG(9, 10)))
	plain := newEngine(t, "tiny-llama", Options{DisablePrefixCaching: true})
	want := runEvents(t, plain, reqs, true)
	e := newEngine(t, "tiny-llama", Options{MaxTokensPerStep: 16, MaxBatch: 4})
	ctx := testCtx(t)
	for round := range 3 {
		cancels := make([]context.CancelFunc, len(reqs))
		streams := make([]*Stream, len(reqs))
		for i, r := range reqs {
			rctx, cancel := context.WithCancel(ctx)
			cancels[i] = cancel
			st, err := e.Submit(rctx, r)
			if err != nil {
				t.Fatal(err)
			}
			streams[i] = st
			if i%3 == round%3 {
				cancel() // before it starts, or as it waits for the shared blocks
			}
		}
		var wg sync.WaitGroup
		for i, st := range streams {
			wg.Go(func() {
				var evs []Event
				for {
					ev, err := st.Recv(ctx)
					if err != nil {
						break
					}
					evs = append(evs, ev)
					if i%3 == (round+1)%3 && len(evs) == 2 {
						cancels[i]() // while decoding
					}
				}
				if last := evs[len(evs)-1]; last.Finish != FinishCancelled {
					ev := slices.Clone(evs)
					ev[len(ev)-1].Err = nil
					sameEvents(t, fmt.Sprint("round ", round, " request ", i), [][]Event{ev}, [][]Event{want[i]})
				}
			})
		}
		wg.Wait()
		for _, c := range cancels {
			c()
		}
		checkBlocksReleased(t, e)
	}
}

// TestPrefixCachingN: n = 4 samples of one prompt submitted at once (as the server submits
// a request's n choices) compute the prompt once: the other three take its blocks from the
// cache. They use fewer KV blocks at their peak and compute fewer tokens than the same four
// requests without prefix caching, and give the same tokens.
func TestPrefixCachingN(t *testing.T) {
	const n, promptLen, gen = 4, 100, 8
	rng := rand.New(rand.NewPCG(11, 12))
	prompt := make([]int, promptLen)
	for i := range prompt {
		prompt[i] = 5 + rng.IntN(495)
	}
	var reqs []Request
	for i := range n {
		reqs = append(reqs, Request{Prompt: prompt, MaxTokens: gen, IgnoreEOS: true,
			Sampling: sample.Params{Temperature: 1, Seed: int64(100 + i), HasSeed: true}})
	}
	off := newEngine(t, "tiny-llama", Options{DisablePrefixCaching: true})
	on := newEngine(t, "tiny-llama", Options{})
	sameEvents(t, "n=4", runEvents(t, on, reqs, true), runEvents(t, off, reqs, true))
	p, c := off.Stats(), on.Stats()
	// Without caching each computes 100 prompt tokens and 7 decodes; with it the three
	// others compute only the prompt's last partial block (100 - 96 = 4 tokens).
	wantPlain := int64(n * (promptLen + gen - 1))
	wantCached := int64(promptLen + (n-1)*(promptLen%16) + n*(gen-1))
	t.Logf("n=%d, a %d-token prompt: computed tokens %d cached, %d without; peak KV blocks %d cached, %d without",
		n, promptLen, c.ComputedTokensTotal, p.ComputedTokensTotal, c.KVBlocksPeak, p.KVBlocksPeak)
	if p.ComputedTokensTotal != wantPlain || c.ComputedTokensTotal != wantCached {
		t.Errorf("computed tokens %d cached, %d without; want %d and %d", c.ComputedTokensTotal, p.ComputedTokensTotal, wantCached, wantPlain)
	}
	// 107 tokens take 7 blocks each; shared, 6 blocks once and 1 per sample.
	if p.KVBlocksPeak != n*7 || c.KVBlocksPeak != 6+n {
		t.Errorf("peak blocks %d cached, %d without; want %d and %d", c.KVBlocksPeak, p.KVBlocksPeak, 6+n, n*7)
	}
	checkBlocksReleased(t, on)
}

// prefixPromptLogits feeds prompt through e's paged KV cache as the engine admits it with
// prefix caching: from its cached prefix on, in chunks of chunk tokens, committing its
// blocks; it returns the logits of its last position and the number of cached tokens.
func prefixPromptLogits(t *testing.T, e *Engine, id kvcache.SeqID, prompt []int, chunk int) ([]float32, int) {
	t.Helper()
	bs := e.alloc.BlockSize()
	hashes := kvcache.BlockHashes(nil, prompt, bs)
	hit, err := e.alloc.ReserveCached(id, hashes[:(len(prompt)-1)/bs], len(prompt))
	if err != nil {
		t.Fatal(err)
	}
	defer e.alloc.Free(id)
	var last []float32
	for from := hit * bs; from < len(prompt); from += chunk {
		n := min(chunk, len(prompt)-from)
		in, err := stepInputs(e.alloc, []stepSeq{{seq: id, tokens: prompt, from: from, n: n}}, e.layout.LogitRows)
		if err != nil {
			t.Fatal(err)
		}
		out, err := e.ranks.run(context.Background(), in)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.alloc.Commit(id, hashes[:(from+n)/bs]); err != nil {
			t.Fatal(err)
		}
		V := out.Shape[2]
		r := n - 1
		if e.layout.LogitRows {
			r = 0
		}
		last = slices.Clone(out.F32[r*V : (r+1)*V])
	}
	return last, hit * bs
}

// TestPrefixCachingHuggingFaceParity: the reference prompts' last-position logits with
// their prefix read from the cache (a prompt that shares its first blocks with another, the
// same prompt again) equal the logits without the cache bit for bit and so hold to Hugging
// Face's; greedy generation on a prefix-caching engine, each prompt twice, gives Hugging
// Face's tokens.
func TestPrefixCachingHuggingFaceParity(t *testing.T) {
	fixtures := slices.Concat(supportedFixtures, moeFixtures)
	if testing.Short() {
		fixtures = []string{"tiny-llama", "tiny-qwen3"}
	}
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			ref := loadReference(t, filepath.Join("..", "testdata", name))
			e := newEngine(t, name, Options{MaxTokensPerStep: 16})
			cachedAny := false
			for i, p := range ref.Prompts {
				want := cachedPromptLogits(t, e, p.IDs, 7)
				id := kvcache.SeqID(1<<21 + 10*i)
				// A prompt that differs from p after its first blocks, then p itself.
				cut := len(p.IDs) * 2 / 3
				other := slices.Concat(p.IDs[:cut], []int{p.IDs[0]}, p.IDs[cut:])
				prefixPromptLogits(t, e, id, other, 7)
				got, from := prefixPromptLogits(t, e, id+1, p.IDs, 7)
				again, all := prefixPromptLogits(t, e, id+2, p.IDs, 7)
				cachedAny = cachedAny || from > 0
				if !bitsEqual(got, want) || !bitsEqual(again, want) {
					d, at := maxAbsDiff(got, want)
					t.Errorf("prompt %d (%d tokens, %d and %d cached): logits differ from the uncached run by %.3g at %d", i, len(p.IDs), from, all, d, at)
				}
				if err := parity.CheckLogits(got, p, logitTol); err != nil {
					t.Error(err)
				}
			}
			if !cachedAny {
				t.Error("no prompt took blocks from the cache")
			}
			reqs := greedyRequests(ref)
			for range 2 {
				checkGreedyAll(t, ref, generateAll(t, e, reqs), engineGen(t, e))
			}
			if e.Stats().CachedTokensTotal == 0 {
				t.Error("the second pass took no tokens from the cache")
			}
			checkBlocksReleased(t, e)
		})
	}
}

// TestPrefixCachingOverlapped: with steps launched ahead (a device that samples), requests
// sharing prefixes give the tokens of the engine without prefix caching.
func TestPrefixCachingOverlapped(t *testing.T) {
	reqs := prefixRequests(rand.New(rand.NewPCG(13, 14)))
	for i := range reqs {
		reqs[i].Sampling = sample.Params{} // the device draws greedy tokens
	}
	m := cachedModel(t, "tiny-llama")
	var want [][]Event
	for _, disable := range []bool{true, false} {
		ranks := m.Ranks()
		l := &asyncLauncher{Executable: ranks[0].Exe}
		ranks[0].Exe = l
		e, err := NewRanks(context.Background(), ranks, modelInfo(m.Model), Options{Logger: quiet, DisablePrefixCaching: disable, MaxTokensPerStep: 24})
		if err != nil {
			t.Fatal(err)
		}
		var got [][]Event
		for _, together := range []bool{false, true} {
			got = append(got, runEvents(t, e, reqs, together)...)
		}
		if disable {
			want = got
		} else {
			sameEvents(t, "overlapped", got, want)
			checkBlocksReleased(t, e)
			if st := e.Stats(); st.AheadStepsTotal == 0 || st.CachedTokensTotal == 0 {
				t.Errorf("want steps launched ahead and cache hits: %+v", st)
			}
		}
		e.Close()
	}
}

// steppedExe runs one step for each value received from steps (all once it is closed).
type steppedExe struct {
	Executable
	steps chan struct{}
}

func (s steppedExe) Run(ctx context.Context, in map[string]*tensor.Tensor) ([]*tensor.Tensor, error) {
	select {
	case <-s.steps:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return s.Executable.Run(ctx, in)
}

// TestPrefixCachingPartialPrefill: a request cancelled in its prompt's second chunk leaves
// the cache only its full blocks, not the block the chunk ended in (40 tokens: blocks 0 and
// 1, not 2): the same prompt after it computes that block and gives the tokens of the
// engine without prefix caching.
func TestPrefixCachingPartialPrefill(t *testing.T) {
	m := cachedModel(t, "tiny-llama")
	prompt := make([]int, 60)
	for i := range prompt {
		prompt[i] = 7 + 3*i
	}
	req := Request{Prompt: prompt, MaxTokens: 6, IgnoreEOS: true}
	want := runEvents(t, newEngine(t, "tiny-llama", Options{DisablePrefixCaching: true}), []Request{req}, false)
	steps := make(chan struct{}, 1)
	e, err := NewRanks(context.Background(), []Rank{{Graph: m.Graph, Exe: steppedExe{m.Program, steps}}}, modelInfo(m.Model),
		Options{Logger: quiet, MaxBatch: 1, MaxTokensPerStep: 20})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx, cancel := context.WithCancel(testCtx(t))
	first, err := e.Submit(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	steps <- struct{}{} // one chunk of 20 tokens; the next, to 40, is planned and waits
	deadline := time.Now().Add(10 * time.Second)
	for e.alloc.Stats().Used < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := e.alloc.Stats(); got.Used != 3 {
		t.Fatalf("at the second chunk: allocator %+v, want 3 blocks for 40 tokens", got)
	}
	cancel()
	close(steps) // the second chunk runs, then the request ends
	if evs, _ := collectEvents(testCtx(t), first); len(evs) != 1 || evs[0].Finish != FinishCancelled {
		t.Fatalf("cancelled request: %v", evs)
	}
	sameEvents(t, "after a partial prefill", runEvents(t, e, []Request{req}, false), want)
	if st := e.Stats(); st.CachedTokensTotal != 32 {
		t.Errorf("%d tokens taken from the cache, want blocks 0 and 1, 32", st.CachedTokensTotal)
	}
	checkBlocksReleased(t, e)
}
