package tokenizer

import (
	"sort"
	"unicode"
	"unicode/utf8"
)

// AddedToken is an entry of tokenizer.json's "added_tokens": a token matched in the raw text
// before normalization and pre-tokenization, so that it is never split.
type AddedToken struct {
	ID      int    `json:"id"`
	Content string `json:"content"`
	// SingleWord: only match when not touching word characters on either side.
	SingleWord bool `json:"single_word"`
	// LStrip and RStrip: the whitespace to the left (right) of a match becomes part of it.
	LStrip bool `json:"lstrip"`
	RStrip bool `json:"rstrip"`
	// Normalized: match against the normalized text instead of the raw text.
	Normalized bool `json:"normalized"`
	// Special: a control token (dropped by Decode with skipSpecial).
	Special bool `json:"special"`
}

// addedMatcher finds added tokens in text, leftmost-longest, as Hugging Face's
// AddedVocabulary does with its Aho-Corasick automaton.
type addedMatcher struct {
	nodes  []trieNode
	tokens []*AddedToken // by pattern index
	starts [256]bool     // first bytes of all patterns
}

type trieNode struct {
	keys     []byte
	children []int32
	pattern  int32 // pattern ending here, or -1
}

func newAddedMatcher(patterns []string, tokens []*AddedToken) *addedMatcher {
	m := &addedMatcher{nodes: []trieNode{{pattern: -1}}, tokens: tokens}
	for pi, p := range patterns {
		if p == "" {
			continue
		}
		m.starts[p[0]] = true
		n := int32(0)
		for i := 0; i < len(p); i++ {
			c := m.child(n, p[i])
			if c < 0 {
				c = int32(len(m.nodes))
				m.nodes = append(m.nodes, trieNode{pattern: -1})
				nd := &m.nodes[n]
				at := sort.Search(len(nd.keys), func(k int) bool { return nd.keys[k] >= p[i] })
				nd.keys = append(nd.keys, 0)
				copy(nd.keys[at+1:], nd.keys[at:])
				nd.keys[at] = p[i]
				nd.children = append(nd.children, 0)
				copy(nd.children[at+1:], nd.children[at:])
				nd.children[at] = c
			}
			n = c
		}
		if m.nodes[n].pattern < 0 { // the first of duplicate patterns wins
			m.nodes[n].pattern = int32(pi)
		}
	}
	return m
}

func (m *addedMatcher) child(n int32, b byte) int32 {
	nd := &m.nodes[n]
	for i, k := range nd.keys {
		if k == b {
			return nd.children[i]
		}
		if k > b {
			break
		}
	}
	return -1
}

func (m *addedMatcher) empty() bool { return len(m.nodes) == 1 }

// longestAt returns the longest pattern starting at s[i] and its end, or -1.
func (m *addedMatcher) longestAt(s string, i int) (pat, end int) {
	pat, end = -1, -1
	n := int32(0)
	for j := i; j < len(s); j++ {
		n = m.child(n, s[j])
		if n < 0 {
			break
		}
		if p := m.nodes[n].pattern; p >= 0 {
			pat, end = int(p), j+1
		}
	}
	return pat, end
}

// addedSplit is a part of the text: either an added token (tok != nil) or text to tokenize.
type addedSplit struct {
	span
	tok *AddedToken
}

// split cuts s into added tokens and the text between them, applying the single_word,
// lstrip and rstrip rules. It appends to dst and returns it.
func (m *addedMatcher) split(s string, dst []addedSplit) []addedSplit {
	if m.empty() {
		return append(dst, addedSplit{span{0, len(s)}, nil})
	}
	startOffset := 0
	for i := 0; i < len(s); {
		if !m.starts[s[i]] {
			i++
			continue
		}
		pat, end := m.longestAt(s, i)
		if pat < 0 {
			i++
			continue
		}
		tok := m.tokens[pat]
		start, stop := i, end
		i = end // the search goes on after the match, whatever becomes of it
		if start < startOffset {
			continue // inside whitespace that a previous rstrip took
		}
		if tok.SingleWord {
			if (start > 0 && endsWithWord(s[:start])) || (stop < len(s) && startsWithWord(s[stop:])) {
				continue
			}
		}
		if tok.LStrip {
			start = max(spaceStartAtEnd(s[:start]), startOffset)
		}
		if tok.RStrip {
			stop += spaceLenAtStart(s[stop:])
			i = max(i, stop)
		}
		if startOffset < start {
			dst = append(dst, addedSplit{span{startOffset, start}, nil})
		}
		dst = append(dst, addedSplit{span{start, stop}, tok})
		startOffset = stop
	}
	if startOffset < len(s) || len(s) == 0 {
		dst = append(dst, addedSplit{span{startOffset, len(s)}, nil})
	}
	return dst
}

func endsWithWord(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return isWordRune(r)
}

func startsWithWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return isWordRune(r)
}

// spaceStartAtEnd returns where the trailing whitespace of s begins.
func spaceStartAtEnd(s string) int {
	i := len(s)
	for i > 0 {
		r, n := utf8.DecodeLastRuneInString(s[:i])
		if !unicode.IsSpace(r) {
			break
		}
		i -= n
	}
	return i
}

// spaceLenAtStart returns the length of the leading whitespace of s.
func spaceLenAtStart(s string) int {
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !unicode.IsSpace(r) {
			break
		}
		i += n
	}
	return i
}
