package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/internal/parity"
)

// run executes the CLI in-process and returns stdout and stderr.
func run(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	cmd := newRootCmd()
	var stdout, stderr bytes.Buffer
	cmd.SetOut(&stdout)
	cmd.SetErr(&stderr)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return stdout.String(), stderr.String(), err
}

func TestGenerateJSON(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tiny-qwen2")
	ref, err := parity.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	p := ref.Prompts[0]
	ids := strings.Trim(jsonString(p.IDs), "[]") // "1,2,3"
	stdout, stderr, err := run(t, "generate", "--model", dir, "--prompt-ids", ids, "--max-new-tokens", "4", "--json", "--logits")
	if err != nil {
		t.Fatalf("generate: %v\n%s", err, stderr)
	}
	dec := json.NewDecoder(strings.NewReader(stdout))
	var out struct {
		IDs    []int     `json:"ids"`
		Logits []float32 `json:"logits"`
	}
	if err := dec.Decode(&out); err != nil {
		t.Fatalf("stdout is not JSON: %v\n%s", err, stdout)
	}
	if dec.More() {
		t.Fatalf("stdout holds more than one JSON object:\n%s", stdout)
	}
	if len(out.IDs) != 4 || jsonString(out.IDs) != jsonString(p.GreedyNewIDs[:4]) {
		t.Errorf("ids = %v, want %v", out.IDs, p.GreedyNewIDs[:4])
	}
	// The last position's logits, within parity.LogitTol of Hugging Face's (a NaN fails).
	if len(out.Logits) != len(p.LastLogits) {
		t.Fatalf("%d logits, want %d", len(out.Logits), len(p.LastLogits))
	}
	if err := parity.CheckLogits(out.Logits, p, parity.LogitTol); err != nil {
		t.Error(err)
	}
	if !strings.Contains(stderr, "model loaded") {
		t.Errorf("logs should go to stderr, got %q", stderr)
	}
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestGenerateErrors(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tiny-llama")
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"bad ids", []string{"generate", "--model", dir, "--prompt-ids", "1,x"}, `"x" is not a token id`},
		{"id out of vocab", []string{"generate", "--model", dir, "--prompt-ids", "1,99999"}, "outside the vocabulary"},
		{"missing model", []string{"generate", "--model", filepath.Join(t.TempDir(), "nope"), "--prompt-ids", "1"}, "nope"},
		{"negative count", []string{"generate", "--model", dir, "--prompt-ids", "1", "--max-new-tokens", "-1"}, "--max-new-tokens"},
		{"unsupported architecture", []string{"inspect", "--model", unsupportedModel(t)}, "supported: LlamaForCausalLM"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdout, _, err := run(t, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error = %v, want it to contain %q", err, tc.want)
			}
			if stdout != "" {
				t.Errorf("nothing should reach stdout on error, got %q", stdout)
			}
		})
	}
}

func TestInspect(t *testing.T) {
	stdout, _, err := run(t, "inspect", "--model", filepath.Join("..", "..", "testdata", "tiny-qwen3"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"architecture: Qwen3ForCausalLM", "head_dim: 24", "graph Qwen3ForCausalLM(input_ids: i32[B,S], positions: i32[B,S])", `param "model.layers.1.self_attn.q_norm.weight"`} {
		if !strings.Contains(stdout, want) {
			t.Errorf("inspect output lacks %q", want)
		}
	}
}

func TestCompile(t *testing.T) {
	dump := t.TempDir()
	out := filepath.Join(t.TempDir(), "final.txt")
	_, stderr, err := run(t, "compile", "--model", filepath.Join("..", "..", "testdata", "tiny-llama"),
		"--dump-graphs", dump, "--check", "-o", out, "--report-candidates",
		"--set", "transforms.cleanup_cse.enabled=false")
	if err != nil {
		t.Fatalf("compile: %v\n%s", err, stderr)
	}
	lines := strings.Split(stderr, "\n")
	summary := regexp.MustCompile(`^\[stage=[a-z_]+ transform=[a-z_]+\] \[SUMMARY\] (matches=\d+ \| time: [0-9.]+m?s|skipped|disabled)$`)
	var summaries int
	for _, l := range lines {
		if strings.HasPrefix(l, "[stage=") {
			summaries++
			if !summary.MatchString(l) {
				t.Errorf("summary line %q has the wrong form", l)
			}
		}
	}
	if summaries == 0 {
		t.Fatalf("no summary lines on stderr:\n%s", stderr)
	}
	if !strings.Contains(stderr, "transform=cleanup_cse] [SUMMARY] disabled") {
		t.Errorf("--set did not disable cleanup_cse:\n%s", stderr)
	}
	if !strings.Contains(stderr, "fusion candidates") {
		t.Errorf("no candidate report:\n%s", stderr)
	}
	text, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := graph.Parse(string(text)); err != nil {
		t.Errorf("the final graph text does not parse: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dump, "index.html")); err != nil {
		t.Errorf("no index.html in the dump directory: %v", err)
	}
	for _, bad := range [][]string{
		{"--set", "transforms.no_such_transform.enabled=false"},
		{"--set", "transforms.cleanup_noop.cast=yes"},
	} {
		_, _, err := run(t, append([]string{"compile", "--model", filepath.Join("..", "..", "testdata", "tiny-llama")}, bad...)...)
		if err == nil {
			t.Errorf("compile %v should fail", bad)
		}
	}
}

// Generating with the optimized graph and the plain one gives the same tokens.
func TestGenerateNoOptimize(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tiny-llama31")
	a, _, err := run(t, "generate", "--model", dir, "--prompt-ids", "0,5,17,42", "--max-new-tokens", "6", "--json")
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := run(t, "generate", "--model", dir, "--prompt-ids", "0,5,17,42", "--max-new-tokens", "6", "--json", "--no-optimize")
	if err != nil {
		t.Fatal(err)
	}
	if a != b {
		t.Errorf("optimized %s != plain %s", a, b)
	}
}
