package transform

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/loom-ml/loom/graph"
	"go.yaml.in/yaml/v3"
)

// richConfig exercises every kind of option the decoder supports.
type richConfig struct {
	Count   int               `yaml:"count"`
	Scale   float64           `yaml:"scale"`
	Mode    string            `yaml:"mode"`
	Ops     []string          `yaml:"ops"`
	Limits  map[string]int    `yaml:"limits"`
	Nested  nestedConfig      `yaml:"nested"`
	Timeout time.Duration     `yaml:"timeout"`
	Small   uint8             `yaml:"small"`
	Extra   map[string]string `yaml:"extra"`
}

type nestedConfig struct {
	Depth int  `yaml:"depth"`
	On    bool `yaml:"on"`
}

var richDefaults = richConfig{Count: 3, Scale: 0.5, Mode: "auto", Ops: []string{"add"}, Limits: map[string]int{"a": 1}, Nested: nestedConfig{Depth: 2}}

func noopRun(context.Context, *Context, *graph.Graph, any) (Info, error) {
	return Info{Clean: true, ValidShapes: true}, nil
}

// testRegistry is the real registry plus test_rich (post_load_fusion) and test_plain
// (pattern_matcher, no options).
func testRegistry() map[string]*Transform {
	reg := map[string]*Transform{}
	for k, v := range registry {
		reg[k] = v
	}
	reg["test_rich"] = &Transform{Name: "test_rich", Stage: PostLoadFusion, Doc: "test", Config: richDefaults, Run: noopRun}
	reg["test_plain"] = &Transform{Name: "test_plain", Stage: PatternMatcher, Doc: "test", Run: noopRun}
	return reg
}

// testBase lists the test transforms the way default.yaml lists the real ones; test_rich
// comes first to show that the stage, not the listing, orders the pipeline.
const testBase = `
transforms:
  test_rich:
    stage: post_load_fusion
    enabled: false
    count: 3
    limits: {a: 1}
  test_plain:
    stage: pattern_matcher
    enabled: true
`

func load(t *testing.T, layers ...layer) (*Config, error) {
	t.Helper()
	all := append([]layer{{name: "transform/default.yaml", data: defaultYAML}, {name: "base.yaml", data: []byte(testBase)}}, layers...)
	return loadLayers(all, testRegistry())
}

func yamlLayer(name, text string) layer { return layer{name: name, data: []byte(text)} }
func setLayer(s string) layer           { return layer{name: "--set " + s, set: s, isSet: true} }

