package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model/synth"
	"github.com/loom-ml/loom/tokenizer"
)

// addShape registers, until the test ends, synth shape name: a copy of shape from with the
// config values in set replaced.
func addShape(t *testing.T, from, name string, set map[string]any) {
	t.Helper()
	s := synth.Shapes[from]
	cfg := map[string]any{}
	for k, v := range s.Config {
		cfg[k] = v
	}
	for k, v := range set {
		cfg[k] = v
	}
	synth.Shapes[name] = synth.Shape{Name: name, Chat: s.Chat, Config: cfg}
	t.Cleanup(func() { delete(synth.Shapes, name) })
}

// tinyMoE registers a copy of a synth MoE shape with small dims until the test ends.
func tinyMoE(t *testing.T, from, name string) {
	set := map[string]any{"vocab_size": 512, "hidden_size": 64, "intermediate_size": 96,
		"num_attention_heads": 4, "num_key_value_heads": 2, "num_experts_per_tok": 2}
	if _, ok := synth.Shapes[from].Config["head_dim"]; ok {
		set["head_dim"], set["moe_intermediate_size"] = 16, 32
	}
	if synth.Shapes[from].Config["bos_token_id"].(int) >= 512 {
		set["bos_token_id"], set["eos_token_id"] = 300, 301
	}
	addShape(t, from, name, set)
}

