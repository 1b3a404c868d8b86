package sample

import (
	"cmp"
	"container/heap"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// Sampler chooses the tokens of one request. It owns the request's random source and the
// token counts the penalties need, so it must see every token the request generates: Sample
// records the token it returns. A Sampler is not safe for concurrent use; the engine keeps
// one per request.
//
// Each call of Sample processes the logits in this order:
//
//  1. penalties: repetition (prompt and generated tokens), then presence and frequency
//     (generated tokens only);
//  2. temperature (greedy decoding stops here and takes the argmax, ties to the lowest id);
//  3. top-k, top-p, min-p, each on the distribution the previous step left;
//  4. one draw from what remains.
//
// Log-probabilities are the log_softmax of the logits after step 2 (penalties and
// temperature, no truncation), over the whole vocabulary.
type Sampler struct {
	p     Params
	rng   *rand.Rand
	seed  uint64 // the random source's seed, also the key of device draws
	drawn uint64 // tokens recorded so far: the counter of the next device draw

	seen   map[int]bool // prompt and generated tokens, for the repetition penalty
	counts map[int]int  // generated tokens, for the presence and frequency penalties

	x     []float64 // processed logits, reused between calls
	order []int     // candidate ids, reused between calls
	w     []float64 // candidate weights, reused between calls
}

// Result is one chosen token.
type Result struct {
	Token int
	// Logprob is the chosen token's log-probability, set when Params.Logprobs is set or
	// Params.TopLogprobs > 0.
	Logprob float32
	// TopLogprobs are the Params.TopLogprobs most likely tokens, most likely first (ties to
	// the lowest id).
	TopLogprobs []TokenLogprob
}

// ErrBadLogits reports logits that no token can be chosen from: empty, NaN, +Inf, or all
// -Inf.
var ErrBadLogits = errors.New("sample: bad logits")

// New returns a sampler for one request with the given prompt (its tokens count for the
// repetition penalty). With p.HasSeed the random source is seeded from p.Seed, so the same
// seed, logits and parameters give the same tokens; otherwise it is seeded randomly.
func New(p Params, prompt []int) (*Sampler, error) {
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("sample: %w", err)
	}
	seed := rand.Uint64()
	if p.HasSeed {
		seed = uint64(p.Seed)
	}
	s := &Sampler{p: p, rng: rand.New(rand.NewPCG(seed, seedStream)), seed: seed, counts: map[int]int{}}
	if s.repetition() {
		s.seen = make(map[int]bool, len(prompt))
		for _, t := range prompt {
			s.seen[t] = true
		}
	}
	return s, nil
}

// seedStream is the second word of the PCG state; any fixed value works.
const seedStream = 0x9e3779b97f4a7c15

// Params returns the sampler's parameters.
func (s *Sampler) Params() Params { return s.p }

func (s *Sampler) repetition() bool {
	return s.p.RepetitionPenalty != 0 && s.p.RepetitionPenalty != 1
}

// Sample chooses the next token from logits [vocab] (not modified) and records it as
// generated. Bad logits (see ErrBadLogits) are an error.
func (s *Sampler) Sample(logits []float32) (Result, error) {
	x, err := s.process(logits)
	if err != nil {
		return Result{}, err
	}
	var tok int
	if s.p.Greedy() {
		tok = Argmax(x)
	} else {
		cand, w := s.candidates(x)
		tok = cand[s.draw(w)]
	}
	res := Result{Token: tok}
	if s.p.Logprobs || s.p.TopLogprobs > 0 {
		lse := logSumExp(x)
		res.Logprob = float32(x[tok] - lse)
		for _, id := range topN(x, s.p.TopLogprobs) {
			res.TopLogprobs = append(res.TopLogprobs, TokenLogprob{Token: id, Logprob: float32(x[id] - lse)})
		}
	}
	s.record(tok)
	return res, nil
}

// DeviceDraw is one request's next-token choice as a sampler on an accelerator makes it,
// from the logits alone: temperature (0: argmax, ties to the lowest id), then top-k, top-p
// and min-p as Sample applies them, then one draw from a counter-based generator keyed by
// Seed and Counter (the same pair always gives the same token for the same logits). The
// draws differ from Sample's, which uses the request's sequential random source; both
// follow the same distribution.
type DeviceDraw struct {
	Temperature, TopP, MinP float32
	TopK                    int32
	Seed, Counter           uint64
}

