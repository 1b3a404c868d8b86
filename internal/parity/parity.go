// Package parity holds Loom's outputs to the references that Hugging Face transformers
// computed for the test fixtures (testdata/*/reference.json): logits within a tolerance
// where a NaN or an infinity always fails, and greedy continuations compared step by step,
// teacher-forced past the near ties where rounding may legitimately pick the other token.
// It is imported by tests only.
package parity

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
)

// LogitTol bounds the absolute error of Loom's float32 logits against Hugging Face's
// float32 logits. The CPU measures at most ~1e-5 on short prompts and a few 1e-5 on prompts
// of 300+ tokens (summation order differs); 1e-4 leaves that room and no more.
const LogitTol = 1e-4

// NearTie is the greedy margin under which a run whose logits are within LogitTol of Hugging
// Face's may pick the other of the top two tokens: both can move by LogitTol, in opposite
// directions.
const NearTie = 2 * LogitTol

// BF16Ulps is how far, in bf16 ulps of the largest |logit| of a row (2^-7 of it: bf16 keeps
// 8 significant bits), bf16 activations may move a logit from Hugging Face's f32 one. Each of
// the fixtures' two layers rounds its activations to bf16 a dozen times (norms, projections,
// attention, the MLP, the residual adds), every rounding within half an ulp of its value;
// errors that add up over ~25 roundings of values near the logits' scale give a few ulps. The
// CPU measures at most 4 on every fixture, the H200 about 8 (0.32 against logits of
// magnitude ~5): 16 leaves twice that.
const BF16Ulps = 16

// BF16Bound is the bound on |bf16 logit - reference logit| over a row whose reference
// logits are want: BF16Ulps bf16 ulps of the row's largest magnitude.
func BF16Bound(want []float32) float64 {
	scale := 0.0
	for _, v := range want {
		scale = max(scale, math.Abs(float64(v)))
	}
	return BF16Ulps * scale / 128
}

// Reference is a fixture's reference.json.
type Reference struct {
	Model   string   `json:"model"`
	Prompts []Prompt `json:"prompts"`
}

// Prompt is one reference prompt: its token ids (BOS included, as the tokenizer gives them),
// Hugging Face's logits at its last position (and at every position when AllLogits is set),
// and the greedy continuation with the margin between the top two logits at each step.
type Prompt struct {
	Text          string      `json:"text"`
	IDs           []int       `json:"ids"`
	LastLogits    []float32   `json:"last_logits"`
	AllLogits     [][]float32 `json:"all_logits"`
	GreedyNewIDs  []int       `json:"greedy_new_ids"`
	GreedyMargins []float64   `json:"greedy_margins"`
}

