package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loom-ml/loom/tokenizer"
)

func TestGeneratePrompt(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tiny-llama")
	tok, err := tokenizer.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	prompt := "The quick brown fox"
	ids, err := tok.Encode(prompt, true)
	if err != nil {
		t.Fatal(err)
	}
	// --prompt gives the same JSON as --prompt-ids with the prompt's ids.
	byText, stderr, err := run(t, "generate", "--model", dir, "--prompt", prompt, "--max-new-tokens", "5", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	byIDs, _, err := run(t, "generate", "--model", dir, "--prompt-ids", strings.Trim(jsonString(ids), "[]"), "--max-new-tokens", "5", "--json")
	if err != nil {
		t.Fatal(err)
	}
	if byText != byIDs {
		t.Errorf("--prompt: %s--prompt-ids: %s", byText, byIDs)
	}
	var out struct {
		IDs []int `json:"ids"`
	}
	if err := json.Unmarshal([]byte(byText), &out); err != nil || len(out.IDs) != 5 {
		t.Fatalf("%s: %v", byText, err)
	}
	// Without --json it prints the new text.
	text, _, err := run(t, "generate", "--model", dir, "--prompt", prompt, "--max-new-tokens", "5")
	if err != nil {
		t.Fatal(err)
	}
	want, err := tok.Decode(out.IDs, true)
	if err != nil {
		t.Fatal(err)
	}
	if text != want+"\n" {
		t.Errorf("text %q, want %q", text, want+"\n")
	}
	for _, args := range [][]string{
		{"generate", "--model", dir},
		{"generate", "--model", dir, "--prompt", "a", "--prompt-ids", "1"},
	} {
		if _, _, err := run(t, args...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
}
