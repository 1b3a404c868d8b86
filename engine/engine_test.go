package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/loom-ml/loom/kvcache"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform"
)

// Engine tests run the tiny testdata checkpoints, optimized and on the paged KV cache.

var (
	loadMu sync.Mutex
	loaded = map[string]*Model{}
)

// cachedModel loads a fixture with the optimizer (so on the paged KV cache) once per test
// binary.
func cachedModel(t *testing.T, name string) *Model {
	t.Helper()
	loadMu.Lock()
	defer loadMu.Unlock()
	if m, ok := loaded[name]; ok {
		return m
	}
	m, err := Load(context.Background(), filepath.Join("..", "testdata", name), LoadOptions{Optimize: true})
	if err != nil {
		t.Fatal(err)
	}
	loaded[name] = m
	return m
}

var quiet = slog.New(slog.DiscardHandler)

// newEngine starts an engine on a fixture and closes it when the test ends.
func newEngine(t *testing.T, name string, opts Options) *Engine {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quiet
	}
	e, err := New(context.Background(), cachedModel(t, name), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// testCtx bounds a test's waits.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// generate submits a request and collects its tokens and final event.
func generate(t *testing.T, e *Engine, req Request) ([]int, Event) {
	t.Helper()
	ctx := testCtx(t)
	st, err := e.Submit(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	toks, last, err := st.Collect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return toks, last
}

// generateAll submits every request at once and collects them all.
func generateAll(t *testing.T, e *Engine, reqs []Request) [][]int {
	t.Helper()
	ctx := testCtx(t)
	streams := make([]*Stream, len(reqs))
	for i, r := range reqs {
		st, err := e.Submit(ctx, r)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		streams[i] = st
	}
	out := make([][]int, len(reqs))
	var wg sync.WaitGroup
	for i, st := range streams {
		wg.Go(func() {
			toks, last, err := st.Collect(ctx)
			if err != nil || last.Finish == FinishError || last.Finish == FinishCancelled {
				t.Errorf("request %d: %v (finish %q, %v)", i, err, last.Finish, last.Err)
			}
			out[i] = toks
		})
	}
	wg.Wait()
	return out
}

func TestLoadIsCached(t *testing.T) {
	m := cachedModel(t, "tiny-llama")
	l, err := CacheLayout(m.Graph)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Cache.Layers) != m.Config.NumHiddenLayers || l.Cache.BlockSize != 16 || l.Vocab != m.Config.VocabSize {
		t.Errorf("layout %+v", l)
	}
	ops := 0
	for _, n := range m.Graph.Nodes {
		if n.Op == "paged_attention" {
			ops++
		}
	}
	if ops != m.Config.NumHiddenLayers {
		t.Errorf("%d paged_attention ops, want %d", ops, m.Config.NumHiddenLayers)
	}
}

// TestEngineParity: greedy generation through the continuous-batching engine on the paged
// KV cache matches Hugging Face's greedy_new_ids, on one rank and tensor-parallel on 2 and 4.
func TestEngineParity(t *testing.T) {
	for _, tp := range []int{1, 2, 4} {
		for _, name := range supportedFixtures {
			t.Run(fmt.Sprintf("%s/tp=%d", name, tp), func(t *testing.T) {
				if tp > 1 && testing.Short() {
					t.Skip("tensor-parallel runs skipped in -short mode")
				}
				engineParity(t, name, tp)
			})
		}
	}
}

func engineParity(t *testing.T, name string, tp int) {
	ref := loadReference(t, filepath.Join("..", "testdata", name))
	var e *Engine
	if tp == 1 {
		e = newEngine(t, name, Options{})
	} else {
		m, err := Load(context.Background(), filepath.Join("..", "testdata", name), LoadOptions{Optimize: true, Mesh: mustMeshFor(t, tp, "")})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		if e, err = New(context.Background(), m, Options{Logger: quiet}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
	}
	checkGreedyAll(t, ref, generateAll(t, e, greedyRequests(ref)), engineGen(t, e))
	if st := e.Stats(); st.KVBlocksUsed != 0 || st.Running != 0 || st.Waiting != 0 {
		t.Errorf("after all requests: %+v", st)
	}
}

// TestCachedEqualsRecompute: decoding through the cache (prefill in chunks, then one token
// per step) gives the logits of recomputing the whole sequence with the same optimized graph
// without the cache, bit for bit (the CPU kernels sum each row in the same order either way).
func TestCachedEqualsRecompute(t *testing.T) {
	for _, name := range []string{"tiny-llama", "tiny-mistral", "tiny-qwen3"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("..", "testdata", name)
			plain, err := Load(context.Background(), dir, LoadOptions{Optimize: true,
				Transforms: transform.Flags{Sets: []string{"transforms.insert_cached_attention.enabled=false"}}})
			if err != nil {
				t.Fatal(err)
			}
			defer plain.Close()
			ref := loadReference(t, dir)
			prompt := ref.Prompts[1].IDs // the longest: beyond Mistral's window of 8
			// Several sequences share the cache: the prompt chunked 7+rest, and two others.
			e := newEngine(t, name, Options{MaxTokensPerStep: 16, KVBlocks: 12})
			rs, alloc := e.ranks, e.alloc
			seqs := [][]int{slices.Clone(prompt), {1, 2, 3}, slices.Clone(prompt[:5])}
			done := make([]int, len(seqs))
			step := func(n []int) [][]float32 {
				var plan []stepSeq
				for i, k := range n {
					if k == 0 {
						continue
					}
					id := kvcache.SeqID(100 + i) // the engine's own ids start at 1
					if err := alloc.Reserve(id, done[i]+k); err != nil {
						t.Fatal(err)
					}
					plan = append(plan, stepSeq{seq: id, tokens: seqs[i], from: done[i], n: k})
				}
				in, err := stepInputs(alloc, plan, e.layout.LogitRows)
				if err != nil {
					t.Fatal(err)
				}
				out, err := rs.run(context.Background(), in)
				if err != nil {
					t.Fatal(err)
				}
				V := out.Shape[2]
				var lasts [][]float32
				row, entry := 0, 0
				for i, k := range n {
					if k == 0 {
						lasts = append(lasts, nil)
						continue
					}
					row += k
					done[i] += k
					r := row - 1
					if e.layout.LogitRows { // gather_logits: one row per plan entry
						r = entry
					}
					entry++
					lasts = append(lasts, out.F32[r*V:(r+1)*V])
				}
				return lasts
			}
			// Every step: each sequence's last row equals recomputing its tokens so far; a
			// sequence whose tokens are all in the cache is extended by its greedy choice.
			run := func(n ...int) {
				for i, l := range step(n) {
					if l == nil {
						continue
					}
					want, err := lastLogits(context.Background(), plain.Program, seqs[i][:done[i]])
					if err != nil {
						t.Fatal(err)
					}
					if !bitsEqual(l, want) {
						d, at := maxAbsDiff(l, want)
						t.Fatalf("sequence %d at %d tokens: cached logits differ from recomputation by %.2e at token %d (want bit for bit)", i, done[i], d, at)
					}
					if done[i] == len(seqs[i]) {
						seqs[i] = append(seqs[i], sample.Argmax(l))
					}
				}
			}
			run(7, 3, 0)
			run(len(prompt)-7, 1, 5)
			for range 12 {
				run(1, 1, 1)
			}
		})
	}
}

