package tokenizer

import (
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"unicode/utf16"
	"unicode/utf8"
)

// The fast loader reads tokenizer.json without encoding/json's reflection over the model
// section, which holds nearly all of the file (Qwen2.5: 151,643 vocabulary entries and
// 151,387 merges, 0.6 s through encoding/json on a 2-core machine). It scans the file once
// with the strict scanner of jsonscan.go, keeps the small sections as raw JSON as before,
// and builds the BPE model straight from the bytes: vocabulary keys are substrings of one
// allocated string, and merges are looked up without building strings.
//
// It handles only what it can read exactly as encoding/json does: a key that differs from a
// known field name only in case, a key with escapes, a repeated field, an id that is not a
// plain integer in range, a merge that names tokens outside the vocabulary, and so on make it
// give up, and parse falls back to encoding/json (parseReference), which then gives the
// same result or error as before.

// maxFastFile bounds the files that the fast loader reads: it keeps offsets into the file,
// and those of its side buffer after them, in int32s.
const maxFastFile = 1 << 29

// fileKeys are the top-level fields of tokenizer.json that file reads.
var fileKeys = [...]string{"added_tokens", "normalizer", "pre_tokenizer", "post_processor", "decoder", "model"}

// modelKeys are the fields of the model section that parseModel reads.
var modelKeys = [...]string{"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
	"fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"}

// keyIndex returns the index of key in keys, -1 for a key that encoding/json would not match
// to any of them, and -2 for one that it would match only case-insensitively (which the
// fast loader leaves to encoding/json).
func keyIndex(key []byte, keys []string) int {
	for i, k := range keys {
		if string(key) == k {
			return i
		}
	}
	for _, k := range keys {
		if strings.EqualFold(string(key), k) {
			return -2
		}
	}
	return -1
}

// fastParse reads data as json.Unmarshal into file and parseModel would, or reports ok
// false when it cannot be sure to. m is the model section's BPE model, or nil if that is to
// be built by parseModel from f.Model.
func fastParse(data []byte) (f file, m *bpe, ok bool) {
	if len(data) > maxFastFile {
		return f, nil, false
	}
	var seen [len(fileKeys)]bool
	i := skipSpace(data, 0)
	if i >= len(data) || data[i] != '{' {
		return f, nil, false
	}
	end, ok := scanObject(data, i, 1, func(ks, ke int, fl strFlags, vs int) (int, bool) {
		if fl != 0 { // possibly a field name in disguise ("mod\u0065l", "added_to\u212Aens")
			return 0, false
		}
		k := keyIndex(data[ks+1:ke-1], fileKeys[:])
		if k == -2 || k >= 0 && seen[k] {
			return 0, false
		}
		if k < 0 {
			return scanValue(data, vs, 1)
		}
		seen[k] = true
		var ve int
		var ok bool
		if fileKeys[k] == "model" {
			if m, ve = fastModel(data, vs); m == nil {
				ve, ok = scanValue(data, vs, 1)
				if !ok {
					return 0, false
				}
			}
		} else if ve, ok = scanValue(data, vs, 1); !ok {
			return 0, false
		}
		raw := json.RawMessage(data[vs:ve])
		switch fileKeys[k] {
		case "added_tokens":
			if json.Unmarshal(raw, &f.AddedTokens) != nil {
				return 0, false
			}
		case "normalizer":
			f.Normalizer = raw
		case "pre_tokenizer":
			f.PreTokenizer = raw
		case "post_processor":
			f.PostProcessor = raw
		case "decoder":
			f.Decoder = raw
		case "model":
			f.Model = raw
		}
		return ve, true
	})
	if !ok || skipSpace(data, end) != len(data) {
		return file{}, nil, false
	}
	return f, m, true
}

// strRef is a string of the file without its quotes, or, at offsets from len(data) on, a
// string of the side buffer that holds unquoted strings with escapes.
type strRef struct{ off, n int32 }

// modelReader holds what fastModel has read so far.
type modelReader struct {
	data  []byte
	extra []byte // unquoted strings that had escapes or invalid UTF-8
	vocab []vocabRef
	// merges: the left and right token of each merge, in rank order
	merges []strRef

	indexing sync.WaitGroup // indexVocab's goroutine
	table    *vocabTable    // the vocabulary, once indexed
	byID     []int32        // id -> table entry, or nil (see indexVocab)
}

