package chattemplate

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Fuzz targets of chat-template rendering. FuzzRender renders the fixtures' templates with
// arbitrary conversations and template variables, and checks the text against what Hugging
// Face renders (the fixture templates are simple enough to write their output down);
// FuzzToJSON checks that tojson writes back the JSON it was given; FuzzTemplate compiles
// arbitrary template sources and renders those whose work is bounded.

// fuzzWait bounds one input's work; an input that takes longer crashes the test binary, and
// the fuzz engine reports it as a hang.
const fuzzWait = 10 * time.Second

func withDeadline(what string, fn func()) {
	timer := time.AfterFunc(fuzzWait, func() { panic(fmt.Sprintf("%s takes longer than %v", what, fuzzWait)) })
	defer timer.Stop()
	fn()
}

var fuzzNow = func() time.Time { return time.Date(2024, 7, 26, 12, 0, 0, 0, time.UTC) }

// pyStrip is Python's str.strip(), Jinja's trim filter, but for one known difference: Python's
// whitespace is Unicode's White_Space plus the separators U+001C..U+001F, which the
// engine's trim (strings.TrimSpace) keeps. fuzzMessages keeps them out of contents.
func pyStrip(s string) string {
	return strings.TrimFunc(s, func(r rune) bool {
		switch r {
		case ' ', '\t', '\n', '\v', '\f', '\r', 0x85, 0xa0, 0x1680, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000:
			return true
		}
		return r >= 0x2000 && r <= 0x200a
	})
}

// renderFixture is a fixture's template and the text Hugging Face renders with it.
type renderFixture struct {
	dir  string
	want func(msgs []Message, gen bool) string
}

var renderFixtures = []renderFixture{
	{"tiny-llama", func(msgs []Message, gen bool) string {
		s := "<|begin_of_text|>"
		for _, m := range msgs {
			s += "<|start_header_id|>" + m.Role + "<|end_header_id|>\n\n" + pyStrip(m.Content) + "<|eot_id|>"
		}
		if gen {
			s += "<|start_header_id|>assistant<|end_header_id|>\n\n"
		}
		return s
	}},
	{"tiny-llama2", func(msgs []Message, gen bool) string {
		s := "<s>"
		for _, m := range msgs {
			switch m.Role {
			case "system":
				s += "<<SYS>>\n" + m.Content + "\n<</SYS>>\n\n"
			case "user":
				s += "[INST] " + m.Content + " [/INST]"
			default:
				s += " " + m.Content + "</s>"
			}
		}
		return s
	}},
	{"tiny-qwen2", func(msgs []Message, gen bool) string {
		s := ""
		for _, m := range msgs {
			s += "<|im_start|>" + m.Role + "\n" + m.Content + "<|im_end|>\n"
		}
		if gen {
			s += "<|im_start|>assistant\n"
		}
		return s
	}},
}

// fuzzMessages reads a conversation: messages separated by \x00, each a role, \x01 and the
// content (a message without \x01 is a user message). U+001C..U+001F become spaces (see
// pyStrip).
func fuzzMessages(spec string) []Message {
	if spec == "" {
		return nil
	}
	var msgs []Message
	for m := range strings.SplitSeq(spec, "\x00") {
		role, content, ok := strings.Cut(m, "\x01")
		if !ok {
			role, content = "user", m
		}
		content = strings.Map(func(r rune) rune {
			if r >= 0x1c && r <= 0x1f {
				return ' '
			}
			return r
		}, content)
		msgs = append(msgs, Message{Role: role, Content: content})
		if len(msgs) == 32 {
			break
		}
	}
	return msgs
}

// reservedVars are the variables the fixture templates read; template variables of the
// same name change what they render.
var reservedVars = []string{"messages", "message", "add_generation_prompt", "bos_token", "eos_token"}

