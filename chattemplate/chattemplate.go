// Package chattemplate renders a model's Jinja chat template the way Hugging Face
// transformers' apply_chat_template does, turning a list of chat messages into the prompt
// text the model was trained on.
//
// The template comes from a checkpoint folder: chat_template.jinja if present, otherwise the
// chat_template entry of tokenizer_config.json (a string, or a list of named templates of
// which "default" is used). It is rendered with Jinja's trim_blocks and lstrip_blocks, the
// variables messages, add_generation_prompt, tools and documents, the special tokens of
// tokenizer_config.json (bos_token, eos_token, ...) and the functions raise_exception,
// strftime_now and range (capped at 100,000 items, as Jinja's sandbox caps it); the filters include trim and tojson (which writes JSON exactly as
// transformers' json.dumps(ensure_ascii=False) does, keys in their given order, honouring
// indent, separators and sort_keys). Turning the prompt into ids is the
// tokenizer's job: transformers encodes it without adding special tokens again, so use
// tokenizer.Encode(prompt, false).
package chattemplate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ardanlabs/jinja"
)

// Message is one chat message.
type Message struct {
	Role    string
	Content string
	// Fields holds any other keys of the message (name, tool_calls, tool_call_id, ...). They
	// are passed to the template as they are; a json.RawMessage keeps the key order of its
	// objects, which matters to templates that print them with tojson. A "content" entry
	// replaces Content, for content that is not a plain string (a list of parts, or nil).
	Fields map[string]any
}

// Options are the less common inputs of a rendering.
type Options struct {
	// AddGenerationPrompt appends the start of an assistant turn.
	AddGenerationPrompt bool
	// Tools and Documents are passed as the template variables tools and documents (None
	// when nil), as transformers passes them.
	Tools     []any
	Documents []any
	// Vars are extra template variables (for example enable_thinking). They may not name a
	// variable the rendering sets itself (messages, add_generation_prompt, tools, documents,
	// the special tokens such as bos_token, the functions such as raise_exception): such a
	// rendering fails with a *ReservedVarError, rather than let a request rewrite the
	// conversation or the special tokens the template writes.
	Vars map[string]any
	// Now is the clock of strftime_now; nil means time.Now.
	Now func() time.Time
}

// Template is a compiled chat template. It is safe for concurrent use.
type Template struct {
	name    string
	source  string
	tmpl    *jinja.Template
	special map[string]jinja.Value
}

// ReservedVarError is the error of Options.Vars naming a variable the rendering sets
// itself (see Options.Vars).
type ReservedVarError struct {
	Name string
}

func (e *ReservedVarError) Error() string {
	return fmt.Sprintf("chattemplate: the template variable %q is set by the renderer and cannot be overridden", e.Name)
}

// RaiseError is the error of a template that called raise_exception, for example to refuse
// a conversation whose roles do not alternate. Message is the template's text.
type RaiseError struct{ Message string }

func (e *RaiseError) Error() string { return "chat template raised an exception: " + e.Message }

// ErrNoTemplate reports a checkpoint folder without a chat template.
var ErrNoTemplate = errors.New("no chat template")

// Load reads the default chat template of a checkpoint folder, with the special tokens of its
// tokenizer_config.json.
func Load(dir string) (*Template, error) { return LoadNamed(dir, "") }

// LoadNamed reads the chat template called name (such as "tool_use") from a checkpoint
// folder: an entry of tokenizer_config.json's list of templates or
// additional_chat_templates/NAME.jinja. An empty name or "default" means the default template.
func LoadNamed(dir, name string) (*Template, error) {
	cfg, err := readConfig(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		return nil, fmt.Errorf("chattemplate: %w", err)
	}
	if name == "" {
		name = "default"
	}
	src, err := findSource(dir, name, cfg)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: %s: %w", dir, err)
	}
	t, err := compile(name, src, specialTokens(cfg))
	if err != nil {
		return nil, fmt.Errorf("chattemplate: %s: template %q: %w", dir, name, err)
	}
	return t, nil
}

