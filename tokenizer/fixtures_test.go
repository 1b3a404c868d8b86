package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// reference is the part of testdata/*/reference.json that the tokenizer tests use; it was
// written by Hugging Face transformers (see tools/make_fixtures.py).
type reference struct {
	Tokenize []struct {
		Text           string `json:"text"`
		IDsWithSpecial []int  `json:"ids_with_special"`
		IDsNoSpecial   []int  `json:"ids_no_special"`
		Decoded        string `json:"decoded"`
	} `json:"tokenize"`
	Chat struct {
		Rendered string `json:"rendered"`
		IDs      []int  `json:"ids"`
	} `json:"chat"`
}

// fixtureDirs returns the fixture folders that hold a tokenizer.
func fixtureDirs(t testing.TB) []string {
	t.Helper()
	dirs, err := filepath.Glob("../testdata/tiny-*")
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no fixtures found: %v", err)
	}
	return dirs
}

func loadReference(t testing.TB, dir string) reference {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref reference
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatalf("%s: %v", dir, err)
	}
	// A reference without cases would make every test over it pass without a check.
	switch {
	case len(ref.Tokenize) == 0:
		t.Fatalf("%s: reference.json has no tokenize cases", dir)
	case ref.Chat.Rendered == "" || len(ref.Chat.IDs) == 0:
		t.Fatalf("%s: reference.json has no rendered chat with its ids", dir)
	}
	return ref
}

func TestFixtures(t *testing.T) {
	for _, dir := range fixtureDirs(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			tok, err := LoadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			ref := loadReference(t, dir)
			for _, c := range ref.Tokenize {
				got, err := tok.Encode(c.Text, true)
				if err != nil {
					t.Errorf("Encode(%q, true): %v", c.Text, err)
				} else if !slices.Equal(got, c.IDsWithSpecial) {
					t.Errorf("Encode(%q, true)\n got %v\nwant %v", c.Text, got, c.IDsWithSpecial)
				}
				got, err = tok.Encode(c.Text, false)
				if err != nil {
					t.Errorf("Encode(%q, false): %v", c.Text, err)
				} else if !slices.Equal(got, c.IDsNoSpecial) {
					t.Errorf("Encode(%q, false)\n got %v\nwant %v", c.Text, got, c.IDsNoSpecial)
				}
				dec, err := tok.Decode(c.IDsWithSpecial, false)
				if err != nil {
					t.Errorf("Decode(%v): %v", c.IDsWithSpecial, err)
				} else if dec != c.Decoded {
					t.Errorf("Decode(%v)\n got %q\nwant %q", c.IDsWithSpecial, dec, c.Decoded)
				}
			}
			got, err := tok.Encode(ref.Chat.Rendered, false)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, ref.Chat.IDs) {
				t.Errorf("Encode(chat %q)\n got %v\nwant %v", ref.Chat.Rendered, got, ref.Chat.IDs)
			}
		})
	}
}

func TestLookups(t *testing.T) {
	tests := []struct {
		dir            string
		vocab          int
		bos, eos       int // -1: none
		bosTok, eosTok string
		special        []int
	}{
		{"tiny-llama", 512, 0, 4, "<|begin_of_text|>", "<|eot_id|>", []int{0, 1, 2, 3, 4}},
		{"tiny-qwen2", 512, -1, 2, "", "<|im_end|>", []int{0, 1, 2}},
		{"tiny-llama2", 556, 1, 2, "<s>", "</s>", []int{0, 1, 2}},
	}
	for _, tt := range tests {
		t.Run(tt.dir, func(t *testing.T) {
			tok, err := LoadDir(filepath.Join("..", "testdata", tt.dir))
			if err != nil {
				t.Fatal(err)
			}
			if got := tok.VocabSize(); got != tt.vocab {
				t.Errorf("VocabSize() = %d, want %d", got, tt.vocab)
			}
			if id, ok := tok.BOS(); ok != (tt.bos >= 0) || (ok && id != tt.bos) {
				t.Errorf("BOS() = %d, %v; want %d", id, ok, tt.bos)
			}
			if id, ok := tok.EOS(); !ok || id != tt.eos {
				t.Errorf("EOS() = %d, %v; want %d", id, ok, tt.eos)
			}
			if s, ok := tok.SpecialToken("bos_token"); s != tt.bosTok || ok != (tt.bosTok != "") {
				t.Errorf("SpecialToken(bos_token) = %q, %v", s, ok)
			}
			if s, _ := tok.SpecialToken("eos_token"); s != tt.eosTok {
				t.Errorf("SpecialToken(eos_token) = %q, want %q", s, tt.eosTok)
			}
			var special []int
			for id := range tok.VocabSize() {
				if tok.IsSpecial(id) {
					special = append(special, id)
				}
				s, ok := tok.IDToken(id)
				if !ok {
					t.Fatalf("IDToken(%d) missing", id)
				}
				if back, ok := tok.TokenID(s); !ok || back != id {
					t.Fatalf("TokenID(IDToken(%d) = %q) = %d, %v", id, s, back, ok)
				}
			}
			if !slices.Equal(special, tt.special) {
				t.Errorf("special ids %v, want %v", special, tt.special)
			}
			if len(tok.AddedTokens()) != len(tt.special) {
				t.Errorf("AddedTokens() = %v", tok.AddedTokens())
			}
			if _, ok := tok.IDToken(tok.VocabSize()); ok {
				t.Error("IDToken(VocabSize()) found a token")
			}
			if _, ok := tok.TokenID("no such token"); ok {
				t.Error("TokenID found a token that does not exist")
			}
		})
	}
}
