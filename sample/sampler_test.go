package sample

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

// logitsOf returns logits whose softmax is probs (ln of each).
func logitsOf(probs ...float64) []float32 {
	out := make([]float32, len(probs))
	for i, p := range probs {
		out[i] = float32(math.Log(p))
	}
	return out
}

// distribution runs the sampler's processing on logits and returns the final distribution
// over the whole vocabulary (zero for filtered tokens), normalized.
func distribution(t *testing.T, s *Sampler, logits []float32) []float64 {
	t.Helper()
	x, err := s.process(logits)
	if err != nil {
		t.Fatal(err)
	}
	cand, w := s.candidates(x)
	out := make([]float64, len(logits))
	total := 0.0
	for _, v := range w {
		total += v
	}
	for i, id := range cand {
		out[id] = w[i] / total
	}
	return out
}

func near(a, b []float64, tol float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !(math.Abs(a[i]-b[i]) <= tol) { // a NaN is never near
			return false
		}
	}
	return true
}

// TestDistribution holds the distribution that remains after temperature, top-k, top-p and
// min-p to values computed by hand.
func TestDistribution(t *testing.T) {
	base := logitsOf(0.4, 0.3, 0.2, 0.1)
	for _, tc := range []struct {
		name   string
		p      Params
		logits []float32
		want   []float64
	}{
		{"plain", Params{Temperature: 1}, base, []float64{0.4, 0.3, 0.2, 0.1}},
		// T=0.5 squares the probabilities: .16 .09 .04 .01 over .30.
		{"temperature 0.5", Params{Temperature: 0.5}, base, []float64{.16 / .3, .09 / .3, .04 / .3, .01 / .3}},
		// T=2 takes square roots.
		{"temperature 2", Params{Temperature: 2}, base, func() []float64 {
			r := []float64{math.Sqrt(.4), math.Sqrt(.3), math.Sqrt(.2), math.Sqrt(.1)}
			s := r[0] + r[1] + r[2] + r[3]
			return []float64{r[0] / s, r[1] / s, r[2] / s, r[3] / s}
		}()},
		{"top-k 2", Params{Temperature: 1, TopK: 2}, base, []float64{4. / 7, 3. / 7, 0, 0}},
		{"top-k larger than vocab", Params{Temperature: 1, TopK: 10}, base, []float64{0.4, 0.3, 0.2, 0.1}},
		// Cumulative .4, .7, .9: top_p .69 keeps two, .71 keeps three.
		{"top-p 0.69", Params{Temperature: 1, TopP: 0.69}, base, []float64{4. / 7, 3. / 7, 0, 0}},
		{"top-p 0.71", Params{Temperature: 1, TopP: 0.71}, base, []float64{4. / 9, 3. / 9, 2. / 9, 0}},
		{"top-p tiny keeps one", Params{Temperature: 1, TopP: 0.01}, base, []float64{1, 0, 0, 0}},
		// After top-k 3 the distribution is .4/.9, .3/.9, .2/.9; top-p .75 needs two (.444+.333).
		{"top-k then top-p", Params{Temperature: 1, TopK: 3, TopP: 0.75}, base, []float64{4. / 7, 3. / 7, 0, 0}},
		// min-p .45: keep p >= .18.
		{"min-p 0.45", Params{Temperature: 1, MinP: 0.45}, base, []float64{4. / 9, 3. / 9, 2. / 9, 0}},
		{"min-p 0.8", Params{Temperature: 1, MinP: 0.8}, base, []float64{1, 0, 0, 0}},
		// Unordered logits: the filters rank by probability, not id.
		{"top-k unordered", Params{Temperature: 1, TopK: 2}, logitsOf(0.1, 0.4, 0.2, 0.3), []float64{0, 4. / 7, 0, 3. / 7}},
		// Ties at the top-k boundary go to the lowest id.
		{"top-k tie", Params{Temperature: 1, TopK: 2}, logitsOf(0.2, 0.4, 0.2, 0.2), []float64{1. / 3, 2. / 3, 0, 0}},
		// -Inf logits never survive.
		{"masked", Params{Temperature: 1}, []float32{0, float32(math.Inf(-1)), 0}, []float64{0.5, 0, 0.5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(tc.p, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := distribution(t, s, tc.logits); !near(got, tc.want, 1e-6) {
				t.Errorf("distribution %v, want %v", got, tc.want)
			}
		})
	}
}

// TestPenalties holds the processed logits after repetition, presence and frequency
// penalties to hand-computed values.
func TestPenalties(t *testing.T) {
	logits := []float32{2, -2, 1, 0.5, 3}
	for _, tc := range []struct {
		name      string
		p         Params
		prompt    []int
		generated []int
		want      []float64
	}{
		{"none", Params{}, []int{0, 1}, []int{2}, []float64{2, -2, 1, 0.5, 3}},
		// Repetition 2 halves positive and doubles negative logits of prompt and output tokens.
		{"repetition", Params{RepetitionPenalty: 2}, []int{0, 1}, []int{2}, []float64{1, -4, 0.5, 0.5, 3}},
		{"repetition 1 is none", Params{RepetitionPenalty: 1}, []int{0, 1}, []int{2}, []float64{2, -2, 1, 0.5, 3}},
		// Presence and frequency count generated tokens only: token 2 twice, token 3 once.
		{"presence", Params{PresencePenalty: 0.5}, []int{0}, []int{2, 3, 2}, []float64{2, -2, 0.5, 0, 3}},
		{"frequency", Params{FrequencyPenalty: 0.5}, []int{0}, []int{2, 3, 2}, []float64{2, -2, 0, 0, 3}},
		{"negative frequency", Params{FrequencyPenalty: -1}, nil, []int{1}, []float64{2, -1, 1, 0.5, 3}},
		// Repetition first, then presence + frequency: token 2: 1/2 - 1 - 2*0.25.
		{"all", Params{RepetitionPenalty: 2, PresencePenalty: 1, FrequencyPenalty: 0.25}, []int{0}, []int{2, 2},
			[]float64{1, -2, -1, 0.5, 3}},
		// Temperature divides after the penalties.
		{"then temperature", Params{Temperature: 0.5, PresencePenalty: 1}, nil, []int{4}, []float64{4, -4, 2, 1, 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(tc.p, tc.prompt)
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range tc.generated {
				s.record(g)
			}
			x, err := s.process(logits)
			if err != nil {
				t.Fatal(err)
			}
			if !near(x, tc.want, 1e-9) {
				t.Errorf("processed %v, want %v", x, tc.want)
			}
		})
	}
}

func TestGreedy(t *testing.T) {
	for _, tc := range []struct {
		name   string
		p      Params
		prompt []int
		logits []float32
		want   []int // tokens of successive calls with the same logits
	}{
		{"argmax", Params{}, nil, []float32{0, 3, 1}, []int{1, 1}},
		{"ties to lowest id", Params{}, nil, []float32{1, 5, 5, 2}, []int{1, 1}},
		{"negative", Params{}, nil, []float32{-3, -1, -2}, []int{1}},
		// Greedy ignores top-k and friends.
		{"filters ignored", Params{TopK: 1, TopP: 0.1, MinP: 0.9}, nil, []float32{0, 3, 1}, []int{1}},
		// Presence penalty 2: 3 -> 1 after the first pick makes 2 win, then 1 > 0 wins again.
		{"penalty moves argmax", Params{PresencePenalty: 2}, nil, []float32{0, 3, 2}, []int{1, 2, 1}},
		{"repetition on prompt", Params{RepetitionPenalty: 4}, []int{1}, []float32{0, 3, 1}, []int{2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(tc.p, tc.prompt)
			if err != nil {
				t.Fatal(err)
			}
			for i, want := range tc.want {
				r, err := s.Sample(tc.logits)
				if err != nil {
					t.Fatal(err)
				}
				if r.Token != want {
					t.Errorf("call %d: token %d, want %d", i, r.Token, want)
				}
			}
		})
	}
}

func TestLogprobs(t *testing.T) {
	logits := logitsOf(0.5, 0.25, 0.125, 0.125)
	for _, tc := range []struct {
		name     string
		p        Params
		wantTok  int
		wantLP   float64
		wantTop  []TokenLogprob
		penalize []int
	}{
		{"greedy chosen only", Params{Logprobs: true}, 0, math.Log(0.5), nil, nil},
		{"greedy top 3, ties to lowest id", Params{Logprobs: true, TopLogprobs: 3}, 0, math.Log(0.5),
			[]TokenLogprob{{0, float32(math.Log(0.5))}, {1, float32(math.Log(0.25))}, {2, float32(math.Log(0.125))}}, nil},
		{"top logprobs alone report the chosen one too", Params{TopLogprobs: 1}, 0, math.Log(0.5),
			[]TokenLogprob{{0, float32(math.Log(0.5))}}, nil},
		// Temperature 0.5 squares: .25, .0625, .015625 x2 over .34375. top_k 1 only truncates
		// the draw, not the log-probabilities.
		{"after temperature", Params{Temperature: 0.5, TopK: 1, Logprobs: true, TopLogprobs: 2}, 0, math.Log(.25 / .34375),
			[]TokenLogprob{{0, float32(math.Log(.25 / .34375))}, {1, float32(math.Log(.0625 / .34375))}}, nil},
		// A frequency penalty of ln 2 on token 0 (generated once) halves its weight: .25,.25,.125,.125.
		{"after penalties", Params{FrequencyPenalty: math.Ln2, Logprobs: true, TopLogprobs: 2}, 0, math.Log(1.0 / 3),
			[]TokenLogprob{{0, float32(math.Log(1.0 / 3))}, {1, float32(math.Log(1.0 / 3))}}, []int{0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(tc.p, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, g := range tc.penalize {
				s.record(g)
			}
			r, err := s.Sample(logits)
			if err != nil {
				t.Fatal(err)
			}
			if r.Token != tc.wantTok || !(math.Abs(float64(r.Logprob)-tc.wantLP) <= 1e-6) {
				t.Errorf("token %d logprob %g, want %d %g", r.Token, r.Logprob, tc.wantTok, tc.wantLP)
			}
			if len(r.TopLogprobs) != len(tc.wantTop) {
				t.Fatalf("top logprobs %v, want %v", r.TopLogprobs, tc.wantTop)
			}
			for i, w := range tc.wantTop {
				g := r.TopLogprobs[i]
				if g.Token != w.Token || !(math.Abs(float64(g.Logprob-w.Logprob)) <= 1e-6) {
					t.Errorf("top logprobs %v, want %v", r.TopLogprobs, tc.wantTop)
					break
				}
			}
		})
	}
}

// TestOnlyAllowedTokens draws many tokens under each filter and checks that only the tokens
// the filter keeps ever come out, each about as often as its probability says.
func TestOnlyAllowedTokens(t *testing.T) {
	logits := logitsOf(0.3, 0.05, 0.25, 0.15, 0.1, 0.1, 0.05)
	const draws = 20000
	for _, tc := range []struct {
		name string
		p    Params
		want map[int]float64 // allowed tokens and their probabilities
	}{
		{"top-k 3", Params{Temperature: 1, TopK: 3}, map[int]float64{0: .3 / .7, 2: .25 / .7, 3: .15 / .7}},
		{"top-p 0.6", Params{Temperature: 1, TopP: 0.6}, map[int]float64{0: .3 / .7, 2: .25 / .7, 3: .15 / .7}},
		{"min-p 0.4", Params{Temperature: 1, MinP: 0.4}, map[int]float64{0: .3 / .7, 2: .25 / .7, 3: .15 / .7}},
		{"top-k 4 min-p 0.5", Params{Temperature: 1, TopK: 4, MinP: 0.5}, map[int]float64{0: .3 / .55, 2: .25 / .55}},
		{"all", Params{Temperature: 1}, map[int]float64{0: .3, 1: .05, 2: .25, 3: .15, 4: .1, 5: .1, 6: .05}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.p
			p.Seed, p.HasSeed = 7, true
			s, err := New(p, nil)
			if err != nil {
				t.Fatal(err)
			}
			count := map[int]int{}
			for range draws {
				x, err := s.process(logits) // draw without recording, so no penalty builds up
				if err != nil {
					t.Fatal(err)
				}
				cand, w := s.candidates(x)
				count[cand[s.draw(w)]]++
			}
			for tok, n := range count {
				want, ok := tc.want[tok]
				if !ok {
					t.Fatalf("drew token %d (%d times), which the filter removes", tok, n)
				}
				// 5 standard deviations of a binomial proportion.
				sd := math.Sqrt(want * (1 - want) / draws)
				if got := float64(n) / draws; math.Abs(got-want) > 5*sd+1e-9 {
					t.Errorf("token %d drawn with frequency %.4f, want %.4f", tok, got, want)
				}
			}
		})
	}
}

func TestSeedReproducible(t *testing.T) {
	logits := logitsOf(0.2, 0.2, 0.2, 0.2, 0.1, 0.1)
	run := func(p Params) []int {
		s, err := New(p, []int{1, 2})
		if err != nil {
			t.Fatal(err)
		}
		var out []int
		for range 64 {
			r, err := s.Sample(logits)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, r.Token)
		}
		return out
	}
	p := Params{Temperature: 0.9, TopP: 0.95, FrequencyPenalty: 0.1, Seed: 42, HasSeed: true}
	a, b := run(p), run(p)
	if !slices.Equal(a, b) {
		t.Fatalf("same seed, different tokens:\n%v\n%v", a, b)
	}
	p.Seed = 43
	if c := run(p); slices.Equal(a, c) {
		t.Errorf("seeds 42 and 43 gave the same 64 tokens %v", a)
	}
	p.HasSeed = false
	if d, e := run(p), run(p); slices.Equal(d, e) {
		t.Errorf("two unseeded samplers gave the same 64 tokens %v", d)
	}
}

