package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// A normalizer rewrites a piece of input text before pre-tokenization (the "normalizer"
// section of tokenizer.json).
type normalizer interface {
	normalize(s string) (string, error)
}

// parseNormalizer builds the normalizer described by raw; where names the JSON path for errors.
// A null section gives a nil normalizer.
func parseNormalizer(raw json.RawMessage, where string) (normalizer, error) {
	typ, null, err := componentType(raw, where)
	if null || err != nil {
		return nil, err
	}
	switch typ {
	case "NFC":
		return unicodeNorm{norm.NFC}, nil
	case "NFD":
		return unicodeNorm{norm.NFD}, nil
	case "NFKC":
		return unicodeNorm{norm.NFKC}, nil
	case "NFKD":
		return unicodeNorm{norm.NFKD}, nil
	case "Lowercase":
		return lowercase{}, nil
	case "StripAccents":
		return stripAccents{}, nil
	case "Sequence":
		var cfg struct {
			Normalizers []json.RawMessage `json:"normalizers"`
		}
		if err := decodeAt(raw, where, &cfg); err != nil {
			return nil, err
		}
		seq, err := parseSequence(cfg.Normalizers, where, "normalizers", parseNormalizer)
		if err != nil {
			return nil, err
		}
		return normalizerSeq(seq), nil
	case "Prepend":
		var cfg struct {
			Prepend string `json:"prepend"`
		}
		if err := decodeAt(raw, where, &cfg); err != nil {
			return nil, err
		}
		return prepend{cfg.Prepend}, nil
	case "Replace":
		var cfg struct {
			Pattern json.RawMessage `json:"pattern"`
			Content string          `json:"content"`
		}
		if err := decodeAt(raw, where, &cfg); err != nil {
			return nil, err
		}
		p, err := parsePattern(cfg.Pattern, where+".pattern")
		if err != nil {
			return nil, err
		}
		return replaceNorm{p, cfg.Content}, nil
	case "Strip":
		var cfg struct {
			Left  bool `json:"strip_left"`
			Right bool `json:"strip_right"`
		}
		if err := decodeAt(raw, where, &cfg); err != nil {
			return nil, err
		}
		return stripNorm(cfg), nil
	case "BertNormalizer":
		cfg := struct {
			CleanText          bool  `json:"clean_text"`
			HandleChineseChars bool  `json:"handle_chinese_chars"`
			StripAccents       *bool `json:"strip_accents"`
			Lowercase          bool  `json:"lowercase"`
		}{CleanText: true, HandleChineseChars: true, Lowercase: true}
		if err := decodeAt(raw, where, &cfg); err != nil {
			return nil, err
		}
		b := bertNorm{clean: cfg.CleanText, chinese: cfg.HandleChineseChars, lower: cfg.Lowercase, accents: cfg.Lowercase}
		if cfg.StripAccents != nil {
			b.accents = *cfg.StripAccents
		}
		return b, nil
	case "ByteLevel":
		return byteLevelNorm{}, nil
	default:
		return nil, fmt.Errorf("%s: unsupported normalizer type %q", where, typ)
	}
}

type normalizerSeq []normalizer

func (q normalizerSeq) normalize(s string) (string, error) {
	var err error
	for _, n := range q {
		if s, err = n.normalize(s); err != nil {
			return "", err
		}
	}
	return s, nil
}

// unicodeNorm applies one of the four Unicode normalization forms.
type unicodeNorm struct{ form norm.Form }

func (u unicodeNorm) normalize(s string) (string, error) { return u.form.String(s), nil }

// lowercase lowercases each character with its full Unicode mapping, as Rust's
// char::to_lowercase does (no context-dependent rules such as final sigma).
type lowercase struct{}

func (lowercase) normalize(s string) (string, error) { return toLowerChars(s), nil }

func toLowerChars(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for _, r := range s {
		if r == 'İ' { // the one unconditional multi-character lowercase mapping
			b.WriteString("i\u0307")
			continue
		}
		b.WriteRune(unicode.ToLower(r))
	}
	return b.String()
}

// stripAccents removes combining marks (use after NFD or NFKD).
type stripAccents struct{}

func (stripAccents) normalize(s string) (string, error) { return removeMarks(s), nil }

func removeMarks(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.Is(unicode.Mn, r) {
			return -1
		}
		return r
	}, s)
}

// prepend adds a fixed string in front of every non-empty piece.
type prepend struct{ s string }

func (p prepend) normalize(s string) (string, error) {
	if s == "" {
		return s, nil
	}
	return p.s + s, nil
}

// replaceNorm replaces every match of a pattern with content.
type replaceNorm struct {
	pat     pattern
	content string
}

func (r replaceNorm) normalize(s string) (string, error) {
	return replaceAllPattern(r.pat, s, r.content)
}

// stripNorm removes leading and/or trailing whitespace.
type stripNorm struct{ Left, Right bool }

func (st stripNorm) normalize(s string) (string, error) {
	if st.Left {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
	}
	if st.Right {
		s = strings.TrimRightFunc(s, unicode.IsSpace)
	}
	return s, nil
}

// bertNorm is BERT's normalizer: control-character cleanup, spaces around CJK ideographs,
// accent stripping and lowercasing.
type bertNorm struct{ clean, chinese, accents, lower bool }

func (b bertNorm) normalize(s string) (string, error) {
	if b.clean {
		s = strings.Map(func(r rune) rune {
			switch {
			case r == 0 || r == 0xFFFD:
				return -1
			case r == '\t' || r == '\n' || r == '\r':
				return ' '
			case unicode.IsSpace(r):
				return ' '
			case unicode.IsControl(r) || unicode.In(r, unicode.Cc, unicode.Cf, unicode.Co, unicode.Cs):
				return -1
			}
			return r
		}, s)
	}
	if b.chinese {
		var sb strings.Builder
		for _, r := range s {
			if isCJK(r) {
				sb.WriteByte(' ')
				sb.WriteRune(r)
				sb.WriteByte(' ')
			} else {
				sb.WriteRune(r)
			}
		}
		s = sb.String()
	}
	if b.accents {
		s = removeMarks(norm.NFD.String(s))
	}
	if b.lower {
		s = toLowerChars(s)
	}
	return s, nil
}

func isCJK(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FFF) || (r >= 0x3400 && r <= 0x4DBF) || (r >= 0x20000 && r <= 0x2A6DF) ||
		(r >= 0x2A700 && r <= 0x2B73F) || (r >= 0x2B740 && r <= 0x2B81F) || (r >= 0x2B820 && r <= 0x2CEAF) ||
		(r >= 0xF900 && r <= 0xFAFF) || (r >= 0x2F800 && r <= 0x2FA1F)
}

// byteLevelNorm maps every byte to its ByteLevel character (the ByteLevel normalizer).
type byteLevelNorm struct{}

func (byteLevelNorm) normalize(s string) (string, error) { return byteLevelEncode(s), nil }
