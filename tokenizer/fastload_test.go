package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// Qwen2.5's tokenizer: 151,643 vocabulary entries made by 151,387 merges from the 256
// byte-level characters, and 22 added tokens from id 151,643 on.
const (
	qwenVocab  = 151643
	qwenMerges = qwenVocab - 256
	qwenAdded  = 22
)

// writeQwenSized writes a tokenizer.json and tokenizer_config.json shaped like Qwen2.5's to
// dir: tiny-qwen2's normalizer, pre-tokenizer, post-processor and decoder, a byte-level
// vocabulary of vocab entries, each made by a "left right" merge string (the format of
// Qwen2.5's file), with token lengths near the real file's (its tokenizer.json is 7 MB), and
// qwenAdded special tokens after the vocabulary. The contents are fixed by seed.
func writeQwenSized(t testing.TB, dir string, vocab int, seed uint64) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "testdata", "tiny-qwen2", "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 1))
	tokens := make([]string, 0, vocab)
	ids := make(map[string]int, vocab)
	for b := range 256 {
		ids[byteToStr[b]] = len(tokens)
		tokens = append(tokens, byteToStr[b])
	}
	// Mostly letters, some with the byte-level space Ġ in front, as in real vocabularies.
	letters := "etaoinshrdlcumwfgypbvkjxqzETAOINSHRDLCUM0123456789.,-_'"
	pick := func(n int) string { return tokens[rng.IntN(min(n, len(tokens)))] }
	merges := make([]string, 0, vocab-256)
	for len(tokens) < vocab {
		var a, b string
		switch r := rng.IntN(10); {
		case r < 2:
			a, b = "Ġ", string(letters[rng.IntN(len(letters))])
		case r < 4:
			a, b = string(letters[rng.IntN(len(letters))]), string(letters[rng.IntN(26)])
		default:
			a, b = pick(12000), pick(1500)
		}
		if _, ok := ids[a]; !ok {
			continue
		}
		if _, ok := ids[b]; !ok {
			continue
		}
		if _, ok := ids[a+b]; ok || len(a+b) > 48 {
			continue
		}
		ids[a+b] = len(tokens)
		tokens = append(tokens, a+b)
		merges = append(merges, a+" "+b)
	}
	// The vocabulary in id order, as Hugging Face writes it (json.Marshal would sort it).
	vocabJSON := []byte{'{'}
	for id, tok := range tokens {
		if id > 0 {
			vocabJSON = append(vocabJSON, ',')
		}
		vocabJSON = append(jsonString(t, vocabJSON, tok), fmt.Sprintf(":%d", id)...)
	}
	vocabJSON = append(vocabJSON, '}')
	mergesJSON := []byte{'['}
	for i, m := range merges {
		if i > 0 {
			mergesJSON = append(mergesJSON, ',')
		}
		mergesJSON = jsonString(t, mergesJSON, m)
	}
	mergesJSON = append(mergesJSON, ']')
	model := map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
		"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "vocab": json.RawMessage(vocabJSON),
		"merges": json.RawMessage(mergesJSON)}
	var added []map[string]any
	decoder := map[string]any{}
	for i := range qwenAdded {
		content := fmt.Sprintf("<|special_%d|>", i)
		if i < 3 {
			content = []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"}[i]
		}
		a := map[string]any{"id": vocab + i, "content": content, "single_word": false, "lstrip": false,
			"rstrip": false, "normalized": false, "special": true}
		added = append(added, a)
		decoder[fmt.Sprint(vocab+i)] = a
	}
	for k, v := range map[string]any{"model": model, "added_tokens": added} {
		if top[k], err = marshalPlain(v); err != nil {
			t.Fatal(err)
		}
	}
	out, err := marshalPlain(top)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := marshalPlain(map[string]any{"added_tokens_decoder": decoder, "bos_token": nil, "eos_token": "<|im_end|>",
		"pad_token": "<|endoftext|>", "clean_up_tokenization_spaces": false, "model_max_length": 131072})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), out, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), cfg, 0o644); err != nil {
		t.Fatal(err)
	}
}

