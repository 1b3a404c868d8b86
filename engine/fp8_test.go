package engine

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
)

// fp8Fixtures are the FP8 checkpoints that tools/make_fp8_fixtures.py quantizes from
// tiny-llama and tiny-qwen3, one per format; their reference.json is transformers in f32 on
// the dequantized weights (fp8 value times scale in f32), which is exactly what Loom's
// dequantization computes, so the bf16 fixtures' tolerance (parity.LogitTol) holds: both
// sides run the same real-valued model in f32 and differ only by summation order.
var fp8Fixtures = []string{
	"tiny-llama-fp8",    // Hugging Face fp8, 16x16 block scales (weight_scale_inv), LM head bf16
	"tiny-llama-fp8-ct", // compressed-tensors, per-channel bf16 scales, dynamic activations
	"tiny-qwen3-fp8",    // Hugging Face fp8, 8x8 blocks, head_dim 24
	"tiny-qwen3-fp8-ct", // compressed-tensors, per-tensor scales, static input_scale
}

// countOps counts the nodes of op in a model's rank graphs.
func countOps(m *Model, op string) int {
	n := 0
	graphs := m.Graphs
	if len(graphs) == 0 {
		graphs = []*graph.Graph{m.Graph}
	}
	for _, g := range graphs {
		for _, node := range g.Nodes {
			if node.Op == op {
				n++
			}
		}
	}
	return n
}