func TestBadInput(t *testing.T) {
	if _, err := New(Params{Temperature: -1}, nil); err == nil {
		t.Error("New accepted temperature -1")
	}
	s, err := New(Params{Temperature: 1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	inf := float32(math.Inf(1))
	for _, logits := range [][]float32{nil, {0, float32(math.NaN())}, {inf, 0}, {float32(math.Inf(-1))}} {
		if _, err := s.Sample(logits); !errors.Is(err, ErrBadLogits) {
			t.Errorf("Sample(%v) = %v, want ErrBadLogits", logits, err)
		}
	}
}

func TestTopN(t *testing.T) {
	x := []float64{1, 5, 3, 5, 2, 3}
	for n, want := range map[int][]int{0: nil, 1: {1}, 3: {1, 3, 2}, 6: {1, 3, 2, 5, 4, 0}, 9: {1, 3, 2, 5, 4, 0}} {
		if got := topN(x, n); !slices.Equal(got, want) {
			t.Errorf("topN(%d) = %v, want %v", n, got, want)
		}
	}
	// The heap path of sortedTop agrees with sorting.
	big := make([]float64, 1000)
	for i := range big {
		big[i] = float64((i * 7919) % 101)
	}
	s := &Sampler{}
	heapTop := s.sortedTop(big, 10)
	sortTop := s.sortedTop(big, 900)[:10]
	if !slices.Equal(heapTop, sortTop) {
		t.Errorf("heap top %v, sorted top %v", heapTop, sortTop)
	}
}

// BenchmarkSample samples from a Llama 3 sized vocabulary whose logits spread like a
// language model's (normal, standard deviation 3).
func BenchmarkSample(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 2))
	logits := make([]float32, 128256)
	for i := range logits {
		logits[i] = float32(rng.NormFloat64() * 3)
	}
	for _, p := range []Params{
		{},
		{Temperature: 0.8},
		{Temperature: 0.8, TopP: 0.9},
		{Temperature: 0.8, TopK: 40},
		{Temperature: 0.8, MinP: 0.05},
		{Temperature: 0.8, TopP: 0.9, Logprobs: true, TopLogprobs: 5},
	} {
		b.Run(fmt.Sprintf("T=%g,top_p=%g,top_k=%d,min_p=%g,top_logprobs=%d", p.Temperature, p.TopP, p.TopK, p.MinP, p.TopLogprobs), func(b *testing.B) {
			p.Seed, p.HasSeed = 1, true
			s, _ := New(p, nil)
			for b.Loop() {
				x, _ := s.process(logits)
				if !p.Greedy() {
					cand, w := s.candidates(x)
					_ = cand[s.draw(w)]
				}
			}
		})
	}
}

