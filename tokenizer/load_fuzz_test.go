package tokenizer

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// Fuzz targets of loading: tokenizer.json (FuzzParse) and tokenizer_config.json
// (FuzzApplyConfig). fuzz_test.go fuzzes encoding and decoding with the fixture tokenizers.

// fuzzWait bounds one fuzz input's work: a tokenizer that takes longer to load, encode
// and decode a short text hangs as far as the fuzz targets are concerned.
const fuzzWait = 10 * time.Second

// maxFuzzText bounds the text the load targets encode.
const maxFuzzText = 256

// withDeadline runs fn, crashing the test binary if it takes longer than fuzzWait: the fuzz
// engine then reports the input (a hang) and saves it under testdata/fuzz.
func withDeadline(what string, fn func()) {
	timer := time.AfterFunc(fuzzWait, func() { panic(fmt.Sprintf("%s takes longer than %v", what, fuzzWait)) })
	defer timer.Stop()
	fn()
}

// checkTokenizer asserts what any loaded tokenizer must do with text: encode it without an
// internal error (a recovered panic) to ids inside the vocabulary, twice alike (the word
// caches agree with a fresh run), decode them to valid UTF-8 as the streaming decoder does,
// decode every token it has on its own, and find each added token by its content.
func checkTokenizer(t *testing.T, tok *Tokenizer, text string) {
	t.Helper()
	if tok.VocabSize() < 0 {
		t.Fatalf("VocabSize %d", tok.VocabSize())
	}
	ids, err := tok.Encode(text, false)
	if err != nil && strings.Contains(err.Error(), "internal error") {
		t.Fatalf("Encode(%q): %v", text, err)
	}
	if err == nil {
		for _, id := range ids {
			if _, ok := tok.IDToken(id); !ok {
				t.Fatalf("Encode(%q) = %v: id %d is not in the vocabulary (size %d)", text, ids, id, tok.VocabSize())
			}
		}
		again, err := tok.Encode(text, false)
		if err != nil || !slices.Equal(ids, again) {
			t.Fatalf("Encode(%q) = %v, then %v, %v", text, ids, again, err)
		}
		for _, skip := range []bool{false, true} {
			s, err := tok.Decode(ids, skip)
			if err != nil || !utf8.ValidString(s) {
				t.Fatalf("Decode(%v, %v) = %q, %v", ids, skip, s, err)
			}
		}
		s := mustDecode(t, tok, ids)
		if streamed := strings.Join(streamAll(t, tok, ids), ""); streamed != s {
			t.Fatalf("ids %v: stream %q, Decode %q", ids, streamed, s)
		}
	}
	// The post-processor adds the ids its file names, in the vocabulary or not.
	withSpecial, err := tok.Encode(text, true)
	if err != nil && strings.Contains(err.Error(), "internal error") {
		t.Fatalf("Encode(%q, true): %v", text, err)
	}
	if again, err2 := tok.Encode(text, true); (err == nil) != (err2 == nil) || !slices.Equal(withSpecial, again) {
		t.Fatalf("Encode(%q, true) = %v, %v, then %v, %v", text, withSpecial, err, again, err2)
	}
	for id := range min(tok.VocabSize(), 1024) {
		if _, ok := tok.IDToken(id); !ok {
			continue
		}
		s, err := tok.Decode([]int{id}, false)
		if err != nil || !utf8.ValidString(s) {
			t.Fatalf("Decode([%d]) = %q, %v", id, s, err)
		}
	}
	for _, a := range tok.AddedTokens() {
		if id, ok := tok.TokenID(a.Content); !ok || tok.tokens[id] != a.Content {
			t.Fatalf("added token %+v: TokenID gives %d, %v", a, id, ok)
		}
	}
}