// TestFP8HuggingFaceParity holds each FP8 fixture to its reference: the plain graph
// (logits at every position, greedy by recompute), and the cached engine with the
// optimized graph (q/k/v and gate/up joined) at tp=1, 2 and 4 (block and channel scales
// sliced with their weights; tiny-llama-fp8's 16-row blocks do not split in 4, and its tp=4
// load must say so).
func TestFP8HuggingFaceParity(t *testing.T) {
	for _, name := range fp8Fixtures {
		dir := filepath.Join("..", "testdata", name)
		t.Run(name+"/plain", func(t *testing.T) {
			ref := loadReference(t, dir)
			m, err := Load(context.Background(), dir, LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if got, want := countOps(m, "linear_fp8"), 14; got != want {
				t.Errorf("%d linear_fp8 ops, want %d (7 per layer)", got, want)
			}
			for _, p := range ref.Prompts {
				logits, _ := runAll(t, m.Program, p.IDs)
				checkLogits(t, logits, p)
				gen := recomputeGen(m.Program)
				if len(p.IDs) > 64 {
					gen = forcedGen(t, m.Program, p)
				}
				checkGreedy(t, gen, p)
			}
		})
		for _, meshText := range []string{"tp=1", "tp=2", "tp=4"} {
			t.Run(fmt.Sprintf("%s/cached/%s", name, meshText), func(t *testing.T) {
				ref := loadReference(t, dir)
				mesh := mustMeshFor(t, 0, meshText)
				if meshText == "tp=1" {
					mesh = mustMeshFor(t, 1, "")
				}
				m, err := Load(context.Background(), dir, LoadOptions{Optimize: true, Mesh: mesh})
				if name == "tiny-llama-fp8" && meshText == "tp=4" {
					// gate/up's 160 rows in 4 parts of 40 would cut its 16-row scale blocks:
					// refused, saying so, instead of sliced wrong.
					if err == nil {
						m.Close()
						t.Fatal("tp=4 loaded, though 160/4 rows cut the 16-row blocks of the scales")
					}
					if !strings.Contains(err.Error(), "block scales only split on block boundaries") {
						t.Fatalf("tp=4: %v, want the refusal to cut 16-row scale blocks", err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				if countOps(m, "linear_fp8") == 0 {
					t.Error("the optimized graph has no linear_fp8")
				}
				if meshText == "tp=1" {
					// fuse_gemms joins q/k/v and gate/up of channel and block scales (2 layers of
					// qkv, o, gate_up, down); one scale a tensor does not join (7 a layer).
					want := 8
					if name == "tiny-qwen3-fp8-ct" {
						want = 14
					}
					if got := countOps(m, "linear_fp8"); got != want {
						t.Errorf("%d linear_fp8 ops in the optimized graph, want %d", got, want)
					}
				}
				if meshText == "tp=2" {
					checkFP8Sliced(t, m)
				}
				checkCachedParity(t, m, ref)
			})
		}
	}
}

// checkFP8Sliced makes sure that on rank 0 of tp=2 every quantized weight that is sliced
// has its channel or block scale sliced along with it.
func checkFP8Sliced(t *testing.T, m *Model) {
	t.Helper()
	g := m.Graphs[0]
	sliced := 0
	for _, n := range g.Nodes {
		if n.Op != "linear_fp8" {
			continue
		}
		ws, ss := fp8Params(t, n)
		for i, w := range ws {
			if s := ss[i]; w.Attrs.Int("slice_count") > 1 {
				sliced++
				if n.Attrs.String("scheme") == "block" && s.Attrs.Int("slice_count") != w.Attrs.Int("slice_count") {
					t.Errorf("%s: weight sliced in %d, block scale in %d", w.Attrs.String("key"), w.Attrs.Int("slice_count"), s.Attrs.Int("slice_count"))
				}
			}
		}
	}
	if sliced == 0 {
		t.Error("tp=2 sliced no fp8 weight")
	}
}

// fp8Params returns the params a linear_fp8 reads as its weight and its scale: the params
// themselves, or those fuse_gemms concatenated (the i-th scale goes with the i-th weight).
func fp8Params(t *testing.T, n *graph.Node) (weights, scales []*graph.Node) {
	t.Helper()
	params := func(v *graph.Value) []*graph.Node {
		switch p := v.Producer; {
		case p != nil && p.Op == graph.OpParam:
			return []*graph.Node{p}
		case p != nil && p.Op == "concat":
			var ps []*graph.Node
			for _, in := range p.Inputs {
				if in.Producer == nil || in.Producer.Op != graph.OpParam {
					t.Fatalf("%s: its %s concatenates %s, not a param", n.Out(), v, in)
				}
				ps = append(ps, in.Producer)
			}
			return ps
		}
		t.Fatalf("%s: %s is neither a param nor a concatenation of params", n.Out(), v)
		return nil
	}
	weights, scales = params(n.Inputs[1]), params(n.Inputs[2])
	if len(weights) != len(scales) {
		t.Fatalf("%s: %d weights and %d scales", n.Out(), len(weights), len(scales))
	}
	return weights, scales
}

// TestFP8BadCheckpoints: an unknown quant_method, a scale of the wrong shape and a missing
// scale are errors naming the field or the tensor, raised before any weight is read.
func TestFP8BadCheckpoints(t *testing.T) {
	src := filepath.Join("..", "testdata", "tiny-llama-fp8")
	for _, tc := range []struct {
		name   string
		config func(string) string
		want   []string
	}{
		{"unknown method", func(c string) string {
			return strings.Replace(c, `"quant_method": "fp8"`, `"quant_method": "awq"`, 1)
		}, []string{"quantization_config.quant_method", `"awq" is not supported`}},
		{"block size", func(c string) string {
			return strings.Replace(c, "\"weight_block_size\": [\n      16,\n      16\n    ]", `"weight_block_size": [32, 16]`, 1)
		}, []string{`scale tensor "model.layers.0.self_attn.q_proj.weight_scale_inv" has shape [4 4]`, "want [2 4]"}},
		{"missing scale", func(c string) string {
			return strings.Replace(c, `"quant_method": "fp8"`, `"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}`, 1)
		}, []string{`no scale tensor "model.layers.0.self_attn.q_proj.weight_scale"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, f := range []string{"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} {
				b, err := os.ReadFile(filepath.Join(src, f))
				if err != nil {
					t.Fatal(err)
				}
				if f == "config.json" {
					b = []byte(tc.config(string(b)))
				}
				if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			m, err := Load(context.Background(), dir, LoadOptions{})
			if err == nil {
				m.Close()
				t.Fatal("loaded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\nwants %q", err, w)
				}
			}
		})
	}
}

// TestFP8BlockBoundary: tp=4 would cut tiny-llama-fp8's 16-row blocks of the MLP (160 rows,
// 40 per rank); sharding refuses, naming the weight, before any weight is read.
func TestFP8BlockBoundary(t *testing.T) {
	dir := filepath.Join("..", "testdata", "tiny-llama-fp8")
	m, err := Load(context.Background(), dir, LoadOptions{Optimize: true, Mesh: mustMeshFor(t, 0, "tp=4")})
	if err == nil {
		m.Close()
		t.Fatal("tp=4 loaded")
	}
	for _, w := range []string{`linear_fp8 weight "model.layers.0.mlp.gate_proj.weight"`, "splitting its 160 rows in 4 parts cuts its blocks of 16 rows"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q\nwants %q", err, w)
		}
	}
}
