package server

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// A prompt is refused as early and as cheaply as its size shows it cannot fit the context:
// text longer than promptBytesPerToken bytes a token of the context before it is decoded or
// tokenized (a token stands for a few bytes of text, rarely more than 16), token ids past the
// context as soon as they are counted, and text whose first part already has more tokens
// than the context before the rest is tokenized (encodeWithin).

// promptBytesPerToken is a generous bound on the bytes of text one token stands for.
const promptBytesPerToken = 32

// maxPromptBytes is the most bytes of prompt text a request may give.
func (s *Server) maxPromptBytes() int { return s.cfg.ContextLength * promptBytesPerToken }

// rawJSON is a JSON value kept as the bytes of the request body it came in, without the
// copy json.RawMessage makes (a prompt may be megabytes). The body's buffer is never
// written after it is read, so keeping a piece of it for the request's life is safe.
type rawJSON []byte

// UnmarshalJSON implements json.Unmarshaler.
func (r *rawJSON) UnmarshalJSON(data []byte) error {
	*r = data
	return nil
}

// textTooLong is the 400 of a text prompt of n bytes (at least n when atLeast).
func (s *Server) textTooLong(param string, n int, atLeast bool) *APIError {
	more := ""
	if atLeast {
		more = "at least "
	}
	e := badParam(param, "%s is %s%d bytes of text; this model's context of %d tokens takes at most %d bytes (%d a token): shorten it",
		param, more, n, s.cfg.ContextLength, s.maxPromptBytes(), promptBytesPerToken)
	e.Code = "context_length_exceeded"
	return e
}

// tooManyTokens is the 400 of a prompt of at least n tokens, when n is at least the context.
func (s *Server) tooManyTokens(param string, n int, atLeast bool) *APIError {
	more := ""
	if atLeast {
		more = "at least "
	}
	e := badParam(param, "this model's maximum context length is %d tokens, but the prompt has %s%d tokens (at least one must be left to generate)",
		s.cfg.ContextLength, more, n)
	e.Code = "context_length_exceeded"
	return e
}

// parsePrompt reads a completion prompt: a string, a list of one string, a list of token
// ids or a list of one list of token ids. Text is encoded with the tokenizer's special
// tokens (such as BOS). It returns the ids and the prompt's text when it was given as text.
// A prompt that cannot fit the context is refused before it is tokenized in full.
func (s *Server) parsePrompt(raw []byte) (ids []int, text string, isText bool, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, "", false, badParam("prompt", "prompt is required")
	}
	bad := badParam("prompt", "prompt must be a string, a list of one string, a list of token ids or a list of one list of token ids")
	// A JSON string of n bytes holds at least n/6 bytes of text (\uXXXX is the longest
	// escape of one byte), so a long enough one is refused before it is decoded.
	if raw[0] == '"' || (raw[0] == '[' && bytes.HasPrefix(bytes.TrimLeft(raw[1:], " \t\r\n"), []byte(`"`))) {
		if n := len(raw) / 6; n > s.maxPromptBytes() {
			return nil, "", false, s.textTooLong("prompt", n, true)
		}
		var str string
		if raw[0] == '"' {
			if json.Unmarshal(raw, &str) != nil {
				return nil, "", false, bad
			}
		} else {
			var strs []string
			if json.Unmarshal(raw, &strs) != nil {
				return nil, "", false, bad
			}
			if len(strs) != 1 {
				return nil, "", false, badParam("prompt", "a list of %d prompts is not supported; send one prompt per request", len(strs))
			}
			str = strs[0]
		}
		if len(str) > s.maxPromptBytes() {
			return nil, "", false, s.textTooLong("prompt", len(str), false)
		}
		ids, over, err := encodeWithin(s.cfg.Tokenizer.Encode, str, true, s.cfg.ContextLength)
		if err != nil {
			return nil, "", false, badParam("prompt", "cannot tokenize the prompt: %v", err)
		}
		if over {
			return nil, "", false, s.tooManyTokens("prompt", len(ids), true)
		}
		return ids, str, true, nil
	}
	if raw[0] != '[' {
		return nil, "", false, bad
	}
	rest := bytes.TrimLeft(raw[1:], " \t\r\n")
	nested := len(rest) > 0 && rest[0] == '['
	if nested {
		raw = rest
	}
	ids, rest, err = s.scanIDs(raw)
	if err != nil {
		return nil, "", false, err
	}
	if ids == nil {
		return nil, "", false, bad
	}
	if nested {
		rest = bytes.TrimLeft(rest, " \t\r\n")
		switch {
		case len(rest) > 0 && rest[0] == ',':
			return nil, "", false, badParam("prompt", "a list of several token lists is not supported; send one prompt per request")
		case len(rest) == 0 || rest[0] != ']':
			return nil, "", false, bad
		}
		rest = rest[1:]
	}
	if len(bytes.TrimSpace(rest)) != 0 {
		return nil, "", false, bad
	}
	return ids, "", false, nil
}

