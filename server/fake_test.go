package server

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/loom-ml/loom/engine"
	"github.com/loom-ml/loom/sample"
)

// fakeEngine stands in for the runtime: each request generates the tokens its script
// returns, one every delay, holding KV blocks (one per blockSize tokens) until it ends.
type fakeEngine struct {
	script    func(req engine.Request) []int
	eos       int
	delay     time.Duration
	blockSize int
	blocks    int

	mu        sync.Mutex
	used      int
	running   int
	requests  []engine.Request
	cancelled int
	shutdown  bool
	gate      chan struct{} // when set, generation waits for it to close
	submitErr error         // when set, Submit fails with it
	// When failErr is set, a request submitted then fails with it (FinishError) after
	// failAfter tokens, as a step of the real engine that fails mid-stream.
	failErr   error
	failAfter int
	wg        sync.WaitGroup
}

func (f *fakeEngine) Submit(ctx context.Context, req engine.Request) (Stream, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.shutdown {
		return nil, errors.New("engine shut down")
	}
	if f.submitErr != nil {
		return nil, f.submitErr
	}
	need := (len(req.Prompt) + req.MaxTokens + f.blockSize - 1) / f.blockSize
	if f.used+need > f.blocks {
		return nil, errors.New("out of KV blocks")
	}
	f.used += need
	f.running++
	f.requests = append(f.requests, req)
	st := &fakeStream{ch: make(chan engine.Event, 1)}
	f.wg.Add(1)
	go f.generate(ctx, req, need, st.ch, f.gate, f.failErr, f.failAfter)
	return st, nil
}

func (f *fakeEngine) generate(ctx context.Context, req engine.Request, need int, ch chan<- engine.Event, gate chan struct{}, failErr error, failAfter int) {
	defer f.wg.Done()
	defer func() {
		f.mu.Lock()
		f.used -= need
		f.running--
		f.mu.Unlock()
		close(ch)
	}()
	cancelled := func() {
		f.mu.Lock()
		f.cancelled++
		f.mu.Unlock()
		// Like the real engine, never wait for a reader that may be gone.
		select {
		case ch <- engine.Event{Finish: engine.FinishCancelled}:
		default:
		}
	}
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			cancelled()
			return
		}
	}
	tokens := f.script(req)
	stops := map[int]bool{}
	for _, id := range req.StopTokenIDs {
		stops[id] = true
	}
	if !req.IgnoreEOS {
		stops[f.eos] = true
	}
	for i := 0; ; i++ {
		tok := tokens[i%len(tokens)]
		ev := engine.Event{Token: tok, PromptTokens: len(req.Prompt), GeneratedTokens: i + 1, Logprob: -0.5}
		if req.Sampling.TopLogprobs > 0 {
			ev.TopLogprobs = []sample.TokenLogprob{{Token: tok, Logprob: -0.5}}
		}
		switch {
		case failErr != nil && i == failAfter:
			ev = engine.Event{Finish: engine.FinishError, Err: failErr, PromptTokens: len(req.Prompt), GeneratedTokens: i}
		case stops[tok]:
			ev.Finish = engine.FinishStop
		case i+1 == req.MaxTokens:
			ev.Finish = engine.FinishLength
		}
		select {
		case <-time.After(f.delay):
		case <-ctx.Done():
			cancelled()
			return
		}
		select {
		case ch <- ev:
		case <-ctx.Done():
			cancelled()
			return
		}
		if ev.Finish != engine.FinishNone {
			return
		}
	}
}

func (f *fakeEngine) Stats() engine.Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return engine.Stats{Running: f.running, KVBlocksUsed: f.used, KVBlocks: f.blocks, BlockSize: f.blockSize}
}

func (f *fakeEngine) Shutdown(ctx context.Context) error {
	f.mu.Lock()
	f.shutdown = true
	f.mu.Unlock()
	done := make(chan struct{})
	go func() { f.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// snapshot returns the requests submitted so far and how many were cancelled.
func (f *fakeEngine) snapshot() ([]engine.Request, int, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]engine.Request(nil), f.requests...), f.cancelled, f.shutdown
}

type fakeStream struct{ ch chan engine.Event }

func (s *fakeStream) Recv(ctx context.Context) (engine.Event, error) {
	select {
	case ev, ok := <-s.ch:
		if !ok {
			return engine.Event{}, errors.New("stream ended")
		}
		return ev, nil
	case <-ctx.Done():
		return engine.Event{}, ctx.Err()
	}
}