// `loom synth` writes small copies of the MoE shapes (--layers, --experts) that generate the
// same tokens through the plain graph and the optimized one, whose sparse blocks are fused
// moe ops (match_moe_pattern).
func TestSynthMoE(t *testing.T) {
	for _, from := range []string{"qwen3-30b-a3b", "mixtral-8x7b"} {
		name := "tiny-" + from
		tinyMoE(t, from, name)
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
		if moes := compiledOps(t, dir, "moe"); moes != 2 {
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

// A synthesized model's replies have text: the tokenizer covers its whole vocabulary, so
// every id generated decodes (with the old 258-token tokenizer almost every id of a larger
// vocabulary had none, and replies came out empty).
func TestSynthTokenizerCoversReplies(t *testing.T) {
	addShape(t, "qwen2.5-0.5b", "tiny-qwen-vocab", map[string]any{"vocab_size": 8192, "hidden_size": 64, "intermediate_size": 96,
		"num_attention_heads": 4, "num_key_value_heads": 2, "bos_token_id": 8000, "eos_token_id": 8002})
	dir := t.TempDir()
	if _, stderr, err := run(t, "synth", "tiny-qwen-vocab", "--out", dir, "--layers", "1", "--seed", "3"); err != nil {
		t.Fatalf("synth: %v\n%s", err, stderr)
	}
	tok, err := tokenizer.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if tok.VocabSize() != 8192 {
		t.Errorf("tokenizer vocabulary %d, model 8192", tok.VocabSize())
	}
	// A hot temperature spreads the random model's picks over the vocabulary.
	args := []string{"--model", dir, "--system", "Be brief.", "--prompt", "hello", "--max-new-tokens", "12", "--temperature", "2", "--seed", "1", "--log-level", "warn"}
	ids := generateIDs(t, args...)
	text, stderr, err := run(t, append([]string{"generate"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stderr, "not in the tokenizer's vocabulary") {
		t.Errorf("generated ids the tokenizer does not know: %s", stderr)
	}
	n, beyondBytes := len(ids), 0
	for i, id := range ids {
		if id == 8002 {
			n = i
			break
		}
		if id > 255 {
			beyondBytes++
		}
	}
	if beyondBytes == 0 {
		t.Fatalf("ids %v: none beyond the bytes, the test proves nothing", ids)
	}
	want, err := tok.Decode(ids[:n], true)
	if err != nil {
		t.Fatal(err)
	}
	if want == "" || text != want+"\n" {
		t.Errorf("ids %v: text %q, want %q (non-empty)", ids, text, want+"\n")
	}
	for _, id := range ids {
		if s, err := tok.Decode([]int{id}, false); err != nil || s == "" {
			t.Errorf("id %d decodes to %q, %v", id, s, err)
		}
	}
}

// synth refuses a folder that is not empty, naming --force; --force writes over it and
// leaves one checkpoint (an old single file does not shadow new shards).
func TestSynthForce(t *testing.T) {
	tinyMoE(t, "mixtral-8x7b", "tiny-force")
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "model-00001-of-00009.safetensors"), []byte("stale"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := run(t, "synth", "tiny-force", "--out", dir, "--layers", "1", "--experts", "2")
	if err == nil || !strings.Contains(err.Error(), "--force") || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("a non-empty folder: error %v, want one naming --force", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "config.json")); err == nil {
		t.Error("config.json written into a folder that was refused")
	}
	if _, stderr, err := run(t, "synth", "tiny-force", "--out", dir, "--layers", "1", "--experts", "2", "--force"); err != nil {
		t.Fatalf("--force: %v\n%s", err, stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "model-00001-of-00009.safetensors")); err == nil {
		t.Error("--force left a stale shard")
	}
	if data, err := os.ReadFile(filepath.Join(dir, "notes.txt")); err != nil || string(data) != "mine" {
		t.Errorf("--force touched a file that is not the checkpoint's: %q, %v", data, err)
	}
	if ids := generateIDs(t, "--model", dir, "--prompt-ids", "5,6", "--max-new-tokens", "2", "--log-level", "warn"); len(ids) != 2 {
		t.Errorf("the forced checkpoint generates %v", ids)
	}
	// A new folder and an empty one need no --force.
	empty := t.TempDir()
	for _, d := range []string{filepath.Join(t.TempDir(), "new", "dir"), empty} {
		if _, stderr, err := run(t, "synth", "tiny-force", "--out", d, "--layers", "1", "--experts", "2"); err != nil {
			t.Errorf("%s: %v\n%s", d, err, stderr)
		}
	}
}

// `loom synth --fp8 block` writes a checkpoint that generates the same tokens through the
// plain graph and the optimized one (linear_fp8 ops, q/k/v and gate/up joined with their
// block scales); an unknown --fp8 value is refused before the folder is touched, naming the
// flag and the formats it takes.
func TestSynthFP8(t *testing.T) {
	// Every projection's rows a multiple of 128 (k/v: 2 heads of 64), as in the real models, so
	// that fuse_gemms can join block-scaled weights on block boundaries.
	addShape(t, "qwen2.5-0.5b", "tiny-qwen-fp8", map[string]any{"vocab_size": 512, "hidden_size": 256, "intermediate_size": 384,
		"num_attention_heads": 4, "num_key_value_heads": 2, "bos_token_id": 300, "eos_token_id": 301})

	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "model.safetensors"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err := run(t, "synth", "tiny-qwen-fp8", "--out", dir, "--layers", "1", "--fp8", "bogus", "--force")
	if err == nil || !strings.Contains(err.Error(), `--fp8 "bogus"`) || !strings.Contains(err.Error(), "block") {
		t.Errorf("--fp8 bogus: error %v, want one naming the flag, the value and block", err)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "model.safetensors")); err != nil || string(data) != "kept" {
		t.Errorf("--fp8 bogus --force touched the folder: %q, %v", data, err)
	}

	stdout, stderr, err := run(t, "synth", "tiny-qwen-fp8", "--out", dir, "--layers", "2", "--fp8", "block", "--seed", "4", "--force")
	if err != nil || !strings.Contains(stdout, "wrote tiny-qwen-fp8") {
		t.Fatalf("synth --fp8 block: %v\n%s%s", err, stdout, stderr)
	}
	config, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil || !strings.Contains(string(config), `"quant_method": "fp8"`) {
		t.Errorf("config.json has no fp8 quantization_config (%v):\n%s", err, config)
	}
	args := []string{"--model", dir, "--prompt-ids", "5,17,42", "--max-new-tokens", "4", "--log-level", "warn"}
	opt := generateIDs(t, args...)
	plain := generateIDs(t, append(args, "--no-optimize")...)
	if len(opt) != 4 || fmt.Sprint(opt) != fmt.Sprint(plain) {
		t.Errorf("optimized %v, plain %v", opt, plain)
	}
	// A layer: q/k/v joined, o, gate/up joined, down.
	if fp8 := compiledOps(t, dir, "linear_fp8"); fp8 != 8 {
		t.Errorf("%d linear_fp8 ops in the optimized graph, want 4 a layer (8)", fp8)
	}
}

// compiledOps counts the nodes of op in the graph `loom compile` writes for the model in dir.
func compiledOps(t *testing.T, dir, op string) int {
	t.Helper()
	out := filepath.Join(t.TempDir(), "final.txt")
	if _, stderr, err := run(t, "compile", "--model", dir, "-o", out); err != nil {
		t.Fatalf("compile %s: %v\n%s", dir, err, stderr)
	}
	text, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	g, err := graph.Parse(string(text))
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	for _, n := range g.Nodes {
		if n.Op == op {
			count++
		}
	}
	return count
}