// marshalPlain is json.Marshal escaping only what JSON requires, as Hugging Face's files
// do (json.Marshal also escapes <, > and &).
func marshalPlain(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSpace(buf.Bytes()), nil
}

// jsonString appends s to dst as a JSON string (marshalPlain).
func jsonString(t testing.TB, dst []byte, s string) []byte {
	b, err := marshalPlain(s)
	if err != nil {
		t.Fatal(err)
	}
	return append(dst, b...)
}

// loadDirReference is LoadDir through encoding/json alone (parseReference): the loader as it
// was before the fast path.
func loadDirReference(dir string) (*Tokenizer, error) {
	data, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, err
	}
	t, err := parseReference(data)
	if err != nil {
		return nil, err
	}
	cfg, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		return nil, err
	}
	return t, t.applyConfig(cfg)
}

// BenchmarkLoadQwenSized loads a Qwen2.5-sized tokenizer (writeQwenSized's, or the folder
// that LOOM_TOKENIZER_DIR names) with LoadDir and, in the same loop, with the encoding/json
// reference path, and reports both times and the ratio.
func BenchmarkLoadQwenSized(b *testing.B) {
	dir := os.Getenv("LOOM_TOKENIZER_DIR")
	if dir == "" {
		dir = b.TempDir()
		writeQwenSized(b, dir, qwenVocab, 1)
	}
	var fast, ref time.Duration
	n := 0
	for b.Loop() {
		t0 := time.Now()
		if _, err := LoadDir(dir); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if _, err := loadDirReference(dir); err != nil {
			b.Fatal(err)
		}
		fast, ref, n = fast+t1.Sub(t0), ref+time.Since(t1), n+1
	}
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 / float64(n) }
	b.ReportMetric(ms(fast), "fast-ms/op")
	b.ReportMetric(ms(ref), "ref-ms/op")
	b.ReportMetric(float64(ref)/float64(fast), "speedup")
}

// modelVocab returns m's tokens and ids as a map.
func modelVocab(m *bpe) map[string]int {
	return maps.Collect(m.vocab.all())
}

// diffModels describes how got differs from want, the model that parseModel builds: the
// vocabulary, the merge table and the settings (the word caches aside).
func diffModels(got, want *bpe) string {
	if gv, wv := modelVocab(got), modelVocab(want); !maps.Equal(gv, wv) {
		return fmt.Sprintf("vocab: %d tokens, want %d (or other ids)", len(gv), len(wv))
	}
	// Both tables take the merges in rank order, so equal contents lie in equal slots.
	if !reflect.DeepEqual(got.merges, want.merges) {
		return "merge tables differ"
	}
	g, w := *got, *want
	g.vocab, w.vocab, g.merges, w.merges = nil, nil, mergeTable{}, mergeTable{}
	g.cache, w.cache, g.rawCache, w.rawCache = nil, nil, nil, nil
	if !reflect.DeepEqual(g, w) {
		return fmt.Sprintf("settings: %+v, want %+v", g, w)
	}
	return ""
}

