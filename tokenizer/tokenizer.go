package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"unicode/utf8"
)

// Tokenizer encodes text to token ids and decodes ids to text as the Hugging Face tokenizer
// described by a tokenizer.json file does. It is safe for concurrent use.
type Tokenizer struct {
	model      *bpe
	normalizer normalizer
	pre        preTokenizer
	post       postProcessor
	decoders   []decoderSpec

	added     []*AddedToken // in file order
	addedByID map[int]*AddedToken
	addedByS  map[string]*AddedToken
	rawMatch  *addedMatcher // tokens matched in the raw text
	normMatch *addedMatcher // tokens matched in the normalized text

	tokens  []string // id -> token; "" where hasID is false
	hasID   []bool
	special map[string]string // bos_token etc. from tokenizer_config.json
	// cleanup applies transformers' clean_up_tokenization to decoded text
	// (tokenizer_config.json's clean_up_tokenization_spaces).
	cleanup bool
}

// maxTokenID bounds the ids a file may give tokens. The id tables are dense, sized by the
// largest id, so an id of 2^31-1 in a few bytes of JSON made loading allocate over 30 GB;
// real vocabularies stay far below this bound.
const maxTokenID = 1<<24 - 1

// file is the top level of tokenizer.json.
// fileAddedToken is an added_tokens entry as the file has it: its id is required.
type fileAddedToken struct {
	AddedToken
	ID *int `json:"id"`
}