// FuzzRender renders each fixture template with an arbitrary conversation (any roles and
// contents, template syntax and invalid UTF-8 included) and arbitrary template variables
// (chat_template_kwargs, a JSON object). Rendering never fails with an internal error (a
// recovered panic) and gives the same text twice; without variables that shadow the
// template's own, the text is exactly what Hugging Face renders: contents are data, never
// template code.
func FuzzRender(f *testing.F) {
	f.Add("user\x01Hello!", true, []byte(nil))
	f.Add("system\x01Be brief.\x00user\x01  Hi  \x00assistant\x01Hello.\x00user\x01{{ raise_exception('x') }}", true, []byte(`{"enable_thinking": false}`))
	f.Add("user\x01{% for m in messages %}{{ m }}{% endfor %}\x00tool\x01\x1c x \u3000", false, []byte(`{"messages": "shadowed"}`))
	f.Add("\x01\x00\x00\x01\x01", true, []byte(`{"bos_token": null, "add_generation_prompt": [1], "x": {"a": [1.5, "é"]}}`))
	f.Add("user\x01\xff\xfe\xc3", false, []byte(`{"message": {"role": "x"}}`))
	f.Add("", true, []byte(`[]`))
	templates := make([]*Template, len(renderFixtures))
	for i, fx := range renderFixtures {
		tm, err := Load(filepath.Join("..", "testdata", fx.dir))
		if err != nil {
			f.Fatal(err)
		}
		templates[i] = tm
	}
	f.Fuzz(func(t *testing.T, spec string, gen bool, kwargs []byte) {
		msgs := fuzzMessages(spec)
		opts := Options{AddGenerationPrompt: gen, Now: fuzzNow}
		shadowed := false
		var vars map[string]json.RawMessage
		if json.Unmarshal(kwargs, &vars) == nil && vars != nil {
			opts.Vars = map[string]any{}
			for k, v := range vars {
				opts.Vars[k] = v
			}
			for _, k := range reservedVars {
				_, in := vars[k]
				shadowed = shadowed || in
			}
		}
		for i, tm := range templates {
			withDeadline("rendering", func() {
				out, err := tm.RenderWith(msgs, opts)
				if err != nil && strings.Contains(err.Error(), "internal error") {
					t.Fatalf("%s: %v", renderFixtures[i].dir, err)
				}
				again, err2 := tm.RenderWith(msgs, opts)
				if again != out || (err == nil) != (err2 == nil) {
					t.Fatalf("%s: two renderings differ: %q, %v; %q, %v", renderFixtures[i].dir, out, err, again, err2)
				}
				if shadowed {
					return
				}
				if err != nil {
					t.Fatalf("%s: %v", renderFixtures[i].dir, err)
				}
				if want := renderFixtures[i].want(msgs, gen); out != want {
					t.Fatalf("%s: rendered\n%q\nwant\n%q", renderFixtures[i].dir, out, want)
				}
			})
		}
	})
}

// escapes finds the \uXXXX escapes of a JSON text (not those of an escaped backslash).
var escapes = regexp.MustCompile(`(?:^|[^\\])(?:\\\\)*\\u([0-9a-fA-F]{4})`)

// FuzzToJSON passes an arbitrary JSON value to a template as a variable (as
// chat_template_kwargs does) and prints it with tojson, plainly and indented. What tojson
// writes is JSON holding the same value (numbers compared as float64, as JSON readers do),
// with non-ASCII characters written as they are (ensure_ascii=False): only control
// characters are escaped as \uXXXX.
func FuzzToJSON(f *testing.F) {
	for _, s := range []string{`{"b": 1, "a": [true, null, 2.5, "x\ny"]}`, `"é\u0001\u2028"`, `1e400`, `12345678901234567890`,
		`-0`, `[]`, `{}`, `{"a": 1, "a": 2}`, `"\ud800"`, `[[[[[[[[1]]]]]]]]`, `"</script>&"`, `1.0`, `1E5`} {
		f.Add([]byte(s))
	}
	plain, err := New("{{ x | tojson }}", nil)
	if err != nil {
		f.Fatal(err)
	}
	indented, err := New("{{ x | tojson(indent=2) }}", nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var want any
		if json.Unmarshal(data, &want) != nil {
			return
		}
		for _, tm := range []*Template{plain, indented} {
			out, err := tm.RenderWith(nil, Options{Vars: map[string]any{"x": json.RawMessage(data)}})
			if err != nil {
				if strings.Contains(err.Error(), "internal error") {
					t.Fatalf("tojson of %s: %v", data, err)
				}
				continue // numbers beyond float64 (1e400) have no JSON form
			}
			var got any
			if err := json.Unmarshal([]byte(out), &got); err != nil {
				t.Fatalf("tojson of %s wrote %q, not JSON: %v", data, out, err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("tojson of %s wrote %q: %v, want %v", data, out, got, want)
			}
			for _, m := range escapes.FindAllStringSubmatch(out, -1) {
				if c, _ := strconv.ParseUint(m[1], 16, 32); c >= 0x20 {
					t.Fatalf("tojson of %s wrote %q: \\u%s escaped", data, out, m[1])
				}
			}
		}
	})
}

// boundedWords are what may make rendering unbounded in time, memory or stack depth with
// the template engine (ardanlabs/jinja), which has no limits of its own: a macro that calls
// itself, or printing a list that holds itself (messages.append(messages)), overflows the
// goroutine stack (a fatal error, not a panic); range(10**12) builds the whole list; 'x' * n
// and the padding filters allocate what n says; set and with chains double a value at each
// step; loops nest. FuzzTemplate renders only sources without them (and without digits, so
// that numbers stay as small as the data), compiling the others.
var boundedWords = []string{"macro", "call", "recursive", "range", "*", "strftime", "format", "center", "indent",
	"wordwrap", "truncate", "batch", "slice", "join", "replace", "~", "+", "int", "float", "namespace", "set", "with",
	"append", "extend", "insert", "update"}

