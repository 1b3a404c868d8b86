package synth

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/loom-ml/loom/chattemplate"
	"github.com/loom-ml/loom/tokenizer"
)

// The tokenizer of every shipped shape covers the whole vocabulary: each id decodes, the
// BPE vocabulary holds vocab_size ids less the special tokens, and each regular token is
// reachable (its text encodes to its id; checked on a third of them). The chat template's markers are special tokens.
func TestTokenizerCoversVocabulary(t *testing.T) {
	for _, name := range []string{"qwen2.5-0.5b", "llama-3.2-1b", "mixtral-8x7b"} {
		t.Run(name, func(t *testing.T) {
			p, err := plan(name, Options{})
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			start := time.Now()
			if err := writeTokenizer(dir, p.shape, p.cfg); err != nil {
				t.Fatal(err)
			}
			t.Logf("written in %v", time.Since(start))
			tok, err := tokenizer.LoadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			vocab := p.cfg.VocabSize
			if got := tok.VocabSize(); got != vocab {
				t.Errorf("tokenizer vocabulary %d, config vocab_size %d", got, vocab)
			}
			var file struct {
				Model struct {
					Vocab  map[string]int `json:"vocab"`
					Merges []string       `json:"merges"`
				} `json:"model"`
				Added []struct {
					ID int `json:"id"`
				} `json:"added_tokens"`
			}
			data, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(data, &file); err != nil {
				t.Fatal(err)
			}
			specials := map[int]bool{}
			for _, a := range file.Added {
				specials[a.ID] = true
			}
			regular := len(file.Model.Vocab)
			if p.shape.Chat == "mistral" {
				regular-- // <unk> is in both, the BPE model's unk_token
			}
			if regular+len(specials) != vocab {
				t.Errorf("%d BPE tokens + %d special = %d, want vocab_size %d", regular, len(specials), regular+len(specials), vocab)
			}
			if len(file.Model.Merges) != regular-256 {
				t.Errorf("%d merges for %d tokens beyond the bytes", len(file.Model.Merges), regular-256)
			}
			unreachable := 0
			for id := range vocab {
				text, ok := tok.IDToken(id)
				if !ok {
					t.Fatalf("id %d has no token", id)
				}
				if specials[id] {
					if !tok.IsSpecial(id) {
						t.Errorf("id %d (%s) is not special", id, text)
					}
					continue
				}
				s, err := tok.Decode([]int{id}, false)
				if err != nil {
					t.Fatalf("decode %d: %v", id, err)
				}
				if id < 300 || id%3 != 0 || strings.ContainsRune(s, '\uFFFD') {
					continue // bytes (part of a character alone); a third of the rest, for time
				}
				ids, err := tok.Encode(s, false)
				if err != nil || len(ids) != 1 || ids[0] != id {
					if unreachable++; unreachable < 5 {
						t.Errorf("id %d decodes to %q, which encodes to %v (%v)", id, s, ids, err)
					}
				}
			}
			if unreachable > 0 {
				t.Errorf("%d tokens not reachable", unreachable)
			}
			// BOS, EOS and the template's markers are special tokens at their ids.
			if bos, ok := tok.BOS(); !ok || bos != p.cfg.BOSTokenID {
				t.Errorf("BOS %d, %v; config %d", bos, ok, p.cfg.BOSTokenID)
			}
			if eos, ok := tok.EOS(); !ok || eos != p.cfg.EOSTokenIDs[0] {
				t.Errorf("EOS %d, %v; config %v", eos, ok, p.cfg.EOSTokenIDs)
			}
			tmpl, err := chattemplate.Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			text, err := tmpl.Render([]chattemplate.Message{{Role: "user", Content: "hello there"}}, true)
			if err != nil {
				t.Fatal(err)
			}
			ids, err := tok.Encode(text, false)
			if err != nil {
				t.Fatal(err)
			}
			nSpecial := 0
			for _, id := range ids {
				if tok.IsSpecial(id) {
					nSpecial++
				}
			}
			if want := map[string]int{"chatml": 3, "llama3": 6, "mistral": 1}[p.shape.Chat]; nSpecial != want {
				t.Errorf("the chat prompt %q encodes to %v with %d special tokens, want %d", text, ids, nSpecial, want)
			}
			if back, err := tok.Decode(ids, false); err != nil || back != text {
				t.Errorf("the chat prompt round-trips to %q, %v", back, err)
			}
			// Ordinary words take fewer ids than bytes.
			if ids, _ := tok.Encode("hello there", false); len(ids) >= len("hello there") {
				t.Errorf("%q encodes to %d ids: no merges apply", "hello there", len(ids))
			}
		})
	}
}
