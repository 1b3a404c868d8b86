package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"text/tabwriter"
)

// WriteTable prints a result as a table.
func (r *Result) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	pf := func(format string, args ...any) { fmt.Fprintf(tw, format, args...) }
	pf("target\t%s\n", r.Target)
	load := fmt.Sprintf("concurrency %d", r.Concurrency)
	if r.Rate > 0 {
		load += fmt.Sprintf(", %.2f requests/s offered", r.Rate)
	}
	pf("load\t%s\n", load)
	pf("requests\t%d ok, %d failed in %.2f s\n", r.Requests, r.Failed, r.Duration)
	pf("requests/s\t%.3f\n", r.RequestsPerSec)
	pf("input tokens/s\t%.1f\t(%d tokens)\n", r.InputTokensPerSec, r.InputTokens)
	pf("output tokens/s\t%.1f\t(%d tokens)\n", r.OutputTokensPerSec, r.OutputTokens)
	pf("\n(ms)\tmean\tp50\tp90\tp99\n")
	for _, d := range []struct {
		name string
		d    Dist
	}{{"time to first token", r.TTFT}, {"inter-token latency", r.ITL}, {"time per output token", r.TPOT}, {"end-to-end latency", r.Latency}} {
		pf("%s\t%.2f\t%.2f\t%.2f\t%.2f\n", d.name, d.d.Mean, d.d.P50, d.d.P90, d.d.P99)
	}
	for _, e := range r.Errors {
		pf("error\t%s\n", e)
	}
	return tw.Flush()
}

// WriteJSON writes a result as indented JSON.
func (r *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// LoadResult reads a result written by WriteJSON.
func LoadResult(path string) (*Result, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	var r Result
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("bench: %s: %w", path, err)
	}
	return &r, nil
}

// Figure is one compared figure of two results.
type Figure struct {
	Name            string
	Current, Before float64
	// HigherIsBetter tells how to read the ratio.
	HigherIsBetter bool
}

// Ratio is Current/Before (NaN when Before is 0).
func (f Figure) Ratio() float64 {
	if f.Before == 0 {
		return math.NaN()
	}
	return f.Current / f.Before
}

// Figures lists the figures of r beside those of base.
func Figures(r, base *Result) []Figure {
	figs := []Figure{
		{"requests/s", r.RequestsPerSec, base.RequestsPerSec, true},
		{"input tokens/s", r.InputTokensPerSec, base.InputTokensPerSec, true},
		{"output tokens/s", r.OutputTokensPerSec, base.OutputTokensPerSec, true},
	}
	for _, d := range []struct {
		name      string
		cur, base Dist
	}{{"ttft", r.TTFT, base.TTFT}, {"itl", r.ITL, base.ITL}, {"tpot", r.TPOT, base.TPOT}, {"e2e latency", r.Latency, base.Latency}} {
		figs = append(figs,
			Figure{d.name + " mean (ms)", d.cur.Mean, d.base.Mean, false},
			Figure{d.name + " p50 (ms)", d.cur.P50, d.base.P50, false},
			Figure{d.name + " p90 (ms)", d.cur.P90, d.base.P90, false},
			Figure{d.name + " p99 (ms)", d.cur.P99, d.base.P99, false})
	}
	return figs
}

// WriteComparison prints each figure of r, of base and their ratio (r / base), marking
// whether the change is better or worse.
func WriteComparison(w io.Writer, r, base *Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "figure\tcurrent\tbaseline\tratio\t\t\n")
	for _, f := range Figures(r, base) {
		ratio := f.Ratio()
		verdict := ""
		switch {
		case math.IsNaN(ratio): // no baseline figure
		case ratio > 1.02 && f.HigherIsBetter, ratio < 0.98 && !f.HigherIsBetter:
			verdict = "better"
		case ratio < 0.98 && f.HigherIsBetter, ratio > 1.02 && !f.HigherIsBetter:
			verdict = "worse"
		}
		r := "-"
		if !math.IsNaN(ratio) {
			r = fmt.Sprintf("%.3fx", ratio)
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%s\t%s\t\n", f.Name, f.Current, f.Before, r, verdict)
	}
	return tw.Flush()
}
