package tokenizer

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"
)

// Decoding runs the token strings through a chain of stages, one per decoder of
// tokenizer.json's "decoder" section. Each stage consumes and produces frags: pieces of
// token text, where a frag with cont set continues the token before it rather than starting
// a new one. Hugging Face's decoders work on whole lists of tokens; the stages here give
// exactly the same result but can also be fed one token at a time, holding back only what a
// later token could still change. Decode and Stream share them, so a stream's output always
// adds up to Decode's.

type frag struct {
	s    string
	cont bool
}

type decodeStage interface {
	push(f frag, out []frag) []frag
	flush(out []frag) []frag
}

// A decoderSpec is one parsed decoder; newStage makes a fresh stage for one decoding.
// fragmented says whether the frags fed to the stage may continue tokens; the result's second
// value says whether the stage's own output may.
type decoderSpec interface {
	newStage(fragmented bool) (decodeStage, bool)
}

func parseDecoder(raw json.RawMessage, where string) ([]decoderSpec, error) {
	typ, null, err := componentType(raw, where)
	if null || err != nil {
		return nil, err
	}
	switch typ {
	case "Sequence":
		var cfg struct {
			Decoders []json.RawMessage `json:"decoders"`
		}
		if err := decodeAt(raw, where, &cfg); err != nil {
			return nil, err
		}
		seq, err := parseSequence(cfg.Decoders, where, "decoders", parseDecoder)
		return slices.Concat(seq...), err
	case "ByteLevel":
		return []decoderSpec{byteLevelDec{}}, nil
	case "ByteFallback":
		return []decoderSpec{byteFallbackDec{}}, nil
	case "Fuse":
		return []decoderSpec{fuseDec{}}, nil
	case "Replace":
		var cfg struct {
			Pattern json.RawMessage `json:"pattern"`
			Content string          `json:"content"`
		}
		if err := decodeAt(raw, where, &cfg); err != nil {
			return nil, err
		}
		p, err := parsePattern(cfg.Pattern, where+".pattern")
		if err != nil {
			return nil, err
		}
		return []decoderSpec{replaceDec{p, cfg.Content}}, nil
	case "Strip":
		var cfg struct {
			Content string `json:"content"`
			Start   int    `json:"start"`
			Stop    int    `json:"stop"`
		}
		if err := decodeAt(raw, where, &cfg); err != nil {
			return nil, err
		}
		r, n := utf8.DecodeRuneInString(cfg.Content)
		if n == 0 || n != len(cfg.Content) || cfg.Start < 0 || cfg.Stop < 0 {
			return nil, fmt.Errorf("%s: want one content character and start, stop >= 0", where)
		}
		return []decoderSpec{stripDec{r, cfg.Start, cfg.Stop}}, nil
	case "Metaspace":
		m, err := parseMetaspace(raw, where)
		if err != nil {
			return nil, err
		}
		return []decoderSpec{metaspaceDec{m}}, nil
	default:
		return nil, fmt.Errorf("%s: unsupported decoder type %q", where, typ)
	}
}

// decodeChain is the set of stages of one decoding (one Decode call or one Stream).
type decodeChain struct {
	stages []decodeStage
	a, b   []frag
}

func newDecodeChain(specs []decoderSpec, cleanup bool) *decodeChain {
	c := &decodeChain{}
	fragmented := false
	for _, sp := range specs {
		var st decodeStage
		st, fragmented = sp.newStage(fragmented)
		c.stages = append(c.stages, st)
	}
	if len(specs) == 0 {
		c.stages = append(c.stages, &joinStage{})
		fragmented = true
	}
	if cleanup {
		c.stages = append(c.stages, &fuseStage{})
		for _, r := range cleanupReplacements {
			st, _ := replaceDec{literalPattern(r[0]), r[1]}.newStage(true)
			c.stages = append(c.stages, st)
		}
	}
	return c
}

