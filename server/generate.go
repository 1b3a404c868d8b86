package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/loom-ml/loom/engine"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tokenizer"
)

// errClientGone ends a request whose client went away (or whose context ended).
var errClientGone = errors.New("client disconnected")

// genToken is a generated token with its log-probabilities, when they were asked for.
type genToken struct {
	id      int
	logprob float32
	top     []sample.TokenLogprob
}

// piece is a part of a completion's text and the tokens whose text starts in it.
type piece struct {
	text   string
	tokens []genToken
}

// result sums up a finished generation.
type result struct {
	finish                         string // "stop" or "length"
	promptTokens, completionTokens int
}

// generation is a request admitted to the engine, ready to be read.
type generation struct {
	s      *Server
	g      *genRequest
	start  time.Time
	stream Stream
	cancel context.CancelFunc
	ctx    context.Context
}

func overloaded(format string, args ...any) *APIError {
	return &APIError{Status: http.StatusTooManyRequests, Type: typeRateLimit, Message: fmt.Sprintf(format, args...)}
}

// errShutdown ends a generation that a forced shutdown cut short.
var errShutdown = &APIError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "server_shutdown",
	Message: "the server shut down before the request finished"}

// begin submits g to the engine g.n times, once per choice, which admits them or refuses
// them (engine.Options.QueueOnFull, MaxConcurrent, MaxQueue: the one admission layer). The
// n choices are n requests with one prompt, submitted back to back: the engine's prefix
// cache (engine/prefix.go) computes the prompt's full KV blocks once, for the first choice,
// and the others share those blocks (each computes only the prompt's last, partial block;
// one queued behind a choice still prefilling the prompt waits for its blocks). A request
// with a seed gives choice i the seed plus i, so that the choices differ. When one is
// refused, those admitted are cancelled. The caller must run or abort every generation
// returned.
func (s *Server) begin(ctx context.Context, id string, start time.Time, g *genRequest) ([]*generation, error) {
	gens := make([]*generation, 0, g.n)
	for i := range max(g.n, 1) {
		sampling := g.sampling
		if sampling.HasSeed {
			sampling.Seed += int64(i)
		}
		gen, err := s.beginOne(ctx, fmt.Sprintf("%s-%d", id, i), start, g, sampling)
		if err != nil {
			for _, gen := range gens {
				gen.abort()
			}
			return nil, err
		}
		gens = append(gens, gen)
	}
	return gens, nil
}

// beginOne submits one choice of g with its sampling parameters.
func (s *Server) beginOne(ctx context.Context, id string, start time.Time, g *genRequest, sampling sample.Params) (*generation, error) {
	if s.closing.Load() {
		return nil, &APIError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Message: "the server is shutting down"}
	}
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	// A forced shutdown cancels the generation (and run says so: errShutdown).
	stopForce := context.AfterFunc(s.forced, cancel)
	cancelAll := func() { stopForce(); cancel() }
	st, err := s.engine().Submit(ctx, engine.Request{
		ID:           id,
		Prompt:       g.prompt,
		MaxTokens:    g.maxTokens,
		Sampling:     sampling,
		StopTokenIDs: g.stopTokenIDs,
		IgnoreEOS:    g.ignoreEOS,
	})
	if err != nil {
		cancelAll()
		if parent.Err() != nil {
			return nil, errClientGone
		}
		if s.forced.Err() != nil {
			return nil, errShutdown
		}
		return nil, submitError(err)
	}
	s.metrics.inFlight.Inc()
	s.metrics.promptTokens.Add(float64(len(g.prompt)))
	return &generation{s: s, g: g, start: start, stream: st, cancel: cancelAll, ctx: ctx}, nil
}

// gone is the error of a generation whose context ended: errShutdown when a forced
// shutdown ended it, else errClientGone.
func (gen *generation) gone() error {
	if gen.s.forced.Err() != nil {
		return errShutdown
	}
	return errClientGone
}

// runAll reads the generations of a request's choices, each in its own goroutine when
// there are several. emit gets each choice's pieces and end (when not nil) its result, both
// under one lock, so that the writes of a stream do not interleave. The first failure
// cancels the other choices; the error returned is the first that is not errClientGone,
// when there is one.
func runAll(gens []*generation, emit func(i int, p piece) error, end func(i int, r result) error) ([]result, error) {
	if len(gens) == 1 {
		r, err := gens[0].run(func(p piece) error { return emit(0, p) })
		if err == nil && end != nil {
			err = end(0, r)
		}
		return []result{r}, err
	}
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		results = make([]result, len(gens))
		errs    = make([]error, len(gens))
	)
	for i, gen := range gens {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := gen.run(func(p piece) error {
				mu.Lock()
				defer mu.Unlock()
				return emit(i, p)
			})
			if err == nil && end != nil {
				mu.Lock()
				err = end(i, r)
				mu.Unlock()
			}
			results[i], errs[i] = r, err
			if err != nil {
				for _, other := range gens {
					other.cancel()
				}
			}
		}()
	}
	wg.Wait()
	var first error
	for _, err := range errs {
		if err != nil && (first == nil || errors.Is(first, errClientGone) && !errors.Is(err, errClientGone)) {
			first = err
		}
	}
	return results, first
}

