package parity

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestMaxAbsDiff(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, tc := range []struct {
		name   string
		a, b   []float32
		want   float64
		wantAt int
	}{
		{"equal", []float32{1, 2}, []float32{1, 2}, 0, 0},
		{"largest", []float32{1, 2, 3}, []float32{1, 2.5, 2.9}, 0.5, 1},
		{"NaN got", []float32{1, nan, 3}, []float32{1, 2, 3}, math.Inf(1), 1},
		{"NaN want", []float32{1, 2}, []float32{1, nan}, math.Inf(1), 1},
		{"NaN after a larger error", []float32{9, nan}, []float32{1, 1}, math.Inf(1), 1},
		{"both +Inf", []float32{inf}, []float32{inf}, math.Inf(1), 0},
		{"lengths", []float32{1}, []float32{1, 2}, math.Inf(1), -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, at := MaxAbsDiff(tc.a, tc.b)
			if math.Abs(d-tc.want) > 1e-6 && !(math.IsInf(d, 1) && math.IsInf(tc.want, 1)) || at != tc.wantAt {
				t.Errorf("MaxAbsDiff = %v at %d, want %v at %d", d, at, tc.want, tc.wantAt)
			}
			if Within(tc.a, tc.b, 1) != (tc.want <= 1) {
				t.Errorf("Within(tol 1) = %v with a difference of %v", !(tc.want <= 1), tc.want)
			}
		})
	}
}

func testPrompt() Prompt {
	return Prompt{
		Text: "p", IDs: []int{7, 8},
		LastLogits:    []float32{0.5, -1, 2},
		AllLogits:     [][]float32{{1, 1, 1}, {0.5, -1, 2}},
		GreedyNewIDs:  []int{2, 0, 1, 1},
		GreedyMargins: []float64{1, 1e-5, 1, 1},
	}
}