// scanIDs reads a JSON list of token ids at the start of raw and returns the ids (nil when
// raw does not start with such a list) and the bytes after it. It stops with an error at an
// id outside the vocabulary, and as soon as the ids fill the context: a list of millions of
// ids is refused without being held.
func (s *Server) scanIDs(raw []byte) (ids []int, rest []byte, err error) {
	skip := func() { raw = bytes.TrimLeft(raw, " \t\r\n") }
	if len(raw) == 0 || raw[0] != '[' {
		return nil, raw, nil
	}
	raw = raw[1:]
	skip()
	ids = []int{}
	if len(raw) > 0 && raw[0] == ']' {
		return ids, raw[1:], nil
	}
	for {
		skip()
		end := 0
		for end < len(raw) && (raw[end] == '-' || raw[end] >= '0' && raw[end] <= '9') {
			end++
		}
		id, perr := strconv.Atoi(string(raw[:end]))
		if perr != nil {
			return nil, raw, nil
		}
		if id < 0 || id >= s.vocab {
			return nil, raw, badParam("prompt", "token id %d is outside the vocabulary (size %d)", id, s.vocab)
		}
		if len(ids) >= s.cfg.ContextLength {
			return nil, raw, s.tooManyTokens("prompt", len(ids)+1, true)
		}
		ids = append(ids, id)
		raw = raw[end:]
		skip()
		if len(raw) == 0 {
			return nil, raw, nil
		}
		switch raw[0] {
		case ',':
			raw = raw[1:]
		case ']':
			return ids, raw[1:], nil
		default:
			return nil, raw, nil
		}
	}
}

// encodeWithin tokenizes text as encode does, but gives up once it is sure that the text
// has at least limit tokens: it first tokenizes a part of the text (cut before a space or a
// newline, and growing fourfold each time), and when a part alone has limit+encodeSlack
// tokens the whole has at least limit (a cut changes the tokens only around it). It then
// returns over and that part's tokens. Text that fits is tokenized whole, so its ids are
// exactly encode's.
func encodeWithin(encode func(string, bool) ([]int, error), text string, addSpecial bool, limit int) (ids []int, over bool, err error) {
	for k := max(2*limit, 4096); k < len(text); k *= 4 {
		part := text[:cutPoint(text, k)]
		ids, err := encode(part, addSpecial)
		if err != nil {
			return nil, false, err
		}
		if len(ids) >= limit+encodeSlack {
			return ids[:len(ids)-encodeSlack], true, nil
		}
	}
	ids, err = encode(text, addSpecial)
	return ids, false, err
}

// encodeSlack bounds how many more tokens a cut part of a text can have than the same
// stretch of the whole text: a word, or an added token, cut in two.
const encodeSlack = 64

// cutPoint is where to cut text near k bytes: before the last space or newline of the 256
// bytes before k, else at the start of the character at k.
func cutPoint(text string, k int) int {
	for i := k; i > k-256 && i > 0; i-- {
		if c := text[i]; c == ' ' || c == '\n' {
			return i
		}
	}
	for k > 0 && !utf8.RuneStart(text[k]) {
		k--
	}
	return k
}
