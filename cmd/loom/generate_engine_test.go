package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loom-ml/loom/chattemplate"
	"github.com/loom-ml/loom/internal/parity"
	"github.com/loom-ml/loom/tokenizer"
)

// generateIDs runs loom generate --json and returns the new ids.
func generateIDs(t *testing.T, args ...string) []int {
	t.Helper()
	stdout, stderr, err := run(t, append([]string{"generate", "--json"}, args...)...)
	if err != nil {
		t.Fatalf("generate %v: %v\n%s", args, err, stderr)
	}
	var out struct {
		IDs []int `json:"ids"`
	}
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("generate %v: stdout is not JSON: %v\n%s", args, err, stdout)
	}
	return out.IDs
}

func idList(ids []int) string { return strings.Trim(jsonString(ids), "[]") }

// Greedy tokens through the engine (the KV-cached graph that loom serve runs) are Hugging
// Face's, on every fixture and every reference prompt (one of them 300+ tokens long),
// teacher-forced past near ties.
func TestGenerateEngineHuggingFaceParity(t *testing.T) {
	for _, name := range []string{"tiny-llama", "tiny-llama31", "tiny-llama2", "tiny-mistral", "tiny-qwen2", "tiny-qwen3", "tiny-gqa6", "tiny-mixtral", "tiny-qwen3moe"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("..", "..", "testdata", name)
			ref, err := parity.Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			gen := func(prompt []int, n int) ([]int, error) {
				return generateIDs(t, "--model", dir, "--prompt-ids", idList(prompt), "--max-new-tokens", fmt.Sprint(n), "--log-level", "warn"), nil
			}
			for i, p := range ref.Prompts {
				if _, err := parity.CheckGreedy(gen, p, parity.NearTie); err != nil {
					t.Errorf("prompt %d (%d tokens): %v", i, len(p.IDs), err)
				}
			}
		})
	}
}

// writeLog records every write to stdout, to see text arrive token by token.
type writeLog struct{ writes []string }

func (w *writeLog) Write(p []byte) (int, error) {
	w.writes = append(w.writes, string(p))
	return len(p), nil
}

// --prompt streams the text as it is generated (one write a token, not one at the end), and
// the text is the decoding of the ids up to the first end-of-sequence token.
func TestGenerateStreamsText(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tiny-llama")
	prompt := "The quick brown fox"
	ids := generateIDs(t, "--model", dir, "--prompt", prompt, "--max-new-tokens", "12")
	cmd := newRootCmd()
	var w writeLog
	cmd.SetOut(&w)
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"generate", "--model", dir, "--prompt", prompt, "--max-new-tokens", "12"})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	eos, _ := tok.EOS()
	n := len(ids)
	for i, id := range ids {
		if id == eos {
			n = i
			break
		}
	}
	want, err := tok.Decode(ids[:n], true)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(w.writes, ""); got != want+"\n" {
		t.Errorf("text %q, want %q", got, want+"\n")
	}
	if len(w.writes) < 3 {
		t.Errorf("the text came in %d writes %q: it does not stream", len(w.writes), w.writes)
	}
	// --prompt-ids streams ids, comma-separated.
	cmd = newRootCmd()
	w = writeLog{}
	cmd.SetOut(&w)
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"generate", "--model", dir, "--prompt-ids", "0,56,76", "--max-new-tokens", "5"})
	if err := cmd.ExecuteContext(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(w.writes, ""), idList(generateIDs(t, "--model", dir, "--prompt-ids", "0,56,76", "--max-new-tokens", "5"))+"\n"; got != want || len(w.writes) != 6 {
		t.Errorf("ids %q in %d writes, want %q in 6", got, len(w.writes), want)
	}
}