type vocabRef struct {
	key strRef
	id  int32
}

// bytes returns the bytes r refers to.
func (r *modelReader) bytes(s strRef) []byte { return refBytes(r.data, r.extra, s) }

// refBytes returns the bytes that s refers to in data or extra.
func refBytes(data, extra []byte, s strRef) []byte {
	if int(s.off) >= len(data) {
		o := int(s.off) - len(data)
		return extra[o : o+int(s.n)]
	}
	return data[s.off : s.off+s.n]
}

// str reads the string whose quote is data[i]: its contents as a strRef, and the index after
// it.
func (r *modelReader) str(i int) (strRef, int, bool) {
	end, fl, ok := scanString(r.data, i)
	if !ok {
		return strRef{}, 0, false
	}
	ref, ok := r.ref(i, end, fl)
	return ref, end, ok
}

// ref returns the contents of the string data[i:end] (quotes included) that scanString
// has read.
func (r *modelReader) ref(i, end int, fl strFlags) (strRef, bool) {
	q := r.data[i+1 : end-1]
	if fl&strBadUTF8 != 0 {
		// As encoding/json reads it: invalid UTF-8 as U+FFFD.
		var s string
		if json.Unmarshal(r.data[i:end], &s) != nil {
			return strRef{}, false
		}
		return r.keep([]byte(s)), true
	}
	if fl&strEscaped == 0 {
		return strRef{int32(i + 1), int32(len(q))}, true
	}
	n := len(r.extra)
	var ok bool
	if r.extra, ok = appendUnescaped(r.extra, q); !ok { // a surrogate
		var s string
		if json.Unmarshal(r.data[i:end], &s) != nil {
			return strRef{}, false
		}
		r.extra = append(r.extra[:n], s...)
	}
	return strRef{int32(len(r.data) + n), int32(len(r.extra) - n)}, true
}

// keep copies s to the side buffer and returns its reference.
func (r *modelReader) keep(s []byte) strRef {
	off := len(r.data) + len(r.extra)
	r.extra = append(r.extra, s...)
	return strRef{int32(off), int32(len(s))}
}

// appendUnescaped appends the contents of a string that scanString has read (q: between
// the quotes) with its escapes resolved, or reports false if it has a \u escape of a UTF-16
// surrogate (left to encoding/json, which pairs surrogates and replaces lone ones).
func appendUnescaped(dst, q []byte) ([]byte, bool) {
	for i := 0; i < len(q); i++ {
		c := q[i]
		if c != '\\' {
			dst = append(dst, c)
			continue
		}
		i++
		switch q[i] {
		case 'b':
			c = '\b'
		case 'f':
			c = '\f'
		case 'n':
			c = '\n'
		case 'r':
			c = '\r'
		case 't':
			c = '\t'
		case 'u':
			r := rune(0)
			for _, h := range q[i+1 : i+5] {
				v, _ := hexVal(h) // scanString checked the digits
				r = r<<4 | rune(v)
			}
			if utf16.IsSurrogate(r) {
				return dst, false
			}
			dst = utf8.AppendRune(dst, r)
			i += 4
			continue
		default: // " \\ /
			c = q[i]
		}
		dst = append(dst, c)
	}
	return dst, true
}

// readVocab reads the vocab object at data[i].
func (r *modelReader) readVocab(i int) (int, bool) {
	if i >= len(r.data) || r.data[i] != '{' {
		return 0, false // null (a missing vocabulary) or not an object: encoding/json says which
	}
	// Room for as many entries as a file of this size usually has (Qwen2.5: 151,643 in
	// 7 MB), which saves growing the list (and touching twice the memory) on large files.
	r.vocab = make([]vocabRef, 0, len(r.data)/48+16)
	return scanObject(r.data, i, 3, func(ks, ke int, fl strFlags, vs int) (int, bool) {
		key, ok := r.ref(ks, ke, fl)
		if !ok {
			return 0, false
		}
		// A plain non-negative integer up to maxTokenID; anything else (a negative or
		// fractional id, null) is left to encoding/json and parseModel.
		d, j, id := r.data, vs, 0
		for j < len(d) && d[j] >= '0' && d[j] <= '9' && j-vs < 9 {
			id = id*10 + int(d[j]-'0')
			j++
		}
		if j == vs || j < len(d) && (d[j] >= '0' && d[j] <= '9' || d[j] == '.' || d[j] == 'e' || d[j] == 'E') ||
			d[vs] == '0' && j-vs > 1 || id > maxTokenID {
			return 0, false
		}
		r.vocab = append(r.vocab, vocabRef{key, int32(id)})
		return j, true
	})
}