// compareTokenizers fails t where got, from the fast loader, differs from want, from the
// reference path: the model, the id tables, the added and special tokens, and what both
// make of texts (encoding with and without special tokens, decoding, streaming) and of every
// id (decoding it alone, finding its token back).
func compareTokenizers(t *testing.T, got, want *Tokenizer, texts []string) {
	t.Helper()
	if d := diffModels(got.model, want.model); d != "" {
		t.Fatalf("model: %s", d)
	}
	// An id that several tokens share goes to any of them, as in Hugging Face (and in the
	// reference path, which fills the id table from a Go map).
	owners := map[int][]string{}
	for s, id := range want.model.vocab.all() {
		owners[id] = append(owners[id], s)
	}
	for _, a := range want.added {
		owners[a.ID] = []string{a.Content}
	}
	if len(got.tokens) != len(want.tokens) || !slices.Equal(got.hasID, want.hasID) {
		t.Fatalf("id tables differ (%d and %d ids)", len(got.tokens), len(want.tokens))
	}
	shared := false // some id has several tokens: decoding it may differ
	for id, s := range got.tokens {
		shared = shared || len(owners[id]) > 1
		if s != want.tokens[id] && !(len(owners[id]) > 1 && slices.Contains(owners[id], s)) {
			t.Fatalf("IDToken(%d) = %q, reference %q", id, s, want.tokens[id])
		}
	}
	if !reflect.DeepEqual(got.AddedTokens(), want.AddedTokens()) || !maps.Equal(got.special, want.special) || got.cleanup != want.cleanup {
		t.Fatalf("added tokens %v, special %v, cleanup %v; want %v, %v, %v",
			got.AddedTokens(), got.special, got.cleanup, want.AddedTokens(), want.special, want.cleanup)
	}
	for _, text := range texts {
		for _, special := range []bool{false, true} {
			g, gerr := got.Encode(text, special)
			w, werr := want.Encode(text, special)
			if fmt.Sprint(gerr) != fmt.Sprint(werr) || !slices.Equal(g, w) {
				t.Fatalf("Encode(%q, %v) = %v, %v; reference %v, %v", text, special, g, gerr, w, werr)
			}
			if shared {
				continue
			}
			for _, skip := range []bool{false, true} {
				gd, gerr := got.Decode(g, skip)
				wd, werr := want.Decode(w, skip)
				if gd != wd || fmt.Sprint(gerr) != fmt.Sprint(werr) {
					t.Fatalf("Decode(%v, %v) = %q, %v; reference %q, %v", g, skip, gd, gerr, wd, werr)
				}
			}
			gs, ws := got.NewStream(), want.NewStream()
			for _, id := range g {
				a, aerr := gs.Next(id)
				b, berr := ws.Next(id)
				if a != b || fmt.Sprint(aerr) != fmt.Sprint(berr) {
					t.Fatalf("stream of %v at %d: %q, %v; reference %q, %v", g, id, a, aerr, b, berr)
				}
			}
		}
	}
	for id := range want.VocabSize() {
		if len(owners[id]) > 1 {
			continue // checked above
		}
		g, gerr := got.Decode([]int{id}, false)
		w, werr := want.Decode([]int{id}, false)
		if g != w || fmt.Sprint(gerr) != fmt.Sprint(werr) {
			t.Fatalf("Decode([%d]) = %q, %v; reference %q, %v", id, g, gerr, w, werr)
		}
		if s, ok := want.IDToken(id); ok {
			gid, gok := got.TokenID(s)
			wid, wok := want.TokenID(s)
			if gid != wid || gok != wok {
				t.Fatalf("TokenID(%q) = %d, %v; reference %d, %v", s, gid, gok, wid, wok)
			}
		}
	}
}

// fixtureTexts returns the texts of dir's reference.json and benchText.
func fixtureTexts(t *testing.T, dir string) []string {
	texts := []string{benchText, "", " ", "Hello world, 1234 ü ▁x\n\t  end", "<|im_start|>user\nhi<|im_end|>"}
	if _, err := os.Stat(filepath.Join(dir, "reference.json")); err == nil {
		ref := loadReference(t, dir)
		for _, c := range ref.Tokenize {
			texts = append(texts, c.Text)
		}
		texts = append(texts, ref.Chat.Rendered)
	}
	return texts
}

// TestFastLoadMatchesReference loads every fixture tokenizer, and a Qwen2.5-shaped one of
// 20,000 tokens, with the fast loader (which must take them all) and through encoding/json
// alone, and compares the two.
func TestFastLoadMatchesReference(t *testing.T) {
	qwen := t.TempDir()
	writeQwenSized(t, qwen, 20000, 7)
	dirs := append(fixtureDirs(t), qwen)
	for _, dir := range dirs {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
			if err != nil {
				t.Fatal(err)
			}
			if _, m, ok := fastParse(data); !ok || m == nil {
				t.Fatalf("the fast loader does not take the file (file %v, model %v)", ok, m != nil)
			}
			got, err := LoadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			want, err := loadDirReference(dir)
			if err != nil {
				t.Fatal(err)
			}
			compareTokenizers(t, got, want, fixtureTexts(t, dir))
		})
	}
}

