package synth

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loom-ml/loom/backend/cpu"
	"github.com/loom-ml/loom/chattemplate"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/tokenizer"
)

func TestWriteLoadsAndRuns(t *testing.T) {
	Shapes["test-tiny"] = llama3("test-tiny", 300, 64, 128, 2, 4, 2, 8, false)
	defer delete(Shapes, "test-tiny")
	dir := t.TempDir()
	// A shard limit below the size of one layer's weights forces a sharded checkpoint.
	if err := Write(context.Background(), "test-tiny", dir, Options{Seed: 1, ShardBytes: 20000}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, model.IndexFile)); err != nil {
		t.Errorf("expected a sharded checkpoint: %v", err)
	}
	m, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	g, err := model.BuildGraph(m.Config, model.BuildOptions{Tensors: m.Checkpoint})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Checkpoint.Check(g); err != nil {
		t.Fatal(err)
	}
	prog, err := cpu.Compile(context.Background(), g, m.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	outs, err := prog.Run(context.Background(), map[string]*tensor.Tensor{
		"input_ids": tensor.FromI32([]int32{1, 2, 3}, 1, 3),
		"positions": tensor.FromI32([]int32{0, 1, 2}, 1, 3),
	})
	if err != nil {
		t.Fatal(err)
	}
	var spread float64
	for _, v := range outs[0].Float32s() {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("logit %v", v)
		}
		spread = math.Max(spread, math.Abs(float64(v)))
	}
	if spread == 0 {
		t.Error("all logits are zero: weights were not randomised")
	}

	tok, err := tokenizer.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := tok.Encode("héllo", true)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1+len("héllo") || ids[0] != 128000 {
		t.Errorf("encode = %v, want BOS then one id per byte", ids)
	}
	if text, err := tok.Decode(ids[1:], false); err != nil || text != "héllo" {
		t.Errorf("decode = %q, %v", text, err)
	}
}

func TestUnknownShape(t *testing.T) {
	err := Write(context.Background(), "gpt-5", t.TempDir(), Options{})
	if err == nil || !strings.Contains(err.Error(), "llama-3.1-8b") {
		t.Errorf("error %v should list the known shapes", err)
	}
}