// readMerges reads the merges list at data[i]: "left right" strings or [left, right] lists.
func (r *modelReader) readMerges(i int) (int, bool) {
	if i >= len(r.data) || r.data[i] != '[' {
		return 0, false
	}
	// Vocabularies usually have about as many merges as tokens.
	r.merges = make([]strRef, 0, 2*len(r.vocab)+32)
	d := r.data
	return scanArray(d, i, 3, func(vs, _ int) (int, bool) {
		switch d[vs] {
		case '"':
			s, end, ok := r.str(vs)
			if !ok {
				return 0, false
			}
			b := r.bytes(s)
			sp := bytes.IndexByte(b, ' ')
			if sp <= 0 || sp == len(b)-1 {
				return 0, false // parseMerge's error
			}
			r.merges = append(r.merges, strRef{s.off, int32(sp)}, strRef{s.off + int32(sp) + 1, s.n - int32(sp) - 1})
			return end, true
		case '[':
			j := skipSpace(d, vs+1)
			for k := 0; k < 2; k++ {
				if j >= len(d) || d[j] != '"' {
					return 0, false
				}
				s, end, ok := r.str(j)
				if !ok {
					return 0, false
				}
				r.merges = append(r.merges, s)
				j = skipSpace(d, end)
				want := byte(',')
				if k == 1 {
					want = ']'
				}
				if j >= len(d) || d[j] != want {
					return 0, false
				}
				j = skipSpace(d, j+1)
			}
			return j, true
		}
		return 0, false
	})
}

// fastModel reads the model section at data[i] and builds its BPE model, returning it and
// the index after the section; it returns nil where it cannot be sure to read the section
// as parseModel does (including every error parseModel reports).
func fastModel(data []byte, i int) (*bpe, int) {
	if i >= len(data) || data[i] != '{' {
		return nil, 0
	}
	r := &modelReader{data: data}
	var cfg bpeConfig
	var seen [len(modelKeys)]bool
	end, ok := scanObject(data, i, 2, func(ks, ke int, fl strFlags, vs int) (int, bool) {
		if fl != 0 {
			return 0, false
		}
		k := keyIndex(data[ks+1:ke-1], modelKeys[:])
		if k == -2 || k >= 0 && seen[k] {
			return 0, false
		}
		if k < 0 {
			return scanValue(data, vs, 2)
		}
		seen[k] = true
		var field any
		switch modelKeys[k] {
		case "vocab":
			end, ok := r.readVocab(vs)
			if ok { // index it while the merges are read
				r.indexing.Go(r.indexVocab(r.extra))
			}
			return end, ok
		case "merges":
			return r.readMerges(vs)
		case "type":
			ve, ok := scanValue(data, vs, 2)
			return ve, ok && string(data[vs:ve]) == `"BPE"`
		case "dropout":
			field = &cfg.Dropout
		case "unk_token":
			field = &cfg.UnkToken
		case "continuing_subword_prefix":
			field = &cfg.Prefix
		case "end_of_word_suffix":
			field = &cfg.Suffix
		case "fuse_unk":
			field = &cfg.FuseUnk
		case "byte_fallback":
			field = &cfg.ByteFallback
		case "ignore_merges":
			field = &cfg.IgnoreMerges
		}
		ve, ok := scanValue(data, vs, 2)
		if !ok || json.Unmarshal(data[vs:ve], field) != nil {
			return 0, false
		}
		return ve, true
	})
	r.indexing.Wait()
	if !ok || !seen[0] || !seen[8] || !seen[9] { // type, vocab and merges
		return nil, 0
	}
	m, ok := r.build(&cfg)
	if !ok {
		return nil, 0
	}
	return m, end
}