// usageOf sums up the choices of a request: the prompt counts once, as OpenAI counts it.
func usageOf(results []result) *usage {
	u := &usage{}
	if len(results) > 0 {
		u.PromptTokens = results[0].promptTokens
	}
	for _, r := range results {
		u.CompletionTokens += r.completionTokens
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

// run reads the engine's events, detokenizes them incrementally, cuts the text at the first
// stop string (cancelling the engine request there) and hands the text to emit piece by
// piece. A failing emit (the client is gone) cancels the request.
func (gen *generation) run(emit func(piece) error) (res result, err error) {
	s, g := gen.s, gen.g
	defer func() {
		gen.cancel()
		s.metrics.inFlight.Dec()
		reason := res.finish
		switch {
		case errors.Is(err, errClientGone), errors.Is(err, errShutdown):
			reason = string(engine.FinishCancelled)
		case err != nil:
			reason = string(engine.FinishError)
		default:
			s.metrics.e2e.Observe(time.Since(gen.start).Seconds())
		}
		s.metrics.finished.WithLabelValues(reason).Inc()
	}()
	res.promptTokens = len(g.prompt)
	var opts []tokenizer.StreamOption
	if g.skipSpecial {
		opts = append(opts, tokenizer.SkipSpecialTokens())
	}
	dec := s.cfg.Tokenizer.NewStream(opts...)
	stops := stopMatcher{stops: g.stop}
	var (
		held []genToken // tokens whose text has not been emitted yet
		last time.Time
	)
	// send emits a piece for every generated token, so that streaming clients see each
	// token arrive even when its text is still held back (an incomplete character, or the
	// possible start of a stop string). Log-probabilities wait for their token's text; at
	// the end everything left goes out.
	send := func(text string, final bool) error {
		p := piece{text: text}
		if text != "" || final {
			p.tokens, held = held, nil
		}
		if final && text == "" && len(p.tokens) == 0 {
			return nil
		}
		if err := emit(p); err != nil {
			return fmt.Errorf("%w: %v", errClientGone, err)
		}
		return nil
	}
	for {
		ev, err := gen.stream.Recv(gen.ctx)
		if err != nil {
			if gen.ctx.Err() != nil {
				return res, gen.gone()
			}
			return res, fmt.Errorf("receive: %w", err)
		}
		switch ev.Finish {
		case engine.FinishCancelled:
			return res, gen.gone()
		case engine.FinishError:
			if ev.Err == nil {
				ev.Err = errors.New("engine failed")
			}
			return res, fmt.Errorf("generate: %w", ev.Err)
		}
		now := time.Now()
		if last.IsZero() {
			s.metrics.ttft.Observe(now.Sub(gen.start).Seconds())
		} else {
			s.metrics.itl.Observe(now.Sub(last).Seconds())
		}
		last = now
		res.completionTokens++
		s.metrics.genTokens.Inc()
		if ev.Finish != engine.FinishStop {
			// A stop token ends generation; its text is not part of the completion.
			if g.sampling.Logprobs {
				held = append(held, genToken{id: ev.Token, logprob: ev.Logprob, top: ev.TopLogprobs})
			}
			text, err := dec.Next(ev.Token)
			if err != nil {
				s.log.Debug("detokenize", "token", ev.Token, "err", err)
			}
			out, stopped := stops.push(text)
			if stopped {
				res.finish = "stop"
				gen.cancel()
				return res, send(out, true)
			}
			if err := send(out, false); err != nil {
				return res, err
			}
		}
		if ev.Finish == engine.FinishNone {
			continue
		}
		out, stopped := stops.push(dec.Flush())
		if !stopped {
			var rest string
			rest, stopped = stops.flush()
			out += rest
		}
		res.finish = "stop"
		if ev.Finish == engine.FinishLength && !stopped {
			res.finish = "length"
		}
		return res, send(out, true)
	}
}

// abort cancels a generation that will not be read and releases what it holds.
func (gen *generation) abort() {
	gen.cancel()
	_, _ = gen.run(func(piece) error { return errClientGone })
}

// submitError answers the engine's refusals: invalid requests with 400, a full engine with
// 429, a closing one with 503.
func submitError(err error) error {
	switch {
	case errors.Is(err, engine.ErrInvalidRequest):
		return badParam("", "%v", err)
	case errors.Is(err, engine.ErrRequestTooLarge):
		return badParam("max_tokens", "the request needs more KV cache than the server has; lower max_tokens or shorten the prompt (%v)", err)
	case errors.Is(err, engine.ErrKVCacheFull), errors.Is(err, engine.ErrQueueFull), errors.Is(err, engine.ErrAtCapacity):
		return overloaded("the server is at capacity; retry later (%v)", err)
	case errors.Is(err, engine.ErrClosed):
		return &APIError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Message: "the server is shutting down"}
	}
	return fmt.Errorf("submit: %w", err)
}
