package server

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/loom-ml/loom/sample"
)

// maxStops is the most stop strings a request may give, as in the OpenAI API.
const maxStops = 4

// maxN is the most choices (n) a request may ask for, as in the OpenAI API.
const maxN = 128

// genRequest is a validated request in tokens, the part both endpoints share.
type genRequest struct {
	prompt       []int
	maxTokens    int
	maxTokensArg string // the parameter that set maxTokens (max_tokens or max_completion_tokens)
	sampling     sample.Params
	stop         []string
	stopTokenIDs []int
	ignoreEOS    bool
	skipSpecial  bool
	stream       bool
	includeUsage bool
	n            int // choices to generate, each from the same prompt
}

// decodeBody reads a JSON request body into v (see readBody). Errors name the parameter at
// fault where there is one.
func (s *Server) decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	data, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		var syntax *json.SyntaxError
		if errors.As(err, &syntax) && strings.Contains(syntax.Error(), "after top-level value") {
			return badParam("", "malformed JSON: unexpected data after the request object")
		}
		if len(bytes.TrimSpace(data)) == 0 {
			return jsonError(io.EOF)
		}
		return jsonError(err)
	}
	return nil
}

// jsonError turns a decoding error into a 400 API error.
func jsonError(err error) error {
	var (
		syntax *json.SyntaxError
		typ    *json.UnmarshalTypeError
	)
	switch {
	case errors.Is(err, io.EOF):
		return badParam("", "request body is empty; expected a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badParam("", "malformed JSON: the request body ends early")
	case errors.As(err, &syntax):
		return badParam("", "malformed JSON at byte %d: %v", syntax.Offset, syntax)
	case errors.As(err, &typ):
		if typ.Field == "" {
			return badParam("", "the request body must be a JSON object, not %s", typ.Value)
		}
		// Fields of the embedded shared struct come prefixed with its Go name.
		field := strings.TrimPrefix(typ.Field, "samplingRequest.")
		return badParam(field, "%s: expected %s, got JSON %s", field, jsonTypeName(typ.Type.String()), typ.Value)
	}
	return badParam("", "invalid request body: %v", err)
}

// jsonTypeName names a Go type the way a client thinks of it.
func jsonTypeName(goType string) string {
	switch {
	case strings.Contains(goType, "float"):
		return "a number"
	case strings.Contains(goType, "int"):
		return "an integer"
	case strings.Contains(goType, "bool"):
		return "a boolean"
	case strings.Contains(goType, "string") && !strings.HasPrefix(goType, "[]") && !strings.HasPrefix(goType, "map"):
		return "a string"
	case strings.HasPrefix(goType, "[]"):
		return "an array"
	}
	return "an object"
}

// checkModel refuses a model name other than the served one with 404 model_not_found, as
// OpenAI does. An empty name means the served model.
func (s *Server) checkModel(name string) error {
	if name != "" && name != s.cfg.Model {
		e := badParam("model", "the model %q does not exist; this server serves %q", name, s.cfg.Model)
		e.Status = http.StatusNotFound
		e.Code = "model_not_found"
		return e
	}
	return nil
}

// sampling validates the fields shared by both endpoints and fills g (all but the prompt
// and the max_tokens check against the context, which need the prompt).
func (s *Server) sampling(sr *samplingRequest, g *genRequest) error {
	if err := s.checkModel(sr.Model); err != nil {
		return err
	}
	g.n = 1
	if sr.N != nil {
		if *sr.N < 1 || *sr.N > maxN {
			return badParam("n", "n must be between 1 and %d, got %d", maxN, *sr.N)
		}
		g.n = *sr.N
	}
	if len(sr.LogitBias) > 0 {
		return badParam("logit_bias", "logit_bias is not supported")
	}
	p := s.cfg.Defaults
	if sr.Temperature != nil {
		p.Temperature = *sr.Temperature
	}
	if sr.TopP != nil {
		if !(*sr.TopP > 0 && *sr.TopP <= 1) {
			return badParam("top_p", "top_p must be greater than 0 and at most 1, got %g", *sr.TopP)
		}
		p.TopP = *sr.TopP
	}
	if sr.TopK != nil {
		switch k := *sr.TopK; {
		case k == -1 || k == 0:
			p.TopK = 0 // -1 is vLLM's spelling of "all tokens"
		case k < -1:
			return badParam("top_k", "top_k must be -1 (all tokens) or at least 1, got %d", k)
		default:
			p.TopK = k
		}
	}
	if sr.MinP != nil {
		p.MinP = *sr.MinP
	}
	if sr.RepetitionPenalty != nil {
		if !(*sr.RepetitionPenalty > 0) {
			return badParam("repetition_penalty", "repetition_penalty must be greater than 0, got %g", *sr.RepetitionPenalty)
		}
		p.RepetitionPenalty = *sr.RepetitionPenalty
	}
	if sr.PresencePenalty != nil {
		p.PresencePenalty = *sr.PresencePenalty
	}
	if sr.FrequencyPenalty != nil {
		p.FrequencyPenalty = *sr.FrequencyPenalty
	}
	if sr.Seed != nil {
		p.Seed, p.HasSeed = *sr.Seed, true
	}
	g.sampling = p
	if err := p.Validate(); err != nil {
		// sample.Params.Validate starts its messages with the parameter's API name.
		msg := err.Error()
		param, _, _ := strings.Cut(msg, " ")
		return badParam(param, "%s", msg)
	}

	// max_completion_tokens is the newer name of max_tokens; either may be given.
	g.maxTokens = -1
	for _, f := range []struct {
		name string
		v    *int
	}{{"max_tokens", sr.MaxTokens}, {"max_completion_tokens", sr.MaxCompletionTokens}} {
		if f.v == nil {
			continue
		}
		if *f.v < 1 {
			return badParam(f.name, "%s must be at least 1, got %d", f.name, *f.v)
		}
		g.maxTokens, g.maxTokensArg = *f.v, f.name
	}

	stops, err := parseStop(sr.Stop)
	if err != nil {
		return err
	}
	g.stop = stops
	for _, id := range sr.StopTokenIDs {
		if id < 0 || id >= s.vocab {
			return badParam("stop_token_ids", "token id %d is outside the vocabulary (size %d)", id, s.vocab)
		}
	}
	g.stopTokenIDs = sr.StopTokenIDs
	g.ignoreEOS = sr.IgnoreEOS
	g.skipSpecial = sr.SkipSpecialTokens == nil || *sr.SkipSpecialTokens
	g.stream = sr.Stream
	if sr.StreamOptions != nil {
		if !sr.Stream {
			return badParam("stream_options", "stream_options is only allowed with stream=true")
		}
		g.includeUsage = sr.StreamOptions.IncludeUsage
	}
	return nil
}

// parseStop reads stop: null, a string, or a list of up to four non-empty strings.
func parseStop(raw json.RawMessage) ([]string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, nil
	}
	var stops []string
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		stops = []string{one}
	} else if err := json.Unmarshal(raw, &stops); err != nil {
		return nil, badParam("stop", "stop must be a string or a list of strings")
	}
	if len(stops) > maxStops {
		return nil, badParam("stop", "at most %d stop sequences are allowed, got %d", maxStops, len(stops))
	}
	for _, s := range stops {
		if s == "" {
			return nil, badParam("stop", "stop sequences must not be empty")
		}
	}
	return stops, nil
}

