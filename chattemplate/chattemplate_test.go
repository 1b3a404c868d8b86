package chattemplate

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loom-ml/loom/tokenizer"
)

type chatReference struct {
	Chat struct {
		Messages []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
		Rendered string `json:"rendered"`
		IDs      []int  `json:"ids"`
	} `json:"chat"`
}

// TestFixtures renders each fixture's chat case and checks the text and ids against what
// transformers' apply_chat_template produced.
func TestFixtures(t *testing.T) {
	dirs, err := filepath.Glob("../testdata/tiny-*")
	if err != nil || len(dirs) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	for _, dir := range dirs {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(dir, "reference.json"))
			if err != nil {
				t.Fatal(err)
			}
			var ref chatReference
			if err := json.Unmarshal(data, &ref); err != nil {
				t.Fatal(err)
			}
			if len(ref.Chat.Messages) == 0 || ref.Chat.Rendered == "" || len(ref.Chat.IDs) == 0 {
				t.Fatalf("reference.json has no chat case (%d messages, rendered %q, %d ids)", len(ref.Chat.Messages), ref.Chat.Rendered, len(ref.Chat.IDs))
			}
			tmpl, err := Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			var msgs []Message
			for _, m := range ref.Chat.Messages {
				msgs = append(msgs, Message{Role: m.Role, Content: m.Content})
			}
			got, err := tmpl.Render(msgs, true)
			if err != nil {
				t.Fatal(err)
			}
			if got != ref.Chat.Rendered {
				t.Fatalf("Render\n got %q\nwant %q", got, ref.Chat.Rendered)
			}
			tok, err := tokenizer.LoadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			ids, err := tok.Encode(got, false)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(ids, ref.Chat.IDs) {
				t.Errorf("ids\n got %v\nwant %v", ids, ref.Chat.IDs)
			}
		})
	}
}

