package server

import (
	"strings"
	"testing"
)

func TestStopMatcher(t *testing.T) {
	const atFlush = 99 // the stop string is settled only when the text ends
	for _, tc := range []struct {
		name    string
		stops   []string
		pieces  []string
		emitted []string // what each push returns
		stopped int      // index of the push that settles a stop string; -1 for none
		rest    string   // what flush returns when no push stopped
	}{
		{"no stops", nil, []string{"ab", "c"}, []string{"ab", "c"}, -1, ""},
		{"whole in one piece", []string{"STOP"}, []string{"abSTOPcd"}, []string{"ab"}, 0, ""},
		{"split over pieces", []string{"STOP"}, []string{"xS", "T", "O", "Py"}, []string{"x", "", "", ""}, 3, ""},
		{"false start released", []string{"STOP"}, []string{"xST", "Ax"}, []string{"x", "STAx"}, -1, ""},
		{"held at the end", []string{"STOP"}, []string{"abST"}, []string{"ab"}, -1, "ST"},
		{"overlapping prefixes", []string{"aab"}, []string{"a", "a", "a", "b"}, []string{"", "", "a", ""}, 3, ""},
		{"earliest start wins over earliest end", []string{"aba", "b"}, []string{"a", "b", "a"}, []string{"", "", ""}, 2, ""},
		{"earlier candidate fails, later match stands", []string{"abc", "b"}, []string{"a", "b", "x"}, []string{"", "", "a"}, 2, ""},
		{"issue 21: world or or", []string{"world", "or"}, []string{"hello w", "or", "ld"}, []string{"hello ", "", ""}, 2, ""},
		{"earliest settled at the end", []string{"cd", "bcdx"}, []string{"abcd"}, []string{"a"}, atFlush, "b"},
		{"longest hold of several", []string{"xyz", "yq"}, []string{"axy"}, []string{"a"}, -1, "xy"},
		{"multibyte", []string{"éé"}, []string{"café", "é!"}, []string{"caf", ""}, 1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := stopMatcher{stops: tc.stops}
			stoppedAt := -1
			for i, p := range tc.pieces {
				out, stopped := m.push(p)
				if out != tc.emitted[i] {
					t.Errorf("push %d (%q) = %q, want %q", i, p, out, tc.emitted[i])
				}
				if stopped {
					stoppedAt = i
					break
				}
			}
			if stoppedAt < 0 {
				rest, stopped := m.flush()
				if rest != tc.rest {
					t.Errorf("flush = %q, want %q", rest, tc.rest)
				}
				if stopped {
					stoppedAt = atFlush
				}
			}
			if stoppedAt != tc.stopped {
				t.Errorf("stopped at push %d, want %d", stoppedAt, tc.stopped)
			}
		})
	}
}

// FuzzStopMatcher checks that the emitted text is the input up to the first stop string,
// however the input is cut into pieces.
func FuzzStopMatcher(f *testing.F) {
	f.Add("hello STOP world", "STOP", "lo", uint8(3))
	f.Add("aaab", "aab", "b", uint8(1))
	f.Add("aba", "aba", "b", uint8(0))
	f.Add("hello world", "world", "or", uint8(6))
	f.Fuzz(func(t *testing.T, text, stop1, stop2 string, cut uint8) {
		var stops []string
		for _, s := range []string{stop1, stop2} {
			if s != "" {
				stops = append(stops, s)
			}
		}
		want, found := text, false
		first := -1
		for _, s := range stops {
			if i := strings.Index(text, s); i >= 0 && (first < 0 || i < first) {
				first = i
			}
		}
		if first >= 0 {
			want, found = text[:first], true
		}
		m := stopMatcher{stops: stops}
		step := int(cut%7) + 1
		var got strings.Builder
		stopped := false
		for i := 0; i < len(text) && !stopped; i += step {
			out, s := m.push(text[i:min(i+step, len(text))])
			got.WriteString(out)
			stopped = s
		}
		if !stopped {
			rest, s := m.flush()
			got.WriteString(rest)
			stopped = s
		}
		if got.String() != want || stopped != found {
			t.Errorf("text %q stops %q step %d: got %q (stopped %v), want %q (%v)", text, stops, step, got.String(), stopped, want, found)
		}
	})
}
