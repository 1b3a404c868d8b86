package tokenizer

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// spec builds a tokenizer.json text. vocab lists tokens (id = index); merges are "a b"
// strings; the other arguments are raw JSON for their sections ("" means null).
type spec struct {
	vocab           []string
	merges          []string
	modelExtra      string // extra model fields, e.g. `"byte_fallback": true`
	added           string // the added_tokens list
	normalizer, pre string
	post, decoder   string
	mergesAsLists   bool
}

func (s spec) json() string {
	vocab := map[string]int{}
	for i, v := range s.vocab {
		vocab[v] = i
	}
	vj, _ := json.Marshal(vocab)
	var merges []any
	for _, m := range s.merges {
		if s.mergesAsLists {
			a, b, _ := strings.Cut(m, " ")
			merges = append(merges, []string{a, b})
		} else {
			merges = append(merges, m)
		}
	}
	mj, _ := json.Marshal(merges)
	or := func(v, d string) string {
		if v == "" {
			return d
		}
		return v
	}
	extra := ""
	if s.modelExtra != "" {
		extra = s.modelExtra + ", "
	}
	return fmt.Sprintf(`{"version": "1.0", "added_tokens": %s, "normalizer": %s, "pre_tokenizer": %s,
		"post_processor": %s, "decoder": %s, "model": {"type": "BPE", %s"vocab": %s, "merges": %s}}`,
		or(s.added, "[]"), or(s.normalizer, "null"), or(s.pre, "null"), or(s.post, "null"), or(s.decoder, "null"), extra, vj, mj)
}

func (s spec) build(t *testing.T) *Tokenizer {
	t.Helper()
	tok, err := Parse([]byte(s.json()))
	if err != nil {
		t.Fatalf("Parse: %v\n%s", err, s.json())
	}
	return tok
}

