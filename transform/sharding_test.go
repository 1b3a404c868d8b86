package transform_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loom-ml/loom/backend/cpu"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/dist/local"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/internal/parity"
	"github.com/loom-ml/loom/model"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform"
	"github.com/loom-ml/loom/transform/transformtest"
)

// shardContext is the transform context of a fixture deployed on mesh, with the
// architecture's own plan.
func shardContext(t *testing.T, m *model.Model, mesh dist.Mesh) *transform.Context {
	t.Helper()
	arch, err := model.LookupArchitecture(m.Config)
	if err != nil {
		t.Fatal(err)
	}
	c := &transform.Context{Arch: m.Config.ModelType, WorldSize: max(mesh.Size(), 1), Weights: m.Checkpoint}
	transform.SetSharding(c, transform.ShardingSetup{Mesh: mesh, FactoryPlan: arch.TPPlan})
	return c
}

// matchedGraph runs a fixture's pipeline up to the pattern matcher: the graph sharding sees.
func matchedGraph(t *testing.T, m *model.Model, g *graph.Graph) *graph.Graph {
	t.Helper()
	var sets []string
	for _, tr := range transform.All() {
		if tr.Stage > transform.PatternMatcher {
			sets = append(sets, "transforms."+tr.Name+".enabled=false")
		}
	}
	cfg, err := transform.LoadConfig(transform.ConfigOptions{Arch: m.Config.ModelType, Sets: sets})
	if err != nil {
		t.Fatal(err)
	}
	graphs, _, err := (&transform.Optimizer{Config: cfg, Check: true}).Run(context.Background(), &transform.Context{Arch: m.Config.ModelType}, g)
	if err != nil {
		t.Fatal(err)
	}
	return graphs[0]
}

