package cuda

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tensor"
)

// nextTokenGraph is a model whose greedy next token is known: logits[0,s,:] is row
// input_ids[0,s] of a table whose row t peaks at next(t) (and is below it elsewhere).
func nextTokenGraph(t *testing.T, V int, next func(int) int) *graph.Graph {
	t.Helper()
	table := make([]float64, V*V)
	for r := range V {
		for c := range V {
			table[r*V+c] = float64((c*7+r)%5) * 0.1
		}
		table[r*V+next(r)] = 2
	}
	b := graph.NewBuilder("next_token")
	ids := b.Input("input_ids", tensor.I32, graph.Shape{graph.D(1), graph.Sym("S")})
	b.Output(b.Embedding(b.Const(tensor.F32, graph.Dims(V, V), table...), ids))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// TestLaunchFeedsSampledIDs chains launches that take their input_ids from the previous
// launch's sampled ids, two in flight at a time, and checks every step's ids against the
// host's chain of next tokens; in CUDA graphs and eagerly, greedy and through the sampling
// kernel (top-1, so that the draw is known).
func TestLaunchFeedsSampledIDs(t *testing.T) {
	d := gpu(t)
	const V = 97
	next := func(tok int) int { return (tok*5 + 3) % V }
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		graphs bool
		draw   sample.DeviceDraw
	}{
		{"graphs greedy", true, sample.DeviceDraw{}},
		{"eager greedy", false, sample.DeviceDraw{}},
		{"graphs top-1 sampling draw", true, sample.DeviceDraw{Temperature: 0.7, TopK: 1, Seed: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Compile(ctx, d, nextTokenGraph(t, V, next), nil, &Options{Graphs: tc.graphs})
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			start := []int32{5, 0, 96}
			draws := []sample.DeviceDraw{tc.draw, tc.draw, tc.draw}
			in := map[string]*tensor.Tensor{"input_ids": tensor.FromI32(start, 1, 3)}
			ignored := map[string]*tensor.Tensor{"input_ids": tensor.FromI32([]int32{-1, -1, -1}, 1, 3)}
			want := slices.Clone(start)
			step := func() {
				for i := range want {
					want[i] = int32(next(int(want[i])))
				}
			}
			prev, err := p.Launch(ctx, in, LaunchOptions{Draws: draws, Download: true})
			if err != nil {
				t.Fatal(err)
			}
			for k := range 8 {
				cur, err := p.Launch(ctx, ignored, LaunchOptions{Draws: draws, FeedIDs: true, Download: true})
				if err != nil {
					t.Fatalf("step %d: %v", k+1, err)
				}
				if k == 0 {
					if _, err := p.Launch(ctx, in, LaunchOptions{Draws: draws}); err == nil || !strings.Contains(err.Error(), "two launches are in flight") {
						t.Errorf("a third launch in flight: err = %v", err)
					}
				}
				ids, err := prev.Wait(ctx)
				if err != nil {
					t.Fatalf("step %d: %v", k, err)
				}
				step()
				if !slices.Equal(ids, want) {
					t.Fatalf("step %d: ids %v, want %v", k, ids, want)
				}
				if k == 0 {
					if _, err := prev.Wait(ctx); err == nil {
						t.Error("a second Wait of one launch did not fail")
					}
				}
				prev = cur
			}
			ids, err := prev.Wait(ctx)
			step()
			if err != nil || !slices.Equal(ids, want) {
				t.Fatalf("last step: ids %v, %v; want %v", ids, err, want)
			}
			// A launch that samples but does not download feeds the next one all the same.
			l, err := p.Launch(ctx, ignored, LaunchOptions{Draws: draws, FeedIDs: true})
			if err != nil {
				t.Fatal(err)
			}
			if ids, err := l.Wait(ctx); err != nil || ids != nil {
				t.Fatalf("no download: ids %v, %v; want none", ids, err)
			}
			step()
			if ids, err := p.RunSampled(ctx, map[string]*tensor.Tensor{"input_ids": tensor.FromI32(want, 1, 3)}, draws); err != nil || !slices.Equal(ids, []int32{int32(next(int(want[0]))), int32(next(int(want[1]))), int32(next(int(want[2])))}) {
				t.Fatalf("RunSampled after the chain: %v, %v", ids, err)
			}
			if busy, n := p.DeviceTime(); n != 11 || busy <= 0 {
				t.Errorf("DeviceTime = %v over %d runs, want 11 runs", busy, n)
			}
		})
	}
}

// TestLaunchFeedErrors checks that a feed without a previous sampling launch, or of a
// different number of tokens, is an error that names input_ids, and that the program can
// launch again afterwards.
func TestLaunchFeedErrors(t *testing.T) {
	d := gpu(t)
	ctx := context.Background()
	p, err := Compile(ctx, d, nextTokenGraph(t, 11, func(t int) int { return (t + 1) % 11 }), nil, &Options{Graphs: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	two := map[string]*tensor.Tensor{"input_ids": tensor.FromI32([]int32{1, 2}, 1, 2)}
	three := map[string]*tensor.Tensor{"input_ids": tensor.FromI32([]int32{1, 2, 3}, 1, 3)}
	greedy := func(n int) []sample.DeviceDraw { return make([]sample.DeviceDraw, n) }
	if _, err := p.Launch(ctx, two, LaunchOptions{Draws: greedy(2), FeedIDs: true}); err == nil || !strings.Contains(err.Error(), "input_ids") {
		t.Errorf("feed with nothing sampled before: err = %v", err)
	}
	l, err := p.Launch(ctx, two, LaunchOptions{Draws: greedy(2), Download: true})
	if err != nil {
		t.Fatal(err)
	}
	if ids, err := l.Wait(ctx); err != nil || !slices.Equal(ids, []int32{2, 3}) {
		t.Fatalf("ids %v, %v; want [2 3]", ids, err)
	}
	if _, err := p.Launch(ctx, three, LaunchOptions{Draws: greedy(3), FeedIDs: true}); err == nil || !strings.Contains(err.Error(), "input_ids") {
		t.Errorf("feed of 3 tokens from 2 sampled ids: err = %v", err)
	}
	if _, err := p.Launch(ctx, two, LaunchOptions{Draws: greedy(3)}); err == nil {
		t.Error("3 draws for 2 rows of logits did not fail")
	}
	if ids, err := p.RunSampled(ctx, three, greedy(3)); err != nil || !slices.Equal(ids, []int32{2, 3, 4}) {
		t.Fatalf("after the errors: ids %v, %v; want [2 3 4]", ids, err)
	}
}
