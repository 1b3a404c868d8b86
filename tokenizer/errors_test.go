package tokenizer

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestParseErrors checks that bad tokenizer.json files give errors that say what is wrong
// and where.
func TestParseErrors(t *testing.T) {
	good := spec{vocab: []string{"a", "b", "ab"}, merges: []string{"a b"}}
	tests := []struct {
		name, json, want string
	}{
		{"not JSON", `{"model":`, "invalid JSON"},
		{"no model", `{"added_tokens": []}`, "model: missing"},
		{"wordpiece", `{"model": {"type": "WordPiece", "vocab": {}}}`, `unsupported model type "WordPiece"`},
		{"unigram", `{"model": {"type": "Unigram", "vocab": []}}`, `unsupported model type "Unigram"`},
		{"no vocab", `{"model": {"type": "BPE", "merges": []}}`, "model: missing vocab"},
		{"merge not in vocab", spec{vocab: []string{"a"}, merges: []string{"a b"}}.json(), `merges[0]: token "b" is not in the vocabulary`},
		{"merged token not in vocab", spec{vocab: []string{"a", "b"}, merges: []string{"a b"}}.json(), `merged token "ab" is not in the vocabulary`},
		{"bad merge string", spec{vocab: []string{"a"}, merges: []string{"a"}}.json(), `merges[0]: want "left right"`},
		{"bad merge list", `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [["a", "b", "c"]]}}`, "merges[0]: want a string"},
		{"normalizer type", func() string {
			s := good
			s.normalizer = `{"type": "Precompiled", "precompiled_charsmap": ""}`
			return s.json()
		}(),
			`normalizer: unsupported normalizer type "Precompiled"`},
		{"nested normalizer type", func() string {
			s := good
			s.normalizer = `{"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Magic"}]}`
			return s.json()
		}(), `normalizer.normalizers[1]: unsupported normalizer type "Magic"`},
		{"pre-tokenizer type", func() string { s := good; s.pre = `{"type": "UnicodeScripts"}`; return s.json() }(),
			`pre_tokenizer: unsupported pre-tokenizer type "UnicodeScripts"`},
		{"nested pre-tokenizer type", func() string {
			s := good
			s.pre = `{"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}, {"type": "Foo"}]}`
			return s.json()
		}(), `pre_tokenizer.pretokenizers[1]: unsupported pre-tokenizer type "Foo"`},
		{"missing type", func() string { s := good; s.pre = `{"pattern": {"String": " "}}`; return s.json() }(), `pre_tokenizer: missing "type"`},
		{"bad regex", func() string {
			s := good
			s.pre = `{"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated", "invert": false}`
			return s.json()
		}(), `pre_tokenizer.pattern: compile regex`},
		{"bad pattern", func() string {
			s := good
			s.pre = `{"type": "Split", "pattern": {"Glob": "*"}, "behavior": "Isolated", "invert": false}`
			return s.json()
		}(), `want {"String": ...} or {"Regex": ...}`},
		{"bad behavior", func() string {
			s := good
			s.pre = `{"type": "Split", "pattern": {"String": " "}, "behavior": "Sideways", "invert": false}`
			return s.json()
		}(), `unknown split behavior "Sideways"`},
		{"bad prepend scheme", func() string {
			s := good
			s.pre = `{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "sometimes"}`
			return s.json()
		}(), `unknown prepend_scheme "sometimes"`},
		{"decoder type", func() string { s := good; s.decoder = `{"type": "CTC"}`; return s.json() }(), `decoder: unsupported decoder type "CTC"`},
		{"post-processor type", func() string { s := good; s.post = `{"type": "Magic"}`; return s.json() }(), `post_processor: unsupported post-processor type "Magic"`},
		{"template without token", func() string {
			s := good
			s.post = `{"type": "TemplateProcessing", "single": "<s> $A", "special_tokens": {}}`
			return s.json()
		}(), `special token "<s>" is missing from special_tokens`},
		{"empty added token", func() string { s := good; s.added = `[{"id": 5, "content": ""}]`; return s.json() }(), "added_tokens[0]: empty content"},
		{"negative id", func() string { s := good; s.added = `[{"id": -1, "content": "x"}]`; return s.json() }(), "added_tokens[0]: invalid id -1"},
		{"added token without id", func() string { s := good; s.added = `[{"content": "x"}]`; return s.json() }(), `added_tokens[0] ("x"): no id`},
		{"two added tokens with one id", func() string {
			s := good
			s.added = `[{"id": 7, "content": "x"}, {"id": 7, "content": "y"}]`
			return s.json()
		}(), `added_tokens[1] ("y"): id 7 is already added_tokens[0] ("x")`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok, err := Parse([]byte(tt.json))
			if err == nil {
				t.Fatalf("Parse succeeded (%v), want an error containing %q", tok != nil, tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "tokenizer: ") {
				t.Errorf("error %q, want one containing %q", err, tt.want)
			}
		})
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(filepath.Join(dir, "missing.json")); err == nil || !strings.Contains(err.Error(), "missing.json") {
		t.Errorf("Load(missing) = %v, want an error naming the file", err)
	}
	bad := filepath.Join(dir, "tokenizer.json")
	if err := os.WriteFile(bad, []byte(`{"model": {"type": "WordLevel", "vocab": {}}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(bad); err == nil || !strings.Contains(err.Error(), bad+": model: unsupported model type") {
		t.Errorf("Load(bad) = %v, want an error naming the file and the model type", err)
	}
	good := spec{vocab: []string{"a"}}.json()
	if err := os.WriteFile(bad, []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "tokenizer_config.json")
	if err := os.WriteFile(cfg, []byte(`{"bos_token": `), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadDir(dir); err == nil || !strings.Contains(err.Error(), "tokenizer_config.json: invalid JSON") {
		t.Errorf("LoadDir(bad config) = %v", err)
	}
	if err := os.Remove(cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadDir(dir); err != nil {
		t.Errorf("LoadDir without tokenizer_config.json: %v", err)
	}
}

func TestDecodeErrors(t *testing.T) {
	tok := spec{vocab: []string{"a"}}.build(t)
	for _, ids := range [][]int{{1}, {-1}, {0, 99}} {
		if _, err := tok.Decode(ids, false); err == nil || !strings.Contains(err.Error(), "not in the vocabulary") {
			t.Errorf("Decode(%v) = %v, want an out-of-vocabulary error", ids, err)
		}
	}
}

func TestUnkTokenMissing(t *testing.T) {
	tok := spec{vocab: []string{"a"}, modelExtra: `"unk_token": "<unk>"`}.build(t)
	if _, err := tok.Encode("ab", false); err == nil || !strings.Contains(err.Error(), `unk_token "<unk>" is not in the vocabulary`) {
		t.Errorf("Encode = %v, want an unk_token error", err)
	}
	if ids, err := tok.Encode("aa", false); err != nil || len(ids) != 2 {
		t.Errorf("Encode(aa) = %v, %v", ids, err)
	}
}