// TestBatchInvariance: 16 concurrent greedy requests give the same tokens as the same
// requests one at a time; a small token budget makes the batch mix chunked prefills and
// decodes.
func TestBatchInvariance(t *testing.T) {
	const name = "tiny-llama"
	rng := rand.New(rand.NewPCG(1, 2))
	var reqs []Request
	for i := range 16 {
		prompt := make([]int, 3+rng.IntN(40))
		for j := range prompt {
			prompt[j] = 5 + rng.IntN(500)
		}
		reqs = append(reqs, Request{ID: fmt.Sprint("r", i), Prompt: prompt, MaxTokens: 4 + rng.IntN(20), IgnoreEOS: true})
	}
	alone := newEngine(t, name, Options{MaxBatch: 1, MaxTokensPerStep: 64})
	want := make([][]int, len(reqs))
	for i, r := range reqs {
		want[i], _ = generate(t, alone, r)
	}
	batched := newEngine(t, name, Options{MaxBatch: 16, MaxTokensPerStep: 24})
	got := generateAll(t, batched, reqs)
	for i := range reqs {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("request %d: batched %v, alone %v", i, got[i], want[i])
		}
	}
	if st := batched.Stats(); st.GeneratedTokensTotal == 0 || st.StepsTotal == 0 || st.KVBlocksUsed != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestPreemption: a cache too small for every sequence at once preempts and recomputes
