package engine

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tensor"
)

// asyncLauncher stands in for a device that queues steps (backend/cuda's Launch): each
// LaunchStep runs its step on a goroutine once the step before it has finished (one
// stream), a little slower than the host, and picks each row's argmax; a fed step takes its
// input_ids from the previous step's ids.
type asyncLauncher struct {
	Executable
	mu       sync.Mutex
	last     *asyncStep
	launched atomic.Int32
	fed      atomic.Int32
}

type asyncStep struct {
	done chan struct{}
	ids  []int32
	err  error
}

func (a *asyncLauncher) LaunchStep(ctx context.Context, in map[string]*tensor.Tensor, draws []sample.DeviceDraw, feed, download bool) (backend.Pending, error) {
	a.mu.Lock()
	prev, st := a.last, &asyncStep{done: make(chan struct{})}
	a.last = st
	a.mu.Unlock()
	if feed && prev == nil {
		return nil, errors.New("feed without a step before")
	}
	a.launched.Add(1)
	if feed {
		a.fed.Add(1)
	}
	go func() {
		defer close(st.done)
		if prev != nil {
			<-prev.done
		}
		if feed {
			ids := in["input_ids"]
			if prev.err != nil || len(prev.ids) != ids.Numel() {
				st.err = fmt.Errorf("feed %v from %d ids (%v)", ids.Shape, len(prev.ids), prev.err)
				return
			}
			in["input_ids"] = tensor.FromI32(slices.Clone(prev.ids), ids.Shape...)
		}
		time.Sleep(200 * time.Microsecond)
		out, err := a.Run(ctx, in)
		if err != nil {
			st.err = err
			return
		}
		V := out[0].Shape[2]
		st.ids = make([]int32, len(draws))
		for i, d := range draws {
			if d.Temperature != 0 {
				st.err = fmt.Errorf("row %d: only greedy draws here, got %+v", i, d)
				return
			}
			row := out[0].F32[i*V : (i+1)*V]
			st.ids[i] = int32(slices.Index(row, slices.Max(row)))
		}
	}()
	return st, nil
}

func (st *asyncStep) Wait(ctx context.Context) ([]int32, error) {
	select {
	case <-st.done:
		return st.ids, st.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestOverlappedSteps runs requests through ranks that queue their steps (one rank, and
// tp=2 on the CPU, each rank sampling and feeding itself): the tokens must be the
// reference engine's, with decode steps launched ahead of their tokens (none with
// SyncSteps). The requests end at different steps, by length and by a stop token met while
// a step ahead is in flight; afterwards no cache block is left in use and a new request
// (reusing the blocks the dropped rows wrote) still gives the reference tokens.
func TestOverlappedSteps(t *testing.T) {
	ref := newEngine(t, "tiny-llama", Options{})
	reqs := []Request{
		{Prompt: []int{1, 2, 3}, MaxTokens: 12, IgnoreEOS: true},
		{Prompt: []int{9, 8, 7, 6, 5}, MaxTokens: 5, IgnoreEOS: true},
		{Prompt: []int{4, 4, 4, 4}, MaxTokens: 9, IgnoreEOS: true},
	}
	free := generateAll(t, ref, reqs[:1])[0]
	// The third request stops at the token its 4th step gives.
	reqs[2].StopTokenIDs = nil
	third := generateAll(t, ref, reqs[2:])[0]
	reqs[2].StopTokenIDs = []int{third[3]}
	want := generateAll(t, ref, reqs)
	if n := len(want[2]); n != slices.Index(third, third[3])+1 || n >= reqs[2].MaxTokens {
		t.Fatalf("the stop token did not end the third request early: %v of %v", want[2], third)
	}
	single := cachedModel(t, "tiny-llama")
	sharded, err := Load(context.Background(), filepath.Join("..", "testdata", "tiny-llama"), LoadOptions{Optimize: true, Mesh: mustMeshFor(t, 2, "")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sharded.Close() })
	for _, tc := range []struct {
		name string
		m    *Model
		sync bool
	}{{"one rank", single, false}, {"tp=2", sharded, false}, {"one rank, sync steps", single, true}} {
		t.Run(tc.name, func(t *testing.T) {
			ranks := tc.m.Ranks()
			var ls []*asyncLauncher
			for r := range ranks {
				l := &asyncLauncher{Executable: ranks[r].Exe}
				ranks[r].Exe, ls = l, append(ls, l)
			}
			e, err := NewRanks(context.Background(), ranks, modelInfo(tc.m.Model), Options{Logger: quiet, SyncSteps: tc.sync})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			if got := generateAll(t, e, reqs); !slices.EqualFunc(got, want, slices.Equal) {
				t.Errorf("tokens %v, want %v", got, want)
			}
			if got, last := generate(t, e, reqs[0]); !slices.Equal(got, free) || last.Finish != FinishLength {
				t.Errorf("after: tokens %v (%s), want %v", got, last.Finish, free)
			}
			generated := len(free)
			for _, w := range want {
				generated += len(w)
			}
			if st := e.Stats(); st.KVBlocksUsed != 0 || st.Running != 0 || st.GeneratedTokensTotal != int64(generated) {
				t.Errorf("after all requests: %+v; want %d tokens generated", st, generated)
			}
			for r, l := range ls {
				fed := l.fed.Load()
				if tc.sync && fed != 0 || !tc.sync && fed < 10 || int64(fed) != e.Stats().AheadStepsTotal {
					t.Errorf("rank %d: %d of %d steps launched ahead, the engine counts %d (sync steps: %v)", r, fed, l.launched.Load(), e.Stats().AheadStepsTotal, tc.sync)
				}
			}
		})
	}
}

// A request cancelled while a step ahead is in flight ends with FinishCancelled; the
// others go on with the reference tokens.
func TestOverlappedCancel(t *testing.T) {
	ref := newEngine(t, "tiny-llama", Options{})
	keep := Request{Prompt: []int{1, 2, 3}, MaxTokens: 24, IgnoreEOS: true}
	want := generateAll(t, ref, []Request{keep})[0]
	m := cachedModel(t, "tiny-llama")
	l := &asyncLauncher{Executable: m.Program}
	e, err := NewRanks(context.Background(), []Rank{{Graph: m.Graph, Exe: l}}, modelInfo(m.Model), Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := testCtx(t)
	cctx, cancel := context.WithCancel(ctx)
	gone, err := e.Submit(cctx, Request{Prompt: []int{5, 6}, MaxTokens: 200, IgnoreEOS: true})
	if err != nil {
		t.Fatal(err)
	}
	kept, err := e.Submit(ctx, keep)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := gone.Recv(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	_, last, err := gone.Collect(ctx)
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if last.Finish != FinishCancelled {
		t.Errorf("cancelled request ended with %+v", last)
	}
	if got, _, err := kept.Collect(ctx); err != nil || !slices.Equal(got, want) {
		t.Errorf("other request: %v, %v; want %v", got, err, want)
	}
	if st := e.Stats(); st.KVBlocksUsed != 0 {
		t.Errorf("%d blocks in use", st.KVBlocksUsed)
	}
	if l.fed.Load() == 0 {
		t.Error("no step was launched ahead")
	}
}
