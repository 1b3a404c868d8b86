package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"unicode"
	"unicode/utf8"
)

// piece is a part of the input on its way from the normalizer to the model.
type piece struct {
	s string
	// first reports that the piece starts at offset 0 of the original input; Metaspace's
	// prepend_scheme "first" adds its prefix only to such a piece.
	first bool
	// byteLevel reports that s still holds raw bytes that stand for their ByteLevel
	// characters: the final ByteLevel pre-tokenizer leaves the mapping to the model, which
	// then works on bytes directly (see deferByteLevel).
	byteLevel bool
}

// A preTokenizer splits a normalized piece into the words that the model tokenizes one by one
// (the "pre_tokenizer" section of tokenizer.json). It may also rewrite them (ByteLevel,
// Metaspace). Empty pieces are never produced.
type preTokenizer interface {
	preTokenize(p piece, dst []piece) ([]piece, error)
}

// behavior is a SplitDelimiterBehavior: what becomes of the matched delimiters.
type behavior int

const (
	removed behavior = iota
	isolated
	mergedWithPrevious
	mergedWithNext
	contiguous
)

func parseBehavior(s, where string) (behavior, error) {
	switch s {
	case "Removed":
		return removed, nil
	case "Isolated":
		return isolated, nil
	case "MergedWithPrevious":
		return mergedWithPrevious, nil
	case "MergedWithNext":
		return mergedWithNext, nil
	case "Contiguous":
		return contiguous, nil
	}
	return 0, fmt.Errorf("%s: unknown split behavior %q", where, s)
}

func parsePreTokenizer(raw json.RawMessage, where string) (preTokenizer, error) {
	typ, null, err := componentType(raw, where)
	if null || err != nil {
		return nil, err
	}
	switch typ {
	case "Sequence":
		var cfg struct {
			PreTokenizers []json.RawMessage `json:"pretokenizers"`
		}
		if err := decodeAt(raw, where, &cfg); err != nil {
			return nil, err
		}
		seq, err := parseSequence(cfg.PreTokenizers, where, "pretokenizers", parsePreTokenizer)
		if err != nil {
			return nil, err
		}
		return preTokenizerSeq(seq), nil
	case "Split":
		var cfg struct {
			Pattern  json.RawMessage `json:"pattern"`
			Behavior string          `json:"behavior"`
			Invert   bool            `json:"invert"`
		}
		if err := decodeAt(raw, where, &cfg); err != nil {
			return nil, err
		}
		pat, err := parsePattern(cfg.Pattern, where+".pattern")
		if err != nil {
			return nil, err
		}
		b, err := parseBehavior(cfg.Behavior, where+".behavior")
		if err != nil {
			return nil, err
		}
		return splitPre{pat, b, cfg.Invert}, nil
	case "ByteLevel":
		cfg := struct {
			AddPrefixSpace bool `json:"add_prefix_space"`
			UseRegex       bool `json:"use_regex"`
		}{AddPrefixSpace: true, UseRegex: true}
		if err := decodeAt(raw, where, &cfg); err != nil {
			return nil, err
		}
		return byteLevelPre{addPrefixSpace: cfg.AddPrefixSpace, useRegex: cfg.UseRegex}, nil
	case "Metaspace":
		m, err := parseMetaspace(raw, where)
		if err != nil {
			return nil, err
		}
		return metaspacePre{m}, nil
	case "Digits":
		var cfg struct {
			Individual bool `json:"individual_digits"`
		}
		if err := decodeAt(raw, where, &cfg); err != nil {
			return nil, err
		}
		b := contiguous
		if cfg.Individual {
			b = isolated
		}
		return runeSplitPre{unicode.IsNumber, b}, nil
	case "Whitespace":
		return whitespacePre{}, nil
	case "WhitespaceSplit":
		return runeSplitPre{unicode.IsSpace, removed}, nil
	case "Punctuation":
		cfg := struct {
			Behavior string `json:"behavior"`
		}{Behavior: "Isolated"}
		if err := decodeAt(raw, where, &cfg); err != nil {
			return nil, err
		}
		b, err := parseBehavior(cfg.Behavior, where+".behavior")
		if err != nil {
			return nil, err
		}
		return runeSplitPre{isPunctuation, b}, nil
	case "BertPreTokenizer":
		return preTokenizerSeq{runeSplitPre{unicode.IsSpace, removed}, runeSplitPre{isPunctuation, isolated}}, nil
	case "CharDelimiterSplit":
		var cfg struct {
			Delimiter string `json:"delimiter"`
		}
		if err := decodeAt(raw, where, &cfg); err != nil {
			return nil, err
		}
		d, n := utf8.DecodeRuneInString(cfg.Delimiter)
		if n == 0 || n != len(cfg.Delimiter) {
			return nil, fmt.Errorf("%s: delimiter must be one character, got %q", where, cfg.Delimiter)
		}
		return runeSplitPre{func(r rune) bool { return r == d }, removed}, nil
	default:
		return nil, fmt.Errorf("%s: unsupported pre-tokenizer type %q", where, typ)
	}
}

