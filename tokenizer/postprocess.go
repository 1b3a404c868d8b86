package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
)

// A postProcessor adds special tokens around an encoded sequence (the "post_processor"
// section of tokenizer.json). It runs only when Encode is asked to add special tokens.
type postProcessor interface {
	process(ids []int) []int
}

// templateProcessing is TemplateProcessing's single-sequence template: a list of items, each
// the sequence itself ($A) or the ids of a named special token.
type templateProcessing struct {
	items [][]int // nil item: the sequence
}

func (t templateProcessing) process(ids []int) []int {
	out := make([]int, 0, len(ids)+4)
	for _, it := range t.items {
		if it == nil {
			out = append(out, ids...)
		} else {
			out = append(out, it...)
		}
	}
	return out
}

type postSeq []postProcessor

func (q postSeq) process(ids []int) []int {
	for _, p := range q {
		ids = p.process(ids)
	}
	return ids
}

// noopPost is a post-processor that changes no ids (ByteLevel only fixes offsets).
type noopPost struct{}

func (noopPost) process(ids []int) []int { return ids }

func parsePostProcessor(raw json.RawMessage, where string) (postProcessor, error) {
	typ, null, err := componentType(raw, where)
	if null || err != nil {
		return nil, err
	}
	switch typ {
	case "TemplateProcessing":
		return parseTemplate(raw, where)
	case "ByteLevel":
		return noopPost{}, nil
	case "Sequence":
		var cfg struct {
			Processors []json.RawMessage `json:"processors"`
		}
		if err := decodeAt(raw, where, &cfg); err != nil {
			return nil, err
		}
		seq, err := parseSequence(cfg.Processors, where, "processors", parsePostProcessor)
		if err != nil {
			return nil, err
		}
		return postSeq(seq), nil
	case "BertProcessing", "RobertaProcessing":
		var cfg struct {
			Sep []json.RawMessage `json:"sep"`
			Cls []json.RawMessage `json:"cls"`
		}
		if err := decodeAt(raw, where, &cfg); err != nil {
			return nil, err
		}
		sep, err1 := tokenPairID(cfg.Sep)
		cls, err2 := tokenPairID(cfg.Cls)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%s: sep and cls must be [token, id] pairs", where)
		}
		return templateProcessing{items: [][]int{{cls}, nil, {sep}}}, nil
	default:
		return nil, fmt.Errorf("%s: unsupported post-processor type %q", where, typ)
	}
}

func tokenPairID(pair []json.RawMessage) (int, error) {
	if len(pair) != 2 {
		return 0, fmt.Errorf("want [token, id]")
	}
	var id int
	return id, json.Unmarshal(pair[1], &id)
}

// parseTemplate reads TemplateProcessing. The template is either the serialized list form
// [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}] or the string form "<s> $A".
func parseTemplate(raw json.RawMessage, where string) (postProcessor, error) {
	var cfg struct {
		Single        json.RawMessage `json:"single"`
		SpecialTokens map[string]struct {
			ID  string `json:"id"`
			IDs []int  `json:"ids"`
		} `json:"special_tokens"`
	}
	if err := decodeAt(raw, where, &cfg); err != nil {
		return nil, err
	}
	special := func(name string) ([]int, error) {
		st, ok := cfg.SpecialTokens[name]
		if !ok {
			return nil, fmt.Errorf("%s.single: special token %q is missing from special_tokens", where, name)
		}
		return append([]int{}, st.IDs...), nil
	}
	var t templateProcessing
	var s string
	if err := json.Unmarshal(cfg.Single, &s); err == nil {
		for _, f := range strings.Fields(s) {
			name, _, _ := strings.Cut(f, ":")
			if strings.HasPrefix(name, "$") {
				if name != "$" && name != "$A" && name != "$0" {
					return nil, fmt.Errorf("%s.single: a single-sequence template cannot use %q", where, name)
				}
				t.items = append(t.items, nil)
				continue
			}
			ids, err := special(name)
			if err != nil {
				return nil, err
			}
			t.items = append(t.items, ids)
		}
		return t, nil
	}
	var items []struct {
		SpecialToken *struct {
			ID string `json:"id"`
		} `json:"SpecialToken"`
		Sequence *struct {
			ID string `json:"id"`
		} `json:"Sequence"`
	}
	if err := decodeAt(cfg.Single, where+".single", &items); err != nil {
		return nil, err
	}
	for i, it := range items {
		switch {
		case it.Sequence != nil:
			if it.Sequence.ID != "A" {
				return nil, fmt.Errorf("%s.single[%d]: a single-sequence template cannot use sequence %q", where, i, it.Sequence.ID)
			}
			t.items = append(t.items, nil)
		case it.SpecialToken != nil:
			ids, err := special(it.SpecialToken.ID)
			if err != nil {
				return nil, err
			}
			t.items = append(t.items, ids)
		default:
			return nil, fmt.Errorf("%s.single[%d]: want SpecialToken or Sequence", where, i)
		}
	}
	return t, nil
}
