package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2/v2"
)

// span is a byte range [start, end) of a string.
type span struct{ start, end int }

// A pattern finds non-overlapping matches, leftmost first, as the String and Regex patterns of
// tokenizer.json's Split pre-tokenizer and Replace normalizer/decoder do.
type pattern interface {
	// findAll appends to dst the spans of all matches in s, in order.
	findAll(s string, dst []span) ([]span, error)
}

// replaceAll replaces each match of p in s with the literal repl.
func replaceAllPattern(p pattern, s, repl string) (string, error) {
	if lit, ok := p.(literalPattern); ok {
		if lit == "" {
			return s, nil
		}
		return strings.ReplaceAll(s, string(lit), repl), nil
	}
	m, err := p.findAll(s, nil)
	if err != nil || len(m) == 0 {
		return s, err
	}
	var b strings.Builder
	prev := 0
	for _, sp := range m {
		b.WriteString(s[prev:sp.start])
		b.WriteString(repl)
		prev = sp.end
	}
	b.WriteString(s[prev:])
	return b.String(), nil
}

// The GPT-2, Llama 3 and Qwen2 pre-tokenization regexes. They are recognised verbatim and run
// by hand-written scanners (see scanLlama3 and scanGPT2) that give the same matches as the
// backtracking regex engine, several times faster.
const (
	gpt2Pattern   = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	qwen2Pattern  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// parsePattern reads {"String": s} or {"Regex": r}.
func parsePattern(raw json.RawMessage, where string) (pattern, error) {
	var cfg struct {
		String *string `json:"String"`
		Regex  *string `json:"Regex"`
	}
	if err := decodeAt(raw, where, &cfg); err != nil {
		return nil, err
	}
	switch {
	case cfg.String != nil:
		return literalPattern(*cfg.String), nil
	case cfg.Regex != nil:
		return compileRegex(*cfg.Regex, where)
	}
	return nil, fmt.Errorf("%s: want {\"String\": ...} or {\"Regex\": ...}, got %s", where, truncate(string(raw), 80))
}

// compileRegex compiles an Oniguruma-style regex as used by Hugging Face tokenizers. Known
// pre-tokenization regexes get a hand-written scanner; others run on regexp2.
func compileRegex(expr, where string) (pattern, error) {
	switch expr {
	case llama3Pattern:
		return scannerPattern{expr, func(s string, dst []span) []span { return scanLlama3(s, 3, dst) }}, nil
	case qwen2Pattern:
		return scannerPattern{expr, func(s string, dst []span) []span { return scanLlama3(s, 1, dst) }}, nil
	case gpt2Pattern:
		return scannerPattern{expr, scanGPT2}, nil
	}
	re, err := regexp2.Compile(expr, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("%s: compile regex %q: %w", where, truncate(expr, 80), err)
	}
	return regexPattern{re}, nil
}

// literalPattern matches a fixed string. The empty string matches nothing.
type literalPattern string

func (l literalPattern) findAll(s string, dst []span) ([]span, error) {
	if l == "" {
		return dst, nil
	}
	for off := 0; ; {
		i := strings.Index(s[off:], string(l))
		if i < 0 {
			return dst, nil
		}
		dst = append(dst, span{off + i, off + i + len(l)})
		off += i + len(l)
	}
}

// regexPattern runs a regexp2 (backtracking, .NET/Perl syntax) regex.
type regexPattern struct{ re *regexp2.Regexp }

func (r regexPattern) findAll(s string, dst []span) ([]span, error) {
	idx, err := r.re.FindAllStringIndex(s, -1)
	if err != nil {
		return dst, fmt.Errorf("regex %q: %w", truncate(r.re.String(), 80), err)
	}
	for _, m := range idx {
		dst = append(dst, span{m[0], m[1]})
	}
	return dst, nil
}

// scannerPattern is a regex with a hand-written matcher.
type scannerPattern struct {
	expr string
	scan func(s string, dst []span) []span
}

func (p scannerPattern) findAll(s string, dst []span) ([]span, error) { return p.scan(s, dst), nil }

// Character classes of the pre-tokenization regexes, with Oniguruma's Unicode meanings:
// \s is White_Space, \p{L} any letter, \p{N} any number.
func isSpaceRune(r rune) bool  { return unicode.IsSpace(r) }
func isLetterRune(r rune) bool { return unicode.IsLetter(r) }
func isNumberRune(r rune) bool { return unicode.IsNumber(r) }

// isOther reports [^\s\p{L}\p{N}].
func isOther(r rune) bool {
	return r >= 0 && !isSpaceRune(r) && !isLetterRune(r) && !isNumberRune(r)
}

func runeAt(s string, i int) (rune, int) {
	if i >= len(s) {
		return -1, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// contraction matches one of the English contractions 's 't 're 've 'm 'll 'd at s[i] (an
// apostrophe), case-insensitively when fold is set, and returns the match length or 0.
func contraction(s string, i int, fold bool) int {
	if i+1 >= len(s) {
		return 0
	}
	lower := func(c byte) byte {
		if fold && c >= 'A' && c <= 'Z' {
			return c + 'a' - 'A'
		}
		return c
	}
	if fold && strings.HasPrefix(s[i+1:], "ſ") { // U+017F LATIN SMALL LETTER LONG S case-folds to s
		return 1 + len("ſ")
	}
	switch lower(s[i+1]) {
	case 's', 't', 'm', 'd':
		return 2
	case 'r', 'v':
		if i+2 < len(s) && lower(s[i+2]) == 'e' {
			return 3
		}
	case 'l':
		if i+2 < len(s) && lower(s[i+2]) == 'l' {
			return 3
		}
	}
	return 0
}

// spaceRun returns the end of the run of whitespace starting at i and the position just past
// the last \r or \n in it (-1 if none).
func spaceRun(s string, i int) (end, lastNL int) {
	lastNL = -1
	for i < len(s) {
		r, n := runeAt(s, i)
		if !isSpaceRune(r) {
			break
		}
		if r == '\r' || r == '\n' {
			lastNL = i + n
		}
		i += n
	}
	return i, lastNL
}

// spaceMatch matches \s+(?!\S)|\s+ at i, where s[i] is whitespace and the run ends at end.
func spaceMatch(s string, i, end int) int {
	if end == len(s) {
		return end
	}
	// \s+(?!\S) backs off one character so that the last space joins the next word.
	_, lastSize := utf8.DecodeLastRuneInString(s[i:end])
	if end-lastSize > i {
		return end - lastSize
	}
	return end
}

// scanLlama3 splits s as llama3Pattern (maxDigits 3) or qwen2Pattern (maxDigits 1) would.
// Every character is covered by some alternative, so the spans tile s.
func scanLlama3(s string, maxDigits int, dst []span) []span {
	for i := 0; i < len(s); {
		end := llama3At(s, i, maxDigits)
		dst = append(dst, span{i, end})
		i = end
	}
	return dst
}

func llama3At(s string, i, maxDigits int) int {
	r, n := runeAt(s, i)
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if r == '\'' {
		if k := contraction(s, i, true); k > 0 {
			return i + k
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	j := i
	if !isLetterRune(r) && !isNumberRune(r) && r != '\r' && r != '\n' {
		j = i + n
	}
	if r2, _ := runeAt(s, j); isLetterRune(r2) {
		for j < len(s) {
			r2, n2 := runeAt(s, j)
			if !isLetterRune(r2) {
				break
			}
			j += n2
		}
		return j
	}
	// \p{N}{1,maxDigits}
	if isNumberRune(r) {
		j = i
		for k := 0; k < maxDigits && j < len(s); k++ {
			r2, n2 := runeAt(s, j)
			if !isNumberRune(r2) {
				break
			}
			j += n2
		}
		return j
	}
	// ' ?[^\s\p{L}\p{N}]+[\r\n]*'
	j = i
	if r == ' ' {
		j = i + 1
	}
	if r2, _ := runeAt(s, j); isOther(r2) {
		for j < len(s) {
			r2, n2 := runeAt(s, j)
			if !isOther(r2) {
				break
			}
			j += n2
		}
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	// \s*[\r\n]+ | \s+(?!\S) | \s+
	end, lastNL := spaceRun(s, i)
	if lastNL > 0 {
		return lastNL
	}
	if end > i {
		return spaceMatch(s, i, end)
	}
	return i + n // unreachable for valid UTF-8: every character matches an alternative
}

// scanGPT2 splits s as gpt2Pattern would.
func scanGPT2(s string, dst []span) []span {
	for i := 0; i < len(s); {
		end := gpt2At(s, i)
		dst = append(dst, span{i, end})
		i = end
	}
	return dst
}

func gpt2At(s string, i int) int {
	r, n := runeAt(s, i)
	if r == '\'' {
		if k := contraction(s, i, false); k > 0 {
			return i + k
		}
	}
	j := i
	if r == ' ' {
		j = i + 1
	}
	// ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+'
	if r2, _ := runeAt(s, j); r2 >= 0 {
		var class func(rune) bool
		switch {
		case isLetterRune(r2):
			class = isLetterRune
		case isNumberRune(r2):
			class = isNumberRune
		case isOther(r2):
			class = isOther
		}
		if class != nil {
			for j < len(s) {
				r3, n3 := runeAt(s, j)
				if !class(r3) {
					break
				}
				j += n3
			}
			return j
		}
	}
	// \s+(?!\S) | \s+
	end, _ := spaceRun(s, i)
	if end > i {
		return spaceMatch(s, i, end)
	}
	return i + n
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