// The mutation the audit used: one NaN and a +0.5 error per row must fail the check, and
// so must each alone; logits within tolerance pass.
func TestCheckLogits(t *testing.T) {
	p := testPrompt()
	all := slices.Concat(p.AllLogits...)
	for _, tc := range []struct {
		name    string
		logits  []float32
		mutate  func([]float32)
		wantErr string
	}{
		{"exact", all, nil, ""},
		{"within tolerance", all, func(l []float32) { l[1] += 5e-5 }, ""},
		{"last row only", slices.Clone(p.LastLogits), nil, ""},
		{"NaN and 0.5", all, func(l []float32) { l[0] = float32(math.NaN()); l[4] += 0.5 }, "position 0"},
		{"NaN in the last row", all, func(l []float32) { l[5] = float32(math.NaN()) }, "last-position"},
		{"0.5 in the last row", slices.Clone(p.LastLogits), func(l []float32) { l[2] += 0.5 }, "last-position"},
		{"wrong length", all[:4], nil, "neither"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := slices.Clone(tc.logits)
			if tc.mutate != nil {
				tc.mutate(l)
			}
			err := CheckLogits(l, p, LogitTol)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("CheckLogits = %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

// fixedRun is a generator that answers each prefix with a scripted continuation.
func fixedRun(next func(prefix []int) int) Generator {
	return func(prompt []int, n int) ([]int, error) {
		seq := slices.Clone(prompt)
		for range n {
			seq = append(seq, next(seq))
		}
		return seq[len(prompt):], nil
	}
}

func TestCheckGreedy(t *testing.T) {
	p := testPrompt() // reference continuation 2 0 1 1; step 1 is a near tie
	ref := func(seq []int) int { return p.GreedyNewIDs[len(seq)-len(p.IDs)] }
	for _, tc := range []struct {
		name     string
		next     func([]int) int
		compared int
		ties     []int
		wantErr  string
	}{
		{"identical", ref, 4, nil, ""},
		{"other side of the near tie, then the reference", func(s []int) int {
			if len(s) == 3 {
				return 5
			}
			return ref(s)
		}, 3, []int{1}, ""},
		{"a clear difference", func(s []int) int {
			if len(s) == 4 {
				return 5
			}
			return ref(s)
		}, 2, nil, "step 2"},
		// A NaN-poisoned run picks the same token every step: the near tie does not hide it.
		{"always 0", func([]int) int { return 0 }, 0, nil, "step 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := CheckGreedy(fixedRun(tc.next), p, NearTie)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("CheckGreedy = %v, want an error containing %q", err, tc.wantErr)
			}
			if res.Compared != tc.compared || !slices.Equal(res.Ties, tc.ties) {
				t.Errorf("compared %d steps with ties at %v, want %d and %v", res.Compared, res.Ties, tc.compared, tc.ties)
			}
		})
	}
	// Too many near ties leave too little compared.
	q := testPrompt()
	q.GreedyMargins = []float64{1e-5, 1e-5, 1e-5, 1}
	res, err := CheckGreedy(fixedRun(func(s []int) int {
		if len(s) == 5 {
			return 1
		}
		return 9
	}), q, NearTie)
	if err == nil || !strings.Contains(err.Error(), "of 4 greedy steps compared") {
		t.Errorf("CheckGreedy over three flipped near ties = %+v, %v; want too few steps compared", res, err)
	}
}

func TestLoadRejects(t *testing.T) {
	for _, tc := range []struct{ name, json, want string }{
		{"no prompts", `{"prompts": []}`, "no prompts"},
		{"no ids", `{"prompts": [{"ids": [], "last_logits": [1], "greedy_new_ids": [1], "greedy_margins": [1]}]}`, "no ids"},
		{"no logits", `{"prompts": [{"ids": [1], "last_logits": [], "greedy_new_ids": [1], "greedy_margins": [1]}]}`, "last-position"},
		{"vocab", `{"prompts": [{"ids": [1], "last_logits": [1, 2], "greedy_new_ids": [1], "greedy_margins": [1]},
			{"ids": [1], "last_logits": [1], "greedy_new_ids": [1], "greedy_margins": [1]}]}`, "prompt 1"},
		{"rows", `{"prompts": [{"ids": [1, 2], "last_logits": [1], "all_logits": [[1]], "greedy_new_ids": [1], "greedy_margins": [1]}]}`, "all_logits"},
		{"margins", `{"prompts": [{"ids": [1], "last_logits": [1], "greedy_new_ids": [1, 2], "greedy_margins": [1]}]}`, "margins"},
		{"negative margin", `{"prompts": [{"ids": [1], "last_logits": [1], "greedy_new_ids": [1], "greedy_margins": [-1]}]}`, "margin 0"},
		{"not json", `{"prompts": [`, "reference.json"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "reference.json"), []byte(tc.json), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Load = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// Every bundled fixture's reference loads and is complete.
func TestFixtureReferences(t *testing.T) {
	dirs, err := filepath.Glob(filepath.Join("..", "..", "testdata", "tiny-*"))
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no fixtures found (%v)", err)
	}
	for _, dir := range dirs {
		ref, err := Load(dir)
		if err != nil {
			t.Errorf("%s: %v", dir, err)
			continue
		}
		if ref.Prompts[0].AllLogits == nil {
			t.Errorf("%s: prompt 0 has no all_logits", dir)
		}
	}
}

func TestBF16Bound(t *testing.T) {
	for _, tc := range []struct {
		row  []float32
		want float64
	}{
		{[]float32{1, -2, 0.5}, 16 * 2.0 / 128}, // 16 ulps of 2: 2^-6 each
		{[]float32{8}, 1},
		{[]float32{0, 0}, 0},
	} {
		if got := BF16Bound(tc.row); got != tc.want {
			t.Errorf("BF16Bound(%v) = %v, want %v", tc.row, got, tc.want)
		}
	}
}