// Load reads dir/reference.json and checks that it can prove something: at least one
// prompt, each with ids, a last-position row of the same vocabulary size as the others, all
// logits (if given) for every position, a non-empty greedy continuation with one margin per
// step, and no NaN or infinity anywhere.
func Load(dir string) (*Reference, error) {
	path := filepath.Join(dir, "reference.json")
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var ref Reference
	if err := json.Unmarshal(data, &ref); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := ref.validate(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &ref, nil
}

func (r *Reference) validate() error {
	if len(r.Prompts) == 0 {
		return errors.New("no prompts")
	}
	vocab := len(r.Prompts[0].LastLogits)
	for i, p := range r.Prompts {
		switch {
		case len(p.IDs) == 0:
			return fmt.Errorf("prompt %d has no ids", i)
		case len(p.LastLogits) == 0 || len(p.LastLogits) != vocab:
			return fmt.Errorf("prompt %d: %d last-position logits, prompt 0 has %d", i, len(p.LastLogits), vocab)
		case len(p.AllLogits) != 0 && len(p.AllLogits) != len(p.IDs):
			return fmt.Errorf("prompt %d: all_logits has %d rows for %d ids", i, len(p.AllLogits), len(p.IDs))
		case len(p.GreedyNewIDs) == 0 || len(p.GreedyMargins) != len(p.GreedyNewIDs):
			return fmt.Errorf("prompt %d: %d greedy ids and %d margins", i, len(p.GreedyNewIDs), len(p.GreedyMargins))
		}
		rows := append([][]float32{p.LastLogits}, p.AllLogits...)
		for j, row := range rows {
			if len(row) != vocab {
				return fmt.Errorf("prompt %d: logits row %d has %d values, want %d", i, j, len(row), vocab)
			}
			if k := slices.IndexFunc(row, func(v float32) bool { return !finite(float64(v)) }); k >= 0 {
				return fmt.Errorf("prompt %d: logits row %d holds %v at %d", i, j, row[k], k)
			}
		}
		for j, m := range p.GreedyMargins {
			if !(m >= 0) || !finite(m) {
				return fmt.Errorf("prompt %d: greedy margin %d is %v", i, j, m)
			}
		}
	}
	return nil
}

// Vocab is the number of logits per position.
func (r *Reference) Vocab() int { return len(r.Prompts[0].LastLogits) }

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// MaxAbsDiff returns the largest |a[i] - b[i]| and its index. A NaN or an infinity on either
// side counts as an infinite difference (and so does a length mismatch, at index -1): a
// tolerance check `d > tol` can never pass over one.
func MaxAbsDiff(a, b []float32) (float64, int) {
	if len(a) != len(b) {
		return math.Inf(1), -1
	}
	worst, at := 0.0, -1
	for i := range a {
		d := math.Abs(float64(a[i]) - float64(b[i]))
		if !finite(float64(a[i])) || !finite(float64(b[i])) || math.IsNaN(d) {
			return math.Inf(1), i
		}
		if d > worst || at < 0 {
			worst, at = d, i
		}
	}
	return worst, at
}

// Within reports whether got is within tol of want everywhere (NaN never is).
func Within(got, want []float32, tol float64) bool {
	d, _ := MaxAbsDiff(got, want)
	return d <= tol
}

// CheckLogits holds logits (the rows of the prompt's positions, [len(ids), vocab], or only
// the last position's row, [vocab]) to the reference within tol: the last row always, every
// row where the reference has them all.
func CheckLogits(logits []float32, p Prompt, tol float64) error {
	vocab := len(p.LastLogits)
	var errs []error
	check := func(what string, got, want []float32) {
		if d, at := MaxAbsDiff(got, want); !(d <= tol) {
			errs = append(errs, fmt.Errorf("%q: %s logits differ by %.2e at token %d (tolerance %.0e)", p.Text, what, d, at, tol))
		}
	}
	switch len(logits) {
	case vocab:
		check("last-position", logits, p.LastLogits)
	case len(p.IDs) * vocab:
		check("last-position", logits[(len(p.IDs)-1)*vocab:], p.LastLogits)
		for pos, row := range p.AllLogits {
			check(fmt.Sprintf("position %d", pos), logits[pos*vocab:(pos+1)*vocab], row)
		}
	default:
		return fmt.Errorf("%q: %d logits are neither one row of %d nor %d rows", p.Text, len(logits), vocab, len(p.IDs))
	}
	return errors.Join(errs...)
}

// Generator continues prompt greedily by n tokens.
type Generator func(prompt []int, n int) ([]int, error)

// Greedy is what CheckGreedy compared: Steps reference steps, Compared of them checked
// token for token, and Ties, the steps where the run picked the other side of a near tie.
type Greedy struct {
	Steps, Compared int
	Ties            []int
}

// CheckGreedy runs gen from the prompt and compares each new token with the reference's
// greedy continuation. A difference at a step whose reference margin is under nearTie is a
// near tie: the run is restarted from the prompt plus the reference's tokens up to and
// including that step (teacher forcing), so the comparison goes on past it. Any other
// difference fails, and so does a run where fewer than half the steps could be compared.
func CheckGreedy(gen Generator, p Prompt, nearTie float64) (Greedy, error) {
	want := p.GreedyNewIDs
	res := Greedy{Steps: len(want)}
	for done := 0; done < len(want); {
		prefix := slices.Concat(p.IDs, want[:done])
		got, err := gen(prefix, len(want)-done)
		if err != nil {
			return res, fmt.Errorf("%q: generating from step %d: %w", p.Text, done, err)
		}
		if len(got) != len(want)-done {
			return res, fmt.Errorf("%q: generated %d tokens from step %d, want %d", p.Text, len(got), done, len(want)-done)
		}
		from := done
		for j, id := range got {
			step := from + j
			done = step + 1
			if id == want[step] {
				res.Compared++
				continue
			}
			if p.GreedyMargins[step] < nearTie {
				res.Ties = append(res.Ties, step)
				break // restart, forcing the reference's token at this step
			}
			return res, fmt.Errorf("%q: step %d: got token %d, reference %d (margin %.4g, near ties under %.0e)\n got  %v\n want %v",
				p.Text, step, id, want[step], p.GreedyMargins[step], nearTie, got, want[from:])
		}
	}
	if 2*res.Compared < res.Steps {
		return res, fmt.Errorf("%q: only %d of %d greedy steps compared (near ties at %v)", p.Text, res.Compared, res.Steps, res.Ties)
	}
	return res, nil
}