func TestConfigLayering(t *testing.T) {
	cfg, err := load(t,
		yamlLayer("overlays/llama.yaml", `
transforms:
  test_rich:
    enabled: true
    mode: overlay
    nested: {depth: 5}
`),
		yamlLayer("a.yaml", `
transforms:
  test_rich:
    count: 10
    ops: [mul, div]
    limits: {b: 2}
  cleanup_cse:
    enabled: false
`),
		yamlLayer("b.yaml", `
transforms:
  test_rich:
    count: 20
    nested: {on: true}
    timeout: 1.5s
  cleanup_cse:
`),
		setLayer("transforms.test_rich.scale=2"),
		setLayer("transforms.test_rich.ops=[sub]"),
		setLayer("transforms.cleanup_noop.enabled=false"),
		setLayer("transforms.test_rich.extra.k=v"),
	)
	if err != nil {
		t.Fatal(err)
	}
	got := cfg.Entry("test_rich").Options.(richConfig)
	want := richConfig{
		Count:   20,                               // b.yaml over a.yaml
		Scale:   2,                                // --set, an integer read into a float
		Mode:    "overlay",                        // overlay, untouched by the files
		Ops:     []string{"sub"},                  // lists replace, they do not append
		Limits:  map[string]int{"a": 1, "b": 2},   // mappings merge key by key
		Nested:  nestedConfig{Depth: 5, On: true}, // deep merge: overlay depth, b.yaml on
		Timeout: 1500 * time.Millisecond,
		Extra:   map[string]string{"k": "v"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("test_rich options:\n got %+v\nwant %+v", got, want)
	}
	if !cfg.Entry("test_rich").Enabled {
		t.Error("test_rich: the overlay's enabled: true was lost")
	}
	if cfg.Entry("cleanup_cse").Enabled {
		t.Error("cleanup_cse: a.yaml disabled it and b.yaml's empty key must not re-enable it")
	}
	if cfg.Entry("cleanup_noop").Enabled {
		t.Error("cleanup_noop: --set enabled=false was lost")
	}
	if !reflect.DeepEqual(richDefaults.Limits, map[string]int{"a": 1}) || !reflect.DeepEqual(richDefaults.Ops, []string{"add"}) {
		t.Errorf("decoding changed the defaults: %+v", richDefaults)
	}
	// The stage orders the pipeline; within a stage, the order of the listing. The real
	// transforms of later stages are left out of the comparison.
	var order []string
	for i, e := range cfg.Entries() {
		if i > 0 && e.Transform.Stage < cfg.Entries()[i-1].Transform.Stage {
			t.Errorf("%s (%s) runs after %s", e.Transform.Name, e.Transform.Stage, cfg.Entries()[i-1].Transform.Name)
		}
		if e.Transform.Stage == PostExport || strings.HasPrefix(e.Transform.Name, "test_") {
			order = append(order, e.Transform.Name)
		}
	}
	wantOrder := []string{"cleanup_noop", "cleanup_cse", "cleanup_dead_code", "test_plain", "test_rich"}
	if !reflect.DeepEqual(order, wantOrder) {
		t.Errorf("run order %v, want %v", order, wantOrder)
	}
}

func TestConfigErrors(t *testing.T) {
	tests := []struct {
		name   string
		layers []layer
		want   []string // all must appear in the error
	}{
		{"unknown transform", []layer{yamlLayer("user.yaml", "transforms:\n  fuse_everything:\n    enabled: true\n")},
			[]string{"user.yaml:2", "transforms.fuse_everything", "unknown transform", "cleanup_cse"}},
		{"unknown transform by --set", []layer{setLayer("transforms.nope.enabled=false")},
			[]string{"--set transforms.nope.enabled=false", "transforms.nope", "unknown transform"}},
		{"unknown option", []layer{yamlLayer("user.yaml", "transforms:\n  cleanup_cse:\n    commutativ: false\n")},
			[]string{"user.yaml:3", "transforms.cleanup_cse.commutativ", "unknown option", "commutative, exclude_ops"}},
		{"option of a transform without options", []layer{yamlLayer("user.yaml", "transforms:\n  cleanup_dead_code:\n    aggressive: true\n")},
			[]string{"user.yaml:3", "transforms.cleanup_dead_code.aggressive", "has no options"}},
		{"unknown nested option", []layer{yamlLayer("n.yaml", "transforms:\n  test_rich:\n    nested:\n      width: 1\n")},
			[]string{"n.yaml:4", "transforms.test_rich.nested.width", "unknown option", "depth, on"}},
		{"string for a bool", []layer{yamlLayer("b.yaml", "transforms:\n  cleanup_noop:\n    cast: \"yes\"\n")},
			[]string{"b.yaml:3", "transforms.cleanup_noop.cast", "want true or false", `the string "yes"`}},
		{"bool for a string", []layer{yamlLayer("b.yaml", "transforms:\n  test_rich:\n    mode: true\n")},
			[]string{"b.yaml:3", "transforms.test_rich.mode", "want a string", "the bool true"}},
		{"float for an int", []layer{yamlLayer("b.yaml", "transforms:\n  test_rich:\n    count: 1.5\n")},
			[]string{"b.yaml:3", "transforms.test_rich.count", "want an integer", "1.5"}},
		{"string for an int by --set", []layer{setLayer("transforms.test_rich.count=many")},
			[]string{"--set transforms.test_rich.count=many", "transforms.test_rich.count", "want an integer"}},
		{"overflow", []layer{yamlLayer("b.yaml", "transforms:\n  test_rich:\n    small: 300\n")},
			[]string{"b.yaml:3", "transforms.test_rich.small", "fits uint8"}},
		{"null for an int", []layer{yamlLayer("b.yaml", "transforms:\n  test_rich:\n    count: ~\n")},
			[]string{"b.yaml:3", "want an integer", "null"}},
		{"scalar for a list", []layer{yamlLayer("b.yaml", "transforms:\n  cleanup_cse:\n    exclude_ops: const\n")},
			[]string{"b.yaml:3", "transforms.cleanup_cse.exclude_ops", "want a list"}},
		{"wrong list element", []layer{yamlLayer("b.yaml", "transforms:\n  cleanup_cse:\n    exclude_ops: [const, 3]\n")},
			[]string{"b.yaml:3", "transforms.cleanup_cse.exclude_ops[1]", "want a string"}},
		{"wrong map value", []layer{yamlLayer("b.yaml", "transforms:\n  test_rich:\n    limits: {a: x}\n")},
			[]string{"b.yaml:3", "transforms.test_rich.limits.a", "want an integer"}},
		{"bad duration", []layer{yamlLayer("b.yaml", "transforms:\n  test_rich:\n    timeout: soon\n")},
			[]string{"b.yaml:3", "transforms.test_rich.timeout", "duration"}},
		{"enabled not a bool", []layer{yamlLayer("e.yaml", "transforms:\n  cleanup_cse:\n    enabled: 1\n")},
			[]string{"e.yaml:3", "transforms.cleanup_cse.enabled", "want true or false"}},
		{"stage moved", []layer{yamlLayer("s.yaml", "transforms:\n  cleanup_cse:\n    stage: cache_init\n")},
			[]string{"s.yaml:3", "transforms.cleanup_cse.stage", "runs in stage post_export, not cache_init"}},
		{"unknown stage", []layer{yamlLayer("s.yaml", "transforms:\n  cleanup_cse:\n    stage: later\n")},
			[]string{"s.yaml:3", "unknown stage \"later\""}},
		{"settings not a mapping", []layer{yamlLayer("m.yaml", "transforms:\n  cleanup_cse: off\n")},
			[]string{"m.yaml:2", "transforms.cleanup_cse", "want a mapping"}},
		{"unknown top-level key", []layer{yamlLayer("t.yaml", "passes:\n  cleanup_cse: {}\n")},
			[]string{"t.yaml:1", "passes", "unknown key"}},
		{"not a mapping", []layer{yamlLayer("l.yaml", "- a\n- b\n")},
			[]string{"l.yaml:1", "must be a mapping"}},
		{"duplicate key", []layer{yamlLayer("d.yaml", "transforms:\n  cleanup_cse:\n    enabled: true\n    enabled: false\n")},
			[]string{"d.yaml:4", "transforms.cleanup_cse.enabled", "given twice", "line 3"}},
		{"YAML syntax", []layer{yamlLayer("y.yaml", "transforms: [\n")},
			[]string{"y.yaml", "yaml"}},
		{"--set without =", []layer{setLayer("transforms.cleanup_cse.enabled")},
			[]string{"--set transforms.cleanup_cse.enabled", "key=value"}},
		{"--set with an empty key part", []layer{setLayer("transforms..enabled=true")},
			[]string{"empty key component"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := load(t, tt.layers...)
			if err == nil {
				t.Fatalf("no error, want one containing %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\ndoes not contain %q", err, w)
				}
			}
		})
	}
}