// DeviceDraw returns the parameters of the next token's choice for a device sampler, or
// false when the request needs what only Sample does: penalties (they depend on the tokens
// so far) or log-probabilities. A token a device chose must then be given to Record.
func (s *Sampler) DeviceDraw() (DeviceDraw, bool) {
	p := s.p
	if s.repetition() || p.PresencePenalty != 0 || p.FrequencyPenalty != 0 || p.Logprobs || p.TopLogprobs > 0 {
		return DeviceDraw{}, false
	}
	return DeviceDraw{
		Temperature: float32(p.Temperature), TopP: float32(p.TopP), MinP: float32(p.MinP), TopK: int32(min(p.TopK, math.MaxInt32)),
		Seed: s.seed, Counter: s.drawn,
	}, true
}

// Record records a token chosen outside Sample (by a device sampler, see DeviceDraw) as
// generated.
func (s *Sampler) Record(tok int) { s.record(tok) }

// record counts a generated token for the penalties.
func (s *Sampler) record(tok int) {
	s.drawn++
	s.counts[tok]++
	if s.seen != nil {
		s.seen[tok] = true
	}
}

// process copies logits to s.x in float64 and applies the penalties and the temperature.
func (s *Sampler) process(logits []float32) ([]float64, error) {
	if len(logits) == 0 {
		return nil, fmt.Errorf("%w: empty", ErrBadLogits)
	}
	x := slices.Grow(s.x[:0], len(logits))[:len(logits)]
	s.x = x
	finite := false
	for i, l := range logits {
		v := float64(l)
		if math.IsNaN(v) || math.IsInf(v, 1) {
			return nil, fmt.Errorf("%w: token %d has logit %g", ErrBadLogits, i, v)
		}
		finite = finite || !math.IsInf(v, -1)
		x[i] = v
	}
	if !finite {
		return nil, fmt.Errorf("%w: every logit is -Inf", ErrBadLogits)
	}
	if s.repetition() {
		rp := s.p.RepetitionPenalty
		for t := range s.seen {
			if t < 0 || t >= len(x) {
				continue
			}
			if x[t] > 0 {
				x[t] /= rp
			} else {
				x[t] *= rp
			}
		}
	}
	if s.p.PresencePenalty != 0 || s.p.FrequencyPenalty != 0 {
		for t, c := range s.counts {
			if t >= 0 && t < len(x) {
				x[t] -= s.p.PresencePenalty + s.p.FrequencyPenalty*float64(c)
			}
		}
	}
	if !s.p.Greedy() {
		for i := range x {
			x[i] /= s.p.Temperature
		}
	}
	return x, nil
}

// candidates applies top-k, top-p and min-p to the processed logits x and returns the
// tokens left and their unnormalized probabilities exp(x - max), in the same order. Without
// any of the three it returns every token in id order; otherwise the kept tokens, most
// likely first (ties to the lowest id).
func (s *Sampler) candidates(x []float64) (cand []int, w []float64) {
	m := slices.Max(x)
	k, topP, minP := s.p.TopK, s.p.TopP > 0 && s.p.TopP < 1, s.p.MinP
	if k <= 0 || k >= len(x) {
		k = 0
	}
	if k == 0 && !topP && minP == 0 {
		cand = slices.Grow(s.order[:0], len(x))[:len(x)]
		w = slices.Grow(s.w[:0], len(x))[:len(x)]
		for i, v := range x {
			cand[i], w[i] = i, math.Exp(v-m)
		}
		s.order, s.w = cand, w
		return cand, w
	}
	total := 0.0 // the probability mass top-p measures against
	if k > 0 {
		cand = s.sortedTop(x, k)
		for _, id := range cand {
			total += math.Exp(x[id] - m)
		}
	} else {
		cand, total = s.sortedLikely(x, m)
	}
	w = slices.Grow(s.w[:0], len(cand))[:len(cand)]
	s.w = w
	for i, id := range cand {
		w[i] = math.Exp(x[id] - m)
	}
	// top-p: the shortest prefix whose probability reaches TopP (at least one token).
	if topP {
		acc := 0.0
		for i := range cand {
			acc += w[i]
			if acc >= s.p.TopP*total {
				cand, w = cand[:i+1], w[:i+1]
				break
			}
		}
	}
	// min-p: drop tokens below MinP times the most likely one (the first).
	if minP > 0 {
		keep := 1
		for keep < len(cand) && w[keep] >= minP*w[0] {
			keep++
		}
		cand, w = cand[:keep], w[:keep]
	}
	return cand, w
}