func TestRender(t *testing.T) {
	special := map[string]string{"bos_token": "<s>", "eos_token": "</s>"}
	user := []Message{{Role: "user", Content: "  hi  "}}
	tests := []struct {
		name, src string
		msgs      []Message
		opts      Options
		want      string
	}{
		{"special tokens", "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}", user, Options{}, "<s>  hi  </s>"},
		{"trim filter", "{{ messages[0]['content'] | trim }}|", user, Options{}, "hi|"},
		{"filter binds before +", "{{ '[' + messages[0]['content'] | trim + ']' }}", user, Options{}, "[hi]"},
		{"generation prompt on", "{% if add_generation_prompt %}GEN{% endif %}", user, Options{AddGenerationPrompt: true}, "GEN"},
		{"generation prompt off", "{% if add_generation_prompt %}GEN{% endif %}", user, Options{}, ""},
		{"tools none", "{% if tools is none %}none{% endif %}{% if documents is none %}!{% endif %}", user, Options{}, "none!"},
		{"tools tojson", "{{ tools | tojson }}", user,
			Options{Tools: []any{json.RawMessage(`{"name":"f","parameters":{"z":1,"a":"é<>"}}`)}},
			`[{"name": "f", "parameters": {"z": 1, "a": "é<>"}}]`},
		{"tojson separators", "{{ messages[0] | tojson(separators=(',', ':')) }}", user, Options{}, `{"role":"user","content":"  hi  "}`},
		{"message fields", "{{ messages[0].tool_calls[0].function.name }}",
			[]Message{{Role: "assistant", Fields: map[string]any{"tool_calls": json.RawMessage(`[{"function":{"name":"get"}}]`)}}},
			Options{}, "get"},
		{"content override", "{% if messages[0].content is none %}null{% endif %}",
			[]Message{{Role: "assistant", Content: "x", Fields: map[string]any{"content": nil}}}, Options{}, "null"},
		{"vars", "{% if enable_thinking %}think{% endif %}", user, Options{Vars: map[string]any{"enable_thinking": true}}, "think"},
		{"strftime_now", `{{ strftime_now("%d %b %Y, %H:%M") }}`, user,
			Options{Now: func() time.Time { return time.Date(2024, 7, 9, 14, 5, 0, 0, time.UTC) }}, "09 Jul 2024, 14:05"},
		{"trim_blocks and lstrip_blocks", "{% for m in messages %}\n  {{ m.role }}\n{% endfor %}", user, Options{}, "  user\n"},
		{"namespace", "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}", user, Options{}, "1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmpl, err := New(tt.src, special)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tmpl.RenderWith(tt.msgs, tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// TestReservedVars: Options.Vars (a request's chat_template_kwargs) cannot replace the
// variables the renderer sets: the conversation, the special tokens, the functions.
func TestReservedVars(t *testing.T) {
	tmpl, err := New("{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}GEN{% endif %}{{ eos_token }}",
		map[string]string{"bos_token": "<s>", "eos_token": "</s>"})
	if err != nil {
		t.Fatal(err)
	}
	user := []Message{{Role: "user", Content: "hi"}}
	for _, name := range []string{"messages", "bos_token", "eos_token", "add_generation_prompt", "tools", "documents", "raise_exception", tojsonName, "strftime_now", "range"} {
		t.Run(name, func(t *testing.T) {
			out, err := tmpl.RenderWith(user, Options{Vars: map[string]any{name: json.RawMessage(`[{"role": "system", "content": "injected"}]`), "enable_thinking": true}})
			var rv *ReservedVarError
			if !errors.As(err, &rv) || rv.Name != name {
				t.Errorf("got %q, %v; want a ReservedVarError naming %s", out, err, name)
			}
		})
	}
	out, err := tmpl.RenderWith(user, Options{AddGenerationPrompt: true, Vars: map[string]any{"enable_thinking": false, "custom": 1}})
	if err != nil || out != "<s>hiGEN</s>" {
		t.Errorf("other vars: got %q, %v", out, err)
	}
}

// TestRange: range behaves as Python's, but refuses more than 100,000 items, as Hugging
// Face's sandboxed Jinja does, rather than allocate without bound.
func TestRange(t *testing.T) {
	for _, tc := range []struct {
		src, want, err string
	}{
		{"{{ range(3) | join(',') }}", "0,1,2", ""},
		{"{{ range(2, 5) | join(',') }}", "2,3,4", ""},
		{"{{ range(10, 0, -3) | join(',') }}", "10,7,4,1", ""},
		{"{{ range(5, 2) | length }}", "0", ""},
		{"{{ range(-3) | length }}", "0", ""},
		{"{{ range(100000) | length }}", "100000", ""},
		{"{{ range(0, 200000, 2) | last }}", "199998", ""},
		{"{% for i in range(10**12) %}x{% endfor %}", "", "too many"},
		{"{{ range(100001) | length }}", "", "too many"},
		{"{{ range(-9223372036854775807 - 1, 9223372036854775807) | length }}", "", "too many"},
		{"{{ range(9223372036854775807, -9223372036854775807 - 1, -1) | length }}", "", "too many"},
		{"{{ range(0, 9223372036854775807, 4611686018427387904) | join(',') }}", "0,4611686018427387904", ""},
		{"{{ range(1, 2, 0) }}", "", "step must not be zero"},
		{"{{ range(1.5) }}", "", "not an integer"},
		{"{{ range('3') }}", "", "not an integer"},
		{"{{ range(10**30) | length }}", "", "too many"},
		{"{{ range(2**2) | join(',') }}", "0,1,2,3", ""},
		{"{{ range(true) | join(',') }}", "0", ""},
		{"{{ range() }}", "", "expected 1 to 3 arguments"},
	} {
		t.Run(tc.src, func(t *testing.T) {
			tmpl, err := New(tc.src, nil)
			if err != nil {
				t.Fatal(err)
			}
			var out string
			withDeadline("rendering", func() { out, err = tmpl.Render(nil, false) })
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("got %q, %v; want an error containing %q", out, err, tc.err)
				}
				return
			}
			if err != nil || out != tc.want {
				t.Errorf("got %q, %v; want %q", out, err, tc.want)
			}
		})
	}
}

func TestRaiseException(t *testing.T) {
	tmpl, err := New("{% if messages[0].role != 'system' %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}ok", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, err = tmpl.Render([]Message{{Role: "user", Content: "x"}}, false)
	var re *RaiseError
	if !errors.As(err, &re) || re.Message != "Conversation roles must alternate" {
		t.Fatalf("err = %v, want a RaiseError with the template's message", err)
	}
	if got, err := tmpl.Render([]Message{{Role: "system"}}, false); err != nil || got != "ok" {
		t.Fatalf("Render = %q, %v", got, err)
	}
}

func writeFiles(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestLoadSources(t *testing.T) {
	listCfg := `{"bos_token": {"content": "<s>", "special": true}, "chat_template": [
		{"name": "default", "template": "D{{ bos_token }}"}, {"name": "tool_use", "template": "T"}]}`
	tests := []struct {
		name    string
		files   map[string]string
		tmpl    string
		want    string
		wantErr string
	}{
		{"config string", map[string]string{"tokenizer_config.json": `{"eos_token": "</s>", "chat_template": "S{{ eos_token }}"}`}, "", "S</s>", ""},
		{"config list default", map[string]string{"tokenizer_config.json": listCfg}, "", "D<s>", ""},
		{"config list named", map[string]string{"tokenizer_config.json": listCfg}, "tool_use", "T", ""},
		{"config list missing name", map[string]string{"tokenizer_config.json": listCfg}, "rag", "", "have default, tool_use"},
		{"jinja file wins", map[string]string{"tokenizer_config.json": `{"chat_template": "C"}`, "chat_template.jinja": "J"}, "", "J", ""},
		{"additional template file", map[string]string{"additional_chat_templates/rag.jinja": "R"}, "rag", "R", ""},
		{"no template", map[string]string{"tokenizer_config.json": `{}`}, "", "", "no chat template"},
		{"bad config", map[string]string{"tokenizer_config.json": `{`}, "", "", "invalid JSON"},
		{"bad template", map[string]string{"chat_template.jinja": "{% if %}"}, "", "", "template \"default\""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := writeFiles(t, tt.files)
			tmpl, err := LoadNamed(dir, tt.tmpl)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got, err := tmpl.Render(nil, false)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestStrftime(t *testing.T) {
	tm := time.Date(2025, 1, 5, 0, 7, 9, 123456000, time.UTC)
	tests := []struct{ format, want string }{
		{"%Y-%m-%d", "2025-01-05"},
		{"%d %B %Y", "05 January 2025"},
		{"%a %A %b %j", "Sun Sunday Jan 005"},
		{"%I:%M:%S %p", "12:07:09 AM"},
		{"%f %% %q 1", "123456 % %q 1"},
	}
	for _, tt := range tests {
		if got := strftime(tm, tt.format); got != tt.want {
			t.Errorf("strftime(%q) = %q, want %q", tt.format, got, tt.want)
		}
	}
}

// TestToJSON checks the tojson filter against Python's json.dumps(x, ensure_ascii=False, ...),
// which transformers uses.
func TestToJSON(t *testing.T) {
	tests := []struct {
		name, src, data, want string
	}{
		{"defaults", "{{ x | tojson }}", `{"b": 1, "a": [1, 2.5, null, true, "é\n\"<>&\u0001\u007f"]}`,
			`{"b": 1, "a": [1, 2.5, null, true, "é\n\"<>&\u0001` + "\x7f" + `"]}`},
		{"indent keeps key order", "{{ x | tojson(indent=2) }}", `{"b": 1, "a": [1, 2.5], "c": {}, "d": []}`,
			"{\n  \"b\": 1,\n  \"a\": [\n    1,\n    2.5\n  ],\n  \"c\": {},\n  \"d\": []\n}"},
		{"sort keys", "{{ x | tojson(sort_keys=true) }}", `{"b": 1, "a": {"d": 0, "c": 1}}`, `{"a": {"c": 1, "d": 0}, "b": 1}`},
		{"separators", "{{ x|tojson(separators=(',', ':')) }}", `{"a": [1, 2]}`, `{"a":[1,2]}`},
		{"floats", "{{ x | tojson }}", `[1.0, 1e-05, 1e16, 123456789012345.0, 0.1, -0.0, 1.5e300]`,
			`[1.0, 1e-05, 1e+16, 123456789012345.0, 0.1, -0.0, 1.5e+300]`},
		{"string", "{{ 'a\"b' | tojson }}", `null`, `"a\"b"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmpl, err := New(tt.src, nil)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tmpl.RenderWith(nil, Options{Vars: map[string]any{"x": json.RawMessage(tt.data)}})
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
	// The source is kept as written.
	if tmpl, _ := New("{{ x | tojson }}", nil); tmpl.Source() != "{{ x | tojson }}" {
		t.Errorf("Source() = %q", tmpl.Source())
	}
}
