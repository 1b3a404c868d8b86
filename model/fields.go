package model

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
)

// fields reads typed values out of one JSON object, recording the first error. Errors name
// the source file and the field's full key (prefix included, e.g. "rope_scaling.factor").
type fields struct {
	src    string
	prefix string
	m      map[string]json.RawMessage
	err    *error // shared by nested objects so the first error wins overall
}

// parseObject decodes data as a JSON object.
func parseObject(data []byte, src string) (*fields, error) {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, fmt.Errorf("%s: not a JSON object", src)
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(trimmed, &m); err != nil {
		return nil, fmt.Errorf("%s: invalid JSON: %w", src, err)
	}
	var err error
	return &fields{src: src, m: m, err: &err}, nil
}

func (f *fields) fail(format string, args ...any) {
	if *f.err == nil {
		*f.err = fmt.Errorf("%s: "+format, append([]any{f.src}, args...)...)
	}
}

// key is the full name of a field for messages.
func (f *fields) key(k string) string { return f.prefix + k }

// has reports whether the field is present and not null.
func (f *fields) has(k string) bool {
	raw, ok := f.m[k]
	return ok && !isNull(raw)
}

// present reports whether the field is present, null or not.
func (f *fields) present(k string) bool {
	_, ok := f.m[k]
	return ok
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

// describe is a short rendering of a raw value for messages.
func describe(raw json.RawMessage) string {
	s := string(bytes.TrimSpace(raw))
	if len(s) > 40 {
		s = s[:37] + "..."
	}
	return s
}

// Int reads an integer field; absent or null gives def. A float with an integral value is
// accepted (some tools write 64.0).
func (f *fields) int(k string, def int) int {
	if !f.has(k) {
		return def
	}
	v, ok := asInt(f.m[k])
	if !ok {
		f.fail("%s: want an integer, got %s", f.key(k), describe(f.m[k]))
		return def
	}
	return v
}

func asInt(raw json.RawMessage) (int, bool) {
	var x float64
	if err := json.Unmarshal(raw, &x); err != nil {
		return 0, false
	}
	if x != math.Trunc(x) || math.Abs(x) > 1<<53 {
		return 0, false
	}
	return int(x), true
}

// float reads a number field; absent or null gives def.
func (f *fields) float(k string, def float64) float64 {
	if !f.has(k) {
		return def
	}
	var x float64
	if err := json.Unmarshal(f.m[k], &x); err != nil {
		f.fail("%s: want a number, got %s", f.key(k), describe(f.m[k]))
		return def
	}
	return x
}

// bool reads a boolean field; absent or null gives def.
func (f *fields) bool(k string, def bool) bool {
	if !f.has(k) {
		return def
	}
	var x bool
	if err := json.Unmarshal(f.m[k], &x); err != nil {
		f.fail("%s: want true or false, got %s", f.key(k), describe(f.m[k]))
		return def
	}
	return x
}

// str reads a string field; absent or null gives def.
func (f *fields) str(k string, def string) string {
	if !f.has(k) {
		return def
	}
	var x string
	if err := json.Unmarshal(f.m[k], &x); err != nil {
		f.fail("%s: want a string, got %s", f.key(k), describe(f.m[k]))
		return def
	}
	return x
}

// strs reads a list of strings; absent or null gives nil.
func (f *fields) strs(k string) []string {
	if !f.has(k) {
		return nil
	}
	var x []string
	if err := json.Unmarshal(f.m[k], &x); err != nil {
		f.fail("%s: want a list of strings, got %s", f.key(k), describe(f.m[k]))
		return nil
	}
	return x
}

// ids reads a token id field that may be an integer, a list of integers or null.
func (f *fields) ids(k string) []int {
	if !f.has(k) {
		return nil
	}
	if v, ok := asInt(f.m[k]); ok {
		return []int{v}
	}
	return f.intListOf(k, "an integer, a list of integers or null")
}

// intList reads a list of integers; absent or null gives nil.
func (f *fields) intList(k string) []int { return f.intListOf(k, "a list of integers") }

// intListOf reads a list of integers, failing with "want <want>" when the field is no list.
func (f *fields) intListOf(k, want string) []int {
	if !f.has(k) {
		return nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(f.m[k], &list); err != nil {
		f.fail("%s: want %s, got %s", f.key(k), want, describe(f.m[k]))
		return nil
	}
	out := make([]int, 0, len(list))
	for _, r := range list {
		v, ok := asInt(r)
		if !ok {
			f.fail("%s: want integers, got %s", f.key(k), describe(r))
			return nil
		}
		out = append(out, v)
	}
	return out
}

func (f *fields) object(k string) *fields {
	if !f.has(k) {
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(f.m[k], &m); err != nil || m == nil {
		f.fail("%s: want an object, got %s", f.key(k), describe(f.m[k]))
		return nil
	}
	return &fields{src: f.src, prefix: f.key(k) + ".", m: m, err: f.err}
}

// positive fails unless v > 0; required also fails when the field is absent or null.
func (f *fields) positive(k string, v int, required bool) {
	switch {
	case required && !f.has(k):
		f.fail("%s is missing", f.key(k))
	case f.has(k) && v <= 0:
		f.fail("%s must be positive, got %d", f.key(k), v)
	}
}

// nonNegative fails when the field is present and v < 0.
func (f *fields) nonNegative(k string, v int) {
	if f.has(k) && v < 0 {
		f.fail("%s must not be negative, got %d", f.key(k), v)
	}
}