// TestFastLoadFallback covers the files that the fast loader must either read exactly as
// encoding/json does or leave to it: in every case Parse gives what parseReference gives,
// the same tokenizer or the same error.
func TestFastLoadFallback(t *testing.T) {
	model := func(fields string) string { return `{"model": {"type": "BPE", ` + fields + `}}` }
	const vm = `"vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]`
	tests := []struct {
		name, json string
		fast       bool // the fast loader builds the model
	}{
		{"plain", model(vm), true},
		{"merge lists", model(`"vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]`), true},
		{"unknown fields", `{"version": "1.0", "truncation": {"x": [1, 2.5e3, -0, true, null]}, "padding": null, ` + model(vm)[1:], true},
		{"escaped tokens", model(`"vocab": {"\u0061": 0, "\"": 1, "a\"": 2, "\t\/": 3}, "merges": ["\u0061 \""]`), true},
		{"escaped surrogates", model(`"vocab": {"\ud83d\ude00": 0, "\ud83d": 1, "\ud83d\ude00\ud83d": 2}, "merges": ["\ud83d\ude00 \ud83d"]`), true},
		{"invalid UTF-8", model("\"vocab\": {\"\xff\": 0, \"\xfe\": 1, \"\ufffd\ufffd\": 2}, \"merges\": [\"\xff \xfe\"]"), true},
		{"repeated token", model(`"vocab": {"a": 0, "b": 1, "ab": 2, "a": 3}, "merges": ["a b"]`), true},
		{"shared id", model(`"vocab": {"a": 0, "b": 0, "ab": 2}, "merges": ["a b"]`), true},
		{"merged ids out of order", model(`"vocab": {"ab": 0, "b": 1, "a": 2, "bb": 3, "aab": 4}, "merges": ["b b", "a b", "a ab"]`), true},
		{"subword prefix", model(`"continuing_subword_prefix": "##", "vocab": {"a": 0, "##b": 1, "ab": 2}, "merges": ["a ##b"]`), true},
		{"settings", model(`"dropout": 0.1, "unk_token": "a", "fuse_unk": true, "byte_fallback": true, "ignore_merges": true, "end_of_word_suffix": "</w>", ` + vm), true},
		{"model key in other case", `{"Model": {"type": "BPE", ` + vm + `}}`, false},
		{"escaped model key", `{"mod\u0065l": {"type": "BPE", ` + vm + `}}`, false},
		{"Kelvin sign in a key", `{"added_to\u212aens": [{"id": 5, "content": "x"}], ` + model(vm)[1:], false},
		{"vocab key in other case", model(`"Vocab": {"a": 0}, "merges": []`), false},
		{"repeated model", `{"model": {"type": "BPE", "vocab": {"x": 0}, "merges": []}, ` + model(vm)[1:], false},
		{"repeated vocab", model(`"vocab": {"a": 0}, "vocab": {"b": 1}, "merges": []`), false},
		{"no type", `{"model": {` + vm + `}}`, false},
		{"no merges", model(`"vocab": {"a": 0}`), false},
		{"null merges", model(`"vocab": {"a": 0}, "merges": null`), false},
		{"null vocab", model(`"vocab": null, "merges": []`), false},
		{"fractional id", model(`"vocab": {"a": 1.0}, "merges": []`), false},
		{"exponent id", model(`"vocab": {"a": 1e2}, "merges": []`), false},
		{"negative id", model(`"vocab": {"a": -1}, "merges": []`), false},
		{"minus zero id", model(`"vocab": {"a": -0}, "merges": []`), false},
		{"id too large", model(`"vocab": {"a": 16777216}, "merges": []`), false},
		{"null id", model(`"vocab": {"a": null}, "merges": []`), false},
		{"merge not in vocab", model(`"vocab": {"a": 0}, "merges": ["a b"]`), false},
		{"merged token not in vocab", model(`"vocab": {"a": 0, "b": 1}, "merges": ["a b"]`), false},
		{"merge without space", model(`"vocab": {"a": 0}, "merges": ["a"]`), false},
		{"merge with empty side", model(`"vocab": {"a": 0}, "merges": [" a"]`), false},
		{"merge list of three", model(`"vocab": {"a": 0}, "merges": [["a", "a", "a"]]`), false},
		{"merge list with null", model(`"vocab": {"a": 0, "": 1}, "merges": [["a", null]]`), false},
		{"bad dropout", model(`"dropout": "x", ` + vm), false},
		{"bad added tokens", `{"added_tokens": {}, ` + model(vm)[1:], false},
		{"trailing garbage", model(vm) + ` x`, false},
		{"trailing comma", model(vm + `,`), false},
		{"leading zero id", model(`"vocab": {"a": 01}, "merges": []`), false},
		{"control character", model("\"vocab\": {\"a\tb\": 0}, \"merges\": []"), false},
		{"bad escape", model(`"vocab": {"\x": 0}, "merges": []`), false},
		{"top-level array", `[` + model(vm) + `]`, false},
		{"empty", ``, false},
		{"null", `null`, false},
		{"deep nesting", `{"x": ` + strings.Repeat(`[`, 600) + strings.Repeat(`]`, 600) + `, ` + model(vm)[1:], false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data := []byte(tt.json)
			_, m, ok := fastParse(data)
			if fast := ok && m != nil; fast != tt.fast {
				t.Errorf("fast loader takes the model: %v, want %v", fast, tt.fast)
			}
			got, gerr := Parse(data)
			want, werr := parseReference(data)
			if werr != nil {
				werr = fmt.Errorf("tokenizer: %w", werr)
			}
			if fmt.Sprint(gerr) != fmt.Sprint(werr) {
				t.Fatalf("Parse: %v\nreference: %v", gerr, werr)
			}
			if gerr == nil {
				compareTokenizers(t, got, want, []string{"ab aab ba", "abab", "\xff\xfe"})
			}
		})
	}
}