func renderable(src string) bool {
	if strings.ContainsAny(src, "0123456789") || strings.Count(src, "for") > 2 {
		return false
	}
	for _, w := range boundedWords {
		if strings.Contains(src, w) {
			return false
		}
	}
	return true
}

// FuzzTemplate compiles an arbitrary template source: New gives a template or an error,
// never both, and the template keeps its source. Sources whose rendering is bounded (see
// renderable) are rendered with a fixed conversation: the result is the same twice, and a
// source without markup ('{') renders as itself. Sources are cut to 1 KiB.
func FuzzTemplate(f *testing.F) {
	for _, fx := range renderFixtures {
		src, err := findSource(filepath.Join("..", "testdata", fx.dir), "default", config{})
		if err != nil {
			f.Fatal(err)
		}
		f.Add(src)
	}
	for _, s := range []string{
		"plain text", "", "{", "}}", "{{", "{%", "{#", "{{ }}", "{% %}", "{% if %}", "{% endfor %}", "{{ messages[0]['content'] | trim }}",
		"{% for m in messages %}{% if loop.first %}[{% endif %}{{ m.role | upper }}{% else %}none{% endfor %}",
		"{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}",
		"{{ raise_exception('no') }}", "{{ x.y.z }}", "{{ messages | tojson }}", "{{ 'a' if true else 'b' }}",
		"{%- if add_generation_prompt -%}\n  yes\n{%- endif -%}", "{# comment #}text", "{% raw %}{{ x }}{% endraw %}",
		"{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "{{ range(99999999999) | length }}",
	} {
		f.Add(s)
	}
	msgs := []Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Hi there"}, {Role: "assistant", Content: "Hello."}}
	f.Fuzz(func(t *testing.T, src string) {
		if len(src) > 1024 {
			src = src[:1024]
		}
		withDeadline("compiling", func() {
			tm, err := New(src, map[string]string{"bos_token": "<s>", "eos_token": "</s>"})
			if (tm == nil) == (err == nil) {
				t.Fatalf("New(%q) = %v, %v", src, tm, err)
			}
			if err != nil {
				if !strings.HasPrefix(err.Error(), "chattemplate: ") {
					t.Fatalf("New(%q): error %q", src, err)
				}
				return
			}
			if tm.Source() != src {
				t.Fatalf("Source() = %q, want %q", tm.Source(), src)
			}
			if !renderable(src) {
				return
			}
			opts := Options{AddGenerationPrompt: true, Now: fuzzNow}
			out, err := tm.RenderWith(msgs, opts)
			again, err2 := tm.RenderWith(msgs, opts)
			if out != again || (err == nil) != (err2 == nil) {
				t.Fatalf("%q: two renderings differ: %q, %v; %q, %v", src, out, err, again, err2)
			}
			if err != nil && !strings.HasPrefix(err.Error(), "chattemplate: render: ") {
				t.Fatalf("%q: error %q", src, err)
			}
			// Known differences the check leaves out: Jinja (keep_trailing_newline off) drops
			// one trailing newline and writes \r\n and \r as \n, where this engine keeps the
			// text as it is; and rewriteToJSON renames tojson in text too ("|tojson" renders
			// as "|loom_tojson").
			text := !strings.Contains(src, "{") && !strings.ContainsAny(src, "\r") && !strings.HasSuffix(src, "\n") && !strings.Contains(src, "tojson")
			if text && (err != nil || out != src) {
				t.Fatalf("text %q renders as %q, %v", src, out, err)
			}
		})
	})
}

// A list that holds itself is refused by tojson, as Python's json.dumps refuses it; the
// encoder recursed until the goroutine stack overflowed, a fatal error.
func TestToJSONCircular(t *testing.T) {
	for _, src := range []string{
		"{{ messages.append(messages) }}{{ messages | tojson }}",
		"{% set d = {} %}{{ d.update({'me': [d]}) }}{{ d | tojson(indent=2) }}",
	} {
		tm, err := New(src, nil)
		if err != nil {
			t.Fatal(err)
		}
		_, err = tm.Render([]Message{{Role: "user", Content: "hi"}}, false)
		if err == nil || !strings.Contains(err.Error(), "circular reference") {
			t.Errorf("%s: %v, want a circular reference error", src, err)
		}
	}
	// The same list twice, side by side, is no cycle.
	tm, err := New("{{ [messages, messages] | tojson }}", nil)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := tm.Render([]Message{{Role: "user", Content: "hi"}}, false); err != nil || !strings.HasPrefix(out, `[[{"role": "user"`) {
		t.Errorf("a list twice: %q, %v", out, err)
	}
}
