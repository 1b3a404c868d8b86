package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
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

// begin submits g to the engine, which admits it or refuses it (engine.Options.QueueOnFull,
// MaxConcurrent, MaxQueue: the one admission layer). The caller must call finish on the
// result.
func (s *Server) begin(ctx context.Context, id string, start time.Time, g *genRequest) (*generation, error) {
	if s.closing.Load() {
		return nil, &APIError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Message: "the server is shutting down"}
	}
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	st, err := s.eng.Submit(ctx, engine.Request{
		ID:           id,
		Prompt:       g.prompt,
		MaxTokens:    g.maxTokens,
		Sampling:     g.sampling,
		StopTokenIDs: g.stopTokenIDs,
		IgnoreEOS:    g.ignoreEOS,
	})
	if err != nil {
		cancel()
		if parent.Err() != nil {
			return nil, errClientGone
		}
		return nil, submitError(err)
	}
	s.metrics.inFlight.Inc()
	s.metrics.promptTokens.Add(float64(len(g.prompt)))
	return &generation{s: s, g: g, start: start, stream: st, cancel: cancel, ctx: ctx}, nil
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
		case errors.Is(err, errClientGone):
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
				return res, errClientGone
			}
			return res, fmt.Errorf("receive: %w", err)
		}
		switch ev.Finish {
		case engine.FinishCancelled:
			return res, errClientGone
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