// New compiles a chat template from source. special maps names such as "bos_token" to token
// strings; they become template variables.
func New(source string, special map[string]string) (*Template, error) {
	vals := make(map[string]jinja.Value, len(special))
	for k, v := range special {
		vals[k] = jinja.NewString(v)
	}
	t, err := compile("", source, vals)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: %w", err)
	}
	return t, nil
}

func compile(name, src string, special map[string]jinja.Value) (t *Template, err error) {
	defer func() {
		if r := recover(); r != nil {
			t, err = nil, fmt.Errorf("compile: internal error: %v", r)
		}
	}()
	tmpl, err := jinja.Compile(rewriteToJSON(src))
	if err != nil {
		return nil, err
	}
	return &Template{name: name, source: src, tmpl: tmpl, special: special}, nil
}

// Source returns the template text.
func (t *Template) Source() string { return t.source }

// Render renders messages. With addGenerationPrompt the prompt ends with the start of an
// assistant turn, ready for generation.
func (t *Template) Render(messages []Message, addGenerationPrompt bool) (string, error) {
	return t.RenderWith(messages, Options{AddGenerationPrompt: addGenerationPrompt})
}

// RenderWith renders messages with the given options.
func (t *Template) RenderWith(messages []Message, opts Options) (out string, err error) {
	defer func() {
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("chattemplate: render: internal error: %v", r)
		}
	}()
	now := opts.Now
	if now == nil {
		now = time.Now
	}
	var raised *RaiseError
	data := make(map[string]jinja.Value, len(t.special)+8)
	for k, v := range t.special {
		data[k] = v
	}
	msgs := make([]jinja.Value, len(messages))
	for i, m := range messages {
		msgs[i] = messageValue(m)
	}
	data["messages"] = jinja.NewList(msgs)
	data["add_generation_prompt"] = jinja.NewBool(opts.AddGenerationPrompt)
	data["tools"] = listOrNone(opts.Tools)
	data["documents"] = listOrNone(opts.Documents)
	data["raise_exception"] = jinja.NewCallable("raise_exception", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		msg := ""
		if len(args) > 0 {
			msg = valueString(args[0])
		}
		raised = &RaiseError{Message: msg}
		return jinja.Undefined(), raised
	})
	data[tojsonName] = jinja.NewCallable(tojsonName, toJSON)
	data["strftime_now"] = jinja.NewCallable("strftime_now", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) != 1 || !args[0].IsString() {
			return jinja.Undefined(), fmt.Errorf("strftime_now: want one format string")
		}
		return jinja.NewString(strftime(now(), args[0].AsString())), nil
	})
	data["range"] = jinja.NewCallable("range", boundedRange)
	for _, k := range slices.Sorted(maps.Keys(opts.Vars)) {
		if _, ok := data[k]; ok {
			return "", &ReservedVarError{Name: k}
		}
	}
	for k, v := range opts.Vars {
		data[k] = toValue(v)
	}
	out, err = t.tmpl.RenderValues(data)
	if err != nil {
		if raised != nil {
			return "", fmt.Errorf("chattemplate: render: %w", raised)
		}
		return "", fmt.Errorf("chattemplate: render: %w", err)
	}
	return out, nil
}

func listOrNone(l []any) jinja.Value {
	if l == nil {
		return jinja.None()
	}
	return toValue(l)
}

// messageValue builds the dict of a message: role, content, then the other fields by name.
func messageValue(m Message) jinja.Value {
	d := jinja.NewDict()
	dict := d.AsDict()
	dict.Set("role", jinja.NewString(m.Role))
	if c, ok := m.Fields["content"]; ok {
		dict.Set("content", toValue(c))
	} else {
		dict.Set("content", jinja.NewString(m.Content))
	}
	keys := make([]string, 0, len(m.Fields))
	for k := range m.Fields {
		if k != "role" && k != "content" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		dict.Set(k, toValue(m.Fields[k]))
	}
	return d
}