// sequences, and the tokens still equal those of the requests one at a time.
func TestPreemption(t *testing.T) {
	const name = "tiny-llama"
	var reqs []Request
	for i := range 6 {
		prompt := []int{10 + i, 20, 30, 40, 50 + i, 60, 70, 80 + i, 90, 100}
		reqs = append(reqs, Request{Prompt: prompt, MaxTokens: 30, IgnoreEOS: true})
	}
	alone := newEngine(t, name, Options{MaxBatch: 1})
	want := make([][]int, len(reqs))
	for i, r := range reqs {
		want[i], _ = generate(t, alone, r)
	}
	// 40 tokens each need 3 blocks of 16; 8 blocks hold two and a half sequences.
	small := newEngine(t, name, Options{KVBlocks: 8, QueueOnFull: true})
	got := generateAll(t, small, reqs)
	for i := range reqs {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("request %d: with preemption %v, alone %v", i, got[i], want[i])
		}
	}
	st := small.Stats()
	if st.PreemptionsTotal == 0 {
		t.Errorf("no preemption happened: %+v", st)
	}
	if st.KVBlocksUsed != 0 {
		t.Errorf("%d blocks still in use", st.KVBlocksUsed)
	}
}

// TestSeededSampling: the same seed gives the same tokens, alone or in a batch with other
// requests; another seed gives other tokens.
func TestSeededSampling(t *testing.T) {
	e := newEngine(t, "tiny-qwen2", Options{MaxTokensPerStep: 32})
	params := sample.Params{Temperature: 1.5, TopP: 0.95, TopK: 100, RepetitionPenalty: 1.1, Seed: 1234, HasSeed: true}
	req := Request{Prompt: []int{1, 2, 3, 4, 5}, MaxTokens: 24, Sampling: params, IgnoreEOS: true}
	first, _ := generate(t, e, req)
	var batch []Request
	for i := range 8 {
		other := req
		other.Sampling.Seed = int64(i)
		batch = append(batch, other)
	}
	batch = append(batch, req)
	got := generateAll(t, e, batch)
	if !slices.Equal(got[len(batch)-1], first) {
		t.Errorf("seed 1234 in a batch gave %v, alone %v", got[len(batch)-1], first)
	}
	distinct := 0
	for _, g := range got[:len(batch)-1] {
		if !slices.Equal(g, first) {
			distinct++
		}
	}
	if distinct == 0 {
		t.Errorf("eight other seeds all gave the tokens of seed 1234: %v", first)
	}
}

