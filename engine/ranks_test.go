package engine

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/loom-ml/loom/backend/cpu"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/dist/local"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform"
)

// Tests of deployments on several ranks: every rank a goroutine, collectives through
// dist/local.

// wholeSequences keeps the optimized graph on whole sequences (no paged KV cache), so that
// runAll and GreedyRecompute drive it like the plain graph.
var wholeSequences = transform.Flags{Sets: []string{"transforms." + transform.InsertCachedAttention.Name + ".enabled=false"}}

func mustMeshFor(t testing.TB, worldSize int, mesh string) dist.Mesh {
	t.Helper()
	m, err := MeshFor(worldSize, mesh)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestHuggingFaceParityTP holds every fixture, sharded for tp = 1, 2 and 4, to Hugging
// Face's logits (last position within parity.LogitTol, every position too) and greedy tokens, as
// TestHuggingFaceParity does for the plain graph. tiny-gqa6 (6 heads, 1 KV head) replicates
// its KV head at tp=2 and 4 and falls back to replicated attention at tp=4.
func TestHuggingFaceParityTP(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every fixture at three tp sizes")
	}
	for _, name := range supportedFixtures {
		for _, tp := range []int{1, 2, 4} {
			t.Run(fmt.Sprintf("%s/tp=%d", name, tp), func(t *testing.T) {
				dir := filepath.Join("..", "testdata", name)
				ref := loadReference(t, dir)
				m, err := Load(context.Background(), dir, LoadOptions{Optimize: true, Transforms: wholeSequences, Mesh: mustMeshFor(t, tp, "")})
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				if got := len(m.Ranks()); got != tp {
					t.Fatalf("%d ranks, want %d", got, tp)
				}
				if got := m.Program.(*cpu.Program).Ranks(); got != tp {
					t.Errorf("the program needs %d ranks, want %d", got, tp)
				}
				exe := m.Executable()
				for _, p := range ref.Prompts {
					logits, _ := runAll(t, exe, p.IDs)
					checkLogits(t, logits, p)
					checkGreedy(t, forcedGen(t, exe, p), p)
				}
			})
		}
	}
}

