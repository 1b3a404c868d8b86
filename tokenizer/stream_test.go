package tokenizer

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// multiByte texts split characters across tokens in every fixture: emoji, CJK, combining marks.
var multiByte = []string{
	"emoji 😀🚀🧪 done", "你好，世界！日本語のテキスト", "👨‍👩‍👧‍👦 family", "naïve café ‰ ∑ Ω", "🧪🧪🧪", "x\u0000y\u0301",
}

// streamAll feeds ids one by one and returns the chunks, checking each is valid UTF-8.
func streamAll(t *testing.T, tok *Tokenizer, ids []int, opts ...StreamOption) []string {
	t.Helper()
	st := tok.NewStream(opts...)
	var chunks []string
	for _, id := range ids {
		s, err := st.Next(id)
		if err != nil {
			t.Fatalf("Next(%d): %v", id, err)
		}
		if !utf8.ValidString(s) {
			t.Fatalf("Next(%d) = %q: invalid UTF-8", id, s)
		}
		chunks = append(chunks, s)
	}
	s := st.Flush()
	if !utf8.ValidString(s) {
		t.Fatalf("Flush() = %q: invalid UTF-8", s)
	}
	return append(chunks, s)
}

func TestStreamMatchesDecode(t *testing.T) {
	for _, dir := range fixtureDirs(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			tok, err := LoadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			var texts []string
			for _, c := range loadReference(t, dir).Tokenize {
				texts = append(texts, c.Text)
			}
			texts = append(texts, multiByte...)
			for _, text := range texts {
				ids, err := tok.Encode(text, true)
				if err != nil {
					t.Fatal(err)
				}
				for _, skip := range []bool{false, true} {
					var opts []StreamOption
					if skip {
						opts = append(opts, SkipSpecialTokens())
					}
					want, err := tok.Decode(ids, skip)
					if err != nil {
						t.Fatal(err)
					}
					if got := strings.Join(streamAll(t, tok, ids, opts...), ""); got != want {
						t.Errorf("%q skip=%v: stream %q, Decode %q", text, skip, got, want)
					}
				}
			}
		})
	}
}

// TestStreamHoldsPartialCharacters checks that a character split over several tokens comes
// out whole, in the chunk of its last token, and that nothing else is delayed.
func TestStreamHoldsPartialCharacters(t *testing.T) {
	for _, dir := range fixtureDirs(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			tok, err := LoadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			ids, err := tok.Encode("a 🧪 b", false)
			if err != nil {
				t.Fatal(err)
			}
			chunks := streamAll(t, tok, ids)
			held := 0
			for _, c := range chunks {
				if c == "" {
					held++
				}
			}
			if !strings.Contains(strings.Join(chunks, ""), "🧪") {
				t.Fatalf("chunks %q lack the emoji", chunks)
			}
			if held == 0 {
				t.Errorf("chunks %q: the emoji's first byte tokens should give empty chunks", chunks)
			}
			// Plain ASCII text is never held back.
			ids, _ = tok.Encode("Hello world, how are you?", false)
			chunks = streamAll(t, tok, ids)
			if last := chunks[len(chunks)-1]; last != "" {
				t.Errorf("Flush returned %q for ASCII text: it was held back", last)
			}
		})
	}
}

// TestStreamRandomIDs feeds random ids, which make ill-formed byte sequences of every kind.
func TestStreamRandomIDs(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, dir := range fixtureDirs(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			tok, err := LoadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			for range 300 {
				ids := make([]int, 1+r.IntN(40))
				for i := range ids {
					ids[i] = r.IntN(tok.VocabSize())
				}
				want, err := tok.Decode(ids, false)
				if err != nil {
					t.Fatal(err)
				}
				if !utf8.ValidString(want) {
					t.Fatalf("Decode(%v) = %q: invalid UTF-8", ids, want)
				}
				if got := strings.Join(streamAll(t, tok, ids), ""); got != want {
					t.Fatalf("ids %v: stream %q, Decode %q", ids, got, want)
				}
			}
		})
	}
}

func TestStreamErrorsAndReuse(t *testing.T) {
	tok, err := LoadDir("../testdata/tiny-llama")
	if err != nil {
		t.Fatal(err)
	}
	st := tok.NewStream()
	if _, err := st.Next(tok.VocabSize()); err == nil {
		t.Error("Next(out of range) did not fail")
	}
	if _, err := st.Next(-1); err == nil {
		t.Error("Next(-1) did not fail")
	}
	ids, _ := tok.Encode("Hello", false)
	for range 2 { // a flushed stream starts over
		var sb strings.Builder
		for _, id := range ids {
			s, _ := st.Next(id)
			sb.WriteString(s)
		}
		sb.WriteString(st.Flush())
		if sb.String() != "Hello" {
			t.Errorf("stream = %q, want Hello", sb.String())
		}
	}
}

// TestCleanUpTokenizationSpaces checks transformers' clean_up_tokenization, turned on by
// tokenizer_config.json, in Decode and in the stream.
func TestCleanUpTokenizationSpaces(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		data, err := os.ReadFile(filepath.Join("../testdata/tiny-llama", f))
		if err != nil {
			t.Fatal(err)
		}
		if f == "tokenizer_config.json" {
			data = []byte(strings.Replace(string(data), "{", `{"clean_up_tokenization_spaces": true,`, 1))
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const in, want = "Hello , world . I do n't know ' ' x ?", "Hello, world. I don't know'' x?"
	for _, d := range []string{dir, "../testdata/tiny-llama2"} {
		tok, err := LoadDir(d)
		if err != nil {
			t.Fatal(err)
		}
		if d == dir && !tok.cleanup {
			t.Fatal("LoadDir did not read clean_up_tokenization_spaces")
		}
		tok.cleanup = true // tiny-llama2: the staged decoders, not the byte-level fast path
		ids, err := tok.Encode(in, false)
		if err != nil {
			t.Fatal(err)
		}
		got, err := tok.Decode(ids, false)
		if err != nil || got != want {
			t.Errorf("%s: Decode = %q, %v; want %q", d, got, err, want)
		}
		if s := strings.Join(streamAll(t, tok, ids), ""); s != want {
			t.Errorf("%s: stream = %q, want %q", d, s, want)
		}
	}
}

// TestConcurrentUse encodes and decodes from many goroutines (run with -race).
func TestConcurrentUse(t *testing.T) {
	tok, err := LoadDir("../testdata/tiny-qwen2")
	if err != nil {
		t.Fatal(err)
	}
	texts := append([]string{"Hello world", "The quick brown fox jumps over the lazy dog."}, multiByte...)
	want := make([][]int, len(texts))
	for i, s := range texts {
		want[i], _ = tok.Encode(s, false)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 50 {
				k := (g + i) % len(texts)
				ids, err := tok.Encode(texts[k], false)
				if err != nil || !slices.Equal(ids, want[k]) {
					t.Errorf("Encode(%q) = %v, %v; want %v", texts[k], ids, err, want[k])
					return
				}
				if s, err := tok.Decode(ids, false); err != nil || s != norm.NFC.String(texts[k]) {
					t.Errorf("Decode = %q, %v", s, err)
					return
				}
			}
		})
	}
	wg.Wait()
}