type preTokenizerSeq []preTokenizer

func (q preTokenizerSeq) preTokenize(p piece, dst []piece) ([]piece, error) {
	sc := pieceScratch.Get().(*[2][]piece)
	defer pieceScratch.Put(sc)
	cur := append(sc[0][:0], p)
	next := sc[1][:0]
	var err error
	for _, pt := range q {
		next = next[:0]
		for _, c := range cur {
			if next, err = pt.preTokenize(c, next); err != nil {
				return dst, err
			}
		}
		cur, next = next, cur
	}
	dst = append(dst, cur...)
	sc[0], sc[1] = cur[:0], next[:0]
	return dst, nil
}

var pieceScratch = sync.Pool{New: func() any { return new([2][]piece) }}

// deferByteLevel lets a ByteLevel pre-tokenizer that runs last leave its pieces as raw bytes
// (piece.byteLevel), so that the model maps bytes to ids without building the mapped strings.
// It returns pt, changed where that applies.
func deferByteLevel(pt preTokenizer) preTokenizer {
	switch p := pt.(type) {
	case byteLevelPre:
		p.deferMap = true
		return p
	case preTokenizerSeq:
		if len(p) > 0 {
			q := append(preTokenizerSeq(nil), p...)
			q[len(q)-1] = deferByteLevel(q[len(q)-1])
			return q
		}
	}
	return pt
}

// matchSeg is one part of a string that a pattern cut up: a match or the gap between two.
type matchSeg struct {
	span
	match bool
}

// segmentsFromMatches covers s with the matches and the gaps between them.
func segmentsFromMatches(s string, matches []span, invert bool) []matchSeg {
	if s == "" {
		return []matchSeg{{span{0, 0}, invert}}
	}
	segs := make([]matchSeg, 0, 2*len(matches)+1)
	prev := 0
	for _, m := range matches {
		if prev != m.start {
			segs = append(segs, matchSeg{span{prev, m.start}, invert})
		}
		segs = append(segs, matchSeg{m, !invert})
		prev = m.end
	}
	if prev != len(s) {
		segs = append(segs, matchSeg{span{prev, len(s)}, invert})
	}
	return segs
}