// cleanupReplacements are transformers' clean_up_tokenization replacements, applied one after
// the other to the whole decoded text.
var cleanupReplacements = [][2]string{
	{" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"},
	{" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
}

func cleanupText(s string) string {
	for _, r := range cleanupReplacements {
		s = strings.ReplaceAll(s, r[0], r[1])
	}
	return s
}

// push feeds one token and appends the text that can be emitted now to sb.
func (c *decodeChain) push(tok string, sb *strings.Builder) {
	c.a = append(c.a[:0], frag{s: tok})
	c.run(sb, false)
}

// flush ends the input and appends the remaining text to sb.
func (c *decodeChain) flush(sb *strings.Builder) {
	c.a = c.a[:0]
	c.run(sb, true)
}

func (c *decodeChain) run(sb *strings.Builder, final bool) {
	for _, st := range c.stages {
		c.b = c.b[:0]
		for _, f := range c.a {
			c.b = st.push(f, c.b)
		}
		if final {
			c.b = st.flush(c.b)
		}
		c.a, c.b = c.b, c.a
	}
	for _, f := range c.a {
		sb.WriteString(f.s)
	}
}

// joinStage is used when there is no decoder: tokens joined by spaces.
type joinStage struct{ n int }

func (j *joinStage) push(f frag, out []frag) []frag {
	if !f.cont {
		if j.n > 0 {
			out = append(out, frag{s: " ", cont: true})
		}
		j.n++
	}
	return append(out, frag{s: f.s, cont: true})
}
func (j *joinStage) flush(out []frag) []frag { return out }

// wholeTokens gives a stage that needs whole tokens its input: it gathers frags until the
// next token starts (or the input ends). Used only after a stage that fragments tokens.
type wholeTokens struct {
	inner tokenStage
	buf   strings.Builder
	open  bool
}

// tokenStage is a stage written for whole tokens.
type tokenStage interface {
	token(t string, out []frag) []frag
	end(out []frag) []frag
}

func (w *wholeTokens) push(f frag, out []frag) []frag {
	if !f.cont {
		out = w.emit(out)
		w.open = true
	}
	w.buf.WriteString(f.s)
	return out
}

func (w *wholeTokens) emit(out []frag) []frag {
	if w.open {
		out = w.inner.token(w.buf.String(), out)
		w.buf.Reset()
		w.open = false
	}
	return out
}

func (w *wholeTokens) flush(out []frag) []frag { return w.inner.end(w.emit(out)) }

// direct feeds whole tokens straight to a tokenStage.
type direct struct{ inner tokenStage }

func (d direct) push(f frag, out []frag) []frag { return d.inner.token(f.s, out) }
func (d direct) flush(out []frag) []frag        { return d.inner.end(out) }

func tokenStageFor(t tokenStage, fragmented bool) decodeStage {
	if fragmented {
		return &wholeTokens{inner: t}
	}
	return direct{t}
}

// byteLevelDec maps ByteLevel characters back to bytes and the bytes to UTF-8 text, with
// U+FFFD for ill-formed sequences. A token with a character outside the table (an added
// token) contributes its own UTF-8 bytes. The output is one token.
type byteLevelDec struct{}

func (byteLevelDec) newStage(fragmented bool) (decodeStage, bool) {
	return tokenStageFor(&byteLevelStage{}, fragmented), true
}

type byteLevelStage struct {
	pending []byte
	started bool
	scratch []byte
}

func (b *byteLevelStage) token(t string, out []frag) []frag {
	n := len(b.pending)
	ok := true
	for _, r := range t {
		c, in := byteOfRune(r)
		if !in {
			ok = false
			break
		}
		b.pending = append(b.pending, c)
	}
	if !ok {
		b.pending = append(b.pending[:n], t...)
	}
	var rest int
	b.scratch, rest = appendLossy(b.scratch[:0], b.pending, false)
	out = append(out, frag{s: string(b.scratch), cont: b.started})
	b.started = true
	b.pending = append(b.pending[:0], b.pending[len(b.pending)-rest:]...)
	return out
}

func (b *byteLevelStage) end(out []frag) []frag {
	if len(b.pending) > 0 {
		b.scratch, _ = appendLossy(b.scratch[:0], b.pending, true)
		out = append(out, frag{s: string(b.scratch), cont: b.started})
		b.pending = b.pending[:0]
	}
	return out
}

// byteFallbackDec turns runs of <0xNN> tokens into the text they encode; a run that is not
// valid UTF-8 gives one U+FFFD per byte token. A run is held until it ends.
type byteFallbackDec struct{}

func (byteFallbackDec) newStage(fragmented bool) (decodeStage, bool) {
	return tokenStageFor(&byteFallbackStage{}, fragmented), false
}

type byteFallbackStage struct{ run []byte }

func (b *byteFallbackStage) token(t string, out []frag) []frag {
	if c, ok := parseByteToken(t); ok {
		b.run = append(b.run, c)
		return out
	}
	return append(b.end(out), frag{s: t})
}

func (b *byteFallbackStage) end(out []frag) []frag {
	if len(b.run) == 0 {
		return out
	}
	if utf8.Valid(b.run) {
		out = append(out, frag{s: string(b.run)})
	} else {
		for range b.run {
			out = append(out, frag{s: "\uFFFD"})
		}
	}
	b.run = b.run[:0]
	return out
}

// parseByteToken reads a byte-fallback token "<0xNN>".
func parseByteToken(t string) (byte, bool) {
	if len(t) != 6 || t[:3] != "<0x" || t[5] != '>' {
		return 0, false
	}
	hi, ok1 := hexVal(t[3])
	lo, ok2 := hexVal(t[4])
	return hi<<4 | lo, ok1 && ok2
}

func hexVal(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// fuseDec joins all tokens into one.
type fuseDec struct{}

func (fuseDec) newStage(bool) (decodeStage, bool) { return &fuseStage{}, true }

type fuseStage struct{ started bool }

func (f *fuseStage) push(in frag, out []frag) []frag {
	out = append(out, frag{s: in.s, cont: f.started})
	f.started = true
	return out
}
func (f *fuseStage) flush(out []frag) []frag { return out }

// replaceDec replaces a pattern in every token.
type replaceDec struct {
	pat     pattern
	content string
}

func (r replaceDec) newStage(fragmented bool) (decodeStage, bool) {
	if lit, ok := r.pat.(literalPattern); ok && fragmented {
		return &replaceStream{pat: string(lit), content: r.content}, true
	}
	return tokenStageFor(replaceToken(r), fragmented), false
}

type replaceToken replaceDec

func (r replaceToken) token(t string, out []frag) []frag {
	s, err := replaceAllPattern(r.pat, t, r.content)
	if err != nil {
		s = t // a regex that times out leaves the token as it is
	}
	return append(out, frag{s: s})
}
func (replaceToken) end(out []frag) []frag { return out }

// replaceStream replaces a literal in fragmented tokens, holding back a tail that could be
// the start of a match.
type replaceStream struct {
	pat, content string
	held         string
}

func (r *replaceStream) push(f frag, out []frag) []frag {
	if !f.cont {
		if r.held != "" {
			out = append(out, frag{s: r.held, cont: true})
			r.held = ""
		}
		out = append(out, frag{})
	}
	s := r.held + f.s
	var b strings.Builder
	prev := 0
	for {
		i := strings.Index(s[prev:], r.pat)
		if i < 0 {
			break
		}
		b.WriteString(s[prev : prev+i])
		b.WriteString(r.content)
		prev += i + len(r.pat)
	}
	keep := 0
	for k := min(len(r.pat)-1, len(s)-prev); k > 0; k-- {
		if strings.HasSuffix(s, r.pat[:k]) {
			keep = k
			break
		}
	}
	b.WriteString(s[prev : len(s)-keep])
	r.held = s[len(s)-keep:]
	return append(out, frag{s: b.String(), cont: true})
}

func (r *replaceStream) flush(out []frag) []frag {
	if r.held != "" {
		out = append(out, frag{s: r.held, cont: true})
		r.held = ""
	}
	return out
}

// stripDec removes up to start leading and stop trailing content characters of each token.
type stripDec struct {
	content     rune
	start, stop int
}

func (d stripDec) newStage(fragmented bool) (decodeStage, bool) {
	if fragmented {
		return &stripStream{d: d}, true
	}
	return direct{stripToken(d)}, false
}

type stripToken stripDec

func (d stripToken) token(t string, out []frag) []frag {
	chars := []rune(t)
	lo := 0
	for lo < d.start && lo < len(chars) && chars[lo] == d.content {
		lo++
	}
	hi := len(chars)
	for k := 0; k < d.stop && hi > lo && chars[hi-1] == d.content; k++ {
		hi--
	}
	return append(out, frag{s: string(chars[lo:hi])})
}
func (stripToken) end(out []frag) []frag { return out }

// stripStream strips fragmented tokens: leading characters as they come, trailing ones by
// holding back up to stop content characters until the token ends.
type stripStream struct {
	d        stripDec
	leading  int // content characters that may still be stripped at the front
	held     []rune
	sb       strings.Builder
	anyToken bool
}

func (st *stripStream) push(f frag, out []frag) []frag {
	if !f.cont {
		st.held = st.held[:0] // the end of the previous token: drop its trailing characters
		st.leading = st.d.start
		out = append(out, frag{})
		st.anyToken = true
	}
	if st.leading == 0 && st.d.stop == 0 {
		return append(out, frag{s: f.s, cont: true}) // nothing left to strip
	}
	st.sb.Reset()
	for _, c := range f.s {
		if st.leading > 0 {
			if c == st.d.content {
				st.leading--
				continue
			}
			st.leading = 0
		}
		if st.d.stop == 0 {
			st.sb.WriteRune(c)
			continue
		}
		if c == st.d.content {
			st.held = append(st.held, c)
			if len(st.held) > st.d.stop {
				st.sb.WriteRune(st.held[0])
				st.held = append(st.held[:0], st.held[1:]...)
			}
			continue
		}
		for _, h := range st.held {
			st.sb.WriteRune(h)
		}
		st.held = st.held[:0]
		st.sb.WriteRune(c)
	}
	return append(out, frag{s: st.sb.String(), cont: true})
}

func (st *stripStream) flush(out []frag) []frag {
	st.held = st.held[:0]
	return out
}

// metaspaceDec turns the replacement character back into spaces; in the first token it is
// dropped instead (unless the prepend scheme is "never").
type metaspaceDec struct{ m metaspace }

func (d metaspaceDec) newStage(fragmented bool) (decodeStage, bool) {
	return &metaspaceStage{m: d.m, index: -1}, fragmented
}

type metaspaceStage struct {
	m     metaspace
	index int
}

func (st *metaspaceStage) push(f frag, out []frag) []frag {
	if !f.cont {
		st.index++
	}
	drop := st.index == 0 && st.m.scheme != prependNever
	s := strings.Map(func(r rune) rune {
		if r != st.m.replacement {
			return r
		}
		if drop {
			return -1
		}
		return ' '
	}, f.s)
	return append(out, frag{s: s, cont: f.cont})
}
func (st *metaspaceStage) flush(out []frag) []frag { return out }