func TestConfigMissingEntries(t *testing.T) {
	// The real default.yaml does not list the test transforms: every registered transform
	// must be listed, with stage and enabled.
	_, err := loadLayers([]layer{{name: "transform/default.yaml", data: defaultYAML}}, testRegistry())
	if err == nil || !strings.Contains(err.Error(), "test_plain, test_rich") {
		t.Errorf("error %v, want one naming test_plain, test_rich", err)
	}
	_, err = loadLayers([]layer{{name: "transform/default.yaml", data: defaultYAML},
		yamlLayer("base.yaml", "transforms:\n  test_rich: {stage: post_load_fusion}\n  test_plain: {stage: pattern_matcher, enabled: true}\n")}, testRegistry())
	if err == nil || !strings.Contains(err.Error(), "base.yaml:2") || !strings.Contains(err.Error(), "needs both stage and enabled") {
		t.Errorf("error %v, want one about stage and enabled at base.yaml:2", err)
	}
}

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a.yaml")
	b := filepath.Join(dir, "b.yaml")
	write := func(path, text string) {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(a, "transforms:\n  cleanup_cse:\n    exclude_ops: [const]\n    commutative: false\n")
	write(b, "transforms:\n  cleanup_cse:\n    exclude_ops: [param]\n")
	overlays := fstest.MapFS{"overlays/llama.yaml": {Data: []byte("transforms:\n  cleanup_noop:\n    cast: false\n    enabled: false\n")}}

	cfg, err := LoadConfig(ConfigOptions{Arch: "llama", Overlays: overlays, Files: []string{a, b},
		Sets: []string{"transforms.cleanup_noop.enabled=true"}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.Entry("cleanup_cse").Options, (CSEConfig{Commutative: false, ExcludeOps: []string{"param"}}); !reflect.DeepEqual(got, want) {
		t.Errorf("cleanup_cse options %+v, want %+v", got, want)
	}
	noop := cfg.Entry("cleanup_noop")
	if got, want := noop.Options, (NoopConfig{Reshape: true, Transpose: true, Cast: false, Views: true}); !reflect.DeepEqual(got, want) || !noop.Enabled {
		t.Errorf("cleanup_noop enabled=%v options %+v, want enabled with %+v", noop.Enabled, got, want)
	}

	// An architecture without an overlay is fine; a missing user file is not.
	if _, err := LoadConfig(ConfigOptions{Arch: "gpt_neox", Overlays: overlays}); err != nil {
		t.Errorf("no overlay for gpt_neox: %v", err)
	}
	if _, err := LoadConfig(ConfigOptions{Arch: "llama"}); err != nil {
		t.Errorf("built-in overlays: %v", err)
	}
	if _, err := LoadConfig(ConfigOptions{Files: []string{filepath.Join(dir, "missing.yaml")}}); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("missing file: error %v", err)
	}
	write(a, "transforms:\n  cleanup_cse:\n    exclude_ops: nope\n")
	if _, err := LoadConfig(ConfigOptions{Files: []string{a}}); err == nil || !strings.Contains(err.Error(), a+":3") {
		t.Errorf("wrong type in a user file: error %v, want it to name %s:3", err, a)
	}
	overlays["overlays/llama.yaml"] = &fstest.MapFile{Data: []byte("transforms:\n  cleanup_noop:\n    casts: false\n")}
	if _, err := LoadConfig(ConfigOptions{Arch: "llama", Overlays: overlays}); err == nil || !strings.Contains(err.Error(), "overlays/llama.yaml:3") {
		t.Errorf("unknown option in an overlay: error %v, want it to name overlays/llama.yaml:3", err)
	}
}

// TestDefaultYAML holds default.yaml to the registry: every transform listed with its stage
// and every option, at the value of the Go default.
func TestDefaultYAML(t *testing.T) {
	cfg, err := DefaultConfig()
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(defaultYAML, &doc); err != nil {
		t.Fatal(err)
	}
	listed := doc.Content[0].Content[1]
	for _, tr := range All() {
		e := cfg.Entry(tr.Name)
		if e == nil {
			t.Errorf("%s is not in default.yaml", tr.Name)
			continue
		}
		if !reflect.DeepEqual(e.Options, tr.DefaultConfig()) {
			t.Errorf("%s: default.yaml gives options %+v, the Go default is %+v", tr.Name, e.Options, tr.DefaultConfig())
		}
		if tr.Config == nil {
			continue
		}
		settings := listed.Content[mapIndex(listed, tr.Name)+1]
		for _, f := range optionFields(reflect.TypeOf(tr.Config)) {
			if mapIndex(settings, f.name) < 0 {
				t.Errorf("%s: default.yaml does not list option %s", tr.Name, f.name)
			}
		}
	}
}

func TestDecodeOptions(t *testing.T) {
	got, err := DecodeOptions(CleanupNoop, "case.txtar", []byte("enabled: true\ncast: false\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := (NoopConfig{Reshape: true, Transpose: true, Views: true}); got != want {
		t.Errorf("got %+v, want %+v", got, want)
	}
	if got, err := DecodeOptions(CleanupNoop, "case.txtar", nil); err != nil || got != CleanupNoop.Config {
		t.Errorf("no options: got %+v, %v; want the defaults", got, err)
	}
	if _, err := DecodeOptions(CleanupNoop, "case.txtar", []byte("cast: 1\n")); err == nil || !strings.Contains(err.Error(), "case.txtar:1: cast: want true or false") {
		t.Errorf("error %v", err)
	}
	if _, err := DecodeOptions(CleanupDeadCode, "case.txtar", []byte("x: 1\n")); err == nil || !strings.Contains(err.Error(), "has no options") {
		t.Errorf("error %v", err)
	}
}

func TestConfigString(t *testing.T) {
	cfg, err := LoadConfig(ConfigOptions{Sets: []string{"transforms.cleanup_cse.exclude_ops=[const]"}})
	if err != nil {
		t.Fatal(err)
	}
	s := cfg.String()
	for _, want := range []string{"  cleanup_cse:\n    stage: post_export\n    enabled: true\n    commutative: true\n    exclude_ops:\n        - const\n"} {
		if !strings.Contains(s, want) {
			t.Errorf("String() =\n%s\nwant it to contain\n%s", s, want)
		}
	}
	// What String prints loads back to the same configuration.
	dir := t.TempDir()
	path := filepath.Join(dir, "printed.yaml")
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	again, err := LoadConfig(ConfigOptions{Files: []string{path}})
	if err != nil {
		t.Fatal(err)
	}
	if again.String() != s {
		t.Errorf("round trip:\n%s\nwant\n%s", again.String(), s)
	}
}
