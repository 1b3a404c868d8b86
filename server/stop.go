package server

import "strings"

// stopMatcher finds stop strings in text that arrives in pieces. It holds back the end of
// the text while it could still be the start of a stop string, so a stop string split over
// several tokens is found and no part of it is ever emitted.
type stopMatcher struct {
	stops   []string
	pending string
}

// push adds text and returns the text that is safe to emit. When a stop string is complete,
// stopped is true, out is the text before it, and the matcher should not be used again.
func (m *stopMatcher) push(text string) (out string, stopped bool) {
	if len(m.stops) == 0 {
		return text, false
	}
	m.pending += text
	// Earliest complete stop string; nothing before pending can start one (it was emitted
	// only once no stop string could begin there).
	first := -1
	for _, s := range m.stops {
		if i := strings.Index(m.pending, s); i >= 0 && (first < 0 || i < first) {
			first = i
		}
	}
	if first >= 0 {
		out, m.pending = m.pending[:first], ""
		return out, true
	}
	hold := 0
	for _, s := range m.stops {
		for k := min(len(s)-1, len(m.pending)); k > hold; k-- {
			if strings.HasSuffix(m.pending, s[:k]) {
				hold = k
				break
			}
		}
	}
	out, m.pending = m.pending[:len(m.pending)-hold], m.pending[len(m.pending)-hold:]
	return out, false
}

// flush returns the text held back; at the end of generation it is no stop string.
func (m *stopMatcher) flush() string {
	out := m.pending
	m.pending = ""
	return out
}