// Every shipped shape builds a graph (without writing its weights).
func TestShapesBuild(t *testing.T) {
	for _, name := range Names() {
		s := Shapes[name]
		data := mustJSON(t, s.Config)
		cfg, err := model.ParseConfig(data, name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := model.BuildGraph(cfg, model.BuildOptions{}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// tinyCopy registers a copy of a mixture-of-experts shape with small dims under name, its
// expert fields, router and tokenizer style kept; the returned func removes it.
func tinyCopy(from, name string) func() {
	s := Shapes[from]
	cfg := map[string]any{}
	for k, v := range s.Config {
		cfg[k] = v
	}
	for k, v := range map[string]any{"vocab_size": 512, "hidden_size": 64, "intermediate_size": 96,
		"num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "num_experts_per_tok": 2} {
		cfg[k] = v
	}
	if _, ok := cfg["head_dim"]; ok {
		cfg["head_dim"] = 16
	}
	if _, ok := cfg["moe_intermediate_size"]; ok {
		cfg["moe_intermediate_size"] = 32
	}
	if cfg["bos_token_id"].(int) >= 512 {
		cfg["bos_token_id"], cfg["eos_token_id"] = 300, 301
	}
	Shapes[name] = Shape{Name: name, Chat: s.Chat, Config: cfg}
	return func() { delete(Shapes, name) }
}

// The MoE shapes at one layer: the config Loom reads and every tensor synth would write,
// with its shape, checked without writing (one layer of Qwen3-30B-A3B's 128 experts is
// 1.2 GB); the full shapes' parameter counts match the released models'.
func TestMoEShapes(t *testing.T) {
	for _, c := range []struct {
		name                          string
		arch                          string
		experts, topK, width, hidden  int
		block, gate, up, down         string
		renorm                        bool
		params                        int64 // of the full model
		qkNorm                        bool
		vocab, heads, kvHeads, layers int
	}{
		{"qwen3-30b-a3b", "Qwen3MoeForCausalLM", 128, 8, 768, 2048, "mlp", "gate_proj", "up_proj", "down_proj", true, 30_532_122_624, true, 151936, 32, 4, 48},
		{"mixtral-8x7b", "MixtralForCausalLM", 8, 2, 14336, 4096, "block_sparse_moe", "w1", "w3", "w2", true, 46_702_792_704, false, 32000, 32, 8, 32},
	} {
		p, err := plan(c.name, Options{Layers: 1})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		cfg := p.cfg
		if cfg.Architectures[0] != c.arch || cfg.NumLocalExperts != c.experts || cfg.NumExpertsPerTok != c.topK ||
			cfg.HiddenSize != c.hidden || cfg.NumHiddenLayers != 1 || cfg.VocabSize != c.vocab ||
			cfg.NumAttentionHeads != c.heads || cfg.NumKeyValueHeads != c.kvHeads || cfg.HeadDim != 128 ||
			cfg.Rope.Theta != 1e6 || cfg.TieWordEmbeddings || cfg.DType != tensor.BF16 || !cfg.IsSparseLayer(0) {
			t.Errorf("%s: config %+v", c.name, cfg)
		}
		if c.arch == "Qwen3MoeForCausalLM" && (cfg.MoE.IntermediateSize != c.width || !cfg.MoE.NormTopKProb || cfg.MaxPositionEmbeddings != 40960 || cfg.RMSNormEps != 1e-6) {
			t.Errorf("%s: MoE config %+v", c.name, cfg.MoE)
		}
		if c.arch == "MixtralForCausalLM" && (cfg.IntermediateSize != c.width || cfg.SlidingWindow != 0 || cfg.MaxPositionEmbeddings != 32768 || cfg.RMSNormEps != 1e-5) {
			t.Errorf("%s: config %+v", c.name, cfg)
		}
		shapes := map[string][]int{}
		for _, n := range p.g.Params() {
			ref, err := graph.ParamOf(n)
			if err != nil {
				t.Fatal(err)
			}
			if ref.DType != tensor.BF16 {
				t.Errorf("%s: %s is %s", c.name, ref.Key, ref.DType)
			}
			shapes[ref.Key] = ref.Shape
		}
		blk := "model.layers.0." + c.block
		want := map[string][]int{
			"model.embed_tokens.weight":              {c.vocab, c.hidden},
			"lm_head.weight":                         {c.vocab, c.hidden},
			"model.layers.0.self_attn.q_proj.weight": {c.heads * 128, c.hidden},
			"model.layers.0.self_attn.k_proj.weight": {c.kvHeads * 128, c.hidden},
			blk + ".gate.weight":                     {c.experts, c.hidden},
		}
		for e := range c.experts {
			ep := fmt.Sprintf("%s.experts.%d.", blk, e)
			want[ep+c.gate+".weight"] = []int{c.width, c.hidden}
			want[ep+c.up+".weight"] = []int{c.width, c.hidden}
			want[ep+c.down+".weight"] = []int{c.hidden, c.width}
		}
		if c.qkNorm {
			want["model.layers.0.self_attn.q_norm.weight"] = []int{128}
		}
		for k, s := range want {
			if got, ok := shapes[k]; !ok || fmt.Sprint(got) != fmt.Sprint(s) {
				t.Errorf("%s: %s has shape %v (present %v), want %v", c.name, k, got, ok, s)
			}
		}
		for k := range shapes {
			if strings.Contains(k, "gate_up_proj") || strings.Contains(k, "shared_expert") {
				t.Errorf("%s: unexpected tensor %s", c.name, k)
			}
		}
		if testing.Short() {
			continue
		}
		full, err := plan(c.name, Options{})
		if err != nil {
			t.Fatal(err)
		}
		var params int64
		for _, n := range full.g.Params() {
			ref, _ := graph.ParamOf(n)
			params += int64(tensor.Numel(ref.Shape))
		}
		if params != c.params {
			t.Errorf("%s: %d params, want %d", c.name, params, c.params)
		}
	}
}

func TestExpertsOption(t *testing.T) {
	p, err := plan("mixtral-8x7b", Options{Layers: 1, Experts: 4})
	if err != nil || p.cfg.NumLocalExperts != 4 || p.cfgMap["num_local_experts"] != 4 {
		t.Errorf("Experts: 4 gives %v", err)
	}
	for _, c := range []struct {
		name    string
		experts int
		want    string
	}{{"qwen3-30b-a3b", 7, "num_experts_per_tok"}, {"llama-3.2-1b", 4, "no experts"}} {
		if _, err := plan(c.name, Options{Experts: c.experts}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s with %d experts: error %v, want one naming %q", c.name, c.experts, err, c.want)
		}
	}
}

// Tiny copies of the MoE shapes, with fewer experts, write, load and run; Mixtral's
// tokenizer keeps <unk>, <s> and </s> at ids 0-2.
func TestMoEWriteLoadsAndRuns(t *testing.T) {
	for _, from := range []string{"qwen3-30b-a3b", "mixtral-8x7b"} {
		name := "test-" + from
		defer tinyCopy(from, name)()
		dir := t.TempDir()
		if err := Write(context.Background(), name, dir, Options{Seed: 2, Experts: 4, ShardBytes: 60000}); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(dir, model.IndexFile)); err != nil {
			t.Errorf("%s: expected a sharded checkpoint: %v", name, err)
		}
		m, err := model.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if m.Config.NumLocalExperts != 4 {
			t.Errorf("%s: %d experts", name, m.Config.NumLocalExperts)
		}
		g, err := model.BuildGraph(m.Config, model.BuildOptions{Tensors: m.Checkpoint})
		if err != nil {
			t.Fatal(err)
		}
		if err := m.Checkpoint.Check(g); err != nil {
			t.Fatal(err)
		}
		prog, err := cpu.Compile(context.Background(), g, m.Checkpoint)
		if err != nil {
			t.Fatal(err)
		}
		outs, err := prog.Run(context.Background(), map[string]*tensor.Tensor{
			"input_ids": tensor.FromI32([]int32{1, 2, 3}, 1, 3),
			"positions": tensor.FromI32([]int32{0, 1, 2}, 1, 3),
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range outs[0].Float32s() {
			if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
				t.Fatalf("%s: logit %v", name, v)
			}
		}
		tok, err := tokenizer.LoadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		ids, err := tok.Encode("hé", true)
		if err != nil {
			t.Fatal(err)
		}
		want, chat := "[104 195 169]", "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" // ChatML adds no BOS
		if from == "mixtral-8x7b" {
			want, chat = "[1 107 198 172]", "<s>[INST] hi [/INST]" // <s>, then each byte + 3
		}
		if fmt.Sprint(ids) != want {
			t.Errorf("%s: encode = %v, want %s", name, ids, want)
		}
		if text, err := tok.Decode(ids, true); err != nil || text != "hé" {
			t.Errorf("%s: decode = %q, %v", name, text, err)
		}
		tmpl, err := chattemplate.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		if text, err := tmpl.Render([]chattemplate.Message{{Role: "user", Content: "hi"}}, true); err != nil || text != chat {
			t.Errorf("%s: chat template renders %q, %v; want %q", name, text, err, chat)
		}
	}
}