// DeviceDraw hands a device the plain parameters and a fresh counter per token, and refuses
// requests whose choice depends on what only the host sampler does.
func TestDeviceDraw(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Params
		ok   bool
	}{
		{"greedy", Params{}, true},
		{"nucleus", Params{Temperature: 0.7, TopP: 0.9, TopK: 40, MinP: 0.05, Seed: 7, HasSeed: true}, true},
		{"repetition", Params{Temperature: 1, RepetitionPenalty: 1.2}, false},
		{"presence", Params{Temperature: 1, PresencePenalty: 0.5}, false},
		{"frequency", Params{Temperature: 1, FrequencyPenalty: -0.5}, false},
		{"logprobs", Params{Temperature: 1, Logprobs: true}, false},
		{"top logprobs", Params{TopLogprobs: 2}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(tc.p, []int{1, 2})
			if err != nil {
				t.Fatal(err)
			}
			d, ok := s.DeviceDraw()
			if ok != tc.ok {
				t.Fatalf("DeviceDraw ok = %v, want %v", ok, tc.ok)
			}
			if !ok {
				return
			}
			if d.Temperature != float32(tc.p.Temperature) || d.TopP != float32(tc.p.TopP) || d.MinP != float32(tc.p.MinP) || int(d.TopK) != tc.p.TopK || d.Counter != 0 {
				t.Errorf("DeviceDraw = %+v for %+v", d, tc.p)
			}
			if tc.p.HasSeed && d.Seed != uint64(tc.p.Seed) {
				t.Errorf("seed %d, want %d", d.Seed, tc.p.Seed)
			}
			s.Record(5)
			s.Record(6)
			if d2, _ := s.DeviceDraw(); d2.Counter != 2 || d2.Seed != d.Seed {
				t.Errorf("after two tokens: %+v, want counter 2 and seed %d", d2, d.Seed)
			}
		})
	}
}