func TestStopAndLogprobs(t *testing.T) {
	e := newEngine(t, "tiny-llama", Options{})
	prompt := []int{7, 8, 9, 10}
	toks, last := generate(t, e, Request{Prompt: prompt, MaxTokens: 12, IgnoreEOS: true})
	if last.Finish != FinishLength || len(toks) != 12 || last.GeneratedTokens != 12 || last.PromptTokens != 4 {
		t.Fatalf("tokens %v, last event %+v", toks, last)
	}
	// Stopping on the fifth token ends at its first occurrence, which is reported.
	stop := toks[4]
	end := slices.Index(toks, stop)
	got, last := generate(t, e, Request{Prompt: prompt, MaxTokens: 12, StopTokenIDs: []int{stop}, IgnoreEOS: true})
	if last.Finish != FinishStop || !slices.Equal(got, toks[:end+1]) {
		t.Errorf("with stop token %d: %v (finish %q), want %v", stop, got, last.Finish, toks[:end+1])
	}
	// Log-probabilities: the greedy token is the most likely one.
	st, err := e.Submit(testCtx(t), Request{Prompt: prompt, MaxTokens: 3, IgnoreEOS: true, Sampling: sample.Params{Logprobs: true, TopLogprobs: 3}})
	if err != nil {
		t.Fatal(err)
	}
	for {
		ev, err := st.Recv(testCtx(t))
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(ev.TopLogprobs) != 3 || ev.TopLogprobs[0].Token != ev.Token || ev.TopLogprobs[0].Logprob != ev.Logprob || ev.Logprob > 0 {
			t.Errorf("event %+v", ev)
		}
	}
}

func TestSubmitValidation(t *testing.T) {
	e := newEngine(t, "tiny-llama", Options{}) // vocabulary 512, context 256
	for _, tc := range []struct {
		name string
		req  Request
		want string
	}{
		{"empty prompt", Request{MaxTokens: 1}, "empty prompt"},
		{"no max_tokens", Request{Prompt: []int{1}}, "max_tokens must be >= 1"},
		{"beyond the context", Request{Prompt: make([]int, 1000), MaxTokens: 25}, "exceed the model's context of 1024"},
		{"max_tokens overflowing the context check", Request{Prompt: []int{1, 2}, MaxTokens: math.MaxInt}, "max_tokens 9223372036854775807 exceed the model's context"},
		{"max_tokens of MaxInt-1", Request{Prompt: []int{1}, MaxTokens: math.MaxInt - 1}, "exceed the model's context"},
		{"token outside the vocabulary", Request{Prompt: []int{1, 512}, MaxTokens: 1}, "prompt token 1 is 512"},
		{"negative token", Request{Prompt: []int{-1}, MaxTokens: 1}, "prompt token 0 is -1"},
		{"stop token outside", Request{Prompt: []int{1}, MaxTokens: 1, StopTokenIDs: []int{600}}, "stop token id 600"},
		{"bad sampling", Request{Prompt: []int{1}, MaxTokens: 1, Sampling: sample.Params{TopP: 2}}, "top_p must be"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.Submit(context.Background(), tc.req)
			if !errors.Is(err, ErrInvalidRequest) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want ErrInvalidRequest containing %q", err, tc.want)
			}
		})
	}
	// At the limit is fine.
	if _, last := generate(t, e, Request{Prompt: make([]int, 250), MaxTokens: 6, IgnoreEOS: true}); last.Finish != FinishLength {
		t.Errorf("a request at the context limit finished with %q (%v)", last.Finish, last.Err)
	}
}