// applyBehavior cuts p along segs as Hugging Face's NormalizedString::split does and appends
// the non-empty parts to dst.
func applyBehavior(p piece, segs []matchSeg, b behavior, dst []piece) []piece {
	type part struct {
		span
		remove bool
	}
	var parts []part
	switch b {
	case isolated:
		parts = make([]part, len(segs))
		for i, sg := range segs {
			parts[i] = part{sg.span, false}
		}
	case removed:
		parts = make([]part, len(segs))
		for i, sg := range segs {
			parts[i] = part{sg.span, sg.match}
		}
	case contiguous:
		prevMatch := false
		for _, sg := range segs {
			if sg.match == prevMatch && len(parts) > 0 {
				parts[len(parts)-1].end = sg.end
			} else {
				parts = append(parts, part{sg.span, false})
			}
			prevMatch = sg.match
		}
	case mergedWithPrevious:
		prevMatch := false
		for _, sg := range segs {
			if sg.match && !prevMatch && len(parts) > 0 {
				parts[len(parts)-1].end = sg.end
			} else {
				parts = append(parts, part{sg.span, false})
			}
			prevMatch = sg.match
		}
	case mergedWithNext:
		prevMatch := false
		for i := len(segs) - 1; i >= 0; i-- {
			sg := segs[i]
			if sg.match && !prevMatch && len(parts) > 0 {
				parts[len(parts)-1].start = sg.start
			} else {
				parts = append(parts, part{sg.span, false})
			}
			prevMatch = sg.match
		}
		for i, j := 0, len(parts)-1; i < j; i, j = i+1, j-1 {
			parts[i], parts[j] = parts[j], parts[i]
		}
	}
	for _, pt := range parts {
		if pt.remove || pt.start == pt.end {
			continue
		}
		dst = append(dst, piece{s: p.s[pt.start:pt.end], first: p.first && pt.start == 0, byteLevel: p.byteLevel})
	}
	return dst
}

// splitPre is the Split pre-tokenizer.
type splitPre struct {
	pat    pattern
	b      behavior
	invert bool
}

func (sp splitPre) preTokenize(p piece, dst []piece) ([]piece, error) {
	buf := spanScratch.Get().(*[]span)
	defer spanScratch.Put(buf)
	m, err := sp.pat.findAll(p.s, (*buf)[:0])
	*buf = m
	if err != nil {
		return dst, err
	}
	if sp.b == isolated && !sp.invert {
		// Matches and the gaps between them, each its own piece.
		prev := 0
		add := func(start, end int) {
			if start < end {
				dst = append(dst, piece{s: p.s[start:end], first: p.first && start == 0, byteLevel: p.byteLevel})
			}
		}
		for _, mt := range m {
			add(prev, mt.start)
			add(mt.start, mt.end)
			prev = mt.end
		}
		add(prev, len(p.s))
		return dst, nil
	}
	return applyBehavior(p, segmentsFromMatches(p.s, m, sp.invert), sp.b, dst), nil
}

var spanScratch = sync.Pool{New: func() any { return new([]span) }}

// runeSplitPre splits on every character for which is returns true, each such character
// being one match.
type runeSplitPre struct {
	is func(rune) bool
	b  behavior
}

func (rs runeSplitPre) preTokenize(p piece, dst []piece) ([]piece, error) {
	var m []span
	for i, r := range p.s {
		if rs.is(r) {
			m = append(m, span{i, i + utf8.RuneLen(r)})
		}
	}
	if len(m) == 0 {
		if p.s != "" {
			dst = append(dst, p)
		}
		return dst, nil
	}
	return applyBehavior(p, segmentsFromMatches(p.s, m, false), rs.b, dst), nil
}

// whitespacePre is the Whitespace pre-tokenizer: runs of word characters and runs of other
// non-space characters, whitespace dropped (the regex \w+|[^\w\s]+).
type whitespacePre struct{}

func (whitespacePre) preTokenize(p piece, dst []piece) ([]piece, error) {
	s := p.s
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if unicode.IsSpace(r) {
			i += n
			continue
		}
		word := isWordRune(r)
		j := i + n
		for j < len(s) {
			r2, n2 := utf8.DecodeRuneInString(s[j:])
			if unicode.IsSpace(r2) || isWordRune(r2) != word {
				break
			}
			j += n2
		}
		dst = append(dst, piece{s: s[i:j], first: p.first && i == 0})
		i = j
	}
	return dst, nil
}

// isWordRune reports the regex class \w with Unicode meaning.
func isWordRune(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.M, r) ||
		unicode.Is(unicode.Pc, r) || unicode.Is(unicode.Nl, r) || r == 0x200C || r == 0x200D
}