// Sampling flags reach the engine: a seed makes a sampled run reproducible, other seeds
// give other tokens, temperature 0 is greedy, and bad values fail naming the flag.
func TestGenerateSampling(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tiny-llama")
	base := []string{"--model", dir, "--prompt-ids", "0,56,76", "--max-new-tokens", "24"}
	greedy := generateIDs(t, base...)
	if got := generateIDs(t, append(base, "--temperature", "0", "--top-k", "5")...); jsonString(got) != jsonString(greedy) {
		t.Errorf("--temperature 0 gave %v, greedy %v", got, greedy)
	}
	sampled := func(seed string, extra ...string) string {
		return jsonString(generateIDs(t, append(append(base, "--temperature", "1.5", "--seed", seed), extra...)...))
	}
	a, b := sampled("1"), sampled("1")
	if a != b {
		t.Errorf("--seed 1 twice: %s and %s", a, b)
	}
	differ := a != jsonString(greedy)
	for seed := 2; seed < 6 && !differ; seed++ {
		differ = sampled(fmt.Sprint(seed)) != a
	}
	if !differ {
		t.Errorf("--temperature 1.5 gives the same tokens for every seed (%s): sampling does not reach the engine", a)
	}
	// --top-k 1 keeps only the most likely token: greedy whatever the temperature.
	if got := sampled("3", "--top-k", "1"); got != jsonString(greedy) {
		t.Errorf("--top-k 1 gave %s, greedy %s", got, jsonString(greedy))
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--temperature", "-1"}, "temperature"},
		{[]string{"--top-p", "1.5"}, "top_p"},
		{[]string{"--temperature", "0.5", "--no-optimize"}, "--no-optimize"},
	} {
		if _, _, err := run(t, append(append([]string{"generate"}, base...), c.args...)...); err == nil || !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(c.want)) {
			t.Errorf("%v: error %v, want one naming %q", c.args, err, c.want)
		}
	}
}

// --system renders the prompt with the model's chat template after a system message: the
// same tokens as the rendered text's ids given by hand.
func TestGenerateSystem(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tiny-qwen2")
	tmpl, err := chattemplate.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	text, err := tmpl.Render([]chattemplate.Message{{Role: "system", Content: "You are terse."}, {Role: "user", Content: "Name a colour."}}, true)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := tok.Encode(text, false)
	if err != nil {
		t.Fatal(err)
	}
	got := generateIDs(t, "--model", dir, "--system", "You are terse.", "--prompt", "Name a colour.", "--max-new-tokens", "6")
	want := generateIDs(t, "--model", dir, "--prompt-ids", idList(ids), "--max-new-tokens", "6")
	if jsonString(got) != jsonString(want) {
		t.Errorf("--system gave %v, the rendered prompt %v", got, want)
	}
	plain := generateIDs(t, "--model", dir, "--prompt", "Name a colour.", "--max-new-tokens", "6")
	if jsonString(plain) == jsonString(got) {
		t.Logf("the plain prompt gives the same tokens as the templated one (possible on a random model)")
	}
	// No template: --system fails naming the flag, before loading.
	noTmpl := t.TempDir()
	for _, f := range []string{"config.json", "model.safetensors", "tokenizer.json"} {
		data, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(noTmpl, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := run(t, "generate", "--model", noTmpl, "--system", "x", "--prompt", "hi"); err == nil || !strings.Contains(err.Error(), "--system") || !strings.Contains(err.Error(), "no chat template") {
		t.Errorf("--system without a template: error %v", err)
	}
	if _, _, err := run(t, "generate", "--model", dir, "--system", "x", "--prompt-ids", "1,2"); err == nil || !strings.Contains(err.Error(), "--prompt") {
		t.Errorf("--system with --prompt-ids: error %v", err)
	}
}

// --max-new-tokens past the model's context fails before loading, naming the flag, the
// context and what fits; what fits exactly runs.
func TestGenerateContextLimit(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tiny-llama") // max_position_embeddings 1024
	stdout, stderr, err := run(t, "generate", "--model", dir, "--prompt-ids", "0,56,76", "--max-new-tokens", "1022")
	if err == nil || !strings.Contains(err.Error(), "--max-new-tokens 1022") || !strings.Contains(err.Error(), "context of 1024") || !strings.Contains(err.Error(), "at most 1021") {
		t.Errorf("error %v, want one naming --max-new-tokens, the context and the 1021 that fit", err)
	}
	if stdout != "" || strings.Contains(stderr, "model loaded") {
		t.Errorf("the model loaded or printed before the refusal: stdout %q\n%s", stdout, stderr)
	}
	if _, _, err := run(t, "generate", "--model", dir, "--prompt-ids", "0,56,76", "--max-new-tokens", "9223372036854775807"); err == nil || !strings.Contains(err.Error(), "--max-new-tokens") {
		t.Errorf("--max-new-tokens 2^63-1: error %v", err)
	}
	if ids := generateIDs(t, "--model", dir, "--prompt-ids", "0,56,76", "--max-new-tokens", "1021", "--log-level", "warn"); len(ids) != 1021 {
		t.Errorf("%d ids, want 1021 (the whole context)", len(ids))
	}
}
