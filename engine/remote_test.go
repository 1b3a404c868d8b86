package engine

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/engine/steps"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/kvcache"
	"github.com/loom-ml/loom/tensor"
)

// testSpec is a one-layer cache of 4-token blocks.
var testSpec = kvcache.Spec{BlockSize: 4, Layers: []kvcache.LayerSpec{{K: "kv_cache.0.k", V: "kv_cache.0.v", KVHeads: 1, HeadDim: 2, DType: tensor.F32}}}

// fakeRank is an Executable that records the inputs of every Run and returns logits
// f32[1,S,vocab]. hook, when set, runs first (with the 1-based run number) and its error
// fails the run.
type fakeRank struct {
	vocab    int
	resident []string
	hook     func(ctx context.Context, run int) error

	mu   sync.Mutex
	runs []map[string]*tensor.Tensor
}

func (f *fakeRank) Run(ctx context.Context, in map[string]*tensor.Tensor) ([]*tensor.Tensor, error) {
	f.mu.Lock()
	f.runs = append(f.runs, in)
	n := len(f.runs)
	f.mu.Unlock()
	if f.hook != nil {
		if err := f.hook(ctx, n); err != nil {
			return nil, err
		}
	}
	S := in["input_ids"].Shape[1]
	return []*tensor.Tensor{tensor.New(tensor.F32, 1, S, max(f.vocab, 1))}, nil
}

func (f *fakeRank) inputs() []map[string]*tensor.Tensor {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.runs)
}

// residentFake is a fakeRank that keeps its caches on its "device".
type residentFake struct{ *fakeRank }

func (f residentFake) Resident() []string { return f.resident }

// follower is a rank other than 0 of a test world: Follow's result arrives on done.
type follower struct {
	conn net.Conn
	done chan error
}

// startWorld connects rank 0 to len(exes) followers (ranks 1, 2, ...) over TCP on
// 127.0.0.1 through the step transport, each following with its executable and spec until
// the test ends.
func startWorld(t *testing.T, ctx context.Context, exes []Executable, spec kvcache.Spec) ([]*steps.Remote, []*follower) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	n := len(exes) + 1
	accepted := make(chan []*steps.Remote, 1)
	acceptErr := make(chan error, 1)
	go func() {
		rrs, err := steps.Accept(ctx, ln, n)
		acceptErr <- err
		accepted <- rrs
	}()
	fs := make([]*follower, len(exes))
	for i, exe := range exes {
		conn, err := steps.Dial(ctx, ln.Addr().String(), i+1, n, uint64(100+i), launcherOf(exe) != nil)
		if err != nil {
			t.Fatal(err)
		}
		f := &follower{conn: conn, done: make(chan error, 1)}
		fs[i] = f
		go func() { f.done <- steps.Follow(ctx, exe, spec, conn) }()
		t.Cleanup(func() { conn.Close() })
	}
	if err := <-acceptErr; err != nil {
		t.Fatal(err)
	}
	rrs := <-accepted
	for i, rr := range rrs {
		if rr.Rank() != i+1 || rr.Free() != uint64(100+i) {
			t.Fatalf("follower %d: rank %d, free %d", i, rr.Rank(), rr.Free())
		}
		rr.SetResident([]string{"kv_cache.0.k", "kv_cache.0.v"})
		t.Cleanup(func() { rr.Close() })
	}
	return rrs, fs
}

// newTestRankSet is a rankSet of rank 0's executable and the remote ranks, with a cache
// of blocks blocks per rank as the engine makes them (shape-only for the remote ranks).
func newTestRankSet(t *testing.T, rank0 Executable, rrs []*steps.Remote, blocks int) *rankSet {
	t.Helper()
	rs := &rankSet{ranks: []Rank{{Exe: rank0}}}
	for _, rr := range rrs {
		rs.ranks = append(rs.ranks, Rank{Exe: rr.Executable()})
	}
	for _, r := range rs.ranks {
		newCache := kvcache.NewCache
		if backend.Keeps(r.Exe, cacheNames(testSpec)) {
			newCache = kvcache.NewCacheShapes
		}
		c, err := newCache(testSpec, blocks)
		if err != nil {
			t.Fatal(err)
		}
		rs.caches = append(rs.caches, c)
	}
	return rs
}