// isPunctuation reports ASCII punctuation (which includes symbols such as $ and +) and any
// Unicode punctuation, as the Punctuation pre-tokenizer defines it.
func isPunctuation(r rune) bool {
	if r < utf8.RuneSelf {
		return unicode.IsPunct(r) || unicode.IsSymbol(r)
	}
	return unicode.IsPunct(r)
}

// byteLevelPre is the ByteLevel pre-tokenizer: optional leading space, optional GPT-2 regex
// split, then every byte mapped to its ByteLevel character. With deferMap the mapping is left
// to the model (see deferByteLevel).
type byteLevelPre struct {
	addPrefixSpace bool
	useRegex       bool
	deferMap       bool
}

var gpt2Split = splitPre{scannerPattern{gpt2Pattern, scanGPT2}, isolated, false}

func (bl byteLevelPre) preTokenize(p piece, dst []piece) ([]piece, error) {
	if bl.addPrefixSpace && !strings.HasPrefix(p.s, " ") {
		p.s = " " + p.s
	}
	start := len(dst)
	if bl.useRegex {
		dst, _ = gpt2Split.preTokenize(p, dst)
	} else if p.s != "" {
		dst = append(dst, p)
	}
	for i := start; i < len(dst); i++ {
		if bl.deferMap {
			dst[i].byteLevel = true
		} else {
			dst[i].s = byteLevelEncode(dst[i].s)
		}
	}
	return dst, nil
}

// prependScheme says when Metaspace adds its replacement character in front of a piece.
type prependScheme int

const (
	prependAlways prependScheme = iota
	prependFirst
	prependNever
)

// metaspace holds the settings shared by the Metaspace pre-tokenizer and decoder.
type metaspace struct {
	replacement rune
	repl        string
	scheme      prependScheme
	split       bool
}

func parseMetaspace(raw json.RawMessage, where string) (metaspace, error) {
	var cfg struct {
		Replacement    string  `json:"replacement"`
		PrependScheme  *string `json:"prepend_scheme"`
		AddPrefixSpace *bool   `json:"add_prefix_space"`
		Split          *bool   `json:"split"`
	}
	if err := decodeAt(raw, where, &cfg); err != nil {
		return metaspace{}, err
	}
	r, n := utf8.DecodeRuneInString(cfg.Replacement)
	if n == 0 || n != len(cfg.Replacement) {
		return metaspace{}, fmt.Errorf("%s: replacement must be one character, got %q", where, cfg.Replacement)
	}
	m := metaspace{replacement: r, repl: cfg.Replacement, scheme: prependAlways, split: true}
	if cfg.Split != nil {
		m.split = *cfg.Split
	}
	if cfg.PrependScheme != nil {
		switch *cfg.PrependScheme {
		case "always":
			m.scheme = prependAlways
		case "first":
			m.scheme = prependFirst
		case "never":
			m.scheme = prependNever
		default:
			return metaspace{}, fmt.Errorf("%s: unknown prepend_scheme %q", where, *cfg.PrependScheme)
		}
	}
	if cfg.AddPrefixSpace != nil && !*cfg.AddPrefixSpace {
		m.scheme = prependNever
	}
	return m, nil
}

// metaspacePre is the Metaspace pre-tokenizer: spaces become the replacement character, which
// is also prepended per the scheme, and words are cut before each replacement character.
type metaspacePre struct{ m metaspace }

func (mp metaspacePre) preTokenize(p piece, dst []piece) ([]piece, error) {
	s := strings.ReplaceAll(p.s, " ", mp.m.repl)
	if !strings.HasPrefix(s, mp.m.repl) && (mp.m.scheme == prependAlways || (mp.m.scheme == prependFirst && p.first)) {
		s = mp.m.repl + s
	}
	q := piece{s: s, first: p.first}
	if !mp.m.split {
		if s != "" {
			dst = append(dst, q)
		}
		return dst, nil
	}
	rs := runeSplitPre{func(r rune) bool { return r == mp.m.replacement }, mergedWithNext}
	return rs.preTokenize(q, dst)
}