// FuzzFastLoad compares the fast loader with encoding/json on arbitrary files: whenever it
// takes a file, encoding/json reads the same sections from it, and whenever it builds the
// model, parseModel builds the same one from that section without an error.
func FuzzFastLoad(f *testing.F) {
	paths, _ := filepath.Glob("../testdata/tiny-*/tokenizer.json")
	for _, p := range paths[:min(len(paths), 3)] {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, s := range []string{`{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}}`,
		`{"model": {"type": "BPE", "continuing_subword_prefix": "##", "vocab": {"a": 0, "##b": 1, "ab": 2, "\u00e9": 3}, "merges": [["a", "##b"]]}}`,
		`{"added_tokens": [{"id": 3, "content": "<s>", "special": true}], "normalizer": null, "model": {"type": "BPE", "vocab": {"a": 0, "a": 1}, "merges": []}}`,
		`{"Model": {"type": "BPE", "vocab": {}, "merges": []}}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fl, m, ok := fastParse(data)
		if !ok {
			return // parse runs parseReference alone
		}
		var ref file
		if err := json.Unmarshal(data, &ref); err != nil {
			t.Fatalf("the fast loader takes a file that encoding/json rejects: %v", err)
		}
		if !reflect.DeepEqual(fl, ref) {
			t.Fatalf("sections %+v\nencoding/json: %+v", fl, ref)
		}
		if m == nil {
			return // parse runs parseModel on the section
		}
		want, err := parseModel(ref.Model)
		if err != nil {
			t.Fatalf("the fast loader builds a model that parseModel rejects: %v", err)
		}
		if d := diffModels(m, want); d != "" {
			t.Fatal(d)
		}
	})
}
