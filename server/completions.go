package server

import (
	"errors"
	"net/http"
	"strings"
	"time"
)

// handleCompletions serves POST /v1/completions.
func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) error {
	start := time.Now()
	var req completionRequest
	if err := s.decodeBody(w, r, &req); err != nil {
		return err
	}
	g := &genRequest{}
	if err := s.sampling(&req.samplingRequest, g); err != nil {
		return err
	}
	if req.Suffix != nil && *req.Suffix != "" {
		return badParam("suffix", "suffix is not supported")
	}
	if req.BestOf != nil && *req.BestOf != g.n {
		return badParam("best_of", "only best_of equal to n (%d) is supported, got %d", g.n, *req.BestOf)
	}
	if req.Logprobs != nil {
		if n := *req.Logprobs; n < 0 || n > 5 {
			return badParam("logprobs", "logprobs must be between 0 and 5, got %d", n)
		}
		if req.Echo {
			return badParam("echo", "echo together with logprobs is not supported")
		}
		g.sampling.Logprobs, g.sampling.TopLogprobs = true, *req.Logprobs
	}
	ids, text, isText, err := s.parsePrompt(req.Prompt)
	if err != nil {
		return err
	}
	g.prompt = ids
	if err := s.fitContext(g, "prompt", s.cfg.DefaultMaxTokens); err != nil {
		return err
	}
	echo := ""
	if req.Echo {
		if echo = text; !isText {
			if echo, err = s.cfg.Tokenizer.Decode(ids, g.skipSpecial); err != nil {
				return badParam("prompt", "cannot decode the prompt: %v", err)
			}
		}
	}

	id := newID("cmpl-")
	gens, err := s.begin(r.Context(), id, start, g)
	if err != nil {
		return err
	}
	created := time.Now().Unix()
	chunk := func(i int, text string, lp *completionLogprobs, finish *string) completion {
		return completion{ID: id, Object: "text_completion", Created: created, Model: s.cfg.Model,
			Choices: []completionChoice{{Index: i, Text: text, Logprobs: lp, FinishReason: finish}}}
	}
	lps := make([]*logprobWriter, len(gens))
	for i := range lps {
		lps[i] = &logprobWriter{s: s, offset: len(echo)}
	}
	logprobsOf := func(i int, p piece) *completionLogprobs {
		if !g.sampling.Logprobs {
			return nil
		}
		return lps[i].completion(p)
	}

	if !g.stream {
		texts := make([]strings.Builder, len(gens))
		all := make([]*completionLogprobs, len(gens))
		for i := range texts {
			texts[i].WriteString(echo)
		}
		results, err := runAll(gens, func(i int, p piece) error {
			texts[i].WriteString(p.text)
			if lp := logprobsOf(i, p); lp != nil {
				all[i] = all[i].join(lp)
			}
			return nil
		}, nil)
		if err != nil {
			return err
		}
		out := completion{ID: id, Object: "text_completion", Created: created, Model: s.cfg.Model, Usage: usageOf(results)}
		for i, res := range results {
			if g.sampling.Logprobs && all[i] == nil {
				all[i] = &completionLogprobs{}
			}
			out.Choices = append(out.Choices, completionChoice{Index: i, Text: texts[i].String(), Logprobs: all[i], FinishReason: &res.finish})
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	}

	abort := func() {
		for _, gen := range gens {
			gen.abort()
		}
	}
	sse, err := startSSE(w)
	if err != nil {
		abort()
		return err
	}
	if echo != "" {
		for i := range gens {
			if err := sse.send(chunk(i, echo, nil, nil)); err != nil {
				abort()
				return err
			}
		}
	}
	results, err := runAll(gens,
		func(i int, p piece) error { return sse.send(chunk(i, p.text, logprobsOf(i, p), nil)) },
		func(i int, res result) error { return sse.send(chunk(i, "", nil, &res.finish)) })
	if err != nil {
		if !errors.Is(err, errClientGone) {
			sse.fail(err)
		}
		return err
	}
	if g.includeUsage {
		last := completion{ID: id, Object: "text_completion", Created: created, Model: s.cfg.Model, Choices: []completionChoice{}, Usage: usageOf(results)}
		if err := sse.send(last); err != nil {
			return err
		}
	}
	return sse.done()
}

// join appends b's entries to a (either may be nil).
func (a *completionLogprobs) join(b *completionLogprobs) *completionLogprobs {
	if a == nil {
		return b
	}
	a.Tokens = append(a.Tokens, b.Tokens...)
	a.TokenLogprobs = append(a.TokenLogprobs, b.TokenLogprobs...)
	a.TopLogprobs = append(a.TopLogprobs, b.TopLogprobs...)
	a.TextOffset = append(a.TextOffset, b.TextOffset...)
	return a
}

// logprobWriter turns generated tokens into the API's log-probability objects.
type logprobWriter struct {
	s      *Server
	offset int // text offset of the next piece
}

// tokenText is a token's own text, as the API lists tokens.
func (l *logprobWriter) tokenText(id int) string {
	text, err := l.s.cfg.Tokenizer.Decode([]int{id}, false)
	if err != nil {
		return ""
	}
	return text
}

// completion returns the legacy logprobs object of a piece's tokens.
func (l *logprobWriter) completion(p piece) *completionLogprobs {
	lp := &completionLogprobs{}
	off := l.offset
	for _, t := range p.tokens {
		text := l.tokenText(t.id)
		lp.Tokens = append(lp.Tokens, text)
		lp.TokenLogprobs = append(lp.TokenLogprobs, t.logprob)
		lp.TextOffset = append(lp.TextOffset, off)
		off += len(text)
		top := make(map[string]float32, len(t.top))
		for _, alt := range t.top {
			top[l.tokenText(alt.Token)] = alt.Logprob
		}
		lp.TopLogprobs = append(lp.TopLogprobs, top)
	}
	l.offset += len(p.text)
	return lp
}

// chat returns the chat logprobs object of a piece's tokens.
func (l *logprobWriter) chat(p piece) *chatLogprobs {
	lp := &chatLogprobs{Content: []chatTokenLogprob{}}
	for _, t := range p.tokens {
		text := l.tokenText(t.id)
		e := chatTokenLogprob{Token: text, Logprob: t.logprob, Bytes: byteList(text), TopLogprobs: []chatTopLogprob{}}
		for _, alt := range t.top {
			at := l.tokenText(alt.Token)
			e.TopLogprobs = append(e.TopLogprobs, chatTopLogprob{Token: at, Logprob: alt.Logprob, Bytes: byteList(at)})
		}
		lp.Content = append(lp.Content, e)
	}
	return lp
}

func byteList(s string) []int {
	out := make([]int, len(s))
	for i := range len(s) {
		out[i] = int(s[i])
	}
	return out
}