// testSteps are the inputs of a few engine steps: a prefill, a batch of two, a decode.
func testSteps(t *testing.T, blocks int) []map[string]*tensor.Tensor {
	t.Helper()
	alloc, err := kvcache.NewAllocator(blocks, testSpec.BlockSize)
	if err != nil {
		t.Fatal(err)
	}
	for seq, n := range []int{9, 3} {
		if err := alloc.Reserve(kvcache.SeqID(seq), n); err != nil {
			t.Fatal(err)
		}
	}
	a, b := []int{5, 6, 7, 8, 9, 10, 11, 12, 13}, []int{1, 2, 3}
	var steps []map[string]*tensor.Tensor
	for _, seqs := range [][]stepSeq{
		{{seq: 0, tokens: a, from: 0, n: 8}},
		{{seq: 0, tokens: a, from: 8, n: 1}, {seq: 1, tokens: b, from: 0, n: 3}},
		{{seq: 1, tokens: b, from: 2, n: 1}},
	} {
		in, err := stepInputs(alloc, seqs, true)
		if err != nil {
			t.Fatal(err)
		}
		steps = append(steps, in)
	}
	return steps
}

func sameTensor(a, b *tensor.Tensor) bool {
	return a.DType == b.DType && slices.Equal(a.Shape, b.Shape) && slices.Equal(a.I32, b.I32) &&
		slices.Equal(a.I64, b.I64) && slices.Equal(a.F32, b.F32)
}

// Without the cache stage (loom generate's whole-sequence graph), the followers run
// GreedyRecompute's steps as rank 0 does, and add no caches.
func TestRemoteGreedyRecompute(t *testing.T) {
	ctx := testCtx(t)
	f := &fakeRank{}
	rrs, _ := startWorld(t, ctx, []Executable{f}, kvcache.Spec{})
	rank0 := &fakeRank{vocab: 5}
	res, err := GreedyRecompute(ctx, &RankGroup{Ranks: []Executable{rank0, rrs[0].Executable()}, Graphs: []*graph.Graph{{Name: "whole-sequence"}}}, []int{1, 2, 3}, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.NewIDs) != 3 {
		t.Fatalf("%d new tokens, want 3", len(res.NewIDs))
	}
	got, want := f.inputs(), rank0.inputs()
	if len(got) != len(want) || len(got) != 3 {
		t.Fatalf("rank 1 ran %d steps, rank 0 %d; want 3", len(got), len(want))
	}
	for i := range got {
		if len(got[i]) != 2 || !sameTensor(got[i]["input_ids"], want[i]["input_ids"]) || !sameTensor(got[i]["positions"], want[i]["positions"]) {
			t.Errorf("step %d: rank 1 got %v, rank 0 %v", i, got[i], want[i])
		}
	}
}

