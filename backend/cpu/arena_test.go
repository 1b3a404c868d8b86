package cpu

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// smallLayer is a decoder layer small enough for tests whose activations still exceed
// arenaMinBytes at a few tokens.
var smallLayer = layerDims{hidden: 128, heads: 4, kv: 2, headDim: 32, ffn: 384}

// arenaPrograms compiles g twice on w: one program runs with the arena, the other allocates
// every output from the Go heap (the behaviour before arena.go), as the reference.
func arenaPrograms(t *testing.T, g *graph.Graph, w MapWeights, lookup func(string) (Kernel, bool)) (withArena, heap *Program) {
	t.Helper()
	ctx := context.Background()
	var err error
	if withArena, err = compile(ctx, g, w, lookup); err != nil {
		t.Fatal(err)
	}
	if heap, err = compile(ctx, g, w, lookup); err != nil {
		t.Fatal(err)
	}
	heap.noArena = true
	return withArena, heap
}

func layerInputs(rng *rand.Rand, S int) map[string]*tensor.Tensor {
	return map[string]*tensor.Tensor{"h": randF32(rng, 1, S, smallLayer.hidden), "positions": positionsFrom(tensor.I32, S, 1, 3)}
}

// TestArenaSameBitsAndOutputsKept runs the plain and the fused layer with and without the
// arena over a sequence of runs of varying length (so buffers move between size classes and
// runs): every output has the same bits, and the outputs of every earlier run still hold the
// values they had when returned (no later run wrote into them).
func TestArenaSameBitsAndOutputsKept(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	w := layerWeights(rng, smallLayer)
	for _, tc := range []struct {
		name   string
		g      *graph.Graph
		mapped bool // some activation reaches offHeapBytes (the fused gate/up product at S=40)
	}{
		{"plain", plainLayer(t, smallLayer, tensor.F32), false},
		{"fused", fusedLayer(t, smallLayer, tensor.F32), true},
		{"fused-bf16", fusedLayer(t, smallLayer, tensor.BF16), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pa, ph := arenaPrograms(t, tc.g, w, Lookup)
			var kept, copies []*tensor.Tensor
			for i, S := range []int{16, 16, 40, 9, 16, 40} {
				in := layerInputs(rng, S)
				if tc.g.Inputs[0].Type.DType == tensor.BF16 {
					in["h"] = in["h"].Cast(tensor.BF16)
				}
				got := runBothSame(t, pa, ph, in, fmt.Sprintf("run %d (S=%d)", i, S))
				for j, k := range kept {
					if !equalBits(k, copies[j]) {
						t.Fatalf("after run %d: output of an earlier run (%d) changed", i, j)
					}
				}
				for j, o := range got {
					if pa.bufs.holds(storage(o)) {
						t.Fatalf("run %d: output %d lies in a buffer of the pool", i, j)
					}
					kept, copies = append(kept, o), append(copies, o.Clone())
				}
			}
			if pa.bufs.bytes == 0 {
				t.Errorf("the pool holds no buffer after the runs: nothing was pooled")
			}
			if mapped, heap := pa.bufs.kinds(); (tc.mapped && mapped == 0) || heap == 0 {
				t.Errorf("the pool holds %d mapped and %d heap buffers", mapped, heap)
			}
			if err := pa.Release(); err != nil {
				t.Fatal(err)
			}
			if mapped, heap := pa.bufs.kinds(); mapped+heap != 0 || pa.bufs.bytes != 0 {
				t.Errorf("after Release the pool holds %d mapped and %d heap buffers, %d bytes", mapped, heap, pa.bufs.bytes)
			}
		})
	}
}

// TestArenaReuse holds a warm run's fresh heap bytes to a small part of what the same run
// allocates without the arena, and its allocation count to at most that run's.
func TestArenaReuse(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	w := layerWeights(rng, smallLayer)
	pa, ph := arenaPrograms(t, fusedLayer(t, smallLayer, tensor.F32), w, Lookup)
	in := layerInputs(rng, 32)
	ctx := context.Background()
	heapBytes := func(p *Program) uint64 {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for range 4 {
			if _, err := p.Run(ctx, in); err != nil {
				t.Fatal(err)
			}
		}
		runtime.ReadMemStats(&after)
		return (after.TotalAlloc - before.TotalAlloc) / 4
	}
	if _, err := pa.Run(ctx, in); err != nil { // fills the pool
		t.Fatal(err)
	}
	with, without := heapBytes(pa), heapBytes(ph)
	t.Logf("bytes allocated a run: %d with the arena, %d without", with, without)
	if with*4 > without {
		t.Errorf("a warm run allocates %d bytes with the arena, %d without: want under a quarter", with, without)
	}
	allocs := func(p *Program) float64 {
		return testing.AllocsPerRun(5, func() {
			if _, err := p.Run(ctx, in); err != nil {
				t.Fatal(err)
			}
		})
	}
	if a, h := allocs(pa), allocs(ph); a > h {
		t.Errorf("%v allocations a run with the arena, %v without", a, h)
	}
}