func TestNormalizers(t *testing.T) {
	tests := []struct {
		cfg, in, want string
	}{
		{`{"type": "NFC"}`, "e\u0301", "é"},
		{`{"type": "NFD"}`, "é", "e\u0301"},
		{`{"type": "NFKC"}`, "ﬁ①", "fi1"},
		{`{"type": "NFKD"}`, "ﬁé", "fie\u0301"},
		{`{"type": "Lowercase"}`, "HeLLo ÉİΣ", "hello éi\u0307σ"},
		{`{"type": "Prepend", "prepend": "▁"}`, "hi", "▁hi"},
		{`{"type": "Prepend", "prepend": "▁"}`, "", ""},
		{`{"type": "Replace", "pattern": {"String": " "}, "content": "▁"}`, "a b  c", "a▁b▁▁c"},
		{`{"type": "Replace", "pattern": {"Regex": "\\s+"}, "content": " "}`, "a \t\n b", "a b"},
		{`{"type": "Strip", "strip_left": true, "strip_right": false}`, "  x  ", "x  "},
		{`{"type": "Strip", "strip_left": true, "strip_right": true}`, "\u3000 x \n", "x"},
		{`{"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "StripAccents"}, {"type": "Lowercase"}]}`, "Été", "ete"},
		{`{"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": null, "lowercase": true}`, "Héllo\t你好\x00", "hello  你  好 "},
		{`{"type": "ByteLevel"}`, "a é", "aĠÃ©"},
	}
	for _, tt := range tests {
		t.Run(tt.cfg, func(t *testing.T) {
			n, err := parseNormalizer(json.RawMessage(tt.cfg), "normalizer")
			if err != nil {
				t.Fatal(err)
			}
			got, err := n.normalize(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("normalize(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestPreTokenizers(t *testing.T) {
	tests := []struct {
		cfg, in string
		want    []string
	}{
		{`{"type": "Split", "pattern": {"String": "-"}, "behavior": "Removed", "invert": false}`, "the-final--countdown", []string{"the", "final", "countdown"}},
		{`{"type": "Split", "pattern": {"String": "-"}, "behavior": "Isolated", "invert": false}`, "the-final--countdown", []string{"the", "-", "final", "-", "-", "countdown"}},
		{`{"type": "Split", "pattern": {"String": "-"}, "behavior": "MergedWithPrevious", "invert": false}`, "the-final--countdown", []string{"the-", "final-", "-", "countdown"}},
		{`{"type": "Split", "pattern": {"String": "-"}, "behavior": "MergedWithNext", "invert": false}`, "the-final--countdown", []string{"the", "-final", "-", "-countdown"}},
		{`{"type": "Split", "pattern": {"String": "-"}, "behavior": "Contiguous", "invert": false}`, "the-final--countdown", []string{"the", "-", "final", "--", "countdown"}},
		{`{"type": "Split", "pattern": {"Regex": "\\w+"}, "behavior": "Removed", "invert": true}`, "Hey, you!", []string{"Hey", "you"}},
		{`{"type": "Split", "pattern": {"Regex": "(?<=a)b"}, "behavior": "Isolated", "invert": false}`, "abcb", []string{"a", "b", "cb"}},
		{`{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}`, "Hello my friend, how?", []string{"ĠHello", "Ġmy", "Ġfriend", ",", "Ġhow", "?"}},
		{`{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false}`, "a b", []string{"aĠb"}},
		{`{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true}`, "Hey   friend!", []string{"▁Hey", "▁", "▁", "▁friend!"}},
		{`{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false}`, "Hey friend", []string{"▁Hey▁friend"}},
		{`{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never", "split": true}`, "Hey friend", []string{"Hey", "▁friend"}},
		{`{"type": "Metaspace", "replacement": "▁", "add_prefix_space": true}`, "Hey friend", []string{"▁Hey", "▁friend"}},
		{`{"type": "Digits", "individual_digits": true}`, "Hey 123 friend", []string{"Hey ", "1", "2", "3", " friend"}},
		{`{"type": "Digits", "individual_digits": false}`, "Hey 123 friend", []string{"Hey ", "123", " friend"}},
		{`{"type": "Whitespace"}`, "Hey man!  How's it going?", []string{"Hey", "man", "!", "How", "'", "s", "it", "going", "?"}},
		{`{"type": "WhitespaceSplit"}`, "Hey man!\tok", []string{"Hey", "man!", "ok"}},
		{`{"type": "Punctuation", "behavior": "Isolated"}`, "Hey friend!     How are you?!?", []string{"Hey friend", "!", "     How are you", "?", "!", "?"}},
		{`{"type": "BertPreTokenizer"}`, "Hey friend!  $5", []string{"Hey", "friend", "!", "$", "5"}},
		{`{"type": "CharDelimiterSplit", "delimiter": "x"}`, "axbxxc", []string{"a", "b", "c"}},
		{`{"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"}, {"type": "Digits", "individual_digits": true}]}`, "a12 b3", []string{"a", "1", "2", "b", "3"}},
	}
	for _, tt := range tests {
		t.Run(tt.cfg, func(t *testing.T) {
			pt, err := parsePreTokenizer(json.RawMessage(tt.cfg), "pre_tokenizer")
			if err != nil {
				t.Fatal(err)
			}
			pieces, err := pt.preTokenize(piece{s: tt.in, first: true}, nil)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range pieces {
				got = append(got, p.s)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("preTokenize(%q)\n got %q\nwant %q", tt.in, got, tt.want)
			}
		})
	}
}

// TestMetaspaceFirst checks prepend_scheme "first": only the part of the input that starts
// the text gets the prefix, not the parts after an added token.
func TestMetaspaceFirst(t *testing.T) {
	tok := spec{
		vocab: []string{"<s>", "▁", "a", "b", "▁a"}, merges: []string{"▁ a"},
		added: `[{"id": 0, "content": "<s>", "special": true, "normalized": false}]`,
		pre:   `{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false}`,
	}.build(t)
	tests := []struct {
		in   string
		want []int
	}{
		{"a", []int{4}},
		{"<s>a", []int{0, 2}},
		{"a<s>a", []int{4, 0, 2}},
		{" a", []int{4}},
	}
	for _, tt := range tests {
		got, err := tok.Encode(tt.in, false)
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("Encode(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

// TestAddedTokenOptions follows Hugging Face's added-vocabulary tests: lstrip, rstrip,
// single_word and normalized matching.
func TestAddedTokenOptions(t *testing.T) {
	type seg struct {
		s  string
		id int // -1: not an added token
	}
	tests := []struct {
		name, added, normalizer, in string
		want                        []seg
	}{
		{
			"normal and special",
			`[{"id": 0, "content": "my", "normalized": false}, {"id": 1, "content": "name", "normalized": false},
			  {"id": 2, "content": "[CLS]", "special": true}, {"id": 3, "content": "[SEP]", "special": true}]`,
			"", "[CLS] My name is Anthony [SEP]",
			[]seg{{"[CLS]", 2}, {" My ", -1}, {"name", 1}, {" is Anthony ", -1}, {"[SEP]", 3}},
		},
		{
			"options",
			`[{"id": 0, "content": "my", "lstrip": true, "rstrip": true, "normalized": true},
			  {"id": 1, "content": "name", "normalized": true}, {"id": 2, "content": "ony", "single_word": true, "normalized": true},
			  {"id": 3, "content": "[CLS]", "special": true}, {"id": 4, "content": "[SEP]", "special": true}]`,
			`{"type": "Lowercase"}`, "[CLS] My name is Anthony [SEP]",
			[]seg{{"[CLS]", 3}, {" my ", 0}, {"name", 1}, {" is anthony ", -1}, {"[SEP]", 4}},
		},
		{
			"single word",
			`[{"id": 0, "content": "<mask>", "single_word": true, "normalized": true}]`,
			`{"type": "Lowercase"}`, "<mask> My name <mask> A<mask> <mask>ony <mask>",
			[]seg{{"<mask>", 0}, {" my name ", -1}, {"<mask>", 0}, {" a<mask> <mask>ony ", -1}, {"<mask>", 0}},
		},
		{
			"single word unicode",
			`[{"id": 0, "content": "<mask>", "single_word": true, "normalized": true}]`,
			`{"type": "Lowercase"}`, "<mask>, <mask>- ◌̰<mask>",
			[]seg{{"<mask>", 0}, {", ", -1}, {"<mask>", 0}, {"- ◌̰<mask>", -1}},
		},
		{
			"lstrip unicode space",
			`[{"id": 0, "content": "<mask>", "lstrip": true, "rstrip": true, "single_word": true, "normalized": true}]`,
			`{"type": "Lowercase"}`, "Hi <mask> there\t<mask>\t<mask>\u2000",
			[]seg{{"hi", -1}, {" <mask> ", 0}, {"there", -1}, {"\t<mask>\t", 0}, {"<mask>\u2000", 0}},
		},
		{
			"longest match wins",
			`[{"id": 0, "content": "<|a|>", "special": true}, {"id": 1, "content": "<|a|><|b|>", "special": true}]`,
			"", "x<|a|><|b|><|a|>",
			[]seg{{"x", -1}, {"<|a|><|b|>", 1}, {"<|a|>", 0}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok := spec{added: tt.added, normalizer: tt.normalizer}.build(t)
			segs, err := tok.segments(tt.in, nil)
			if err != nil {
				t.Fatal(err)
			}
			var got []seg
			for _, sg := range segs {
				id := -1
				if sg.tok != nil {
					id = sg.tok.ID
				}
				got = append(got, seg{sg.s, id})
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("segments(%q)\n got %+v\nwant %+v", tt.in, got, tt.want)
			}
		})
	}
}

func TestBPEModel(t *testing.T) {
	base := spec{vocab: []string{"a", "b", "c", "ab", "bc", "abc", "<unk>"}, merges: []string{"a b", "ab c", "b c"}}
	tests := []struct {
		name string
		sp   func(spec) spec
		in   string
		want []int
	}{
		{"merges by rank", func(s spec) spec { return s }, "abc", []int{5}},
		{"merges as lists", func(s spec) spec { s.mergesAsLists = true; return s }, "abcab", []int{5, 3}},
		{"rank beats position", func(s spec) spec { s.merges = []string{"b c", "a b", "ab c"}; return s }, "abc", []int{0, 4}},
		{"unknown dropped without unk", func(s spec) spec { return s }, "axb", []int{3}}, // a and b then merge
		{"unk", func(s spec) spec { s.modelExtra = `"unk_token": "<unk>"`; return s }, "axyb", []int{0, 6, 6, 1}},
		{"fuse unk", func(s spec) spec { s.modelExtra = `"unk_token": "<unk>", "fuse_unk": true`; return s }, "axyb", []int{0, 6, 1}},
		{"ignore merges", func(s spec) spec {
			s.vocab = append(s.vocab, "ca")
			s.modelExtra = `"ignore_merges": true`
			return s
		}, "ca", []int{7}},
		{"without ignore merges", func(s spec) spec { s.vocab = append(s.vocab, "ca"); return s }, "ca", []int{2, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok := tt.sp(base).build(t)
			for range 2 { // the second time from the cache
				got, err := tok.Encode(tt.in, false)
				if err != nil || !slices.Equal(got, tt.want) {
					t.Fatalf("Encode(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
				}
			}
		})
	}
}

func TestByteFallbackAndSubwordPrefix(t *testing.T) {
	vocab := []string{"<unk>", "a"}
	for b := 0; b < 256; b++ {
		vocab = append(vocab, fmt.Sprintf("<0x%02X>", b))
	}
	tok := spec{vocab: vocab, modelExtra: `"unk_token": "<unk>", "byte_fallback": true`,
		decoder: `{"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]}`}.build(t)
	got, err := tok.Encode("aé", false)
	if want := []int{1, 2 + 0xC3, 2 + 0xA9}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("Encode = %v, %v; want %v", got, err, want)
	}
	if s, err := tok.Decode(got, false); err != nil || s != "aé" {
		t.Fatalf("Decode = %q, %v", s, err)
	}
	// A run of byte tokens that is not valid UTF-8 gives one U+FFFD per token.
	if s, _ := tok.Decode([]int{2 + 0xC3, 1, 2 + 0xE4, 2 + 0xBD}, false); s != "\uFFFDa\uFFFD\uFFFD" {
		t.Fatalf("Decode(invalid) = %q", s)
	}

	wp := spec{vocab: []string{"un", "##a", "##b", "##ab", "una"}, merges: []string{"##a ##b"},
		modelExtra: `"continuing_subword_prefix": "##"`}.build(t)
	// "u" and "##n" are not in the vocabulary and dropped; "##a" and "##b" merge into "##ab".
	if got, err := wp.Encode("unab", false); err != nil || !slices.Equal(got, []int{3}) {
		t.Errorf("Encode(unab) = %v, %v; want [3]", got, err)
	}
}

func TestDecoders(t *testing.T) {
	tests := []struct {
		name, cfg string
		tokens    []string
		want      string
	}{
		{"no decoder joins with spaces", "", []string{"a", "b", "c"}, "a b c"},
		{"byte level", `{"type": "ByteLevel"}`, []string{"Hello", "Ġw", "orld", "ĠðŁĺ", "Ģ"}, "Hello world 😀"},
		{"byte level incomplete", `{"type": "ByteLevel"}`, []string{"a", "ðŁĺ"}, "a\uFFFD"},
		{"byte level added token", `{"type": "ByteLevel"}`, []string{"<|x|>", "Ġhi", "→"}, "<|x|> hi→"},
		{"metaspace", `{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"}`, []string{"▁Hey", "▁friend!"}, "Hey friend!"},
		{"metaspace never", `{"type": "Metaspace", "replacement": "▁", "prepend_scheme": "never"}`, []string{"▁Hey", "▁friend!"}, " Hey friend!"},
		{"strip start and stop", `{"type": "Strip", "content": "H", "start": 1, "stop": 1}`, []string{"Hey", "HHH", "H"}, "eyH"},
		{"llama sequence", `{"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
			{"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}`,
			[]string{"▁Hello", "<0xE4>", "<0xBD>", "<0xA0>", "▁▁x"}, "Hello你  x"},
		{"fused strip stop", `{"type": "Sequence", "decoders": [{"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 2, "stop": 2}]}`,
			[]string{"  ", " a ", " ", " "}, " a "},
		{"fused replace across tokens", `{"type": "Sequence", "decoders": [{"type": "Fuse"}, {"type": "Replace", "pattern": {"String": "ab"}, "content": "X"}]}`,
			[]string{"a", "ba", "b", "a"}, "XXa"},
		{"regex replace", `{"type": "Replace", "pattern": {"Regex": "_+"}, "content": " "}`, []string{"a__b", "_c"}, "a b c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sp := spec{vocab: tt.tokens, decoder: tt.cfg}
			// Tokens may repeat: give each its own id through the vocabulary's order.
			uniq := map[string]int{}
			sp.vocab = nil
			var ids []int
			for _, tk := range tt.tokens {
				id, ok := uniq[tk]
				if !ok {
					id = len(sp.vocab)
					uniq[tk] = id
					sp.vocab = append(sp.vocab, tk)
				}
				ids = append(ids, id)
			}
			tok := sp.build(t)
			got, err := tok.Decode(ids, false)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("Decode = %q, want %q", got, tt.want)
			}
			// The stream gives the same text.
			st := tok.NewStream()
			var sb strings.Builder
			for _, id := range ids {
				s, err := st.Next(id)
				if err != nil {
					t.Fatal(err)
				}
				sb.WriteString(s)
			}
			sb.WriteString(st.Flush())
			if sb.String() != tt.want {
				t.Errorf("stream = %q, want %q", sb.String(), tt.want)
			}
		})
	}
}

func TestPostProcessors(t *testing.T) {
	added := `[{"id": 0, "content": "<s>", "special": true}, {"id": 1, "content": "</s>", "special": true}]`
	tests := []struct {
		name, cfg string
		want      []int
	}{
		{"template list", `{"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}],
			"pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}, "</s>": {"id": "</s>", "ids": [1], "tokens": ["</s>"]}}}`, []int{0, 2, 1}},
		{"template string", `{"type": "TemplateProcessing", "single": "<s> $A:0", "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}}`, []int{0, 2}},
		{"byte level", `{"type": "ByteLevel", "trim_offsets": true}`, []int{2}},
		{"roberta", `{"type": "RobertaProcessing", "sep": ["</s>", 1], "cls": ["<s>", 0]}`, []int{0, 2, 1}},
		{"sequence", `{"type": "Sequence", "processors": [{"type": "ByteLevel"}, {"type": "TemplateProcessing", "single": "<s> $A", "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]}}}]}`, []int{0, 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tok := spec{vocab: []string{"<s>", "</s>", "x"}, added: added, post: tt.cfg}.build(t)
			got, err := tok.Encode("x", true)
			if err != nil || !slices.Equal(got, tt.want) {
				t.Errorf("Encode(x, true) = %v, %v; want %v", got, err, tt.want)
			}
			got, err = tok.Encode("x", false)
			if err != nil || !slices.Equal(got, []int{2}) {
				t.Errorf("Encode(x, false) = %v, %v; want [2]", got, err)
			}
		})
	}
}

// TestByteLevelFastPath checks that tokenizing raw bytes equals tokenizing their ByteLevel
// characters, with and without ignore_merges.
func TestByteLevelFastPath(t *testing.T) {
	tok, err := LoadDir("../testdata/tiny-llama")
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(5, 6))
	for _, ignore := range []bool{false, true} {
		tok.model.ignoreMerges = ignore
		for range 2000 {
			w := randomText(r, 1+r.IntN(8))
			want, err1 := tok.model.mergeWord(byteLevelEncode(w), nil)
			if ignore {
				if id, ok := tok.model.vocab.get(byteLevelEncode(w)); ok {
					want = []int{id}
				}
			}
			got, err2 := tok.model.tokenizeByteLevel(w, nil)
			if err1 != nil || err2 != nil || !slices.Equal(got, want) {
				t.Fatalf("ignore_merges=%v %q: got %v (%v), want %v (%v)", ignore, w, got, err2, want, err1)
			}
		}
		tok.model.rawCache = newWordCache(cacheWords)
	}
}