// toValue converts a Go value to a template value. Maps are ordered by key; JSON text
// (json.RawMessage) keeps its own order.
func toValue(v any) jinja.Value {
	switch x := v.(type) {
	case jinja.Value:
		return x
	case json.RawMessage:
		val, err := jsonValue(x)
		if err != nil {
			return jinja.NewString(string(x))
		}
		return val
	case []Message:
		return listValue(x, messageValue)
	case Message:
		return messageValue(x)
	case []any:
		return listValue(x, toValue)
	case []string:
		return listValue(x, jinja.NewString)
	case []map[string]any:
		return listValue(x, func(m map[string]any) jinja.Value { return toValue(m) })
	case map[string]any:
		return dictValue(x, toValue)
	case map[string]string:
		return dictValue(x, jinja.NewString)
	case int:
		return jinja.NewInt(int64(x))
	case int32:
		return jinja.NewInt(int64(x))
	case int64:
		return jinja.NewInt(x)
	case float32:
		return jinja.NewFloat(float64(x))
	}
	return jinja.FromGoValue(v)
}

// listValue makes a Jinja list of xs, converting each item with conv.
func listValue[T any](xs []T, conv func(T) jinja.Value) jinja.Value {
	items := make([]jinja.Value, len(xs))
	for i, x := range xs {
		items[i] = conv(x)
	}
	return jinja.NewList(items)
}

// dictValue makes a Jinja dict of m with its keys in sorted order, converting each value
// with conv.
func dictValue[V any](m map[string]V, conv func(V) jinja.Value) jinja.Value {
	d := jinja.NewDict()
	for _, k := range slices.Sorted(maps.Keys(m)) {
		d.AsDict().Set(k, conv(m[k]))
	}
	return d
}

// jsonValue decodes JSON keeping the order of object keys.
func jsonValue(data []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeJSON(dec)
	if err != nil {
		return jinja.Undefined(), err
	}
	if _, err := dec.Token(); err != io.EOF {
		return jinja.Undefined(), fmt.Errorf("trailing data after JSON value")
	}
	return v, nil
}

func decodeJSON(dec *json.Decoder) (jinja.Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	switch x := tok.(type) {
	case json.Delim:
		switch x {
		case '{':
			d := jinja.NewDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return jinja.Undefined(), err
				}
				k, _ := kt.(string)
				v, err := decodeJSON(dec)
				if err != nil {
					return jinja.Undefined(), err
				}
				d.AsDict().Set(k, v)
			}
			_, err = dec.Token()
			return d, err
		case '[':
			var items []jinja.Value
			for dec.More() {
				v, err := decodeJSON(dec)
				if err != nil {
					return jinja.Undefined(), err
				}
				items = append(items, v)
			}
			_, err = dec.Token()
			return jinja.NewList(items), err
		}
		return jinja.Undefined(), fmt.Errorf("unexpected %v", x)
	default:
		return jinja.FromGoValue(x), nil
	}
}

func valueString(v jinja.Value) string {
	if v.IsString() {
		return v.AsString()
	}
	return fmt.Sprint(v)
}

// config is the part of tokenizer_config.json that matters here.
type config map[string]json.RawMessage

func readConfig(path string) (config, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return config{}, nil
	}
	if err != nil {
		return nil, err
	}
	var cfg config
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, fmt.Errorf("%s: invalid JSON: %w", path, err)
	}
	return cfg, nil
}

