package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// unsupportedModel is a copy of tiny-llama whose config names an architecture Loom has no
// frontend for.
func unsupportedModel(t *testing.T) string {
	t.Helper()
	src, dir := filepath.Join("..", "..", "testdata", "tiny-llama"), t.TempDir()
	for _, f := range []string{"config.json", "model.safetensors"} {
		data, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if f == "config.json" {
			data = []byte(strings.Replace(string(data), `"LlamaForCausalLM"`, `"GPT2LMHeadModel"`, 1))
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