// sortedLikely serves top-p and min-p without top-k. It returns, best first (ties to the
// lowest id), a set of the most likely tokens that contains whatever top-p and min-p keep,
// and the total unnormalized probability sum(exp(x - m)) of the whole vocabulary. Sorting
// the whole vocabulary is slow, so it collects the tokens of relative probability at least
// a threshold: MinP when set (min-p drops the rest anyway), else a small one lowered until
// the collected mass reaches TopP.
func (s *Sampler) sortedLikely(x []float64, m float64) ([]int, float64) {
	total := 0.0
	for _, v := range x {
		total += math.Exp(v - m)
	}
	topP := s.p.TopP > 0 && s.p.TopP < 1
	ids := s.order[:0]
	for tau := 1e-4; ; tau *= 1e-4 {
		if s.p.MinP > 0 {
			tau = s.p.MinP
		}
		if tau < 1e-300 {
			tau = 0
		}
		cut := math.Log(tau) // relative probability >= tau  <=>  x - m >= ln tau
		ids, mass := ids[:0], 0.0
		for i, v := range x {
			if v-m >= cut {
				ids = append(ids, i)
				mass += math.Exp(v - m)
			}
		}
		if s.p.MinP > 0 || !topP || mass >= s.p.TopP*total || tau == 0 {
			s.order = ids
			slices.SortFunc(ids, func(a, b int) int {
				if c := cmp.Compare(x[b], x[a]); c != 0 {
					return c
				}
				return cmp.Compare(a, b)
			})
			return ids, total
		}
	}
}

// sortedTop returns the k largest entries of x as ids, largest first, ties to the lowest id.
func (s *Sampler) sortedTop(x []float64, k int) []int {
	if k < len(x)/8 {
		return topN(x, k) // a heap is cheaper than sorting the vocabulary
	}
	ids := slices.Grow(s.order[:0], len(x))[:len(x)]
	for i := range ids {
		ids[i] = i
	}
	slices.SortFunc(ids, func(a, b int) int {
		if c := cmp.Compare(x[b], x[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	s.order = ids
	return ids[:k]
}

// draw picks an index with probability proportional to w (non-negative, positive sum).
func (s *Sampler) draw(w []float64) int {
	total := 0.0
	for _, v := range w {
		total += v
	}
	u := s.rng.Float64() * total
	acc := 0.0
	for i, v := range w {
		acc += v
		if u < acc {
			return i
		}
	}
	// Rounding left u at or beyond the sum: take the last token with weight.
	for i := len(w) - 1; i > 0; i-- {
		if w[i] > 0 {
			return i
		}
	}
	return 0
}

// Argmax returns the index of the largest value, the lowest one on ties (NaN never
// replaces the first element, as a sequential scan with ">" gives).
func Argmax[F float32 | float64](x []F) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}

// logSumExp is log(sum(exp(x))), computed stably.
func logSumExp(x []float64) float64 {
	m := slices.Max(x)
	sum := 0.0
	for _, v := range x {
		sum += math.Exp(v - m)
	}
	return m + math.Log(sum)
}

// topN returns the ids of the n largest entries of x, largest first, ties to the lowest id.
func topN(x []float64, n int) []int {
	n = min(n, len(x))
	if n <= 0 {
		return nil
	}
	h := &minHeap{x: x}
	for i := range x {
		if h.Len() < n {
			heap.Push(h, i)
		} else if h.less(h.ids[0], i) {
			h.ids[0] = i
			heap.Fix(h, 0)
		}
	}
	out := make([]int, h.Len())
	for i := len(out) - 1; i >= 0; i-- {
		out[i] = heap.Pop(h).(int)
	}
	return out
}

// minHeap keeps ids with the worst-ranked (smallest value, then highest id) at the top.
type minHeap struct {
	x   []float64
	ids []int
}

// less reports whether a ranks below b: a smaller value, or an equal value and a higher id.
func (h *minHeap) less(a, b int) bool {
	if h.x[a] != h.x[b] {
		return h.x[a] < h.x[b]
	}
	return a > b
}

func (h *minHeap) Len() int           { return len(h.ids) }
func (h *minHeap) Less(i, j int) bool { return h.less(h.ids[i], h.ids[j]) }
func (h *minHeap) Swap(i, j int)      { h.ids[i], h.ids[j] = h.ids[j], h.ids[i] }
func (h *minHeap) Push(v any)         { h.ids = append(h.ids, v.(int)) }
func (h *minHeap) Pop() any {
	v := h.ids[len(h.ids)-1]
	h.ids = h.ids[:len(h.ids)-1]
	return v
}
