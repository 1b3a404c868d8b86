package transform_test

import (
	"context"
	"math"
	"path/filepath"
	"slices"
	"testing"

	"github.com/loom-ml/loom/backend/cpu"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/internal/parity"
	"github.com/loom-ml/loom/model"
	_ "github.com/loom-ml/loom/model/all" // register every frontend
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform"
)

// fixture is a testdata checkpoint and the match counts the default pipeline must report on
// it: every pattern found once per place the frontend wrote it.
type fixture struct {
	name    string
	layers  int
	gqa     bool // KV heads fewer than query heads: repeat_kv matches twice per layer
	qkNorm  bool // Qwen3: two more norms per layer
	qkvBias bool // Qwen2: the q/k/v biases sit between the fused linear and qkv_rope
}

var fixtures = []fixture{
	{name: "tiny-llama", layers: 2, gqa: true},
	{name: "tiny-llama31", layers: 2, gqa: true},
	{name: "tiny-llama2", layers: 2},
	{name: "tiny-mistral", layers: 2, gqa: true},
	{name: "tiny-qwen2", layers: 2, gqa: true, qkvBias: true},
	{name: "tiny-qwen3", layers: 2, gqa: true, qkNorm: true},
	{name: "tiny-gqa6", layers: 2, gqa: true},
}

// wantMatches is what each transform of the default pipeline must report on f.
func (f fixture) wantMatches() map[string]int {
	l := f.layers
	want := map[string]int{
		"match_rmsnorm_pattern": 2*l + 1,
		"match_rope_pattern":    l,
		"match_repeat_kv":       0,
		"match_eager_attention": l,
		"match_swiglu_pattern":  l,
		"fuse_gemms":            2 * l, // q/k/v and gate/up
		"fuse_add_rmsnorm":      2 * l, // every residual add but the embedding's is normed next
		"fuse_qkv_rope":         l,
		"fuse_split_swiglu":     l,
		"fuse_linear_qkv_rope":  l,
		"fuse_linear_swiglu":    l,
	}
	if f.qkNorm {
		want["match_rmsnorm_pattern"] += 2 * l
		want["fuse_linear_qkv_rope"] = 0 // qkv_norm_rope, which no linear takes in its epilogue
	}
	if f.qkvBias {
		want["fuse_linear_qkv_rope"] = 0
	}
	if f.gqa {
		want["match_repeat_kv"] = 2 * l
	}
	return want
}

// wantOps is how many nodes of some ops the optimized graph of f holds (the stages up to
// post_load_fusion): one fused node per layer where the frontend wrote the pattern, and none
// of what the fusions replace. The first layer's input norm reads the embedding, not a
// residual add.
func (f fixture) wantOps() map[string]int {
	l := f.layers
	want := map[string]int{"sdpa": l, "add_rmsnorm": 2 * l, "rmsnorm": 1,
		"linear_qkv_rope": l, "qkv_rope": 0, "qkv_norm_rope": 0, "rope": 0, "linear_swiglu": l, "swiglu_packed": 0, "swiglu": 0, "split": 0}
	if f.qkNorm {
		want["linear_qkv_rope"], want["qkv_norm_rope"] = 0, l // the q/k norms go into qkv_norm_rope
	}
	if f.qkvBias {
		want["linear_qkv_rope"], want["qkv_rope"] = 0, l
	}
	return want
}

