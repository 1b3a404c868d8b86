package server

import "strings"

// stopMatcher finds stop strings in text that arrives in pieces. The rule is the one a
// reader of the whole text would apply: the completion ends where the earliest stop string
// in the text begins, however the text is cut into tokens. To keep that rule while
// streaming, the matcher holds back text from the earliest position where a stop string
// could still begin (the text from there on is a proper prefix of one), even when a later
// stop string is already complete; no part of a stop string is ever emitted.
type stopMatcher struct {
	stops   []string
	pending string
}

// push adds text and returns the text that is safe to emit. When the earliest stop string
// is settled, stopped is true, out is the text before it, and the matcher should not be
// used again.
func (m *stopMatcher) push(text string) (out string, stopped bool) {
	if len(m.stops) == 0 {
		return text, false
	}
	m.pending += text
	first := m.firstMatch()
	open := m.firstOpen()
	if first >= 0 && (open < 0 || open > first) {
		out, m.pending = m.pending[:first], ""
		return out, true
	}
	if open < 0 {
		open = len(m.pending)
	}
	out, m.pending = m.pending[:open], m.pending[open:]
	return out, false
}

// flush ends the text: it returns what was held back, cut at the earliest complete stop
// string if there is one (stopped is then true).
func (m *stopMatcher) flush() (out string, stopped bool) {
	out = m.pending
	m.pending = ""
	for _, s := range m.stops {
		if i := strings.Index(out, s); i >= 0 {
			out, stopped = out[:i], true
		}
	}
	return out, stopped
}

// firstMatch is the start of the earliest complete stop string in pending, or -1.
func (m *stopMatcher) firstMatch() int {
	first := -1
	for _, s := range m.stops {
		if i := strings.Index(m.pending, s); i >= 0 && (first < 0 || i < first) {
			first = i
		}
	}
	return first
}

// firstOpen is the earliest position from which pending is a proper prefix of a stop
// string (more text could complete one there), or -1. Positions before it can never
// begin a stop string, so the text before it is final.
func (m *stopMatcher) firstOpen() int {
	longest := 0
	for _, s := range m.stops {
		longest = max(longest, len(s))
	}
	for q := max(0, len(m.pending)-longest+1); q < len(m.pending); q++ {
		tail := m.pending[q:]
		for _, s := range m.stops {
			if len(tail) < len(s) && strings.HasPrefix(s, tail) {
				return q
			}
		}
	}
	return -1
}
