package main

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/loom-ml/loom/bench"
	"github.com/loom-ml/loom/tokenizer"
)

// Warm-up requests share no prompt prefix with the measured ones, whatever the workload: with
// prefix caching on, a shared prefix would let the measured requests skip their prefill.
func TestWarmupSharesNoPrefix(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tiny-llama")
	tok, err := tokenizer.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(t.TempDir(), "data.jsonl")
	if err := os.WriteFile(data, []byte(`{"prompt": "the first line of the dataset"}`+"\n"+`{"prompt_ids": [5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const vocab, inputLen, n = 256, 64, 8
	for _, tc := range []struct {
		name    string
		dataset string
		tok     *tokenizer.Tokenizer
		chat    bool
	}{
		{"token ids", "", tok, false},
		{"chat text", "", tok, true},
		{"words", "", nil, false},
		{"dataset with a tokenizer", data, tok, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			work, err := benchWorkload(tc.dataset, n, inputLen, 4, vocab, tc.tok, tc.chat, 7)
			if err != nil {
				t.Fatal(err)
			}
			warm, err := warmupRequests(tc.dataset, work, n, inputLen, 4, vocab, tc.tok, tc.chat, 7)
			if err != nil {
				t.Fatal(err)
			}
			if len(warm) != n {
				t.Fatalf("%d warm-up requests, want %d", len(warm), n)
			}
			for _, w := range warm {
				for _, r := range work {
					if a, b := promptHead(w), promptHead(r); a == b {
						t.Fatalf("a warm-up request starts as a measured one: %q", a)
					}
				}
			}
		})
	}
}

// promptHead is the start of a request's prompt (its first 8 ids, or 24 bytes of text).
func promptHead(r bench.Request) string {
	if r.PromptIDs != nil {
		return fmt.Sprint(r.PromptIDs[:min(8, len(r.PromptIDs))])
	}
	p := []byte(r.Prompt)
	if len(r.Messages) > 0 {
		p = []byte(fmt.Sprint(r.Messages))
	}
	return string(p[:min(24, len(p))])
}
