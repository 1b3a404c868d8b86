package tokenizer

import (
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// fuzzFixture is a fixture tokenizer and the round-trip property it has.
type fuzzFixture struct {
	name string
	tok  *Tokenizer
	// want returns what decode(encode(s, false), false) must give for valid UTF-8 s, and false
	// where the property does not apply to s.
	want func(tok *Tokenizer, s string) (string, bool)
}

var (
	fuzzOnce     sync.Once
	fuzzFixtures []fuzzFixture
	fuzzErr      error
)

// Round-trip properties, for valid UTF-8 s:
//
//   - Byte-level BPE (tiny-llama and the other Llama 3 style fixtures): decode(encode(s)) == s,
//     special tokens written in s included.
//   - Byte-level BPE with NFC (tiny-qwen2, tiny-qwen3): decode(encode(s)) == s with every
//     part between added tokens in NFC.
//   - SentencePiece legacy (tiny-llama2, normalizer Prepend "▁" + Replace " " -> "▁",
//     decoder Replace "▁" -> " ", ByteFallback, Fuse, Strip one leading space):
//     decode(encode(s)) == s when s has no "▁" (decoded as a space) and no added token text
//     (the text after an added token gets its own "▁" prefix, decoded as a space).
//   - SentencePiece with Metaspace prepend_scheme "first" (tiny-mistral): as legacy, except
//     that a text starting with a space loses it: Metaspace only prepends "▁" when the text
//     does not already start with one, and the decoder strips one leading space, so
//     decode(encode(s)) == strings.TrimPrefix(s, " "). This is what Hugging Face does too.
func byteLevelWant(tok *Tokenizer, s string) (string, bool) { return s, true }

func nfcWant(tok *Tokenizer, s string) (string, bool) {
	var b strings.Builder
	for _, sp := range tok.rawMatch.split(s, nil) {
		part := s[sp.start:sp.end]
		if sp.tok == nil {
			part = norm.NFC.String(part)
		}
		b.WriteString(part)
	}
	return b.String(), true
}

func hasAddedText(tok *Tokenizer, s string) bool {
	for _, a := range tok.added {
		if strings.Contains(s, a.Content) {
			return true
		}
	}
	return false
}

func legacyWant(tok *Tokenizer, s string) (string, bool) {
	if strings.Contains(s, "▁") || hasAddedText(tok, s) {
		return "", false
	}
	return s, true
}

func metaspaceFirstWant(tok *Tokenizer, s string) (string, bool) {
	if strings.Contains(s, "▁") || hasAddedText(tok, s) {
		return "", false
	}
	return strings.TrimPrefix(s, " "), true
}

func loadFuzzFixtures(t testing.TB) []fuzzFixture {
	fuzzOnce.Do(func() {
		for _, f := range []struct {
			name string
			want func(*Tokenizer, string) (string, bool)
		}{
			{"tiny-llama", byteLevelWant},
			{"tiny-qwen2", nfcWant},
			{"tiny-llama2", legacyWant},
			{"tiny-mistral", metaspaceFirstWant},
		} {
			tok, err := LoadDir(filepath.Join("..", "testdata", f.name))
			if err != nil {
				fuzzErr = err
				return
			}
			fuzzFixtures = append(fuzzFixtures, fuzzFixture{f.name, tok, f.want})
		}
	})
	if fuzzErr != nil {
		t.Fatal(fuzzErr)
	}
	return fuzzFixtures
}

// FuzzEncodeDecode checks the round trip of each kind of fixture tokenizer (see the
// properties above), that any input, invalid UTF-8 included, encodes without error or panic,
// and that streaming decode agrees with Decode.
func FuzzEncodeDecode(f *testing.F) {
	seeds := []string{"", " ", "  x", "Hello world", "don't 1234567", "line\n\n\ttab", "你好，世界！", "emoji 😀🚀",
		"<|begin_of_text|>raw", "<|im_start|>user\nhi<|im_end|>", "<s>[INST] hi [/INST]", "e\u0301 \u2126", "x\x00y",
		"\xff\xfe invalid \xc3", "▁x", "'S 'll"}
	seeds = append(seeds, multiByte...)
	for _, s := range seeds {
		f.Add(s)
	}
	fixtures := loadFuzzFixtures(f)
	f.Fuzz(func(t *testing.T, s string) {
		for _, fx := range fixtures {
			ids, err := fx.tok.Encode(s, false)
			if err != nil {
				t.Fatalf("%s: Encode(%q): %v", fx.name, s, err)
			}
			withSpecial, err := fx.tok.Encode(s, true)
			if err != nil || len(withSpecial) < len(ids) {
				t.Fatalf("%s: Encode(%q, true) = %v, %v", fx.name, s, withSpecial, err)
			}
			got, err := fx.tok.Decode(ids, false)
			if err != nil {
				t.Fatalf("%s: Decode: %v", fx.name, err)
			}
			if !utf8.ValidString(got) {
				t.Fatalf("%s: Decode gave invalid UTF-8 %q", fx.name, got)
			}
			if utf8.ValidString(s) {
				if want, ok := fx.want(fx.tok, s); ok && got != want {
					t.Fatalf("%s: decode(encode(%q)) = %q, want %q (ids %v)", fx.name, s, got, want, ids)
				}
			} else if fx.name == "tiny-llama" && got != sanitizeUTF8(s) {
				t.Fatalf("%s: decode(encode(%q)) = %q, want the text with U+FFFD", fx.name, s, got)
			}
			if streamed := strings.Join(streamAll(t, fx.tok, withSpecial), ""); streamed != mustDecode(t, fx.tok, withSpecial) {
				t.Fatalf("%s: stream %q differs from Decode", fx.name, streamed)
			}
		}
	})
}

// FuzzDecode decodes arbitrary id sequences: no error for ids in range, valid UTF-8 always,
// and the stream equals Decode.
func FuzzDecode(f *testing.F) {
	f.Add([]byte{0, 1, 2, 200, 255})
	f.Add([]byte("\xf0\x9f\x98"))
	fixtures := loadFuzzFixtures(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, fx := range fixtures {
			ids := make([]int, 0, len(data)/2)
			for i := 0; i+1 < len(data); i += 2 {
				ids = append(ids, (int(data[i])<<8|int(data[i+1]))%fx.tok.VocabSize())
			}
			got := mustDecode(t, fx.tok, ids)
			if !utf8.ValidString(got) {
				t.Fatalf("%s: Decode(%v) = %q: invalid UTF-8", fx.name, ids, got)
			}
			if streamed := strings.Join(streamAll(t, fx.tok, ids), ""); streamed != got {
				t.Fatalf("%s: ids %v: stream %q, Decode %q", fx.name, ids, streamed, got)
			}
		}
	})
}

func mustDecode(t *testing.T, tok *Tokenizer, ids []int) string {
	t.Helper()
	s, err := tok.Decode(ids, false)
	if err != nil {
		t.Fatalf("Decode(%v): %v", ids, err)
	}
	return s
}
