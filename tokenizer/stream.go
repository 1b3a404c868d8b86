package tokenizer

import (
	"fmt"
	"strings"
)

// Stream decodes ids one at a time, for printing generated text as it comes. It never returns
// part of a UTF-8 character: bytes of an incomplete character (and any text a later token could
// still change, such as a run of byte-fallback tokens) are held back until they are settled.
// The strings returned by Next and Flush, joined, equal Decode of all the ids.
// A Stream is not safe for concurrent use.
type Stream struct {
	t           *Tokenizer
	skipSpecial bool
	chain       *decodeChain
	sb          strings.Builder
}

// StreamOption configures a Stream.
type StreamOption func(*Stream)

// SkipSpecialTokens makes the stream leave out special tokens, as Decode with skipSpecial.
func SkipSpecialTokens() StreamOption { return func(s *Stream) { s.skipSpecial = true } }

// NewStream returns a streaming decoder. By default it keeps special tokens, as
// Decode(ids, false).
func (t *Tokenizer) NewStream(opts ...StreamOption) *Stream {
	s := &Stream{t: t, chain: newDecodeChain(t.decoders, t.cleanup)}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Next adds one id and returns the text that is now settled (possibly "").
func (s *Stream) Next(id int) (text string, err error) {
	defer func() {
		if r := recover(); r != nil {
			text, err = "", fmt.Errorf("tokenizer: stream: internal error: %v", r)
		}
	}()
	tok, ok := s.t.IDToken(id)
	if !ok {
		return "", fmt.Errorf("tokenizer: stream: id %d is not in the vocabulary (size %d)", id, s.t.VocabSize())
	}
	if s.skipSpecial && s.t.isSpecialToken(tok) {
		return "", nil
	}
	s.sb.Reset()
	s.chain.push(tok, &s.sb)
	return s.sb.String(), nil
}

// Flush ends the sequence and returns the text still held back. The stream is then reset and
// can decode a new sequence.
func (s *Stream) Flush() string {
	s.sb.Reset()
	s.chain.flush(&s.sb)
	s.chain = newDecodeChain(s.t.decoders, s.t.cleanup)
	return s.sb.String()
}
