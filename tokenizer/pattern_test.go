package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// palette holds characters from every class the pre-tokenization regexes tell apart.
var palette = []string{
	"a", "Z", "é", "ß", "Ω", "你", "界", "\u0301", "1", "9", "٣", "½", "Ⅻ", " ", " ", " ", "\t", "\n", "\r",
	"\u00a0", "\u2009", "\u3000", "\u0085", "\v", "\f", "'", "'", "s", "S", "t", "r", "e", "v", "m", "l", "L", "d",
	".", ",", "!", "?", "-", "$", "😀", "🚀", "\u200b", "_", "\x00", "ſ", "\u212a",
}

func randomText(r *rand.Rand, n int) string {
	var b strings.Builder
	for range n {
		b.WriteString(palette[r.IntN(len(palette))])
	}
	return b.String()
}

func regexSpans(t testing.TB, re *regexp2.Regexp, s string) []span {
	t.Helper()
	idx, err := re.FindAllStringIndex(s, -1)
	if err != nil {
		t.Fatal(err)
	}
	var out []span
	for _, m := range idx {
		out = append(out, span{m[0], m[1]})
	}
	return out
}

// TestScannersMatchRegex checks the hand-written scanners against the regex engine.
func TestScannersMatchRegex(t *testing.T) {
	scanners := []struct {
		name, expr string
		scan       func(string, []span) []span
	}{
		{"llama3", llama3Pattern, func(s string, d []span) []span { return scanLlama3(s, 3, d) }},
		{"qwen2", qwen2Pattern, func(s string, d []span) []span { return scanLlama3(s, 1, d) }},
		{"gpt2", gpt2Pattern, scanGPT2},
	}
	fixed := []string{"", "Hello world", "  leading and trailing  ", "don't CAN'T I'LL we'Ve", "1234567 3.14",
		"line one\nline two\n\n\ttabbed", "a  \n  b", " \r\n x", "你好，世界！", "emoji 😀🚀 done", "x\u0000y", "'''s"}
	r := rand.New(rand.NewPCG(1, 2))
	for _, sc := range scanners {
		t.Run(sc.name, func(t *testing.T) {
			re := regexp2.MustCompile(sc.expr, regexp2.None)
			cases := slices.Clone(fixed)
			for range 3000 {
				cases = append(cases, randomText(r, 1+r.IntN(12)))
			}
			for _, s := range cases {
				got := sc.scan(s, nil)
				want := regexSpans(t, re, s)
				if !slices.Equal(got, want) {
					t.Fatalf("%q:\n got %v\nwant %v", s, got, want)
				}
			}
		})
	}
}

func FuzzScanLlama3(f *testing.F) {
	for _, s := range []string{"Hello world", "don't 123456", " \n\n x", "'S'RE  a"} {
		f.Add(s)
	}
	re := regexp2.MustCompile(llama3Pattern, regexp2.None)
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		want := regexSpans(t, re, s)
		if got := scanLlama3(s, 3, nil); !slices.Equal(got, want) {
			t.Fatalf("%q:\n got %v\nwant %v", s, got, want)
		}
	})
}