// TestArenaAliasedResult runs a graph whose reshape kernel (a test stand-in that breaks the
// kernel contract on purpose) returns a view of its input: the input's buffer must stay
// taken while the view lives, although the input itself is released, so the add after it
// (which takes a buffer of the same size) cannot write into the view.
func TestArenaAliasedResult(t *testing.T) {
	viewReshape := func(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
		return []*tensor.Tensor{in[0].View(0, out[0].Shape...)}, nil
	}
	lookup := func(op string) (Kernel, bool) {
		if op == "reshape" {
			return viewReshape, true
		}
		return Lookup(op)
	}
	b := graph.NewBuilder("alias")
	x := b.Input("x", tensor.F32, graph.Dims(64, 32))
	a := b.Add(x, x)                            // from the arena
	r := b.Reshape(a, graph.D(32), graph.D(64)) // a view of a; a is released here
	c := b.Add(b.Reshape(x, graph.D(32), graph.D(64)), r)
	b.Output(b.Add(c, r), r)
	g := mustBuild(t, b)
	pa, ph := arenaPrograms(t, g, nil, lookup)
	rng := rand.New(rand.NewPCG(11, 12))
	for i := range 3 {
		in := map[string]*tensor.Tensor{"x": randF32(rng, 64, 32)}
		runBothSame(t, pa, ph, in, fmt.Sprintf("run %d", i))
	}
}

func TestSizeClass(t *testing.T) {
	for _, tc := range []struct{ bytes, words int }{
		{1, 1}, {8, 1}, {9, 2}, {64, 8}, {72, 9}, {128, 16}, {129, 18}, {136, 18}, {8 * 17, 18},
		{8 * 31, 32}, {8 * 33, 36}, {8 * 1000, 1024}, {8 * 1025, 1152}, {4096, 512},
	} {
		w := sizeClass(tc.bytes)
		if w != tc.words {
			t.Errorf("sizeClass(%d) = %d words, want %d", tc.bytes, w, tc.words)
		}
		if 8*w < tc.bytes || (tc.bytes > 64 && float64(8*w) > 1.125*float64(tc.bytes)+8) {
			t.Errorf("sizeClass(%d) = %d words: too small or over 12.5%% larger", tc.bytes, w)
		}
	}
}

// equalBits reports whether a and b have the same dtype, shape and storage bits.
func equalBits(a, b *tensor.Tensor) bool {
	if a.DType != b.DType || !slices.Equal(a.Shape, b.Shape) {
		return false
	}
	switch a.DType {
	case tensor.F32:
		for i, v := range a.F32 {
			if math.Float32bits(v) != math.Float32bits(b.F32[i]) {
				return false
			}
		}
		return len(a.F32) == len(b.F32)
	case tensor.BF16, tensor.F16:
		return slices.Equal(a.Half, b.Half)
	case tensor.I32:
		return slices.Equal(a.I32, b.I32)
	case tensor.I64:
		return slices.Equal(a.I64, b.I64)
	case tensor.Bool:
		return slices.Equal(a.Bool, b.Bool)
	}
	return slices.Equal(a.U8, b.U8)
}

// holds reports whether address at lies in one of the pool's free buffers.
func (p *bufPool) holds(at uintptr) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.free {
		for _, b := range l {
			if b.lo <= at && at < b.hi {
				return true
			}
		}
	}
	return false
}

// kinds counts the pool's free buffers mapped outside the heap and in the heap.
func (p *bufPool) kinds() (mapped, heap int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.free {
		for _, b := range l {
			if b.mapped != nil {
				mapped++
			} else {
				heap++
			}
		}
	}
	return mapped, heap
}

// TestArenaConcurrentRuns runs one program from several goroutines at once (they share its
// pool): each run's outputs have the bits of the run without the arena on the same inputs.
func TestArenaConcurrentRuns(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	w := layerWeights(rng, smallLayer)
	pa, ph := arenaPrograms(t, fusedLayer(t, smallLayer, tensor.F32), w, Lookup)
	const n = 4
	ins := make([]map[string]*tensor.Tensor, n)
	wants := make([][]*tensor.Tensor, n)
	for i := range ins {
		ins[i] = layerInputs(rng, 24+8*i)
		var err error
		if wants[i], err = ph.Run(context.Background(), ins[i]); err != nil {
			t.Fatal(err)
		}
	}
	errs := make(chan error, n)
	for i := range n {
		go func() {
			for range 3 {
				got, err := pa.Run(context.Background(), ins[i])
				if err == nil && !equalBits(got[0], wants[i][0]) {
					err = fmt.Errorf("run on input %d: output differs from the run without the arena", i)
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// runBothSame runs in through pa (with the arena) and ph (without) and fails unless every
// output has the same bits; it returns pa's outputs.
func runBothSame(t *testing.T, pa, ph *Program, in map[string]*tensor.Tensor, what string) []*tensor.Tensor {
	t.Helper()
	got, err := pa.Run(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	want, err := ph.Run(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	for j := range want {
		if !equalBits(got[j], want[j]) {
			t.Fatalf("%s: output %d differs from the run without the arena", what, j)
		}
	}
	return got
}
