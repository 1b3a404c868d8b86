package llama

import (
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model"
	"github.com/loom-ml/loom/tensor"
)

var moeFixtures = []string{"tiny-mixtral", "tiny-qwen2moe", "tiny-qwen3moe"}

// openFixture opens a fixture checkpoint (closed with the test).
func openFixture(t *testing.T, name string) *model.Model {
	t.Helper()
	m, err := model.Open(filepath.Join("..", "..", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// editedConfig is a fixture's config.json with edits applied (nil deletes a key).
func editedConfig(t *testing.T, name string, edits map[string]any) *model.Config {
	t.Helper()
	_, data := fixtureConfig(t, name)
	var raw map[string]any
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	for k, v := range edits {
		if v == nil {
			delete(raw, k)
		} else {
			raw[k] = v
		}
	}
	data, _ = json.Marshal(raw)
	cfg, err := model.ParseConfig(data, name+"/config.json")
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// The mixture-of-experts graphs read every tensor of their checkpoints, each once, with the
// stored shape; they print and parse back; each sparse layer routes once (a softmax and a
// topk) and runs every expert.
func TestMoEGraphs(t *testing.T) {
	for _, name := range moeFixtures {
		t.Run(name, func(t *testing.T) {
			m := openFixture(t, name)
			cfg := m.Config
			g, err := model.BuildGraph(cfg, model.BuildOptions{Tensors: m.Checkpoint})
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Checkpoint.Check(g); err != nil {
				t.Fatal(err)
			}
			var keys []string
			for _, n := range g.Params() {
				keys = append(keys, n.Attrs.String("key"))
			}
			slices.Sort(keys)
			names := m.Checkpoint.Names()
			slices.Sort(names)
			if !slices.Equal(keys, names) {
				t.Errorf("params %v\nare not the checkpoint's tensors %v", keys, names)
			}
			text := g.String()
			back, err := graph.Parse(text)
			if err != nil {
				t.Fatal(err)
			}
			if err := graph.Equal(g, back); err != nil {
				t.Fatal(err)
			}
			sparse := 0
			for l := range cfg.NumHiddenLayers {
				if cfg.IsSparseLayer(l) {
					sparse++
				}
			}
			dense := cfg.NumHiddenLayers - sparse
			shared := 0
			if name == "tiny-qwen2moe" {
				shared = sparse
			}
			count := map[string]int{}
			for _, n := range g.Nodes {
				count[n.Op]++
			}
			E := cfg.NumLocalExperts
			for op, want := range map[string]int{
				"topk":    sparse,
				"softmax": cfg.NumHiddenLayers + sparse,
				"silu":    dense + sparse*E + shared,
				"sigmoid": shared,
				"linear":  4*cfg.NumHiddenLayers + 3*dense + sparse*(1+3*E) + shared*4 + 1,
			} {
				if count[op] != want {
					t.Errorf("%d %s ops, want %d", count[op], op, want)
				}
			}
			if name == "tiny-qwen3moe" && (sparse != 1 || cfg.IsSparseLayer(0)) {
				t.Errorf("tiny-qwen3moe: layer 0 should be dense and layer 1 sparse (decoder_sparse_step 2)")
			}
		})
	}
}

// infoWithout is a checkpoint's tensor index with some names removed and others added.
type infoWithout struct {
	model.TensorInfoSource
	drop, add []string
}

func (s infoWithout) Info(name string) (model.TensorInfo, bool) {
	if slices.Contains(s.drop, name) {
		return model.TensorInfo{}, false
	}
	if slices.Contains(s.add, name) {
		return model.TensorInfo{Name: name}, true
	}
	return s.TensorInfoSource.Info(name)
}

// Bad configs and checkpoints fail while the graph is built, before any weight is read,
// naming the field or the tensor.
func TestMoEBuildErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		fixture string
		edits   map[string]any
		drop    []string
		add     []string
		want    []string
	}{
		{name: "missing expert", fixture: "tiny-mixtral", drop: []string{"model.layers.1.block_sparse_moe.experts.3.w2.weight"},
			want: []string{"checkpoint has no tensor model.layers.1.block_sparse_moe.experts.3.w2.weight, though num_local_experts is 4"}},
		{name: "missing experts", fixture: "tiny-qwen2moe", drop: []string{"model.layers.0.mlp.experts.2.up_proj.weight", "model.layers.1.mlp.experts.0.gate_proj.weight"},
			want: []string{"no tensor model.layers.0.mlp.experts.2.up_proj.weight (and 1 more expert tensors), though num_experts is 4"}},
		{name: "fused experts", fixture: "tiny-qwen3moe", add: []string{"model.layers.1.mlp.experts.gate_up_proj"},
			want: []string{"stores the experts of layer 1 fused (model.layers.1.mlp.experts.gate_up_proj)"}},
		{name: "expert count missing", fixture: "tiny-qwen2moe", edits: map[string]any{"num_experts": nil, "num_experts_per_tok": nil},
			want: []string{"num_experts is missing: Qwen2MoeForCausalLM needs the number of experts"}},
		{name: "mixtral without experts", fixture: "tiny-mixtral", edits: map[string]any{"num_local_experts": 0},
			want: []string{"num_local_experts must be positive for MixtralForCausalLM, got 0"}},
		{name: "expert width missing", fixture: "tiny-qwen3moe", edits: map[string]any{"moe_intermediate_size": nil},
			want: []string{"moe_intermediate_size must be positive for the experts of Qwen3MoeForCausalLM, got 0"}},
		{name: "shared expert width missing", fixture: "tiny-qwen2moe", edits: map[string]any{"shared_expert_intermediate_size": nil},
			want: []string{"shared_expert_intermediate_size must be positive for Qwen2MoeForCausalLM"}},
		{name: "per-layer windows", fixture: "tiny-qwen2moe", edits: map[string]any{"use_sliding_window": true, "sliding_window": 8},
			want: []string{"use_sliding_window is not supported for Qwen2MoeForCausalLM"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := openFixture(t, tc.fixture)
			cfg := m.Config
			if tc.edits != nil {
				cfg = editedConfig(t, tc.fixture, tc.edits)
			}
			_, err := model.BuildGraph(cfg, model.BuildOptions{Tensors: infoWithout{m.Checkpoint, tc.drop, tc.add}})
			if err == nil {
				t.Fatal("built a graph")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if n := m.Checkpoint.BytesRead(); n != 0 {
				t.Errorf("%d bytes of weights read", n)
			}
		})
	}
	// A config made in code, not parsed (so not checked by ParseConfig).
	cfg, _ := fixtureConfig(t, "tiny-mixtral")
	cfg.NumExpertsPerTok = 5
	if _, err := model.BuildGraph(cfg, model.BuildOptions{}); err == nil || !strings.Contains(err.Error(), "num_experts_per_tok must be in [1, 4] (num_local_experts), got 5") {
		t.Errorf("error %v", err)
	}
}

// The settings that change the graph: qkv_bias, sliding windows (Qwen reads sliding_window
// only with use_sliding_window), which layers are sparse, and the routing weights.
func TestMoEVariants(t *testing.T) {
	params := func(g *graph.Graph, sub string) int {
		n := 0
		for _, p := range g.Params() {
			if strings.Contains(p.Attrs.String("key"), sub) {
				n++
			}
		}
		return n
	}
	ops := func(g *graph.Graph, op string) int {
		n := 0
		for _, m := range g.Nodes {
			if m.Op == op {
				n++
			}
		}
		return n
	}
	build := func(name string, edits map[string]any) *graph.Graph {
		t.Helper()
		g, err := model.BuildGraph(editedConfig(t, name, edits), model.BuildOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	if g := build("tiny-qwen2moe", nil); params(g, "q_proj.bias") != 2 || params(g, "o_proj.bias") != 0 || ops(g, "div") != 0 {
		t.Errorf("qwen2moe: %d q biases, %d o biases, %d divisions (norm_topk_prob false)", params(g, "q_proj.bias"), params(g, "o_proj.bias"), ops(g, "div"))
	}
	if g := build("tiny-qwen2moe", map[string]any{"qkv_bias": false, "attention_bias": true, "norm_topk_prob": true}); params(g, "_proj.bias") != 0 || ops(g, "div") != 2 {
		t.Errorf("qwen2moe without qkv_bias: %d biases, %d divisions", params(g, "_proj.bias"), ops(g, "div"))
	}
	// A window applies only with use_sliding_window: true (Qwen3-MoE: on every layer).
	if g := build("tiny-qwen3moe", map[string]any{"sliding_window": 8, "use_sliding_window": nil}); ops(g, "logical_and") != 0 {
		t.Error("qwen3moe: sliding_window without use_sliding_window gave a window")
	}
	if g := build("tiny-qwen3moe", map[string]any{"sliding_window": 8, "use_sliding_window": true}); ops(g, "logical_and") != 1 {
		t.Error("qwen3moe: use_sliding_window gave no window")
	}
	if g := build("tiny-mixtral", map[string]any{"sliding_window": 8}); ops(g, "logical_and") != 1 {
		t.Error("mixtral: sliding_window gave no window")
	}
	// Which layers are sparse; Mixtral ignores Qwen's fields.
	if g := build("tiny-qwen3moe", map[string]any{"decoder_sparse_step": 1, "mlp_only_layers": []int{1}}); params(g, "layers.0.mlp.experts.3.") != 3 || params(g, "layers.1.mlp.down_proj") != 1 {
		t.Error("qwen3moe with mlp_only_layers [1]: layer 0 should be sparse, layer 1 dense")
	}
	if g := build("tiny-mixtral", map[string]any{"decoder_sparse_step": 2, "mlp_only_layers": []int{0}}); ops(g, "topk") != 2 {
		t.Error("mixtral: a layer became dense")
	}
	// Mixtral multiplies the experts' outputs by f32 weights; Qwen by the activations' dtype
	// (bf16 here): a cast back to bf16 after each product, or none.
	for name, want := range map[string]int{"tiny-mixtral": 4 * 2, "tiny-qwen3moe": 0} {
		cfg, _ := fixtureConfig(t, name)
		g, err := model.BuildGraph(cfg, model.BuildOptions{ActivationDType: tensor.BF16})
		if err != nil {
			t.Fatal(err)
		}
		weighed, casts := 0, 0 // products of an expert's output and its column of weights
		for _, n := range g.Nodes {
			if n.Op == "mul" && slices.ContainsFunc(n.Inputs, func(v *graph.Value) bool {
				return v.Producer != nil && v.Producer.Op == "slice" && v.Type.Shape[2] == graph.D(1)
			}) {
				weighed++
				if n.Out().Type.DType == tensor.F32 {
					casts++
				}
			}
		}
		if weighed != cfg.NumLocalExperts*2-boolInt(name == "tiny-qwen3moe")*cfg.NumLocalExperts || casts != want {
			t.Errorf("%s in bf16: %d weighed expert outputs, %d of them in f32; want %d in f32", name, weighed, casts, want)
		}
	}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
