package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model/synth"
)

// tinyMoE registers a copy of a synth MoE shape with small dims; the returned func removes it.
func tinyMoE(from, name string) func() {
	s := synth.Shapes[from]
	cfg := map[string]any{}
	for k, v := range s.Config {
		cfg[k] = v
	}
	for k, v := range map[string]any{"vocab_size": 512, "hidden_size": 64, "intermediate_size": 96,
		"num_attention_heads": 4, "num_key_value_heads": 2, "num_experts_per_tok": 2} {
		cfg[k] = v
	}
	if _, ok := cfg["head_dim"]; ok {
		cfg["head_dim"], cfg["moe_intermediate_size"] = 16, 32
	}
	if cfg["bos_token_id"].(int) >= 512 {
		cfg["bos_token_id"], cfg["eos_token_id"] = 300, 301
	}
	synth.Shapes[name] = synth.Shape{Name: name, Chat: s.Chat, Config: cfg}
	return func() { delete(synth.Shapes, name) }
}

// `loom synth` writes small copies of the MoE shapes (--layers, --experts) that generate the
// same tokens through the plain graph and the optimized one, whose sparse blocks are fused
// moe ops (match_moe_pattern).
func TestSynthMoE(t *testing.T) {
	for _, from := range []string{"qwen3-30b-a3b", "mixtral-8x7b"} {
		name := "tiny-" + from
		defer tinyMoE(from, name)()
		dir := t.TempDir()
		stdout, stderr, err := run(t, "synth", name, "--out", dir, "--layers", "2", "--experts", "4", "--seed", "5")
		if err != nil || !strings.Contains(stdout, "wrote "+name) {
			t.Fatalf("synth %s: %v\n%s%s", name, err, stdout, stderr)
		}
		args := []string{"generate", "--model", dir, "--prompt-ids", "5,17,42", "--max-new-tokens", "4", "--json"}
		opt, stderr, err := run(t, args...)
		if err != nil {
			t.Fatalf("%s: generate: %v\n%s", name, err, stderr)
		}
		plain, stderr, err := run(t, append(args, "--no-optimize")...)
		if err != nil {
			t.Fatalf("%s: generate --no-optimize: %v\n%s", name, err, stderr)
		}
		if !strings.Contains(opt, `"ids"`) || opt != plain {
			t.Errorf("%s: optimized %s, plain %s", name, opt, plain)
		}
		out := filepath.Join(t.TempDir(), "final.txt")
		if _, stderr, err := run(t, "compile", "--model", dir, "-o", out); err != nil {
			t.Fatalf("%s: compile: %v\n%s", name, err, stderr)
		}
		text, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		g, err := graph.Parse(string(text))
		if err != nil {
			t.Fatal(err)
		}
		moes := 0
		for _, n := range g.Nodes {
			if n.Op == "moe" {
				moes++
			}
		}
		if moes != 2 {
			t.Errorf("%s: %d moe ops in the optimized graph, want one a layer (2)", name, moes)
		}
	}
}

func TestSynthUnknownShape(t *testing.T) {
	_, _, err := run(t, "synth", "gpt-5", "--out", t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "mixtral-8x7b") || !strings.Contains(err.Error(), "qwen3-30b-a3b") {
		t.Errorf("error %v should list the known shapes", err)
	}
}