// findSource returns the template called name: chat_template.jinja (default) or
// additional_chat_templates/NAME.jinja, else tokenizer_config.json's chat_template.
func findSource(dir, name string, cfg config) (string, error) {
	file := filepath.Join(dir, "chat_template.jinja")
	if name != "default" {
		file = filepath.Join(dir, "additional_chat_templates", name+".jinja")
	}
	if data, err := os.ReadFile(file); err == nil {
		return string(data), nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	raw, ok := cfg["chat_template"]
	if !ok || string(raw) == "null" {
		return "", fmt.Errorf("%w (no chat_template.jinja and no chat_template in tokenizer_config.json)", ErrNoTemplate)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		if name != "default" {
			return "", fmt.Errorf("%w named %q: tokenizer_config.json has a single template", ErrNoTemplate, name)
		}
		return s, nil
	}
	var list []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return "", fmt.Errorf("tokenizer_config.json: chat_template: want a string or a list of {name, template}: %w", err)
	}
	names := make([]string, 0, len(list))
	for _, e := range list {
		if e.Name == name {
			return e.Template, nil
		}
		names = append(names, e.Name)
	}
	return "", fmt.Errorf("%w named %q (have %s)", ErrNoTemplate, name, strings.Join(names, ", "))
}

// specialTokens returns the template variables for the special tokens of tokenizer_config.json,
// as transformers' special_tokens_map: unset tokens are left undefined.
func specialTokens(cfg config) map[string]jinja.Value {
	out := map[string]jinja.Value{}
	for _, name := range []string{"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"} {
		if s, ok := tokenContent(cfg[name]); ok {
			out[name] = jinja.NewString(s)
		}
	}
	if raw, ok := cfg["additional_special_tokens"]; ok {
		var list []json.RawMessage
		if json.Unmarshal(raw, &list) == nil {
			var items []jinja.Value
			for _, r := range list {
				if s, ok := tokenContent(r); ok {
					items = append(items, jinja.NewString(s))
				}
			}
			out["additional_special_tokens"] = jinja.NewList(items)
		}
	}
	return out
}

// tokenContent reads a token entry: a string or an object with "content".
func tokenContent(raw json.RawMessage) (string, bool) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", false
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, true
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err == nil && obj.Content != nil {
		return *obj.Content, true
	}
	return "", false
}

// maxRange is the most items range may make, as in Jinja's sandbox (MAX_RANGE), which
// Hugging Face renders chat templates in.
const maxRange = 100_000

// boundedRange is Python's range for templates, refusing more than maxRange items (the
// jinja package's own allocates without bound: range(10**12) would exhaust memory).
func boundedRange(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) < 1 || len(args) > 3 {
		return jinja.Undefined(), fmt.Errorf("range: expected 1 to 3 arguments, got %d", len(args))
	}
	ints := make([]int64, len(args))
	for i, a := range args {
		switch {
		case a.IsInt():
			ints[i] = a.AsInt()
		case a.IsBool() && a.AsBool():
			ints[i] = 1
		case a.IsBool():
			ints[i] = 0
		case a.IsFloat() && a.AsFloat() == math.Trunc(a.AsFloat()):
			// The jinja package's ** makes floats (10**12 is 1e12); integral ones count
			// as Python's ints, those beyond int64 clamped to it.
			f := a.AsFloat()
			switch {
			case f >= math.MaxInt64:
				ints[i] = math.MaxInt64
			case f <= math.MinInt64:
				ints[i] = math.MinInt64
			default:
				ints[i] = int64(f)
			}
		default:
			return jinja.Undefined(), fmt.Errorf("range: argument %d is not an integer", i+1)
		}
	}
	start, stop, step := int64(0), ints[0], int64(1)
	if len(ints) > 1 {
		start, stop = ints[0], ints[1]
	}
	if len(ints) > 2 {
		step = ints[2]
	}
	// The item count, in unsigned arithmetic so that no bound overflows.
	var n uint64
	switch {
	case step == 0:
		return jinja.Undefined(), fmt.Errorf("range: step must not be zero")
	case step > 0 && start < stop:
		n = (uint64(stop)-uint64(start)-1)/uint64(step) + 1
	case step < 0 && start > stop:
		n = (uint64(start)-uint64(stop)-1)/(0-uint64(step)) + 1
	}
	if n > maxRange {
		return jinja.Undefined(), fmt.Errorf("range: %d items is too many; templates may make at most %d", n, maxRange)
	}
	items := make([]jinja.Value, n)
	for i := range items {
		items[i] = jinja.NewInt(start + int64(i)*step)
	}
	return jinja.NewList(items), nil
}