func TestAdmission(t *testing.T) {
	ctx := testCtx(t)
	long := Request{Prompt: make([]int, 40), MaxTokens: 60, IgnoreEOS: true} // 99 tokens: 7 blocks
	t.Run("never fits", func(t *testing.T) {
		e := newEngine(t, "tiny-llama", Options{KVBlocks: 6})
		if _, err := e.Submit(ctx, long); !errors.Is(err, ErrRequestTooLarge) {
			t.Errorf("error %v, want ErrRequestTooLarge", err)
		}
	})
	t.Run("max_tokens overflowing the cache check", func(t *testing.T) {
		// No model context to check against: the KV cache check alone must refuse it.
		e := newEngine(t, "tiny-llama", Options{KVBlocks: 6})
		e.info.MaxPositions = 0
		for _, n := range []int{math.MaxInt, math.MaxInt - 1, math.MaxInt/2 + 1} {
			_, err := e.Submit(ctx, Request{Prompt: []int{1, 2}, MaxTokens: n, IgnoreEOS: true})
			if !errors.Is(err, ErrRequestTooLarge) || !strings.Contains(err.Error(), "max_tokens") {
				t.Errorf("max_tokens %d: error %v, want ErrRequestTooLarge naming max_tokens", n, err)
			}
		}
	})
	t.Run("cache full, no queueing", func(t *testing.T) {
		e := newEngine(t, "tiny-llama", Options{KVBlocks: 7})
		first, err := e.Submit(ctx, long)
		if err != nil {
			t.Fatal(err)
		}
		// The first prompt's 3 blocks are promised; the second's 3 still fit, a third does not.
		if _, err := e.Submit(ctx, long); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Submit(ctx, long); !errors.Is(err, ErrKVCacheFull) {
			t.Errorf("error %v, want ErrKVCacheFull", err)
		}
		if _, last, err := first.Collect(ctx); err != nil || last.Finish != FinishLength {
			t.Errorf("first request: %v, %+v", err, last)
		}
	})
	t.Run("queue full", func(t *testing.T) {
		e := newEngine(t, "tiny-llama", Options{MaxQueue: 1, MaxBatch: 1, KVBlocks: 64})
		// One request runs, one waits, the next is refused (long before the first finishes).
		var err error
		for range 4 {
			if _, err = e.Submit(ctx, long); err != nil {
				break
			}
		}
		if !errors.Is(err, ErrQueueFull) {
			t.Errorf("error %v, want ErrQueueFull", err)
		}
	})
	t.Run("queueing", func(t *testing.T) {
		e := newEngine(t, "tiny-llama", Options{KVBlocks: 7, MaxQueue: 2, QueueOnFull: true, MaxTokensPerStep: 16})
		var reqs []Request
		for range 5 {
			reqs = append(reqs, Request{Prompt: make([]int, 40), MaxTokens: 20, IgnoreEOS: true})
		}
		for _, toks := range generateAll(t, e, reqs) {
			if len(toks) != 20 {
				t.Errorf("%d tokens, want 20", len(toks))
			}
		}
	})
}