// fitContext checks the prompt and max_tokens against the model's context and sets the
// default max_tokens (def, or what remains of the context when def is 0). promptParam
// names the prompt's parameter (prompt or messages).
func (s *Server) fitContext(g *genRequest, promptParam string, def int) error {
	n, ctxLen := len(g.prompt), s.cfg.ContextLength
	if n == 0 {
		return badParam(promptParam, "the prompt is empty")
	}
	if n >= ctxLen {
		e := badParam(promptParam, "this model's maximum context length is %d tokens, but the prompt has %d tokens (at least one must be left to generate)", ctxLen, n)
		e.Code = "context_length_exceeded"
		return e
	}
	if g.maxTokens > 0 {
		// maxTokens > ctxLen-n rather than n+maxTokens > ctxLen: a max_tokens near the
		// largest int would overflow the sum and pass.
		if g.maxTokens > ctxLen-n {
			param := cmp.Or(g.maxTokensArg, "max_tokens")
			e := badParam(param, "this model's maximum context length is %d tokens, but %d prompt tokens + %s %d were requested", ctxLen, n, param, g.maxTokens)
			e.Code = "context_length_exceeded"
			return e
		}
		return nil
	}
	g.maxTokens = ctxLen - n
	if def > 0 {
		g.maxTokens = min(def, g.maxTokens)
	}
	// Without an explicit max_tokens, also stay within what the whole KV cache can hold
	// (the keys and values of all but the last token), rather than refuse the request.
	if st := s.engine().Stats(); st.KVBlocks > 0 && st.BlockSize > 0 {
		if room := st.KVBlocks*st.BlockSize - n + 1; room >= 1 && room < g.maxTokens {
			g.maxTokens = room
		}
	}
	return nil
}