// Every follower runs every step on exactly rank 0's inputs, with its own caches of the
// engine's number of blocks: shape-only when it keeps them on its device, else allocated.
func TestRemoteStepsForwarded(t *testing.T) {
	for _, tc := range []struct {
		name      string
		followers int
		resident  bool
	}{
		{"2 ranks, host caches", 1, false},
		{"2 ranks, device caches", 1, true},
		{"3 ranks, device caches", 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := testCtx(t)
			const blocks = 8
			fakes := make([]*fakeRank, tc.followers)
			exes := make([]Executable, tc.followers)
			for i := range fakes {
				fakes[i] = &fakeRank{resident: []string{"kv_cache.0.k", "kv_cache.0.v"}}
				exes[i] = fakes[i]
				if tc.resident {
					exes[i] = residentFake{fakes[i]}
				}
			}
			rrs, _ := startWorld(t, ctx, exes, testSpec)
			rank0 := &fakeRank{vocab: 3}
			rs := newTestRankSet(t, rank0, rrs, blocks)
			steps := testSteps(t, blocks)
			for i, in := range steps {
				out, err := rs.run(ctx, in)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				if out.Shape[2] != 3 {
					t.Fatalf("step %d: logits %v are not rank 0's", i, out.Shape)
				}
			}
			want := rank0.inputs()
			for r, f := range fakes {
				got := f.inputs()
				if len(got) != len(steps) {
					t.Fatalf("rank %d ran %d steps, want %d", r+1, len(got), len(steps))
				}
				for i := range got {
					for name, w := range want[i] {
						g := got[i][name]
						if g == nil {
							t.Fatalf("rank %d step %d: no input %s", r+1, i, name)
						}
						if isCacheInput(name) {
							if !slices.Equal(g.Shape, []int{blocks, 4, 1, 2}) || (len(g.F32) == 0) == !tc.resident {
								t.Errorf("rank %d step %d: cache %s is %v with %d elements (device caches %v)", r+1, i, name, g.Shape, len(g.F32), tc.resident)
							}
							continue
						}
						if !sameTensor(g, w) {
							t.Errorf("rank %d step %d: %s = %v %v, rank 0 had %v %v", r+1, i, name, g.Shape, g.I32, w.Shape, w.I32)
						}
					}
					if len(got[i]) != len(want[i]) {
						t.Errorf("rank %d step %d: %d inputs, rank 0 had %d", r+1, i, len(got[i]), len(want[i]))
					}
				}
			}
		})
	}
}

// A follower's failure fails rank 0's step with an error naming the rank and carrying the
// follower's; rank 0's own program, waiting for the follower in a collective, is
// cancelled; the next step runs again.
func TestRemoteErrorNamesRank(t *testing.T) {
	ctx := testCtx(t)
	bad := &fakeRank{hook: func(ctx context.Context, run int) error {
		if run == 2 {
			return errors.New("nccl: rank 2: kernel exploded")
		}
		return nil
	}}
	rrs, _ := startWorld(t, ctx, []Executable{&fakeRank{}, bad}, testSpec)
	waited := make(chan error, 3)
	rank0 := &fakeRank{vocab: 2, hook: func(ctx context.Context, run int) error {
		if run != 2 {
			return nil
		}
		select { // stuck in a collective until cancelled
		case <-ctx.Done():
			waited <- ctx.Err()
			return fmt.Errorf("sync: %w", ctx.Err())
		case <-time.After(10 * time.Second):
			waited <- nil
			return errors.New("rank 0 was not cancelled")
		}
	}}
	rs := newTestRankSet(t, rank0, rrs, 8)
	steps := testSteps(t, 8)
	if _, err := rs.run(ctx, steps[0]); err != nil {
		t.Fatal(err)
	}
	_, err := rs.run(ctx, steps[1])
	if err == nil || !strings.Contains(err.Error(), "rank 2: step 2 on the follower: nccl: rank 2: kernel exploded") {
		t.Fatalf("error = %v, want rank 2's failure", err)
	}
	if strings.Contains(err.Error(), "rank 0") || strings.Contains(err.Error(), "rank 1") {
		t.Errorf("error %q names ranks that did not fail", err)
	}
	if werr := <-waited; !errors.Is(werr, context.Canceled) {
		t.Errorf("rank 0 waiting in its step: %v, want it cancelled", werr)
	}
	if _, err := rs.run(ctx, steps[2]); err != nil {
		t.Errorf("the step after a follower's error: %v", err)
	}
}