// FuzzParse loads arbitrary tokenizer.json contents (seeded with the fixtures' files and
// small handmade ones) and encodes a text with what loads. Errors start with "tokenizer: ";
// a tokenizer that loads keeps the properties of checkTokenizer. Texts are cut to
// maxFuzzText bytes, and an input that takes longer than fuzzWait fails as a hang.
func FuzzParse(f *testing.F) {
	paths, _ := filepath.Glob("../testdata/tiny-*/tokenizer.json")
	seen := map[string]bool{}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		if !seen[string(data)] {
			seen[string(data)] = true
			f.Add(data, "Hello world, 1234 <|begin_of_text|> ▁x ü\n")
		}
	}
	small := spec{vocab: []string{"a", "b", "ab", "<unk>"}, merges: []string{"a b"}}
	variants := []spec{small}
	for _, edit := range []func(*spec){
		func(s *spec) { s.modelExtra = `"unk_token": "<unk>", "fuse_unk": true` },
		func(s *spec) { s.modelExtra = `"byte_fallback": true, "unk_token": "<none>"` },
		func(s *spec) {
			s.added = `[{"id": 4, "content": "<s>", "special": true}, {"id": 9, "content": "b", "lstrip": true, "rstrip": true, "single_word": true, "normalized": true}]`
		},
		func(s *spec) {
			s.normalizer = `{"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}`
		},
		func(s *spec) {
			s.pre = `{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}`
		},
		func(s *spec) {
			s.pre = `{"type": "Split", "pattern": {"Regex": "(a+)+b"}, "behavior": "Isolated", "invert": false}`
		},
		func(s *spec) {
			s.pre = `{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": true}`
		},
		func(s *spec) {
			s.post = `{"type": "TemplateProcessing", "single": "<s> $A", "pair": "$A $B", "special_tokens": {"<s>": {"id": "<s>", "ids": [4], "tokens": ["<s>"]}}}`
		},
		func(s *spec) {
			s.decoder = `{"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}`
		},
		func(s *spec) { s.mergesAsLists = true },
	} {
		s := small
		edit(&s)
		variants = append(variants, s)
	}
	for _, s := range variants {
		f.Add([]byte(s.json()), "ab aab b\tba")
	}
	for _, s := range []string{``, `null`, `{}`, `{"model": null}`, `{"model": {"type": "BPE", "vocab": {"a": -1}}}`,
		// Ids up to 2^31-1 were accepted, and the dense id tables of such a file took 30 GB.
		`{"model": {"type": "BPE", "vocab": {"a": 2147483647}, "merges": []}}`,
		`{"added_tokens": [{"id": 2147483647, "content": "x"}], "model": {"type": "BPE", "vocab": {}}}`,
		`{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a a"]}}`, `{"model": {"vocab": {}, "merges": []}}`,
		`{"added_tokens": [{"id": 0, "content": ""}], "model": {"type": "BPE", "vocab": {}}}`} {
		f.Add([]byte(s), "a")
	}
	f.Fuzz(func(t *testing.T, data []byte, text string) {
		if len(text) > maxFuzzText {
			text = text[:maxFuzzText]
		}
		withDeadline("loading and using the tokenizer", func() {
			tok, err := Parse(data)
			if err != nil {
				if tok != nil || !strings.HasPrefix(err.Error(), "tokenizer: ") || strings.Contains(err.Error(), "internal error") {
					t.Fatalf("Parse: %v, %v", tok != nil, err)
				}
				return
			}
			checkTokenizer(t, tok, text)
		})
	})
}

// FuzzApplyConfig loads tiny-llama's and tiny-llama2's tokenizer.json with an arbitrary
// tokenizer_config.json. Errors name what is wrong (an invalid JSON or a field); with a
// config that applies, the special tokens it names are found, the added tokens it declares
// are in the vocabulary, and the tokenizer keeps the properties of checkTokenizer.
func FuzzApplyConfig(f *testing.F) {
	var bases [][]byte
	for _, dir := range []string{"tiny-llama", "tiny-llama2"} {
		data, err := os.ReadFile(filepath.Join("..", "testdata", dir, "tokenizer.json"))
		if err != nil {
			f.Fatal(err)
		}
		bases = append(bases, data)
		cfg, err := os.ReadFile(filepath.Join("..", "testdata", dir, "tokenizer_config.json"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(cfg, "<s>hello</s> world")
	}
	for _, s := range []string{
		``, `null`, `{}`, `[]`, `{"bos_token": null, "eos_token": {"content": "</s>"}, "clean_up_tokenization_spaces": true}`,
		`{"clean_up_tokenization_spaces": "yes"}`, `{"added_tokens_decoder": []}`,
		`{"added_tokens_decoder": {"x": {"content": "<x>"}}}`, `{"added_tokens_decoder": {"-1": {"content": "<x>"}}}`,
		`{"added_tokens_decoder": {"600": {"content": "<new>", "special": true}}, "eos_token": "<new>"}`,
		`{"added_tokens_decoder": {"3": {"content": "<clash>"}, "600": {"content": ""}}}`,
		`{"added_tokens_decoder": {"600 ": {"content": "a"}, "0x10": {"content": "b"}}}`,
		`{"added_tokens_decoder": {"2147483647": {"content": "<far>"}}}`,
	} {
		f.Add([]byte(s), "a <new> b")
	}
	f.Fuzz(func(t *testing.T, cfg []byte, text string) {
		if len(text) > maxFuzzText {
			text = text[:maxFuzzText]
		}
		base := bases[len(cfg)%len(bases)]
		withDeadline("applying the config", func() {
			tok, err := Parse(base)
			if err != nil {
				t.Fatal(err)
			}
			before := tok.VocabSize()
			if err := tok.applyConfig(cfg); err != nil {
				msg := err.Error()
				if !strings.HasPrefix(msg, "invalid JSON") && !strings.HasPrefix(msg, "clean_up_tokenization_spaces") &&
					!strings.HasPrefix(msg, "added_tokens_decoder") {
					t.Fatalf("applyConfig: error %q names no field", msg)
				}
				return
			}
			if tok.VocabSize() < before {
				t.Fatalf("vocabulary shrinks from %d to %d", before, tok.VocabSize())
			}
			for _, role := range []string{"bos_token", "eos_token", "unk_token", "pad_token"} {
				if s, ok := tok.SpecialToken(role); ok && s == "" {
					t.Fatalf("%s is the empty string", role)
				}
			}
			checkTokenizer(t, tok, text)
		})
	})
}