type file struct {
	AddedTokens   []fileAddedToken `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Decoder       json.RawMessage  `json:"decoder"`
	Model         json.RawMessage  `json:"model"`
}

// Load reads a tokenizer.json file.
func Load(path string) (*Tokenizer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", path, errors.Unwrap(err))
	}
	return t, nil
}

// LoadDir reads dir/tokenizer.json and, when present, dir/tokenizer_config.json, which names
// the special tokens (bos_token, eos_token, ...) and may declare more added tokens.
func LoadDir(dir string) (*Tokenizer, error) {
	t, err := Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, err
	}
	cfgPath := filepath.Join(dir, "tokenizer_config.json")
	data, err := os.ReadFile(cfgPath)
	if errors.Is(err, os.ErrNotExist) {
		return t, nil
	}
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if err := t.applyConfig(data); err != nil {
		return nil, fmt.Errorf("tokenizer: %s: %w", cfgPath, err)
	}
	return t, nil
}

// Parse builds a tokenizer from the contents of a tokenizer.json file.
func Parse(data []byte) (*Tokenizer, error) {
	t, err := parse(data)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	return t, nil
}

func parse(data []byte) (*Tokenizer, error) {
	f, m, ok := fastParse(data)
	if !ok {
		return parseReference(data)
	}
	return build(f, m)
}

// parseReference is parse through encoding/json alone: the path for files that fastParse
// leaves (errors among them), and the reference that the fast loader is tested against.
func parseReference(data []byte) (*Tokenizer, error) {
	var f file
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	return build(f, nil)
}

// build makes the tokenizer of the sections of f; m is the model if already built from
// f.Model.
func build(f file, m *bpe) (*Tokenizer, error) {
	t := &Tokenizer{special: map[string]string{}, model: m}
	var err error
	if t.model == nil {
		if t.model, err = parseModel(f.Model); err != nil {
			return nil, err
		}
	}
	if t.normalizer, err = parseNormalizer(f.Normalizer, "normalizer"); err != nil {
		return nil, err
	}
	if t.pre, err = parsePreTokenizer(f.PreTokenizer, "pre_tokenizer"); err != nil {
		return nil, err
	}
	if t.pre != nil {
		t.pre = deferByteLevel(t.pre)
	}
	if t.post, err = parsePostProcessor(f.PostProcessor, "post_processor"); err != nil {
		return nil, err
	}
	if t.decoders, err = parseDecoder(f.Decoder, "decoder"); err != nil {
		return nil, err
	}
	first := make(map[int]int, len(f.AddedTokens)) // id -> index of the entry that has it
	for i, fa := range f.AddedTokens {
		a := fa.AddedToken
		if a.Content == "" {
			return nil, fmt.Errorf("added_tokens[%d]: empty content", i)
		}
		if fa.ID == nil {
			return nil, fmt.Errorf("added_tokens[%d] (%q): no id", i, a.Content)
		}
		a.ID = *fa.ID
		if a.ID < 0 || a.ID > maxTokenID {
			return nil, fmt.Errorf("added_tokens[%d]: invalid id %d (ids go from 0 to %d)", i, a.ID, maxTokenID)
		}
		if j, dup := first[a.ID]; dup {
			return nil, fmt.Errorf("added_tokens[%d] (%q): id %d is already added_tokens[%d] (%q)", i, a.Content, a.ID, j, f.AddedTokens[j].Content)
		}
		first[a.ID] = i
		t.added = append(t.added, &a)
	}
	t.index()
	return t, nil
}

// index rebuilds the id tables and the added-token matchers.
func (t *Tokenizer) index() {
	size := 0
	for _, id := range t.model.vocab.all() {
		size = max(size, id+1)
	}
	for _, a := range t.added {
		size = max(size, a.ID+1)
	}
	t.tokens = make([]string, size)
	t.hasID = make([]bool, size)
	for s, id := range t.model.vocab.all() {
		t.tokens[id], t.hasID[id] = s, true
	}
	t.addedByID = make(map[int]*AddedToken, len(t.added))
	t.addedByS = make(map[string]*AddedToken, len(t.added))
	for _, a := range t.added {
		t.tokens[a.ID], t.hasID[a.ID] = a.Content, true
		t.addedByID[a.ID] = a
		t.addedByS[a.Content] = a
	}
	// Special tokens first, then the others, as Hugging Face orders its patterns.
	ordered := make([]*AddedToken, 0, len(t.added))
	for _, special := range []bool{true, false} {
		for _, a := range t.added {
			if a.Special == special {
				ordered = append(ordered, a)
			}
		}
	}
	var raw, norm []string
	var rawTok, normTok []*AddedToken
	for _, a := range ordered {
		if !a.Normalized {
			raw, rawTok = append(raw, a.Content), append(rawTok, a)
			continue
		}
		p := a.Content
		if t.normalizer != nil {
			if n, err := t.normalizer.normalize(p); err == nil {
				p = n
			}
		}
		norm, normTok = append(norm, p), append(normTok, a)
	}
	t.rawMatch = newAddedMatcher(raw, rawTok)
	t.normMatch = newAddedMatcher(norm, normTok)
}

// applyConfig reads tokenizer_config.json: the special token names, and added tokens from
// added_tokens_decoder that tokenizer.json lacks.
func (t *Tokenizer) applyConfig(data []byte) error {
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("invalid JSON: %w", err)
	}
	for _, name := range []string{"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"} {
		if s, ok := tokenContent(cfg[name]); ok {
			t.special[name] = s
		}
	}
	if raw, ok := cfg["clean_up_tokenization_spaces"]; ok && !isNull(raw) {
		if err := decodeAt(raw, "clean_up_tokenization_spaces", &t.cleanup); err != nil {
			return err
		}
	}
	if raw, ok := cfg["added_tokens_decoder"]; ok && !isNull(raw) {
		var dec map[string]AddedToken
		if err := decodeAt(raw, "added_tokens_decoder", &dec); err != nil {
			return err
		}
		keys := make([]string, 0, len(dec))
		for k := range dec {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		changed := false
		for _, k := range keys {
			a := dec[k]
			var id int
			if _, err := fmt.Sscan(k, &id); err != nil || id < 0 || id > maxTokenID {
				return fmt.Errorf("added_tokens_decoder: invalid id %q", k)
			}
			if _, ok := t.addedByS[a.Content]; ok || a.Content == "" {
				continue
			}
			if _, ok := t.addedByID[id]; ok {
				continue
			}
			a.ID = id
			t.added = append(t.added, &a)
			changed = true
		}
		if changed {
			t.index()
		}
	}
	return nil
}

// tokenContent reads a special token entry of tokenizer_config.json: a string or an object
// with a "content" field.
func tokenContent(raw json.RawMessage) (string, bool) {
	if isNull(raw) {
		return "", false
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, s != ""
	}
	var obj struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err == nil && obj.Content != "" {
		return obj.Content, true
	}
	return "", false
}

// Encode returns the token ids of text. With addSpecial, the post-processor's special tokens
// (such as a leading BOS) are added. Special tokens written in the text are always recognised,
// as in Hugging Face's default. Invalid UTF-8 bytes are read as U+FFFD.
func (t *Tokenizer) Encode(text string, addSpecial bool) (ids []int, err error) {
	defer func() {
		if r := recover(); r != nil {
			ids, err = nil, fmt.Errorf("tokenizer: encode: internal error: %v", r)
		}
	}()
	segs, err := t.segments(sanitizeUTF8(text), nil)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: encode: %w", err)
	}
	ids = make([]int, 0, len(text)/3+4)
	var words []piece
	for _, sg := range segs {
		if sg.tok != nil {
			ids = append(ids, sg.tok.ID)
			continue
		}
		words = words[:0]
		if t.pre != nil {
			if words, err = t.pre.preTokenize(sg.piece, words); err != nil {
				return nil, fmt.Errorf("tokenizer: encode: pre-tokenize: %w", err)
			}
		} else {
			words = append(words, sg.piece)
		}
		for _, w := range words {
			if w.byteLevel {
				ids, err = t.model.tokenizeByteLevel(w.s, ids)
			} else {
				ids, err = t.model.tokenize(w.s, ids)
			}
			if err != nil {
				return nil, fmt.Errorf("tokenizer: encode: %w", err)
			}
		}
	}
	if addSpecial && t.post != nil {
		ids = t.post.process(ids)
	}
	return ids, nil
}

// segment is a part of the input after added tokens are split out and the rest normalized:
// an added token (tok set, piece holding its text) or normalized text to pre-tokenize.
type segment struct {
	piece
	tok *AddedToken
}

// segments splits text as Hugging Face's AddedVocabulary::extract_and_normalize does: first
// the added tokens that match the raw text, then, in each normalized remaining part, those
// that match normalized text. Empty parts are dropped.
func (t *Tokenizer) segments(text string, dst []segment) ([]segment, error) {
	for _, rs := range t.rawMatch.split(text, nil) {
		s := text[rs.start:rs.end]
		if rs.tok != nil {
			dst = append(dst, segment{piece{s: s}, rs.tok})
			continue
		}
		if s == "" {
			continue
		}
		if t.normalizer != nil {
			var err error
			if s, err = t.normalizer.normalize(s); err != nil {
				return dst, fmt.Errorf("normalize: %w", err)
			}
		}
		for _, ns := range t.normMatch.split(s, nil) {
			if ns.start == ns.end {
				continue
			}
			p := piece{s: s[ns.start:ns.end], first: rs.start == 0 && ns.start == 0}
			dst = append(dst, segment{p, ns.tok})
		}
	}
	return dst, nil
}

// Decode returns the text of ids. With skipSpecial, special added tokens are left out.
// An id outside the vocabulary is an error.
func (t *Tokenizer) Decode(ids []int, skipSpecial bool) (text string, err error) {
	defer func() {
		if r := recover(); r != nil {
			text, err = "", fmt.Errorf("tokenizer: decode: internal error: %v", r)
		}
	}()
	if len(t.decoders) == 1 {
		if _, ok := t.decoders[0].(byteLevelDec); ok {
			return t.decodeByteLevel(ids, skipSpecial)
		}
	}
	chain := newDecodeChain(t.decoders, t.cleanup)
	var sb strings.Builder
	for i, id := range ids {
		tok, ok := t.IDToken(id)
		if !ok {
			return "", fmt.Errorf("tokenizer: decode: ids[%d] = %d is not in the vocabulary (size %d)", i, id, t.VocabSize())
		}
		if skipSpecial && t.isSpecialToken(tok) {
			continue
		}
		chain.push(tok, &sb)
	}
	chain.flush(&sb)
	return sb.String(), nil
}

// decodeByteLevel is Decode for the common lone ByteLevel decoder, without the stages: the
// bytes of all tokens, then one lossy UTF-8 conversion.
func (t *Tokenizer) decodeByteLevel(ids []int, skipSpecial bool) (string, error) {
	buf := make([]byte, 0, 4*len(ids))
	for i, id := range ids {
		tok, ok := t.IDToken(id)
		if !ok {
			return "", fmt.Errorf("tokenizer: decode: ids[%d] = %d is not in the vocabulary (size %d)", i, id, t.VocabSize())
		}
		if skipSpecial && t.isSpecialToken(tok) {
			continue
		}
		n := len(buf)
		for _, r := range tok {
			c, ok := byteOfRune(r)
			if !ok { // not a ByteLevel token (an added token): its own bytes
				buf = append(buf[:n], tok...)
				break
			}
			buf = append(buf, c)
		}
	}
	out := string(buf)
	if !utf8.Valid(buf) {
		b, _ := appendLossy(nil, buf, true)
		out = string(b)
	}
	if t.cleanup {
		out = cleanupText(out)
	}
	return out, nil
}

func (t *Tokenizer) isSpecialToken(tok string) bool {
	a, ok := t.addedByS[tok]
	return ok && a.Special
}

// VocabSize returns one more than the largest token id, added tokens included (the size of
// an embedding table that covers every id).
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// TokenID returns the id of the token s (an added token or a vocabulary entry; for byte-level
// tokenizers s is in the ByteLevel alphabet, e.g. "Ġthe").
func (t *Tokenizer) TokenID(s string) (int, bool) {
	if a, ok := t.addedByS[s]; ok {
		return a.ID, true
	}
	id, ok := t.model.vocab.get(s)
	return id, ok
}

// IDToken returns the token string of id.
func (t *Tokenizer) IDToken(id int) (string, bool) {
	if id < 0 || id >= len(t.tokens) || !t.hasID[id] {
		return "", false
	}
	return t.tokens[id], true
}

// IsSpecial reports whether id is a special added token (one that Decode with skipSpecial
// leaves out).
func (t *Tokenizer) IsSpecial(id int) bool {
	tok, ok := t.IDToken(id)
	return ok && t.isSpecialToken(tok)
}

// AddedTokens returns the added tokens, in file order.
func (t *Tokenizer) AddedTokens() []AddedToken {
	out := make([]AddedToken, len(t.added))
	for i, a := range t.added {
		out[i] = *a
	}
	return out
}

// SpecialToken returns the token that tokenizer_config.json names for role, one of
// "bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token" and
// "mask_token".
func (t *Tokenizer) SpecialToken(role string) (string, bool) {
	s, ok := t.special[role]
	return s, ok
}

// BOS returns the id of the beginning-of-sequence token named by tokenizer_config.json.
func (t *Tokenizer) BOS() (int, bool) { return t.specialID("bos_token") }

// EOS returns the id of the end-of-sequence token named by tokenizer_config.json.
func (t *Tokenizer) EOS() (int, bool) { return t.specialID("eos_token") }

func (t *Tokenizer) specialID(role string) (int, bool) {
	s, ok := t.special[role]
	if !ok {
		return 0, false
	}
	return t.TokenID(s)
}
