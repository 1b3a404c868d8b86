package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// tokenizeRef is the tokenizer part of a fixture's reference.json (made by transformers).
type tokenizeRef struct {
	Tokenize []struct {
		Text           string `json:"text"`
		IDsWithSpecial []int  `json:"ids_with_special"`
		IDsNoSpecial   []int  `json:"ids_no_special"`
	} `json:"tokenize"`
	Chat struct {
		Messages json.RawMessage `json:"messages"`
		Rendered string          `json:"rendered"`
		IDs      []int           `json:"ids"`
	} `json:"chat"`
}

func loadTokenizeRef(t *testing.T, dir string) tokenizeRef {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref tokenizeRef
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	return ref
}

// tokenizerOnly copies a fixture's tokenizer files (no config, no weights) to a new directory.
func tokenizerOnly(t *testing.T, src string) string {
	t.Helper()
	dst := t.TempDir()
	for _, name := range []string{"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} {
		data, err := os.ReadFile(filepath.Join(src, name))
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

func TestTokenize(t *testing.T) {
	for _, fixture := range []string{"tiny-llama", "tiny-llama2", "tiny-mistral", "tiny-qwen2", "tiny-qwen3"} {
		t.Run(fixture, func(t *testing.T) {
			src := filepath.Join("..", "..", "testdata", fixture)
			ref := loadTokenizeRef(t, src)
			dir := tokenizerOnly(t, src) // only the tokenizer files are needed
			for _, tc := range ref.Tokenize {
				for _, special := range []bool{true, false} {
					args := []string{"tokenize", "--model", dir, "--text", tc.Text}
					want := tc.IDsWithSpecial
					if !special {
						args, want = append(args, "--no-special-tokens"), tc.IDsNoSpecial
					}
					stdout, stderr, err := run(t, args...)
					if err != nil {
						t.Fatalf("%v: %v\n%s", args, err, stderr)
					}
					if strings.TrimSpace(stdout) != jsonString(want) {
						t.Errorf("%q (special %v): %s, want %s", tc.Text, special, stdout, jsonString(want))
					}
				}
			}
			if len(ref.Chat.IDs) == 0 {
				return
			}
			msgs := filepath.Join(t.TempDir(), "messages.json")
			if err := os.WriteFile(msgs, ref.Chat.Messages, 0o644); err != nil {
				t.Fatal(err)
			}
			stdout, stderr, err := run(t, "tokenize", "--model", dir, "--messages", msgs)
			if err != nil {
				t.Fatalf("%v\n%s", err, stderr)
			}
			if strings.TrimSpace(stdout) != jsonString(ref.Chat.IDs) {
				t.Errorf("chat ids %s, want %s", stdout, jsonString(ref.Chat.IDs))
			}
			stdout, _, err = run(t, "tokenize", "--model", dir, "--messages", msgs, "--render")
			if err != nil || stdout != ref.Chat.Rendered {
				t.Errorf("rendered %q (%v), want %q", stdout, err, ref.Chat.Rendered)
			}
			stdout, _, err = run(t, "tokenize", "--model", dir, "--messages", msgs, "--render", "--add-generation-prompt=false")
			if err != nil || !strings.HasPrefix(ref.Chat.Rendered, stdout) || len(stdout) > len(ref.Chat.Rendered) {
				t.Errorf("without the generation prompt: %q (%v)", stdout, err)
			}
		})
	}
}

func TestTokenizeErrors(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tiny-llama")
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"role": "user"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	noRole := filepath.Join(t.TempDir(), "norole.json")
	if err := os.WriteFile(noRole, []byte(`[{"content": "hi"}]`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"tokenize", "--model", dir}, "--text or --messages"},
		{[]string{"tokenize", "--model", dir, "--text", "a", "--messages", bad}, "--text or --messages"},
		{[]string{"tokenize", "--model", dir, "--text", "a", "--render"}, "--render goes with --messages"},
		{[]string{"tokenize", "--model", dir, "--messages", bad}, "JSON list"},
		{[]string{"tokenize", "--model", dir, "--messages", noRole}, "no role"},
		{[]string{"tokenize", "--model", t.TempDir(), "--text", "a"}, "tokenizer.json"},
	} {
		_, _, err := run(t, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.want)
		}
	}
}
