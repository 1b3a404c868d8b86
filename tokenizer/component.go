package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Helpers shared by the parsers of tokenizer.json's component sections (normalizer,
// pre_tokenizer, post_processor, decoder). where is the JSON path of raw, which prefixes
// every error.

// isNull reports whether a section is absent or null.
func isNull(raw json.RawMessage) bool {
	t := strings.TrimSpace(string(raw))
	return t == "" || t == "null"
}

// decodeAt unmarshals raw into cfg, prefixing an error with where.
func decodeAt(raw json.RawMessage, where string, cfg any) error {
	if err := json.Unmarshal(raw, cfg); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	return nil
}

// componentType reads a component's "type". null is true, with no error, when the component
// is absent or null; a missing or empty type is an error.
func componentType(raw json.RawMessage, where string) (typ string, null bool, err error) {
	if isNull(raw) {
		return "", true, nil
	}
	var head struct {
		Type string `json:"type"`
	}
	if err := decodeAt(raw, where, &head); err != nil {
		return "", false, err
	}
	if head.Type == "" {
		return "", false, fmt.Errorf("%s: missing \"type\"", where)
	}
	return head.Type, false, nil
}

// parseSequence parses the components of a "Sequence" component, read from its list under
// key into items, each with parse as where.key[i]. Results that are nil interfaces (null
// components) are dropped.
func parseSequence[T any](items []json.RawMessage, where, key string, parse func(json.RawMessage, string) (T, error)) ([]T, error) {
	var out []T
	for i, r := range items {
		v, err := parse(r, fmt.Sprintf("%s.%s[%d]", where, key, i))
		if err != nil {
			return nil, err
		}
		if any(v) != nil {
			out = append(out, v)
		}
	}
	return out, nil
}
