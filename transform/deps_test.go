package transform

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestDefaultPipelineKeepsDeps loads default.yaml in the ways Loom does and holds each
// result to every transform's After declarations: each dependency runs earlier.
func TestDefaultPipelineKeepsDeps(t *testing.T) {
	var allOff, allOn []string
	for _, tr := range All() {
		allOff = append(allOff, "transforms."+tr.Name+".enabled=false")
		allOn = append(allOn, "transforms."+tr.Name+".enabled=true")
	}
	tests := []struct {
		name string
		opts ConfigOptions
	}{
		{"default.yaml", ConfigOptions{}},
		{"llama", ConfigOptions{Arch: "llama"}},
		{"every transform disabled", ConfigOptions{Sets: allOff}},
		{"every transform enabled", ConfigOptions{Sets: allOn}},
		{"the engine's cache stage", ConfigOptions{Enable: []*Transform{InsertCachedAttention, GatherLogits}}},
	}
	declared := 0
	for _, tt := range tests {
		cfg, err := LoadConfig(tt.opts)
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		pos := map[string]int{}
		for i, e := range cfg.Entries() {
			pos[e.Transform.Name] = i
		}
		for _, e := range cfg.Entries() {
			for _, d := range e.Transform.After {
				declared++
				if j, ok := pos[d.Transform.Name]; !ok || j >= pos[e.Transform.Name] {
					t.Errorf("%s: %s runs at %d, its dependency %s at %d (listed: %t)", tt.name, e.Transform.Name, pos[e.Transform.Name], d.Transform.Name, j, ok)
				}
			}
		}
	}
	if declared == 0 {
		t.Error("no transform declares a dependency")
	}
}

