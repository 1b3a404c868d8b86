// Package bench is a load generator for OpenAI-compatible servers (Loom's or any other) and,
// through the Target interface, for anything else that streams tokens. It sends a workload
// (synthetic prompts of given lengths, or a JSONL dataset) at a fixed concurrency or a
// request rate, and reports requests/s, tokens/s, time to first token, inter-token latency,
// time per output token and end-to-end latency (mean, p50, p90, p99) as a table or JSON;
// Compare sets a result beside an earlier one.
package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"
)

// Message is one chat message of a workload request.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Request is one request of a workload: a text prompt, a token-id prompt or chat messages.
type Request struct {
	Prompt    string
	PromptIDs []int
	Messages  []Message
	// MaxTokens is the number of tokens to generate.
	MaxTokens int
}

// Sample is what one request measured.
type Sample struct {
	// TTFT is the time from sending the request to the first generated text.
	TTFT time.Duration
	// ITL holds the gaps between consecutive pieces of streamed output.
	ITL []time.Duration
	// Latency is the time from sending the request to the end of its response.
	Latency time.Duration
	// PromptTokens and OutputTokens count tokens (from the server's usage when it gives it).
	PromptTokens, OutputTokens int
	// Err is set when the request failed.
	Err error

	last time.Time // when the previous piece arrived (Arrived)
}

// Arrived records a piece of streamed output arriving at now, for a request sent at start:
// the first sets TTFT, each later one adds its gap since the previous to ITL.
func (s *Sample) Arrived(start, now time.Time) {
	if s.last.IsZero() {
		s.TTFT = now.Sub(start)
	} else {
		s.ITL = append(s.ITL, now.Sub(s.last))
	}
	s.last = now
}

// Target runs one request and measures it. Do must honour ctx.
type Target interface {
	Do(ctx context.Context, r Request) Sample
	// Name describes the target in reports.
	Name() string
}

// Config sets how a workload is sent.
type Config struct {
	// Concurrency is the most requests in flight at once (0: no limit when Rate is set, 1 otherwise).
	Concurrency int
	// Rate is the mean number of requests started per second, with exponentially distributed
	// gaps (a Poisson process); 0 starts them as fast as Concurrency allows.
	Rate float64
	// Seed seeds the arrival times.
	Seed uint64
}

// Run sends every request of the workload to t and sums up the samples. It returns early
// with ctx's error when ctx ends (the result still covers the requests that finished).
func Run(ctx context.Context, t Target, workload []Request, cfg Config) (*Result, error) {
	if len(workload) == 0 {
		return nil, errors.New("bench: empty workload")
	}
	if cfg.Concurrency < 0 || cfg.Rate < 0 || math.IsNaN(cfg.Rate) || math.IsInf(cfg.Rate, 0) {
		return nil, fmt.Errorf("bench: concurrency (%d) and rate (%g) must be finite and not negative", cfg.Concurrency, cfg.Rate)
	}
	limit := cfg.Concurrency
	if limit == 0 {
		limit = 1
		if cfg.Rate > 0 {
			limit = len(workload)
		}
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6c6f6f6d))
	slots := make(chan struct{}, limit)
	samples := make([]Sample, len(workload))
	done := make([]bool, len(workload))
	var wg sync.WaitGroup
	start := time.Now()
	next := start
	var runErr error
loop:
	for i, r := range workload {
		if cfg.Rate > 0 {
			next = next.Add(time.Duration(rng.ExpFloat64() / cfg.Rate * float64(time.Second)))
			if err := sleepUntil(ctx, next); err != nil {
				runErr = err
				break loop
			}
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			runErr = ctx.Err()
			break loop
		}
		wg.Go(func() {
			defer func() { <-slots }()
			samples[i] = t.Do(ctx, r)
			done[i] = true
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	var finished []Sample
	for i, s := range samples {
		if done[i] && !(runErr != nil && errors.Is(s.Err, context.Canceled)) {
			finished = append(finished, s)
		}
	}
	res := Summarize(finished, elapsed)
	res.Target, res.Concurrency, res.Rate = t.Name(), cfg.Concurrency, cfg.Rate
	if runErr != nil {
		return res, fmt.Errorf("bench: %w", runErr)
	}
	return res, nil
}

func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Dist sums up a latency distribution, in milliseconds.
type Dist struct {
	Mean float64 `json:"mean_ms"`
	P50  float64 `json:"p50_ms"`
	P90  float64 `json:"p90_ms"`
	P99  float64 `json:"p99_ms"`
}

// Result is the outcome of a run; it is written and read as JSON.
type Result struct {
	Target      string  `json:"target"`
	Concurrency int     `json:"concurrency"`
	Rate        float64 `json:"request_rate"`
	Requests    int     `json:"requests"`
	Failed      int     `json:"failed"`
	// Errors holds the first few distinct error messages.
	Errors   []string `json:"errors,omitempty"`
	Duration float64  `json:"duration_s"`

	RequestsPerSec     float64 `json:"requests_per_s"`
	InputTokensPerSec  float64 `json:"input_tokens_per_s"`
	OutputTokensPerSec float64 `json:"output_tokens_per_s"`
	InputTokens        int     `json:"input_tokens"`
	OutputTokens       int     `json:"output_tokens"`

	TTFT    Dist `json:"ttft"`
	ITL     Dist `json:"itl"`
	TPOT    Dist `json:"tpot"`
	Latency Dist `json:"e2e_latency"`
}

// Summarize computes a result from the samples of a run that took elapsed.
func Summarize(samples []Sample, elapsed time.Duration) *Result {
	r := &Result{Duration: elapsed.Seconds()}
	var ttft, itl, tpot, lat []float64
	seen := map[string]bool{}
	for _, s := range samples {
		if s.Err != nil {
			r.Failed++
			if msg := s.Err.Error(); !seen[msg] && len(r.Errors) < 5 {
				seen[msg] = true
				r.Errors = append(r.Errors, msg)
			}
			continue
		}
		r.Requests++
		r.InputTokens += s.PromptTokens
		r.OutputTokens += s.OutputTokens
		ttft = append(ttft, ms(s.TTFT))
		lat = append(lat, ms(s.Latency))
		for _, d := range s.ITL {
			itl = append(itl, ms(d))
		}
		if s.OutputTokens > 1 {
			tpot = append(tpot, ms(s.Latency-s.TTFT)/float64(s.OutputTokens-1))
		}
	}
	if sec := elapsed.Seconds(); sec > 0 {
		r.RequestsPerSec = float64(r.Requests) / sec
		r.InputTokensPerSec = float64(r.InputTokens) / sec
		r.OutputTokensPerSec = float64(r.OutputTokens) / sec
	}
	r.TTFT, r.ITL, r.TPOT, r.Latency = dist(ttft), dist(itl), dist(tpot), dist(lat)
	return r
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// dist returns the mean and percentiles of xs (zero when empty).
func dist(xs []float64) Dist {
	if len(xs) == 0 {
		return Dist{}
	}
	xs = slices.Clone(xs)
	slices.Sort(xs)
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return Dist{Mean: sum / float64(len(xs)), P50: Percentile(xs, 50), P90: Percentile(xs, 90), P99: Percentile(xs, 99)}
}

// Percentile returns the p-th percentile (0-100) of sorted xs, interpolating linearly
// between the closest ranks (numpy's default).
func Percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	pos := p / 100 * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(sorted)-1)
	frac := pos - float64(lo)
	return sorted[lo] + (sorted[hi]-sorted[lo])*frac
}