// A follower that goes away (its process died) fails rank 0's step naming the rank, and
// every later one at once.
func TestRemoteFollowerDisconnect(t *testing.T) {
	ctx := testCtx(t)
	conn := make(chan net.Conn, 1)
	dies := &fakeRank{hook: func(ctx context.Context, run int) error {
		if run == 2 {
			(<-conn).Close()
		}
		return nil
	}}
	rrs, fs := startWorld(t, ctx, []Executable{dies}, testSpec)
	conn <- fs[0].conn
	rs := newTestRankSet(t, &fakeRank{vocab: 2}, rrs, 8)
	steps := testSteps(t, 8)
	if _, err := rs.run(ctx, steps[0]); err != nil {
		t.Fatal(err)
	}
	for i, in := range steps[1:] {
		start := time.Now()
		_, err := rs.run(ctx, in)
		if err == nil || !strings.Contains(err.Error(), "rank 1: step 2: the follower process closed its connection") {
			t.Errorf("step %d after the follower died: %v", i+2, err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Errorf("step %d took %v to fail", i+2, d)
		}
	}
	if err := <-fs[0].done; err == nil {
		t.Error("the follower whose connection closed returned nil")
	}
}

// The engine with rank 1 of a tp=2 CPU deployment behind the step transport (its program
// following in another goroutine, as it would in another process; the collectives meet
// through the in-process communicators) generates the tokens of the in-process tp=2
// engine.
func TestRemoteEngineCPU(t *testing.T) {
	if testing.Short() {
		t.Skip("loads a model")
	}
	mesh, err := dist.ParseMesh("tp=2")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join("..", "testdata", "tiny-llama")
	m, err := Load(context.Background(), dir, LoadOptions{Optimize: true, Mesh: mesh})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ref := loadReference(t, dir)
	var reqs []Request
	for _, p := range ref.Prompts {
		reqs = append(reqs, Request{Prompt: p.IDs, MaxTokens: 6, IgnoreEOS: true})
	}
	opts := Options{MaxTokensPerStep: 16, KVBlocks: 64, Logger: quiet}
	local, err := New(context.Background(), m, opts)
	if err != nil {
		t.Fatal(err)
	}
	want := generateAll(t, local, reqs)
	local.Close()

	ctx := testCtx(t)
	l1, err := CacheLayout(m.Graphs[1])
	if err != nil {
		t.Fatal(err)
	}
	rrs, fs := startWorld(t, ctx, []Executable{m.Programs[1]}, l1.Cache)
	rrs[0].SetResident(cacheInputs(m.Graphs[1]))
	e, err := NewRanks(ctx, []Rank{{Graph: m.Graphs[0], Exe: m.Programs[0]}, {Graph: m.Graphs[1], Exe: rrs[0].Executable()}},
		ModelInfo{Name: dir, MaxPositions: m.Config.MaxPositionEmbeddings}, opts)
	if err != nil {
		t.Fatal(err)
	}
	got := generateAll(t, e, reqs)
	e.Close()
	for i := range reqs {
		if len(got[i]) != 6 || !slices.Equal(got[i], want[i]) {
			t.Errorf("request %d: remote rank 1 gives %v, in-process %v", i, got[i], want[i])
		}
	}
	if rrs[0].Close(); <-fs[0].done != nil {
		t.Error("the follower did not end cleanly")
	}

	// Both ranks launching steps ahead: rank 1 gets launches over the wire, samples the
	// same ids as rank 0 and feeds its next step from them.
	l0, a1 := &asyncLauncher{Executable: m.Programs[0]}, &asyncLauncher{Executable: m.Programs[1]}
	rrs, fs = startWorld(t, ctx, []Executable{a1}, l1.Cache)
	rrs[0].SetResident(cacheInputs(m.Graphs[1]))
	if !rrs[0].Launches() || launcherOf(rrs[0].Executable()) == nil {
		t.Fatal("the follower with a backend.Launcher does not say it launches")
	}
	e, err = NewRanks(ctx, []Rank{{Graph: m.Graphs[0], Exe: l0}, {Graph: m.Graphs[1], Exe: rrs[0].Executable()}},
		ModelInfo{Name: dir, MaxPositions: m.Config.MaxPositionEmbeddings}, opts)
	if err != nil {
		t.Fatal(err)
	}
	got = generateAll(t, e, reqs)
	ahead := e.Stats().AheadStepsTotal
	e.Close()
	for i := range reqs {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("request %d, steps launched ahead: remote rank 1 gives %v, in-process %v", i, got[i], want[i])
		}
	}
	if ahead == 0 || int64(a1.fed.Load()) != ahead || int64(l0.fed.Load()) != ahead {
		t.Errorf("%d steps launched ahead; rank 0 fed %d, rank 1 %d", ahead, l0.fed.Load(), a1.fed.Load())
	}
	if rrs[0].Close(); <-fs[0].done != nil {
		t.Error("the follower did not end cleanly")
	}
}