// openFixture opens a testdata checkpoint and builds its plain graph.
func openFixture(t *testing.T, name string) (*model.Model, *graph.Graph) {
	t.Helper()
	m, err := model.Open(filepath.Join("..", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	g, err := model.BuildGraph(m.Config, model.BuildOptions{Tensors: m.Checkpoint})
	if err != nil {
		t.Fatal(err)
	}
	return m, g
}

// optimize runs the default pipeline, with the model's overlay, up to post_load_fusion and
// returns the final graph and the match counts. The stage after it (cache_init)
// changes the graph's inputs for a runtime with a KV cache, which these tests do not drive.
func optimize(t *testing.T, m *model.Model, g *graph.Graph) (*graph.Graph, map[string]int) {
	t.Helper()
	var sets []string
	for _, tr := range transform.All() {
		if tr.Stage > transform.PostLoadFusion {
			sets = append(sets, "transforms."+tr.Name+".enabled=false")
		}
	}
	cfg, err := transform.LoadConfig(transform.ConfigOptions{Arch: m.Config.ModelType, Sets: sets})
	if err != nil {
		t.Fatal(err)
	}
	c := &transform.Context{Arch: m.Config.ModelType, WorldSize: 1, Weights: m.Checkpoint}
	graphs, results, err := (&transform.Optimizer{Config: cfg, Check: true}).Run(context.Background(), c, g)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, r := range results {
		got[r.Name] = r.Info.Matches
	}
	return graphs[0], got
}

func TestPipelineMatchCounts(t *testing.T) {
	for _, f := range fixtures {
		t.Run(f.name, func(t *testing.T) {
			m, g := openFixture(t, f.name)
			if m.Config.NumHiddenLayers != f.layers {
				t.Fatalf("%s has %d layers, the table says %d", f.name, m.Config.NumHiddenLayers, f.layers)
			}
			out, got := optimize(t, m, g)
			for name, want := range f.wantMatches() {
				if got[name] != want {
					t.Errorf("%s: matches=%d, want %d", name, got[name], want)
				}
			}
			if n := transform.RemoveDeadCode(out.Clone()); n > 0 {
				t.Errorf("%d dead nodes left after the pipeline", n)
			}
			ops := map[string]int{}
			for _, n := range out.Nodes {
				ops[n.Op]++
			}
			// What the fused ops replaced must be gone, shared tables and mask included.
			for _, op := range []string{"rsqrt", "softmax", "silu", "pow", "cos", "sin", "where", "expand", "neg", "repeat_kv"} {
				if ops[op] > 0 {
					t.Errorf("%d %s node(s) left after the pipeline:\n%s", ops[op], op, out)
				}
			}
			for op, want := range f.wantOps() {
				if ops[op] != want {
					t.Errorf("%d %s nodes, want %d", ops[op], op, want)
				}
			}
		})
	}
}

// TestPipelineParity runs each fixture's optimized graph on the CPU backend and holds its
// logits to Hugging Face's. The prompts are fed as the reference saw them for its logits, a
// leading BOS included.
func TestPipelineParity(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every fixture model")
	}
	for _, f := range fixtures {
		t.Run(f.name, func(t *testing.T) {
			m, g := openFixture(t, f.name)
			ref, err := parity.Load(m.Dir)
			if err != nil {
				t.Fatal(err)
			}
			out, _ := optimize(t, m, g)
			prog, err := cpu.Compile(context.Background(), out, m.Checkpoint)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range ref.Prompts {
				ids, pos := make([]int32, len(p.IDs)), make([]int32, len(p.IDs))
				for i, id := range p.IDs {
					ids[i], pos[i] = int32(id), int32(i)
				}
				outs, err := prog.Run(context.Background(), map[string]*tensor.Tensor{
					"input_ids": tensor.FromI32(ids, 1, len(ids)),
					"positions": tensor.FromI32(pos, 1, len(pos)),
				})
				if err != nil {
					t.Fatal(err)
				}
				if err := parity.CheckLogits(outs[0].Float32s(), p, parity.LogitTol); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// TestPipelineBF16 runs the pipeline on graphs with bf16 activations, where every cast the
// frontend writes survives post_export: the same patterns must match as in f32, and the
// optimized graph must compute what the plain graph computes on the CPU backend, up to the
// bit: the CPU backend's fused kernels round as the primitives do.
func TestPipelineBF16(t *testing.T) {
	for _, f := range fixtures {
		t.Run(f.name, func(t *testing.T) {
			m, err := model.Open(filepath.Join("..", "testdata", f.name))
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			build := func() *graph.Graph {
				g, err := model.BuildGraph(m.Config, model.BuildOptions{Tensors: m.Checkpoint, ActivationDType: tensor.BF16})
				if err != nil {
					t.Fatal(err)
				}
				return g
			}
			plain := build()
			out, got := optimize(t, m, build())
			for name, want := range f.wantMatches() {
				if got[name] != want {
					t.Errorf("%s: matches=%d, want %d", name, got[name], want)
				}
			}
			ids := []int32{1, 5, 9, 3, 7, 2, 8, 4, 6, 11, 13, 12}
			pos := make([]int32, len(ids))
			for i := range pos {
				pos[i] = int32(i)
			}
			run := func(g *graph.Graph) []float32 {
				prog, err := cpu.Compile(context.Background(), g, m.Checkpoint)
				if err != nil {
					t.Fatal(err)
				}
				outs, err := prog.Run(context.Background(), map[string]*tensor.Tensor{
					"input_ids": tensor.FromI32(ids, 1, len(ids)),
					"positions": tensor.FromI32(pos, 1, len(pos)),
				})
				if err != nil {
					t.Fatal(err)
				}
				return outs[0].Float32s()
			}
			want, have := run(plain), run(out)
			zero := make([]float32, len(want))
			if scale, _ := parity.MaxAbsDiff(want, zero); scale < 1e-3 {
				t.Fatalf("the plain graph's logits are all about 0 (max %.2g): nothing to compare", scale)
			}
			if i := slices.IndexFunc(want, func(v float32) bool { return v != v }); i >= 0 {
				t.Fatalf("the plain graph's logit %d is NaN", i)
			}
			for i := range want {
				if math.Float32bits(have[i]) != math.Float32bits(want[i]) {
					t.Fatalf("logit %d of the optimized graph is %v, the plain graph's %v: not bit for bit", i, have[i], want[i])
				}
			}
		})
	}
}

// TestPipelineShardedFusions runs the pipeline on every fixture at tp=2, where sharding runs
// before post_load_fusion: each rank's graph, with its local head counts and its slice of
// the MLP, must be fused as the single-rank graph is.
func TestPipelineShardedFusions(t *testing.T) {
	for _, f := range fixtures {
		t.Run(f.name, func(t *testing.T) {
			m, plain := openFixture(t, f.name)
			graphs := ranksOf(t, m, plain, "tp=2")
			if len(graphs) != 2 {
				t.Fatalf("%d rank graphs, want 2", len(graphs))
			}
			for r, g := range graphs {
				ops := map[string]int{}
				for _, n := range g.Nodes {
					ops[n.Op]++
				}
				want := f.wantOps()
				for _, op := range []string{"linear_qkv_rope", "qkv_rope", "qkv_norm_rope", "rope", "linear_swiglu", "swiglu_packed", "swiglu", "split"} {
					if ops[op] != want[op] {
						t.Errorf("rank %d: %d %s nodes, want %d", r, ops[op], op, want[op])
					}
				}
			}
		})
	}
}
