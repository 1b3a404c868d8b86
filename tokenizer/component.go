package tokenizer

import (
	"encoding/json"
	"fmt"
	"reflect"
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

// parseSequence reads the list of components under key of a "Sequence" component and parses
// each with parse, as where.key[i]. Results that are nil interfaces (null components) are
// dropped.
func parseSequence[T any](raw json.RawMessage, where, key string, parse func(json.RawMessage, string) (T, error)) ([]T, error) {
	// The list is read through a struct with the one field json:"key", so that key matching
	// and error messages are those of encoding/json for a struct field.
	cfg := reflect.New(reflect.StructOf([]reflect.StructField{{
		Name: "Items",
		Type: reflect.TypeFor[[]json.RawMessage](),
		Tag:  reflect.StructTag(`json:"` + key + `"`),
	}}))
	if err := decodeAt(raw, where, cfg.Interface()); err != nil {
		return nil, err
	}
	var out []T
	for i, r := range cfg.Elem().Field(0).Interface().([]json.RawMessage) {
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
