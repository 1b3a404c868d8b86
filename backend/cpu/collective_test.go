package cpu

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/dist/local"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// world makes n local communicators for a test.
func world(t *testing.T, n int) []dist.Communicator {
	t.Helper()
	comms, err := local.New(n, local.Options{Timeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]dist.Communicator, n)
	for i, c := range comms {
		out[i] = c
	}
	return out
}

// compileRanks compiles g once per rank of mesh (g(rank) builds each rank's graph).
func compileRanks(t *testing.T, g func(rank int) *graph.Graph, w MapWeights, mesh dist.Mesh) []*Program {
	t.Helper()
	comms := world(t, mesh.Size())
	progs := make([]*Program, len(comms))
	for r, c := range comms {
		p, err := CompileWith(context.Background(), g(r), w, Options{Comm: c, Mesh: mesh})
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		progs[r] = p
	}
	return progs
}

// runRanks runs every rank's program concurrently on its inputs and returns each rank's outputs.
func runRanks(t *testing.T, progs []*Program, inputs func(rank int) map[string]*tensor.Tensor) [][]*tensor.Tensor {
	t.Helper()
	outs := make([][]*tensor.Tensor, len(progs))
	errs := make([]error, len(progs))
	var wg sync.WaitGroup
	for r, p := range progs {
		wg.Go(func() { outs[r], errs[r] = p.Run(context.Background(), inputs(r)) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return outs
}

func mustMesh(t *testing.T, s string) dist.Mesh {
	t.Helper()
	m, err := dist.ParseMesh(s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func randCollF32(rng *rand.Rand, shape ...int) *tensor.Tensor {
	x := tensor.New(tensor.F32, shape...)
	for i := range x.F32 {
		x.F32[i] = rng.Float32()*2 - 1
	}
	return x
}

// sumInOrder adds the tensors elementwise in f32, in the order given: what every rank of an
// all_reduce gets.
func sumInOrder(ts ...*tensor.Tensor) *tensor.Tensor {
	s := ts[0].Clone()
	for _, t := range ts[1:] {
		for i := range s.F32 {
			s.F32[i] += t.F32[i]
		}
	}
	return s
}

func sameF32(t *testing.T, what string, got, want *tensor.Tensor) {
	t.Helper()
	if !slices.Equal(got.Shape, want.Shape) {
		t.Fatalf("%s: shape %v, want %v", what, got.Shape, want.Shape)
	}
	g, w := got.Float32s(), want.Float32s()
	for i := range w {
		if g[i] != w[i] {
			t.Fatalf("%s: element %d = %v, want %v (exactly)", what, i, g[i], w[i])
		}
	}
}

// TestCollectiveKernels runs every plain collective on a 2-D mesh tp=2,dp=2 over the tp
// axis: each dp replica reduces and gathers among its own two ranks only.
func TestCollectiveKernels(t *testing.T) {
	mesh := mustMesh(t, "tp=2,dp=2")
	tp := graph.Attrs{"group": "tp", "group_size": 2}
	with := func(extra graph.Attrs) graph.Attrs {
		a := tp.Clone()
		for k, v := range extra {
			a[k] = v
		}
		return a
	}
	b := graph.NewBuilder("collectives")
	x := b.Input("x", tensor.F32, graph.Dims(3, 4))
	b.Output(
		b.Op("all_reduce", tp, x),
		b.Op("all_gather", with(graph.Attrs{"axis": -1}), x),
		b.Op("reduce_scatter", with(graph.Attrs{"axis": 1}), x),
		b.Op("all_to_all", with(graph.Attrs{"split_axis": 1, "concat_axis": 0}), x),
		b.Op("all_reduce", with(graph.Attrs{"op": "max", "strategy": "twoshot"}), x),
	)
	g := mustBuild(t, b)
	if got := graph.CollectiveRanks(g); got != 2 {
		t.Fatalf("CollectiveRanks = %d, want 2", got)
	}
	progs := compileRanks(t, func(int) *graph.Graph { return g }, nil, mesh)
	rng := rand.New(rand.NewPCG(1, 2))
	xs := make([]*tensor.Tensor, 4)
	for r := range xs {
		xs[r] = randCollF32(rng, 3, 4)
	}
	outs := runRanks(t, progs, func(r int) map[string]*tensor.Tensor { return map[string]*tensor.Tensor{"x": xs[r]} })
	for r, o := range outs {
		if progs[r].Ranks() != 2 {
			t.Errorf("rank %d: Ranks = %d, want 2", r, progs[r].Ranks())
		}
		g0, g1 := (r/2)*2, (r/2)*2+1 // the tp group of r
		idx := r % 2
		sum := sumInOrder(xs[g0], xs[g1])
		sameF32(t, fmt.Sprintf("rank %d all_reduce", r), o[0], sum)
		gath := tensor.New(tensor.F32, 3, 8)
		for i := range 3 {
			copy(gath.F32[i*8:i*8+4], xs[g0].F32[i*4:i*4+4])
			copy(gath.F32[i*8+4:i*8+8], xs[g1].F32[i*4:i*4+4])
		}
		sameF32(t, fmt.Sprintf("rank %d all_gather", r), o[1], gath)
		rs := tensor.New(tensor.F32, 3, 2)
		for i := range 3 {
			copy(rs.F32[i*2:i*2+2], sum.F32[i*4+2*idx:i*4+2*idx+2])
		}
		sameF32(t, fmt.Sprintf("rank %d reduce_scatter", r), o[2], rs)
		a2a := tensor.New(tensor.F32, 6, 2)
		for j, src := range []*tensor.Tensor{xs[g0], xs[g1]} {
			for i := range 3 {
				copy(a2a.F32[(j*3+i)*2:(j*3+i)*2+2], src.F32[i*4+2*idx:i*4+2*idx+2])
			}
		}
		sameF32(t, fmt.Sprintf("rank %d all_to_all", r), o[3], a2a)
		mx := xs[g0].Clone()
		for i := range mx.F32 {
			mx.F32[i] = max(mx.F32[i], xs[g1].F32[i])
		}
		sameF32(t, fmt.Sprintf("rank %d all_reduce max", r), o[4], mx)
	}
	// The inputs are the caller's: all_reduce works on a copy.
	if xs[0].F32[0] == outs[0][0].F32[0] && xs[1].F32[0] != 0 {
		t.Errorf("all_reduce changed its input")
	}
}

// TestFusedCollectiveKernels holds linear_all_reduce (with and without overlapped chunks) and
// all_reduce_add_rmsnorm to their decompositions run rank by rank and summed in rank order.
func TestFusedCollectiveKernels(t *testing.T) {
	const M, K, N = 5, 24, 40
	rng := rand.New(rand.NewPCG(3, 4))
	ws := MapWeights{"w": randCollF32(rng, N, 2*K), "norm": randCollF32(rng, N)}
	for r := range 2 {
		ws[fmt.Sprintf("w%d", r)] = randCollF32(rng, N, K)
	}
	build := func(rank int) *graph.Graph {
		b := graph.NewBuilder("fused")
		x := b.Input("x", tensor.F32, graph.Shape{graph.Sym("S"), graph.D(K)})
		res := b.Input("res", tensor.F32, graph.Shape{graph.Sym("S"), graph.D(N)})
		w := b.Op(graph.OpParam, graph.Attrs{"key": "w", "dtype": tensor.F32, "shape": graph.Dims(N, 2*K), "slice_dim": 1, "slice_index": rank, "slice_count": 2})
		nw := b.Param("norm", tensor.F32, graph.Dims(N))
		y := b.Op("linear_all_reduce", graph.Attrs{"group": "tp", "group_size": 2}, x, w)
		outs := b.Apply("all_reduce_add_rmsnorm", graph.Attrs{"group": "tp", "group_size": 2, "eps": 1e-5}, b.Linear(x, w), res, nw)
		b.Output(y, outs[0], outs[1])
		return mustBuild(t, b)
	}
	xs := []*tensor.Tensor{randCollF32(rng, M, K), randCollF32(rng, M, K)}
	res := randCollF32(rng, M, N)
	// What the decompositions give: each rank's linear on its slice, summed in rank order.
	ys := make([]*tensor.Tensor, 2)
	for r := range 2 {
		b := graph.NewBuilder("one")
		x := b.Input("x", tensor.F32, graph.Shape{graph.Sym("S"), graph.D(K)})
		w := b.Op(graph.OpParam, graph.Attrs{"key": "w", "dtype": tensor.F32, "shape": graph.Dims(N, 2*K), "slice_dim": 1, "slice_index": r, "slice_count": 2})
		b.Output(b.Linear(x, w))
		out, err := mustCompile(t, mustBuild(t, b), ws).Run(context.Background(), map[string]*tensor.Tensor{"x": xs[r]})
		if err != nil {
			t.Fatal(err)
		}
		ys[r] = out[0]
	}
	want := sumInOrder(ys[0], ys[1])
	nb := graph.NewBuilder("norm")
	s := nb.Input("s", tensor.F32, graph.Shape{graph.D(M), graph.D(N)})
	rr := nb.Input("r", tensor.F32, graph.Shape{graph.D(M), graph.D(N)})
	nb.Output(nb.Apply("add_rmsnorm", graph.Attrs{"eps": 1e-5}, s, rr, nb.Param("norm", tensor.F32, graph.Dims(N)))...)
	wantNorm, err := mustCompile(t, mustBuild(t, nb), ws).Run(context.Background(), map[string]*tensor.Tensor{"s": want, "r": res})
	if err != nil {
		t.Fatal(err)
	}
	for _, chunk := range []int{0, 64} { // one piece; pieces of 64 bytes (several chunks)
		t.Run(fmt.Sprintf("chunk=%d", chunk), func(t *testing.T) {
			prev := OverlapChunkBytes
			OverlapChunkBytes = chunk
			defer func() { OverlapChunkBytes = prev }()
			if n := len(overlapChunks(M, N, 4)); (chunk == 0) != (n == 1) {
				t.Fatalf("%d chunks with OverlapChunkBytes=%d", n, chunk)
			}
			progs := compileRanks(t, build, ws, mustMesh(t, "tp=2"))
			outs := runRanks(t, progs, func(r int) map[string]*tensor.Tensor {
				return map[string]*tensor.Tensor{"x": xs[r], "res": res}
			})
			for r, o := range outs {
				sameF32(t, fmt.Sprintf("rank %d linear_all_reduce", r), o[0], want)
				sameF32(t, fmt.Sprintf("rank %d all_reduce_add_rmsnorm norm", r), o[1], wantNorm[0])
				sameF32(t, fmt.Sprintf("rank %d all_reduce_add_rmsnorm sum", r), o[2], wantNorm[1])
			}
		})
	}
}

func TestOverlapChunks(t *testing.T) {
	prev := OverlapChunkBytes
	defer func() { OverlapChunkBytes = prev }()
	OverlapChunkBytes = 1 << 10
	for _, c := range []struct{ M, N, want int }{{1, 64, 1}, {16, 64, 4}, {128, 4096, maxOverlapChunks}, {64, 6, 1}} {
		got := overlapChunks(c.M, c.N, 4)
		if len(got) != c.want {
			t.Errorf("M=%d N=%d: %d chunks %v, want %d", c.M, c.N, len(got), got, c.want)
		}
		next := 0
		for _, ch := range got {
			if ch[0] != next || ch[1] <= ch[0] || (ch[1] != c.N && (ch[1]-ch[0])%4 != 0) {
				t.Errorf("M=%d N=%d: chunks %v do not tile [0,%d) in fours", c.M, c.N, got, c.N)
			}
			next = ch[1]
		}
		if next != c.N {
			t.Errorf("M=%d N=%d: chunks %v end at %d", c.M, c.N, got, next)
		}
	}
}

// TestCollectiveCompileErrors: a program refuses to compile for a communicator or mesh of
// another size, and says both numbers.
func TestCollectiveCompileErrors(t *testing.T) {
	b := graph.NewBuilder("tp2")
	x := b.Input("x", tensor.F32, graph.Shape{graph.D(4)})
	b.Output(b.Op("all_reduce", graph.Attrs{"group": "tp", "group_size": 2}, x))
	g := mustBuild(t, b)
	ctx := context.Background()
	four := world(t, 4)
	for _, c := range []struct {
		name string
		opts Options
		want string
	}{
		{"no communicator", Options{}, "the graph needs 2 ranks (its largest collective group) and no communicator was given"},
		{"communicator of 4", Options{Comm: four[1]}, "the graph needs 2 ranks (its largest collective group), the communicator has 4"},
		{"mesh tp=4", Options{Comm: four[1], Mesh: mustMesh(t, "tp=4")}, `the graph was built for group_size 2, mesh "tp=4" has tp=4`},
		{"mesh without tp", Options{Comm: four[1], Mesh: mustMesh(t, "dp=4")}, `mesh "dp=4" has no axis "tp"`},
		{"mesh of 2, communicator of 4", Options{Comm: four[1], Mesh: mustMesh(t, "tp=2")}, `mesh "tp=2" has 2 ranks, the communicator has 4`},
		{"mesh without a communicator", Options{Mesh: mustMesh(t, "tp=2")}, "needs 2 ranks"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := CompileWith(ctx, g, nil, c.opts)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("CompileWith = %v, want an error containing %q", err, c.want)
			}
		})
	}
	if _, err := Compile(ctx, g, nil); err == nil || !strings.Contains(err.Error(), "needs 2 ranks") {
		t.Errorf("Compile = %v, want the ranks the graph needs", err)
	}
	// A group of one rank needs no communicator: the identity.
	b = graph.NewBuilder("tp1")
	x = b.Input("x", tensor.F32, graph.Shape{graph.D(2)})
	b.Output(b.Op("all_gather", graph.Attrs{"group": "tp", "group_size": 1, "axis": 0}, b.Op("all_reduce", graph.Attrs{"group": "tp", "group_size": 1}, x)))
	p := mustCompile(t, mustBuild(t, b), nil)
	if p.Ranks() != 1 {
		t.Errorf("Ranks = %d, want 1", p.Ranks())
	}
	in := tensor.FromF32([]float32{1, 2}, 2)
	out, err := p.Run(ctx, map[string]*tensor.Tensor{"x": in})
	if err != nil {
		t.Fatal(err)
	}
	sameF32(t, "tp=1", out[0], in)
	if out[0] == in {
		t.Errorf("the identity returned its input")
	}
}