func TestCancel(t *testing.T) {
	e := newEngine(t, "tiny-llama", Options{})
	ctx, cancel := context.WithCancel(context.Background())
	st, err := e.Submit(ctx, Request{Prompt: []int{1, 2, 3}, MaxTokens: 200, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := st.Recv(testCtx(t)); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	_, last, err := st.Collect(testCtx(t))
	if err != nil || last.Finish != FinishCancelled || !errors.Is(last.Err, context.Canceled) {
		t.Fatalf("after cancel: %v, last event %+v", err, last)
	}
	if last.GeneratedTokens >= 200 {
		t.Errorf("generated %d tokens after cancellation", last.GeneratedTokens)
	}
	// The blocks come back (the loop frees them when it ends the request).
	if st := e.Stats(); st.KVBlocksUsed != 0 || st.Running != 0 {
		t.Errorf("after cancel: %+v", st)
	}
	// A request cancelled while waiting never starts.
	ctx2, cancel2 := context.WithCancel(context.Background())
	cancel2()
	if _, err := e.Submit(ctx2, Request{Prompt: []int{1}, MaxTokens: 1}); !errors.Is(err, context.Canceled) {
		t.Errorf("submit with a cancelled context: %v", err)
	}
}

func TestShutdown(t *testing.T) {
	e := newEngine(t, "tiny-llama", Options{})
	ctx := testCtx(t)
	var streams []*Stream
	for i := range 4 {
		st, err := e.Submit(ctx, Request{Prompt: []int{1, 2, 3 + i}, MaxTokens: 10, IgnoreEOS: true})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	if err := e.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	for i, st := range streams {
		toks, last, err := st.Collect(ctx)
		if err != nil || last.Finish != FinishLength || len(toks) != 10 {
			t.Errorf("request %d after Shutdown: %v tokens, %+v, %v", i, len(toks), last, err)
		}
	}
	if _, err := e.Submit(ctx, Request{Prompt: []int{1}, MaxTokens: 1}); !errors.Is(err, ErrClosed) {
		t.Errorf("submit after shutdown: %v", err)
	}

	// Close ends requests in flight with ErrClosed.
	e2 := newEngine(t, "tiny-llama", Options{})
	st, err := e2.Submit(ctx, Request{Prompt: []int{1, 2}, MaxTokens: 250, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(ctx); err != nil {
		t.Fatal(err)
	}
	e2.Close()
	_, last, err := st.Collect(ctx)
	if err != nil || last.Finish != FinishError || !errors.Is(last.Err, ErrClosed) {
		t.Errorf("after Close: %v, %+v", err, last)
	}
}

func TestOptions(t *testing.T) {
	m := cachedModel(t, "tiny-llama")
	for _, tc := range []struct {
		opts Options
		want string
	}{
		{Options{MaxBatch: 8, MaxTokensPerStep: 4}, "at least MaxBatch"},
		{Options{BlockSize: 32}, "blocks of 16 tokens"},
		{Options{KVCacheBytes: 10}, "holds no block"},
		{Options{MaxBatch: -1}, "MaxBatch must be >= 1"},
	} {
		tc.opts.Logger = quiet
		if _, err := New(context.Background(), m, tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error containing %q", tc.opts, err, tc.want)
		}
	}
	// The plain graph has no cache: a clear error.
	plain, err := Load(context.Background(), filepath.Join("..", "testdata", "tiny-llama"), LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := New(context.Background(), plain, Options{Logger: quiet}); err == nil || !strings.Contains(err.Error(), "paged KV cache") {
		t.Errorf("New on the plain graph: %v", err)
	}
	// Defaults: 16 sequences of the whole context (1024 tokens, 64 blocks each).
	e := newEngine(t, "tiny-llama", Options{})
	if st := e.Stats(); st.KVBlocks != 16*64 || st.BlockSize != 16 {
		t.Errorf("default cache: %+v", st)
	}
}

// flakyExe fails (or panics) while told to, and otherwise runs the real executable.
type flakyExe struct {
	Executable
	mode atomic.Int32 // 0 run, 1 fail, 2 panic
}

func (f *flakyExe) Run(ctx context.Context, in map[string]*tensor.Tensor) ([]*tensor.Tensor, error) {
	switch f.mode.Load() {
	case 1:
		return nil, errors.New("device on fire")
	case 2:
		panic("kernel bug")
	}
	return f.Executable.Run(ctx, in)
}

// TestStepError: a step that fails (or panics) ends the requests in it with FinishError and
// frees their blocks; the engine goes on serving.
func TestStepError(t *testing.T) {
	m := cachedModel(t, "tiny-llama")
	exe := &flakyExe{Executable: m.Program}
	e, err := NewRanks(context.Background(), []Rank{{Graph: m.Graph, Exe: exe}}, ModelInfo{MaxPositions: 256}, Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for mode, want := range map[int32]string{1: "device on fire", 2: "panic in step: kernel bug"} {
		exe.mode.Store(mode)
		_, last := generate(t, e, Request{Prompt: []int{1, 2, 3}, MaxTokens: 4})
		if last.Finish != FinishError || last.Err == nil || !strings.Contains(last.Err.Error(), want) {
			t.Errorf("mode %d: last event %+v, want an error containing %q", mode, last, want)
		}
		exe.mode.Store(0)
		if toks, last := generate(t, e, Request{Prompt: []int{1, 2, 3}, MaxTokens: 4, IgnoreEOS: true}); len(toks) != 4 {
			t.Errorf("after the failure: %v, %+v", toks, last)
		}
		if st := e.Stats(); st.KVBlocksUsed != 0 {
			t.Errorf("%d blocks in use after the failure", st.KVBlocksUsed)
		}
	}
}

// An executable that samples on its device gets the step's draws and returns token ids;
// the tokens equal the host sampler's. Requests that need the host (log-probabilities)
// bring the logits back instead, as does Options.HostSampling.
func TestDeviceSampling(t *testing.T) {
	m := cachedModel(t, "tiny-llama")
	ref := newEngine(t, "tiny-llama", Options{})
	reqs := []Request{{Prompt: []int{1, 2, 3}, MaxTokens: 6, IgnoreEOS: true}, {Prompt: []int{9, 8, 7, 6, 5}, MaxTokens: 6, IgnoreEOS: true}}
	want := generateAll(t, ref, reqs)
	for _, tc := range []struct {
		name         string
		hostSampling bool
		logprobs     bool
		onDevice     bool
	}{{"device", false, false, true}, {"logprobs", false, true, false}, {"host option", true, false, false}} {
		t.Run(tc.name, func(t *testing.T) {
			exe := &asyncLauncher{Executable: m.Program}
			e, err := NewRanks(context.Background(), []Rank{{Graph: m.Graph, Exe: exe}}, ModelInfo{MaxPositions: 256}, Options{Logger: quiet, HostSampling: tc.hostSampling})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			rs := slices.Clone(reqs)
			for i := range rs {
				rs[i].Sampling.Logprobs = tc.logprobs
			}
			if got := generateAll(t, e, rs); !slices.EqualFunc(got, want, slices.Equal) {
				t.Errorf("tokens %v, want %v", got, want)
			}
			if n := exe.launched.Load(); (n > 0) != tc.onDevice {
				t.Errorf("%d steps sampled on the device, want any: %v", n, tc.onDevice)
			}
		})
	}
}

// gatedExe runs its executable once gate is closed.
type gatedExe struct {
	Executable
	gate chan struct{}
}

func (g gatedExe) Run(ctx context.Context, in map[string]*tensor.Tensor) ([]*tensor.Tensor, error) {
	select {
	case <-g.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return g.Executable.Run(ctx, in)
}

// TestMaxConcurrent: the engine admits at most MaxConcurrent requests at once. Past it,
// Submit fails with ErrAtCapacity, or with QueueOnFull holds the request for a slot (it
// counts among the waiting, Stats.Waiting) until MaxQueue are waiting, and then fails with
// ErrQueueFull; a held request starts when a slot frees.
func TestMaxConcurrent(t *testing.T) {
	m := cachedModel(t, "tiny-llama")
	for _, queue := range []bool{false, true} {
		t.Run(fmt.Sprintf("queue=%v", queue), func(t *testing.T) {
			ctx := testCtx(t)
			gate := make(chan struct{})
			e, err := NewRanks(ctx, []Rank{{Graph: m.Graph, Exe: gatedExe{m.Program, gate}}}, ModelInfo{MaxPositions: 256},
				Options{MaxConcurrent: 1, MaxQueue: 1, QueueOnFull: queue, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			req := Request{Prompt: []int{1, 2, 3}, MaxTokens: 3, IgnoreEOS: true}
			first, err := e.Submit(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			waitFor := func(what string, cond func(Stats) bool) {
				t.Helper()
				deadline := time.Now().Add(10 * time.Second)
				for !cond(e.Stats()) && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond)
				}
				if st := e.Stats(); !cond(st) {
					t.Fatalf("%s: %+v", what, st)
				}
			}
			waitFor("the first request to run", func(st Stats) bool { return st.Running == 1 })
			var held *Stream
			heldErr := make(chan error, 1)
			if queue {
				go func() {
					var err error
					held, err = e.Submit(ctx, req)
					heldErr <- err
				}()
				waitFor("a request held for a slot", func(st Stats) bool { return st.Waiting == 1 })
			}
			_, err = e.Submit(ctx, req)
			want := ErrAtCapacity
			if queue {
				want = ErrQueueFull
			}
			if !errors.Is(err, want) {
				t.Errorf("past the limit: %v, want %v", err, want)
			}
			close(gate)
			if toks, _, err := first.Collect(ctx); err != nil || len(toks) != 3 {
				t.Errorf("first request: %v, %v", toks, err)
			}
			if queue {
				if err := <-heldErr; err != nil {
					t.Fatalf("the held request: %v", err)
				}
				if toks, _, err := held.Collect(ctx); err != nil || len(toks) != 3 {
					t.Errorf("held request: %v, %v", toks, err)
				}
			}
		})
	}
}