// runOn compiles rank graphs for mesh and runs every rank on its own ids (ids[r]),
// concurrently; it returns each rank's logits [S*vocab].
func runOn(t *testing.T, graphs []*graph.Graph, w *model.Checkpoint, mesh dist.Mesh, ids [][]int) [][]float32 {
	t.Helper()
	progs, err := cpu.CompileRanks(context.Background(), graphs, w, mesh)
	if err != nil {
		t.Fatal(err)
	}
	out := make([][]float32, len(progs))
	errs := make([]error, len(progs))
	var wg sync.WaitGroup
	for r, p := range progs {
		wg.Go(func() {
			in, pos := make([]int32, len(ids[r])), make([]int32, len(ids[r]))
			for i, id := range ids[r] {
				in[i], pos[i] = int32(id), int32(i)
			}
			res, err := p.Run(context.Background(), map[string]*tensor.Tensor{
				"input_ids": tensor.FromI32(in, 1, len(in)), "positions": tensor.FromI32(pos, 1, len(pos)),
			})
			if err != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
				return
			}
			out[r] = res[0].Float32s()
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// rankGraphs optimizes a fixture for mesh on whole sequences, with extra --set flags.
func rankGraphs(t *testing.T, m *model.Model, mesh dist.Mesh, sets ...string) []*graph.Graph {
	t.Helper()
	g, err := model.BuildGraph(m.Config, model.BuildOptions{Tensors: m.Checkpoint})
	if err != nil {
		t.Fatal(err)
	}
	flags := transform.Flags{Sets: append(slices.Clone(wholeSequences.Sets), sets...)}
	graphs, _, err := OptimizeRanks(context.Background(), &flags, m, g, mesh)
	if err != nil {
		t.Fatal(err)
	}
	return graphs
}

// TestMesh2D runs tiny-llama on 4 ranks as tp=2,dp=2, each dp replica on a prompt of its own:
// both replicas must give their single-rank logits, so every collective stays inside its tp
// group. Then the same graphs, with their collectives bound to the whole world instead of
// tp, must give wrong logits: the test would catch a subgroup collective that silently ran
// over every rank.
func TestMesh2D(t *testing.T) {
	m, err := model.Open(filepath.Join("..", "testdata", "tiny-llama"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	prompts := [][]int{{1, 5, 9, 3, 7, 2, 8, 4}, {6, 11, 13, 12, 40, 41, 17, 99}} // dp replica 0, 1
	one := rankGraphs(t, m, dist.Mesh{})
	var single [][]float32
	for _, p := range prompts {
		single = append(single, runOn(t, one, m.Checkpoint, mustMeshFor(t, 1, "tp=1"), [][]int{p})[0])
	}
	if d, _ := maxAbsDiff(single[0], single[1]); d < 0.1 {
		t.Fatalf("the two prompts give nearly the same logits (%.2g apart): the test could not tell them apart", d)
	}
	mesh := mustMeshFor(t, 4, "tp=2,dp=2")
	replicaOf := func(r int) int { c, _ := mesh.Coords(r); return c[1] }
	ids := make([][]int, 4)
	for r := range ids {
		ids[r] = prompts[replicaOf(r)]
	}
	check := func(t *testing.T, graphs []*graph.Graph) {
		t.Helper()
		for r, logits := range runOn(t, graphs, m.Checkpoint, mesh, ids) {
			if d, at := maxAbsDiff(logits, single[replicaOf(r)]); d > 1e-4 {
				t.Errorf("rank %d (dp replica %d): logits differ from one rank's by %.2e at %d", r, replicaOf(r), d, at)
			}
		}
	}
	t.Run("default", func(t *testing.T) {
		graphs := rankGraphs(t, m, mesh)
		if len(graphs) != 4 {
			t.Fatalf("%d rank graphs, want 4", len(graphs))
		}
		check(t, graphs)
	})
	t.Run("teeth", func(t *testing.T) {
		// Only all_reduces, whose shapes do not depend on the group's size, so that the
		// graphs can be bound to the world as they are.
		graphs := rankGraphs(t, m, mesh, "transforms.rewrite_all_gather_as_all_reduce.enabled=true")
		check(t, graphs)
		var world []*graph.Graph
		collectives := 0
		for _, g := range graphs {
			w := g.Clone()
			for _, n := range w.Nodes {
				if spec := n.Spec(); spec != nil && spec.Collective {
					n.Attrs["group"], n.Attrs["group_size"] = dist.WorldAxis, mesh.Size()
					collectives++
				}
			}
			if err := graph.Verify(w); err != nil {
				t.Fatal(err)
			}
			world = append(world, w)
		}
		if collectives == 0 {
			t.Fatal("no collectives to bind to the world")
		}
		for r, logits := range runOn(t, world, m.Checkpoint, mesh, ids) {
			d, _ := maxAbsDiff(logits, single[replicaOf(r)])
			if d < 1e-2 {
				t.Errorf("rank %d: with its collectives bound to the whole world the logits still match one rank's (off by %.2e): the 2-D mesh test has no teeth", r, d)
				continue
			}
			t.Logf("rank %d: collectives bound to the world mix the dp replicas' partial sums: logits off by %.2g, as they must be", r, d)
		}
	})
}

// paramBytes is what a rank graph's params read: each param node's slice.
func paramBytes(t *testing.T, g *graph.Graph) (total int64, sliced map[string]int64) {
	t.Helper()
	sliced = map[string]int64{}
	for _, n := range g.Params() {
		ref, err := graph.ParamOf(n)
		if err != nil {
			t.Fatal(err)
		}
		b := int64(ref.DType.Size())
		for _, d := range ref.LocalShape() {
			b *= int64(d)
		}
		total += b
		if ref.SliceDim >= 0 && ref.SliceCount > 1 {
			sliced[ref.Key] += b
		}
	}
	return total, sliced
}

// TestRankWeightBytes loads each rank of tiny-llama (and tiny-llama31, tied embeddings) at
// tp=2 and tp=4 from a checkpoint of its own and counts the bytes it reads
// (Checkpoint.BytesRead): exactly its graph's slices, less than the whole checkpoint, and
// over all ranks, every split weight read once in all.
func TestRankWeightBytes(t *testing.T) {
	for _, name := range []string{"tiny-llama", "tiny-llama31"} {
		for _, tp := range []int{2, 4} {
			t.Run(fmt.Sprintf("%s/tp=%d", name, tp), func(t *testing.T) {
				dir := filepath.Join("..", "testdata", name)
				m, err := model.Open(dir)
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				var whole int64
				for _, key := range m.Checkpoint.Names() {
					info, _ := m.Checkpoint.Info(key)
					n := int64(info.DType.Size())
					for _, d := range info.Shape {
						n *= int64(d)
					}
					whole += n
				}
				mesh := mustMeshFor(t, tp, "")
				graphs := rankGraphs(t, m, mesh)
				comms, err := local.New(tp, local.Options{})
				if err != nil {
					t.Fatal(err)
				}
				splitTotal := map[string]int64{}
				for r, g := range graphs {
					ck, err := model.OpenCheckpoint(dir)
					if err != nil {
						t.Fatal(err)
					}
					if _, err := cpu.CompileWith(context.Background(), g, ck, cpu.Options{Comm: comms[r], Mesh: mesh}); err != nil {
						t.Fatal(err)
					}
					want, sliced := paramBytes(t, g)
					if got := ck.BytesRead(); got != want {
						t.Errorf("rank %d read %d bytes, its params hold %d", r, got, want)
					}
					if want >= whole {
						t.Errorf("rank %d read %d bytes, the whole checkpoint is %d", r, want, whole)
					}
					for k, b := range sliced {
						splitTotal[k] += b
					}
					t.Logf("rank %d read %d of %d bytes", r, ck.BytesRead(), whole)
					ck.Close()
				}
				if len(splitTotal) == 0 {
					t.Fatal("no param was split")
				}
				for key, b := range splitTotal {
					info, _ := m.Checkpoint.Info(key)
					n := int64(info.DType.Size())
					for _, d := range info.Shape {
						n *= int64(d)
					}
					// Replicated KV heads (2 heads at tp=4) are read by two ranks each.
					if b != n && !(strings.Contains(key, "k_proj") || strings.Contains(key, "v_proj")) {
						t.Errorf("%s: the ranks read %d bytes of it in all, it has %d", key, b, n)
					}
				}
			})
		}
	}
}

// TestEngineOnRanks runs the continuous-batching engine on tiny-llama at tp=2 (each rank its
// own KV cache of its local KV heads) and holds its tokens to one rank's greedy recompute.
func TestEngineOnRanks(t *testing.T) {
	dir := filepath.Join("..", "testdata", "tiny-llama")
	m, err := Load(context.Background(), dir, LoadOptions{Optimize: true, Mesh: mustMeshFor(t, 2, "")})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	e, err := New(context.Background(), m, Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ref := cachedModel(t, "tiny-llama")
	for _, prompt := range [][]int{{1, 5, 9, 3}, {7, 2, 8, 4, 6, 11, 13}} {
		want, err := GreedyRecompute(context.Background(), ref.Program, prompt, 6)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := generate(t, e, Request{Prompt: prompt, MaxTokens: 6, IgnoreEOS: true})
		if !slices.Equal(got, want.NewIDs) {
			t.Errorf("prompt %v: tp=2 engine %v, one rank %v", prompt, got, want.NewIDs)
		}
	}
}

func TestMeshFor(t *testing.T) {
	for _, c := range []struct {
		world int
		mesh  string
		want  string
		err   string
	}{
		{0, "", "", ""},
		{1, "", "", ""},
		{4, "", "tp=4", ""},
		{0, "tp=2,dp=2", "tp=2,dp=2", ""},
		{4, "tp=2,dp=2", "tp=2,dp=2", ""},
		{2, "tp=2,dp=2", "", "world size 2, but mesh \"tp=2,dp=2\" has 4 ranks"},
		{0, "tp=two", "", "size of axis"},
		{-1, "", "", "world size -1"},
	} {
		m, err := MeshFor(c.world, c.mesh)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("MeshFor(%d, %q) = %v, want an error containing %q", c.world, c.mesh, err, c.err)
		case c.err == "" && (err != nil || m.String() != c.want):
			t.Errorf("MeshFor(%d, %q) = %q, %v; want %q", c.world, c.mesh, m, err, c.want)
		}
	}
	_, err := Load(context.Background(), filepath.Join("..", "testdata", "tiny-llama"), LoadOptions{Mesh: mustMeshFor(t, 2, "")})
	if err == nil || !strings.Contains(err.Error(), "needs the optimizer") {
		t.Errorf("Load of 2 ranks without the optimizer: %v", err)
	}
}
