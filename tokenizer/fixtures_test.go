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