// reorder returns default.yaml with transform move listed just before transform before (last
// when before is empty).
func reorder(t *testing.T, move, before string) []byte {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal(defaultYAML, &doc); err != nil {
		t.Fatal(err)
	}
	m := doc.Content[0].Content[mapIndex(doc.Content[0], "transforms")+1]
	i := mapIndex(m, move)
	if i < 0 || before != "" && mapIndex(m, before) < 0 {
		t.Fatalf("default.yaml does not list %s and %s", move, before)
	}
	pair := append([]*yaml.Node(nil), m.Content[i:i+2]...)
	m.Content = append(m.Content[:i], m.Content[i+2:]...)
	if before == "" {
		m.Content = append(m.Content, pair...)
	} else {
		j := mapIndex(m, before)
		m.Content = append(m.Content[:j], append(pair, m.Content[j:]...)...)
	}
	out, err := yaml.Marshal(&doc)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestReorderedPipeline lists one transform elsewhere in default.yaml: before a transform it
// must follow is an error naming both and the reason, disabled or not; anywhere its
// dependencies still come first (or in another stage's part of the file, since the stage
// decides first) is fine.
func TestReorderedPipeline(t *testing.T) {
	tests := []struct {
		move, before string
		want         []string // in the error; none: the order is fine
	}{
		{"fuse_qkv_rope", "fuse_gemms", []string{"fuse_qkv_rope must run after fuse_gemms", "fuse_gemms makes the split of the fused q/k/v linear"}},
		{"fuse_split_swiglu", "fuse_gemms", []string{"fuse_split_swiglu must run after fuse_gemms"}},
		{"fuse_linear_qkv_rope", "fuse_qkv_rope", []string{"fuse_linear_qkv_rope must run after fuse_qkv_rope", "makes the qkv_rope"}},
		{"fuse_linear_swiglu", "fuse_split_swiglu", []string{"fuse_linear_swiglu must run after fuse_split_swiglu"}},
		{"fuse_add_rmsnorm", "fuse_allreduce_residual_rmsnorm", []string{"fuse_add_rmsnorm must run after fuse_allreduce_residual_rmsnorm", "first pick"}},
		{"fuse_linear_allreduce", "fuse_allreduce_residual_rmsnorm", []string{"fuse_linear_allreduce must run after fuse_allreduce_residual_rmsnorm"}},
		{"cleanup_cse", "cleanup_noop", []string{"cleanup_cse must run after cleanup_noop"}},
		{"cleanup_dead_code", "cleanup_cse", []string{"cleanup_dead_code must run after cleanup_cse"}},
		{"match_eager_attention", "match_repeat_kv", []string{"match_eager_attention must run after match_repeat_kv"}},
		{"sharding_executor", "detect_sharding", []string{"sharding_executor must run after detect_sharding"}},
		// rewrite_all_gather_as_all_reduce is disabled by default: the order holds all the same.
		{"rewrite_all_gather_as_all_reduce", "sharding_executor", []string{"rewrite_all_gather_as_all_reduce must run after sharding_executor"}},
		// So is insert_cached_attention, the dependency here.
		{"fuse_attention_transpose", "insert_cached_attention", []string{"fuse_attention_transpose must run after insert_cached_attention", "makes the paged_attention"}},
		{"gather_logits", "insert_cached_attention", []string{"gather_logits must run after insert_cached_attention"}},
		// Orders that keep every dependency.
		{"fuse_split_swiglu", "fuse_qkv_rope", nil},
		{"fuse_allreduce_residual_rmsnorm", "fuse_gemms", nil},
		{"match_swiglu_pattern", "match_rmsnorm_pattern", nil},
		// Last in the file, still last of post_export.
		{"cleanup_dead_code", "", nil},
		// First in the file, first of post_load_fusion: before fuse_gemms.
		{"fuse_qkv_rope", "cleanup_noop", []string{"fuse_qkv_rope must run after fuse_gemms"}},
	}
	for _, tt := range tests {
		name := tt.move + " before " + tt.before
		_, err := loadLayers([]layer{{name: "reordered.yaml", data: reorder(t, tt.move, tt.before)}}, registry)
		if tt.want == nil {
			if err != nil {
				t.Errorf("%s: %v", name, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		for _, w := range append([]string{"reordered.yaml:", "transforms." + tt.move + ":", "is listed before it"}, tt.want...) {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not say %q", name, err, w)
			}
		}
	}
}

// TestDepErrors covers dependencies that no listing can keep: on a transform that is not
// registered, and (for declarations that skipped Register's checks) on a later stage.
func TestDepErrors(t *testing.T) {
	reg := testRegistry()
	ghost := &Transform{Name: "test_ghost", Stage: PostExport, Doc: "test", Run: noopRun}
	reg["test_plain"] = &Transform{Name: "test_plain", Stage: PatternMatcher, Doc: "test", Run: noopRun,
		After: []Dep{{ghost, "test_ghost feeds it"}}}
	_, err := loadLayers([]layer{{name: "transform/default.yaml", data: defaultYAML}, {name: "base.yaml", data: []byte(testBase)}}, reg)
	if err == nil || !strings.Contains(err.Error(), "base.yaml:8: transforms.test_plain: test_plain must run after test_ghost, which is not registered: test_ghost feeds it") {
		t.Errorf("dependency on an unregistered transform: error %v", err)
	}
	reg["test_plain"].After = []Dep{{FuseGEMMs, "fuse_gemms feeds it"}}
	_, err = loadLayers([]layer{{name: "transform/default.yaml", data: defaultYAML}, {name: "base.yaml", data: []byte(testBase)}}, reg)
	if err == nil || !strings.Contains(err.Error(), "test_plain must run after fuse_gemms, but its stage pattern_matcher comes before fuse_gemms's stage post_load_fusion: fuse_gemms feeds it") {
		t.Errorf("dependency on a later stage: error %v", err)
	}
}

// TestEnable turns transforms on through ConfigOptions.Enable and Flags.Enable: over
// default.yaml and the files, under the --set flags.
func TestEnable(t *testing.T) {
	dir := t.TempDir()
	off := filepath.Join(dir, "off.yaml")
	if err := os.WriteFile(off, []byte("transforms:\n  insert_cached_attention: {enabled: false}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cache := []*Transform{InsertCachedAttention, GatherLogits}
	tests := []struct {
		name          string
		opts          ConfigOptions
		cached, logit bool
	}{
		{"default", ConfigOptions{}, false, false},
		{"enabled", ConfigOptions{Enable: cache}, true, true},
		{"enabled over a file", ConfigOptions{Files: []string{off}, Enable: cache}, true, true},
		{"a --set wins", ConfigOptions{Enable: cache, Sets: []string{"transforms.insert_cached_attention.enabled=false"}}, false, true},
	}
	for _, tt := range tests {
		cfg, err := LoadConfig(tt.opts)
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if got := cfg.Entry(InsertCachedAttention.Name).Enabled; got != tt.cached {
			t.Errorf("%s: insert_cached_attention enabled %t, want %t", tt.name, got, tt.cached)
		}
		if got := cfg.Entry(GatherLogits.Name).Enabled; got != tt.logit {
			t.Errorf("%s: gather_logits enabled %t, want %t", tt.name, got, tt.logit)
		}
	}
	f := Flags{Enable: cache}
	if o, err := f.Optimizer("llama"); err != nil || !o.Config.Entry(GatherLogits.Name).Enabled {
		t.Errorf("Flags.Enable: %v", err)
	}
	if _, err := LoadConfig(ConfigOptions{Enable: []*Transform{GatherLogits, nil}}); err == nil || !strings.Contains(err.Error(), "ConfigOptions.Enable[1] is nil") {
		t.Errorf("a nil transform: error %v", err)
	}
	stray := &Transform{Name: "test_stray", Stage: PostExport, Doc: "test", Run: noopRun}
	if _, err := LoadConfig(ConfigOptions{Enable: []*Transform{stray}}); err == nil || !strings.Contains(err.Error(), "ConfigOptions.Enable: transforms.test_stray: unknown transform") {
		t.Errorf("an unregistered transform: error %v", err)
	}
}