func mesh(t testing.TB, s string) dist.Mesh {
	t.Helper()
	if s == "" {
		return dist.Mesh{}
	}
	m, err := dist.ParseMesh(s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// detect runs detect_sharding's plan detection with options (YAML) over a fixture's matched graph.
func detect(t *testing.T, m *model.Model, g *graph.Graph, meshText, options string) (*transform.ShardingPlan, error) {
	t.Helper()
	cfg, err := transform.DecodeOptions(transform.DetectSharding, "options", []byte(options))
	if err != nil {
		t.Fatal(err)
	}
	return transform.DetectPlan(shardContext(t, m, mesh(t, meshText)), g, cfg.(transform.DetectShardingConfig))
}

// TestDetectShardingFixtures holds the plan detected on every fixture at tp=2 and tp=4 to
// its golden file (go test -run DetectShardingFixtures -update rewrites them), and the
// heuristic, run alone, to the factory plan's splits.
func TestDetectShardingFixtures(t *testing.T) {
	update := flag.Lookup("update") != nil && flag.Lookup("update").Value.String() == "true"
	for _, f := range fixtures {
		for _, tp := range []int{2, 4} {
			t.Run(fmt.Sprintf("%s/tp=%d", f.name, tp), func(t *testing.T) {
				m, plain := openFixture(t, f.name)
				g := matchedGraph(t, m, plain)
				meshText := fmt.Sprintf("tp=%d", tp)
				plan, err := detect(t, m, g, meshText, "")
				if err != nil {
					t.Fatal(err)
				}
				file := filepath.Join("testdata", "detect_sharding", "plans", fmt.Sprintf("%s.tp%d.txt", f.name, tp))
				got := plan.String()
				if update {
					if err := os.WriteFile(file, []byte(got), 0o644); err != nil {
						t.Fatal(err)
					}
				} else if want, err := os.ReadFile(file); err != nil {
					t.Fatalf("%v (go test -update writes it)", err)
				} else if got != string(want) {
					t.Errorf("plan differs from %s (-want +got):\n%s", file, transformtest.Diff(string(want), got))
				}
				heur, err := detect(t, m, g, meshText, "sharding_source: [heuristic]")
				if err != nil {
					t.Fatal(err)
				}
				for key, w := range plan.Weights {
					h := heur.Weights[key]
					if h.Kind != w.Kind || h.Parts != w.Parts {
						t.Errorf("%s: heuristic %s/%d, factory %s/%d", key, h.Kind, h.Parts, w.Kind, w.Parts)
					}
				}
			})
		}
	}
}

// TestDetectShardingManual: manual plans with wildcards, their precedence over the factory
// plan, and the errors of bad plans.
func TestDetectShardingManual(t *testing.T) {
	m, plain := openFixture(t, "tiny-llama")
	g := matchedGraph(t, m, plain)
	for _, c := range []struct {
		name, mesh, options string
		want                map[string]string // key -> "kind/parts"
		err                 string
	}{
		{
			name: "wildcards", mesh: "tp=2",
			options: `
sharding_source: [manual]
tp_plan:
  "model.layers.*.mlp.gate_proj": colwise
  "model.layers.*.mlp.up_proj": colwise
  "model.layers.*.mlp.down_proj.weight": rowwise
  "model.layers.1.mlp.gate_proj": replicate
  "lm_head": gather`,
			want: map[string]string{
				"model.layers.0.mlp.gate_proj.weight":    "colwise/2",
				"model.layers.0.mlp.down_proj.weight":    "rowwise/2",
				"model.layers.1.mlp.gate_proj.weight":    "replicate/0", // a name without wildcards is more specific
				"model.layers.1.mlp.down_proj.weight":    "rowwise/2",
				"model.layers.0.self_attn.q_proj.weight": "replicate/0", // no source names it
				"lm_head.weight":                         "gather/2",
				"model.embed_tokens.weight":              "replicate/0",
				"model.layers.0.self_attn.o_proj.weight": "replicate/0",
				"model.layers.1.self_attn.k_proj.weight": "replicate/0",
				"model.layers.1.mlp.up_proj.weight":      "colwise/2",
				"model.layers.0.mlp.up_proj.weight":      "colwise/2",
				"model.layers.1.self_attn.q_proj.weight": "replicate/0",
				"model.layers.0.self_attn.v_proj.weight": "replicate/0",
				"model.layers.1.self_attn.o_proj.weight": "replicate/0",
				"model.layers.0.self_attn.k_proj.weight": "replicate/0",
				"model.layers.1.self_attn.v_proj.weight": "replicate/0",
			},
		},
		{
			name: "manual before factory", mesh: "tp=2",
			options: `
sharding_source: [manual, factory]
tp_plan: {"model.layers.*.self_attn.o_proj": gather, "model.layers.*.self_attn.*_proj": replicate}`,
			want: map[string]string{
				"model.layers.0.self_attn.o_proj.weight": "gather/2",
				"model.layers.0.self_attn.q_proj.weight": "replicate/0",
				"model.layers.0.mlp.down_proj.weight":    "rowwise/2",
			},
		},
		{
			name: "factory before manual", mesh: "tp=2",
			options: `tp_plan: {"model.layers.*.self_attn.o_proj": gather}`,
			want:    map[string]string{"model.layers.0.self_attn.o_proj.weight": "rowwise/2"},
		},
		{
			name: "simple_shard_only", mesh: "tp=4", options: "simple_shard_only: true",
			want: map[string]string{
				"model.layers.0.self_attn.q_proj.weight": "gather/4",
				"model.layers.0.self_attn.k_proj.weight": "gather/4",
				"model.layers.0.mlp.down_proj.weight":    "gather/4",
				"lm_head.weight":                         "gather/4",
			},
		},
		{
			name: "KV heads replicated", mesh: "tp=4",
			want: map[string]string{
				"model.layers.0.self_attn.q_proj.weight": "colwise/4",
				"model.layers.0.self_attn.k_proj.weight": "colwise/2",
				"model.layers.0.self_attn.v_proj.weight": "colwise/2",
				"model.layers.0.self_attn.o_proj.weight": "rowwise/4",
			},
		},
		{
			name: "a 2-D mesh splits along tp", mesh: "tp=2,dp=2",
			want: map[string]string{"model.layers.0.mlp.gate_proj.weight": "colwise/2"},
		},
		{name: "one rank", mesh: "dp=2", want: map[string]string{}},
		{
			name: "unknown weight pattern", mesh: "tp=2",
			options: `tp_plan: {"model.layers.*.mlp.gate": colwise}`,
			err:     `tp_plan: pattern "model.layers.*.mlp.gate" matches no weight that a linear or an embedding reads`,
		},
		{
			name: "unknown split", mesh: "tp=2",
			options: `tp_plan: {"lm_head": rows}`,
			err:     `tp_plan: "lm_head": unknown split "rows" (want colwise, rowwise, gather or replicate)`,
		},
		{
			name: "does not divide", mesh: "tp=3",
			options: `{sharding_source: [manual], tp_plan: {"model.layers.*.mlp.gate_proj": colwise}}`,
			err:     "tp_plan: model.layers.0.mlp.gate_proj.weight [160 64]: colwise splits dimension 0 (160) into 3 parts, which does not divide it",
		},
		{
			name: "embedding split", mesh: "tp=2",
			options: `{sharding_source: [manual], tp_plan: {"model.embed_tokens": colwise}}`,
			err:     "tp_plan: model.embed_tokens.weight is read only by an embedding lookup, which is always replicated; it cannot be colwise",
		},
		{
			name: "equally specific", mesh: "tp=2",
			options: `tp_plan: {"model.layers.*.mlp.up_proj": colwise, "model.layers.0.mlp.u*_proj": replicate}`,
			err:     `model.layers.0.mlp.up_proj.weight matches "model.layers.*.mlp.up_proj" (colwise) and "model.layers.0.mlp.u*_proj" (replicate), equally specific`,
		},
		{name: "ep without experts", mesh: "tp=2,ep=2", err: "the mesh has ep=2, but the graph has no moe op to split by experts"},
		{name: "ep not sharded for", mesh: "tp=2,ep=2", options: "sharding_dims: [tp]", want: map[string]string{"model.layers.0.mlp.up_proj.weight": "colwise/2"}},
		{name: "unknown dim", mesh: "tp=2", options: "sharding_dims: [tp, pp]", err: `sharding_dims: unknown dimension "pp" (want tp or ep)`},
		{name: "bad source", mesh: "tp=2", options: "sharding_source: [magic]", err: `sharding_source: unknown source "magic"`},
		{name: "bad mesh", mesh: "tp=2", options: "mesh: tp=two", err: "option mesh:"},
	} {
		t.Run(c.name, func(t *testing.T) {
			plan, err := detect(t, m, g, c.mesh, c.options)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for key, want := range c.want {
				w, ok := plan.Weights[key]
				if got := fmt.Sprintf("%s/%d", w.Kind, w.Parts); !ok || got != want {
					t.Errorf("%s: %s, want %s\n%s", key, got, want, plan)
				}
			}
		})
	}
}

// ranksOf optimizes a fixture for mesh up to post_load_fusion (options: extra --set flags)
// and returns the rank graphs.
func ranksOf(t *testing.T, m *model.Model, plain *graph.Graph, meshText string, sets ...string) []*graph.Graph {
	t.Helper()
	for _, tr := range transform.All() {
		if tr.Stage > transform.PostLoadFusion {
			sets = append(sets, "transforms."+tr.Name+".enabled=false")
		}
	}
	cfg, err := transform.LoadConfig(transform.ConfigOptions{Arch: m.Config.ModelType, Sets: sets})
	if err != nil {
		t.Fatal(err)
	}
	c := shardContext(t, m, mesh(t, meshText))
	graphs, _, err := (&transform.Optimizer{Config: cfg, Check: true}).Run(context.Background(), c, plain.Clone())
	if err != nil {
		t.Fatal(err)
	}
	return graphs
}

// runRanks compiles each rank graph with its own communicator and runs all ranks on ids;
// inputs(r) may give each rank its own ids. It returns every rank's logits.
func runRanks(t *testing.T, m *model.Model, graphs []*graph.Graph, meshText string, ids func(rank int) []int32) [][]float32 {
	t.Helper()
	ms := mesh(t, meshText)
	comms, err := local.New(len(graphs), local.Options{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	progs := make([]*cpu.Program, len(graphs))
	for r, g := range graphs {
		if progs[r], err = cpu.CompileWith(context.Background(), g, m.Checkpoint, cpu.Options{Comm: comms[r], Mesh: ms}); err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	out := make([][]float32, len(graphs))
	errs := make([]error, len(graphs))
	var wg sync.WaitGroup
	for r, p := range progs {
		wg.Go(func() {
			in := ids(r)
			pos := make([]int32, len(in))
			for i := range pos {
				pos[i] = int32(i)
			}
			res, err := p.Run(context.Background(), map[string]*tensor.Tensor{
				"input_ids": tensor.FromI32(in, 1, len(in)), "positions": tensor.FromI32(pos, 1, len(pos)),
			})
			if err != nil {
				errs[r] = err
				return
			}
			out[r] = res[0].Float32s()
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	return out
}

var testIDs = []int32{1, 5, 9, 3, 7, 2, 8, 4, 6, 11, 13, 12}

// TestShardedEqualsSingleRank runs every fixture at tp=2 and tp=4 and holds every rank's
// logits to the single-rank optimized graph's.
func TestShardedEqualsSingleRank(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every fixture model on several ranks")
	}
	for _, f := range fixtures {
		t.Run(f.name, func(t *testing.T) {
			m, plain := openFixture(t, f.name)
			one := ranksOf(t, m, plain, "")
			want := runRanks(t, m, one, "", func(int) []int32 { return testIDs })[0]
			for _, tp := range []string{"tp=2", "tp=4"} {
				graphs := ranksOf(t, m, plain, tp)
				got := runRanks(t, m, graphs, tp, func(int) []int32 { return testIDs })
				for r, logits := range got {
					if d, at := parity.MaxAbsDiff(logits, want); !(d <= 1e-4) {
						t.Errorf("%s rank %d: logits differ from one rank's by %.2e at %d", tp, r, d, at)
					}
				}
			}
		})
	}
}

// TestCollectiveRewritesEqual holds rewrite_all_gather_as_all_reduce, fuse_linear_allreduce
// and fuse_allreduce_residual_rmsnorm, each on its own, to the graph without them: every
// rank's logits must be equal. tiny-gqa6 at tp=4 gathers its attention outputs (the
// fallback), so every rank's position in the group is rewritten.
func TestCollectiveRewritesEqual(t *testing.T) {
	off := func(names ...string) []string {
		var sets []string
		for _, n := range names {
			sets = append(sets, "transforms."+n+".enabled=false")
		}
		return sets
	}
	const rewrite, fuseLinear, fuseNorm = "rewrite_all_gather_as_all_reduce", "fuse_linear_allreduce", "fuse_allreduce_residual_rmsnorm"
	for _, c := range []struct{ fixture, mesh string }{{"tiny-llama", "tp=2"}, {"tiny-gqa6", "tp=4"}, {"tiny-qwen2", "tp=2,dp=2"}} {
		t.Run(c.fixture+"/"+c.mesh, func(t *testing.T) {
			m, plain := openFixture(t, c.fixture)
			base := ranksOf(t, m, plain, c.mesh, off(fuseLinear, fuseNorm)...)
			want := runRanks(t, m, base, c.mesh, func(int) []int32 { return testIDs })
			for _, v := range []struct {
				name   string
				sets   []string
				op     string // an op the variant must produce
				absent string // an op it must leave none of
			}{
				{rewrite, append(off(fuseLinear, fuseNorm), "transforms."+rewrite+".enabled=true"), "all_reduce", "all_gather"},
				{fuseLinear, off(fuseNorm), "linear_all_reduce", "all_reduce"},
				{fuseNorm, off(fuseLinear), "all_reduce_add_rmsnorm", "all_reduce"},
			} {
				t.Run(v.name, func(t *testing.T) {
					graphs := ranksOf(t, m, plain, c.mesh, v.sets...)
					for r, g := range graphs {
						ops := map[string]int{}
						for _, n := range g.Nodes {
							ops[n.Op]++
						}
						if ops[v.op] == 0 || ops[v.absent] != 0 {
							t.Errorf("rank %d: %d %s and %d %s nodes, want some and none", r, ops[v.op], v.op, ops[v.absent], v.absent)
						}
						if err := graph.CheckFusedCollectives(g); err != nil {
							t.Errorf("rank %d: %v", r, err)
						}
					}
					got := runRanks(t, m, graphs, c.mesh, func(int) []int32 { return testIDs })
					for r := range got {
						if d, at := parity.MaxAbsDiff(got[r], want[r]); d != 0 {
							t.Errorf("rank %d: logits differ from the graph without %s by %.2e at %d", r, v.name, d, at)
						}
					}
				})
			}
		})
	}
}

// TestShardingVariantsEqualSingleRank runs plans other than the factory's, which take other
// paths through sharding_executor: every linear gathered (simple_shard_only), the heuristic
// alone, a manual plan that leaves attention whole but splits its output projection by rows
// (the executor slices o_proj's whole input), and one that splits only the MLP.
func TestShardingVariantsEqualSingleRank(t *testing.T) {
	m, plain := openFixture(t, "tiny-qwen2")
	want := runRanks(t, m, ranksOf(t, m, plain, ""), "", func(int) []int32 { return testIDs })[0]
	for _, c := range []struct {
		name string
		sets []string
	}{
		{"simple_shard_only", []string{"transforms.detect_sharding.simple_shard_only=true"}},
		{"heuristic", []string{"transforms.detect_sharding.sharding_source=[heuristic]"}},
		{"o_proj rowwise on whole attention", []string{
			"transforms.detect_sharding.sharding_source=[manual]",
			`transforms.detect_sharding.tp_plan={"model.layers.*.self_attn.o_proj": rowwise, "model.layers.*.mlp.*_proj": replicate}`,
		}},
		{"mlp only", []string{
			"transforms.detect_sharding.sharding_source=[manual]",
			`transforms.detect_sharding.tp_plan={"model.layers.*.mlp.gate_proj": colwise, "model.layers.*.mlp.up_proj": colwise, "model.layers.*.mlp.down_proj": rowwise}`,
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for _, tp := range []string{"tp=2", "tp=4"} {
				graphs := ranksOf(t, m, plain, tp, c.sets...)
				collectives := 0
				for _, n := range graphs[0].Nodes {
					if spec := n.Spec(); spec != nil && spec.Collective {
						collectives++
					}
				}
				if collectives == 0 {
					t.Errorf("%s: rank 0 has no collective: nothing was split", tp)
				}
				for r, logits := range runRanks(t, m, graphs, tp, func(int) []int32 { return testIDs }) {
					if d, at := parity.MaxAbsDiff(logits, want); !(d <= 1e-4) {
						t.Errorf("%s rank %d: logits differ from one rank's by %.2e at %d", tp, r, d, at)
					}
				}
			}
		})
	}
}
