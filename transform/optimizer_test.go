package transform

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/loom-ml/loom/graph"
)

const smallGraph = `graph g(x: f32[4]) {
  %0 = reshape(%x) {shape=[4]} : f32[4] @model
  %1 = neg(%0) : f32[4] @model
  %2 = neg(%0) : f32[4] @model
  %3 = add(%1, %2) : f32[4] @model
  return %3
}
`

// postExportConfig is the default configuration with every stage after post_export
// disabled, for tests of the optimizer's own workings that should not change whenever a
// later transform is added.
func postExportConfig(t *testing.T) *Config {
	t.Helper()
	var sets []string
	for _, tr := range All() {
		if tr.Stage != PostExport {
			sets = append(sets, "transforms."+tr.Name+".enabled=false")
		}
	}
	cfg, err := LoadConfig(ConfigOptions{Sets: sets})
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func parse(t *testing.T, text string) *graph.Graph {
	t.Helper()
	g, err := graph.Parse(text)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// testConfig enables the given transforms, in order.
func testConfig(ts ...*Transform) *Config {
	c := &Config{byName: map[string]*Entry{}}
	for _, t := range ts {
		e := &Entry{Transform: t, Enabled: true, Options: t.DefaultConfig()}
		c.entries = append(c.entries, e)
		c.byName[t.Name] = e
	}
	return c
}

func fake(name string, stage Stage, run RunFunc) *Transform {
	return &Transform{Name: name, Stage: stage, Doc: "test", Run: run}
}

// logTo returns a context whose summary lines go to buf, exactly.
func logTo(buf *bytes.Buffer) *Context {
	return &Context{Logger: slog.New(NewLineHandler(buf, nil))}
}

func TestSummary(t *testing.T) {
	tests := []struct {
		r    Result
		want string
	}{
		{Result{Stage: PatternMatcher, Name: "match_rmsnorm_pattern", Info: Info{Matches: 5}, Duration: 400 * time.Microsecond},
			"[stage=pattern_matcher transform=match_rmsnorm_pattern] [SUMMARY] matches=5 | time: 0.4ms"},
		{Result{Stage: PostExport, Name: "cleanup_cse", Info: Info{}, Duration: 12345 * time.Microsecond},
			"[stage=post_export transform=cleanup_cse] [SUMMARY] matches=0 | time: 12.3ms"},
		{Result{Stage: PostExport, Name: "cleanup_cse", Duration: 40 * time.Microsecond},
			"[stage=post_export transform=cleanup_cse] [SUMMARY] matches=0 | time: 0.04ms"},
		{Result{Stage: CacheInit, Name: "insert_cached_attention", Info: Info{Matches: 1}, Duration: 12 * time.Second},
			"[stage=cache_init transform=insert_cached_attention] [SUMMARY] matches=1 | time: 12.0s"},
		{Result{Stage: Sharding, Name: "detect_sharding", Info: Info{Skipped: true, Matches: 3}},
			"[stage=sharding transform=detect_sharding] [SUMMARY] skipped"},
		{Result{Stage: PostLoadFusion, Name: "fuse_gemms", Disabled: true},
			"[stage=post_load_fusion transform=fuse_gemms] [SUMMARY] disabled"},
	}
	for _, tt := range tests {
		if got := tt.r.Summary(); got != tt.want {
			t.Errorf("Summary() = %q, want %q", got, tt.want)
		}
	}
}

func TestOptimizerDefault(t *testing.T) {
	var buf bytes.Buffer
	g := parse(t, smallGraph)
	cfg, err := LoadConfig(ConfigOptions{Sets: []string{"transforms.cleanup_dead_code.enabled=false"}})
	if err != nil {
		t.Fatal(err)
	}
	o := &Optimizer{Config: cfg, DumpDir: ""}
	t.Setenv(DumpEnv, "")
	graphs, results, err := o.Run(context.Background(), logTo(&buf), g)
	if err != nil {
		t.Fatal(err)
	}
	if len(graphs) != 1 || graphs[0] != g {
		t.Fatalf("Run returned %d graphs, want g itself", len(graphs))
	}
	want := `graph g(x: f32[4]) {
  %1 = neg(%x) : f32[4] @model
  %3 = add(%1, %1) : f32[4] @model
  return %3
}
`
	if got := g.String(); got != want {
		t.Errorf("optimized graph:\n%s\nwant:\n%s", got, want)
	}
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	wantLines := []string{
		`^\[stage=post_export transform=cleanup_noop\] \[SUMMARY\] matches=1 \| time: [0-9]+\.[0-9]+ms$`,
		`^\[stage=post_export transform=cleanup_cse\] \[SUMMARY\] matches=1 \| time: [0-9]+\.[0-9]+ms$`,
		`^\[stage=post_export transform=cleanup_dead_code\] \[SUMMARY\] disabled$`,
	}
	// The later stages find nothing to do in this graph (or are off by default).
	for range len(results) - len(wantLines) {
		wantLines = append(wantLines, `^\[stage=[a-z_]+ transform=[a-z0-9_]+\] \[SUMMARY\] (matches=0 \| time: [0-9]+\.[0-9]+ms|disabled|skipped)$`)
	}
	if len(lines) != len(wantLines) {
		t.Fatalf("log:\n%s\nwant %d lines", buf.String(), len(wantLines))
	}
	for i, re := range wantLines {
		if !regexp.MustCompile(re).MatchString(lines[i]) {
			t.Errorf("log line %d = %q, want %s", i, lines[i], re)
		}
		if lines[i] != results[i].Summary() {
			t.Errorf("log line %d = %q, result says %q", i, lines[i], results[i].Summary())
		}
	}
	if results[0].Info.Matches != 1 || results[1].Info.Matches != 1 || !results[2].Disabled {
		t.Errorf("results %+v", results)
	}
}

func TestOptimizerStages(t *testing.T) {
	var ran []string
	rec := func(name string, info Info) RunFunc {
		return func(_ context.Context, c *Context, g *graph.Graph, _ any) (Info, error) {
			ran = append(ran, name)
			return info, nil
		}
	}
	// Dead code left behind: the optimizer sweeps it when the transform says it is unclean.
	litter := func(clean bool) RunFunc {
		return func(_ context.Context, _ *Context, g *graph.Graph, _ any) (Info, error) {
			if _, err := g.Append("exp", nil, []*graph.Value{g.Inputs[0]}, "litter"); err != nil {
				return Info{}, err
			}
			return Info{Matches: 1, Clean: clean, ValidShapes: true}, nil
		}
	}
	cfg := testConfig(
		fake("first", PostExport, rec("first", Info{Matches: 2, Clean: true, ValidShapes: true})),
		fake("skips", PatternMatcher, rec("skips", Info{Skipped: true})),
		fake("unclean", PatternMatcher, litter(false)),
		fake("clean_liar", PatternMatcher, litter(true)),
		fake("last", CacheInit, rec("last", Info{Clean: true, ValidShapes: true})),
	)
	cfg.entries[4].Enabled = false
	var buf bytes.Buffer
	g := parse(t, smallGraph)
	_, results, err := (&Optimizer{Config: cfg}).Run(context.Background(), logTo(&buf), g)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"first", "skips"}; !reflect.DeepEqual(ran, want) {
		t.Errorf("ran %v, want %v", ran, want)
	}
	if !strings.Contains(buf.String(), "[stage=pattern_matcher transform=skips] [SUMMARY] skipped\n") ||
		!strings.Contains(buf.String(), "[stage=cache_init transform=last] [SUMMARY] disabled\n") {
		t.Errorf("log:\n%s", buf.String())
	}
	if len(results) != 5 {
		t.Errorf("%d results, want 5", len(results))
	}
	litters := 0
	for _, n := range g.Nodes {
		if n.Scope == "litter" {
			litters++
		}
	}
	if litters != 1 {
		t.Errorf("%d dead exp nodes left, want 1 (from the transform that claimed a clean graph):\n%s", litters, g)
	}
}

func TestOptimizerShapes(t *testing.T) {
	// widen changes the input from f32[4] to f32[8], leaving recorded types stale.
	widen := func(valid bool) RunFunc {
		return func(_ context.Context, _ *Context, g *graph.Graph, _ any) (Info, error) {
			g.Inputs[0].Type.Shape = graph.Dims(8)
			for _, n := range g.Nodes {
				if n.Op == "reshape" {
					n.Attrs["shape"] = graph.Dims(8)
				}
			}
			return Info{Matches: 1, Clean: true, ValidShapes: valid}, nil
		}
	}
	g := parse(t, smallGraph)
	if _, _, err := (&Optimizer{Config: testConfig(fake("widen", PostExport, widen(false)))}).Run(context.Background(), nil, g); err != nil {
		t.Fatalf("types re-inferred: %v", err)
	}
	if got := g.Outputs[0].Type.String(); got != "f32[8]" {
		t.Errorf("output type %s after re-inference, want f32[8]", got)
	}
	g = parse(t, smallGraph)
	_, _, err := (&Optimizer{Config: testConfig(fake("widen", PostExport, widen(true)))}).Run(context.Background(), nil, g)
	if err == nil || !strings.Contains(err.Error(), "transform widen (stage post_export)") || !strings.Contains(err.Error(), "inference gives f32[8]") {
		t.Errorf("stale types claimed valid: error %v, want the verifier's", err)
	}
}

func TestOptimizerErrors(t *testing.T) {
	tests := []struct {
		name string
		tr   *Transform
		want []string
	}{
		{"error", fake("fails", PatternMatcher, func(context.Context, *Context, *graph.Graph, any) (Info, error) {
			return Info{}, errors.New("no luck")
		}), []string{"transform fails (stage pattern_matcher)", "no luck"}},
		{"panic", fake("panics", PatternMatcher, func(context.Context, *Context, *graph.Graph, any) (Info, error) {
			panic("index out of range")
		}), []string{"transform panics (stage pattern_matcher)", "panic: index out of range"}},
		{"broken graph", fake("breaks", PatternMatcher, func(_ context.Context, _ *Context, g *graph.Graph, _ any) (Info, error) {
			g.Outputs = nil
			return Info{Clean: true, ValidShapes: true}, nil
		}), []string{"transform breaks", "verify", "no outputs"}},
		{"too many ranks", &Transform{Name: "shards", Stage: Sharding, Doc: "test",
			RunRanks: func(_ context.Context, c *Context, gs []*graph.Graph, _ any) ([]*graph.Graph, Info, error) {
				return []*graph.Graph{gs[0], gs[0].Clone(), gs[0].Clone()}, Info{}, nil
			}}, []string{"transform shards (stage sharding)", "3 graphs for a world of 2 ranks"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, results, err := (&Optimizer{Config: testConfig(tt.tr)}).Run(context.Background(), &Context{WorldSize: 2}, parse(t, smallGraph))
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if len(results) != 1 {
				t.Errorf("%d results, want the failing transform's", len(results))
			}
		})
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := (&Optimizer{}).Run(ctx, nil, parse(t, smallGraph)); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: error %v", err)
	}
	if _, _, err := (&Optimizer{}).Run(context.Background(), nil, nil); err == nil {
		t.Error("nil graph: no error")
	}
}

// TestOptimizerRanks follows the graph list through a sharding transform that turns one graph
// into one per rank: later per-rank transforms run on each, with Context.Rank set.
func TestOptimizerRanks(t *testing.T) {
	var ranks []int
	var seen []*graph.Graph
	perRank := func(_ context.Context, c *Context, g *graph.Graph, _ any) (Info, error) {
		ranks = append(ranks, c.Rank)
		seen = append(seen, g)
		return Info{Matches: 1 + c.Rank, Clean: true, ValidShapes: true}, nil
	}
	shard := &Transform{Name: "shard", Stage: Sharding, Doc: "test",
		RunRanks: func(_ context.Context, c *Context, gs []*graph.Graph, _ any) ([]*graph.Graph, Info, error) {
			if len(gs) != 1 {
				return nil, Info{}, errors.New("want one graph")
			}
			out := []*graph.Graph{gs[0]}
			for r := 1; r < c.World(); r++ {
				out = append(out, gs[0].Clone())
			}
			return out, Info{Matches: len(out), Clean: true, ValidShapes: true}, nil
		}}
	cfg := testConfig(fake("before", PostExport, perRank), shard, fake("after", PostLoadFusion, perRank))
	dir := t.TempDir()
	var buf bytes.Buffer
	c := logTo(&buf)
	c.WorldSize = 3
	g := parse(t, smallGraph)
	graphs, results, err := (&Optimizer{Config: cfg, DumpDir: dir}).Run(context.Background(), c, g)
	if err != nil {
		t.Fatal(err)
	}
	if len(graphs) != 3 || graphs[0] != g {
		t.Fatalf("%d graphs, want 3 with rank 0 the original", len(graphs))
	}
	if want := []int{0, 0, 1, 2}; !reflect.DeepEqual(ranks, want) {
		t.Errorf("ranks seen %v, want %v", ranks, want)
	}
	for i, r := range []int{1, 2, 3} {
		if seen[r] != graphs[i] {
			t.Errorf("rank %d ran on the wrong graph", i)
		}
	}
	after := results[2]
	if after.Info.Matches != 1 || len(after.Ranks) != 3 || after.Ranks[2].Matches != 3 {
		t.Errorf("after: info %+v ranks %+v; want rank 0's info and all three", after.Info, after.Ranks)
	}
	if !strings.Contains(buf.String(), "[stage=post_load_fusion transform=after] [SUMMARY] matches=1 |") {
		t.Errorf("the summary shows rank 0:\n%s", buf.String())
	}
	if c.Rank != 0 {
		t.Errorf("Context.Rank left at %d", c.Rank)
	}
	if _, err := os.Stat(filepath.Join(dir, "003_post_load_fusion_after.txt")); err != nil {
		t.Error(err)
	}
}

func TestDumps(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, "007_compile_old.txt")
	keep := filepath.Join(dir, "notes.txt")
	for _, f := range []string{stale, keep} {
		if err := os.WriteFile(f, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv(DumpEnv, dir)
	g := parse(t, smallGraph)
	if _, _, err := (&Optimizer{Config: postExportConfig(t)}).Run(context.Background(), nil, g); err != nil {
		t.Fatal(err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, e := range entries {
		files = append(files, e.Name())
	}
	want := []string{
		"000_input.txt",
		"001_post_export_cleanup_noop.txt",
		"002_post_export_cleanup_cse.txt",
		"003_post_export_cleanup_dead_code.txt",
		"index.html",
		"notes.txt",
	}
	if !reflect.DeepEqual(files, want) {
		t.Errorf("dump files %v, want %v", files, want)
	}
	input, _ := os.ReadFile(filepath.Join(dir, "000_input.txt"))
	if string(input) != smallGraph {
		t.Errorf("000_input.txt =\n%s\nwant\n%s", input, smallGraph)
	}
	last, _ := os.ReadFile(filepath.Join(dir, "003_post_export_cleanup_dead_code.txt"))
	if string(last) != g.String() {
		t.Errorf("last dump =\n%s\nwant the final graph\n%s", last, g)
	}
	page, err := os.ReadFile(filepath.Join(dir, "index.html"))
	if err != nil {
		t.Fatal(err)
	}
	html := string(page)
	for _, want := range []string{
		"<!DOCTYPE html>",
		"<style>", "<script>",
		`001 post_export / cleanup_noop`,
		`matches=1 | time: `,
		// cleanup_noop replaced %0 by %x in two lines:
		`<div class="l add">  <span class="v" data-v="%1">%1</span> = neg(<span class="v" data-v="%x">%x</span>) : f32[4] @model</div>`,
		`<details class="rm"><summary>3 removed</summary>`,
		// cleanup_dead_code changed nothing: its column starts collapsed.
		`<div class="col same collapsed"><div class="hdr" title="click to collapse or expand"><div class="t">003 post_export / cleanup_dead_code`,
		`<a href="002_post_export_cleanup_cse.txt">`,
	} {
		if !strings.Contains(html, want) {
			t.Errorf("index.html lacks %q", want)
		}
	}
	// Self-contained: nothing is fetched from anywhere.
	for _, bad := range []string{"http://", "https://", "<link", " src="} {
		if strings.Contains(html, bad) {
			t.Errorf("index.html contains %q", bad)
		}
	}
	if strings.Count(html, `class="hdr"`) != 4 {
		t.Errorf("index.html has %d columns, want 4", strings.Count(html, `class="hdr"`))
	}
}

func TestDumpFlagOverridesEnv(t *testing.T) {
	env, flagDir := t.TempDir(), filepath.Join(t.TempDir(), "new", "dir")
	t.Setenv(DumpEnv, env)
	if _, _, err := (&Optimizer{DumpDir: flagDir}).Run(context.Background(), nil, parse(t, smallGraph)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(flagDir, "index.html")); err != nil {
		t.Error(err)
	}
	if entries, _ := os.ReadDir(env); len(entries) != 0 {
		t.Errorf("the environment's directory got %d files", len(entries))
	}
}

func TestMarkValues(t *testing.T) {
	got := markValues(`%a.b, %1 = param "k<&>" : f32[4] @x`)
	want := `<span class="v" data-v="%a.b">%a.b</span>, <span class="v" data-v="%1">%1</span> = param &#34;k&lt;&amp;&gt;&#34; : f32[4] @x`
	if got != want {
		t.Errorf("markValues =\n%s\nwant\n%s", got, want)
	}
}

func TestFlags(t *testing.T) {
	dir := t.TempDir()
	a := filepath.Join(dir, "a.yaml")
	if err := os.WriteFile(a, []byte("transforms:\n  cleanup_cse:\n    commutative: false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var f Flags
	fs := flag.NewFlagSet("loom", flag.ContinueOnError)
	f.Register(fs)
	args := []string{"--config", a, "--set", "transforms.cleanup_noop.enabled=false", "--set", "transforms.cleanup_cse.exclude_ops=[param]", "--dump-graphs", dir, "--check"}
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	o, err := f.Optimizer("llama")
	if err != nil {
		t.Fatal(err)
	}
	if !o.Check || o.DumpDir != dir {
		t.Errorf("optimizer %+v", o)
	}
	if o.Config.Entry("cleanup_noop").Enabled {
		t.Error("--set enabled=false lost")
	}
	if got, want := o.Config.Entry("cleanup_cse").Options, (CSEConfig{ExcludeOps: []string{"param"}}); !reflect.DeepEqual(got, want) {
		t.Errorf("cleanup_cse options %+v, want %+v", got, want)
	}
	f.Sets = append(f.Sets, "transforms.cleanup_cse.bogus=1")
	if _, err := f.Optimizer(""); err == nil || !strings.Contains(err.Error(), "--set transforms.cleanup_cse.bogus=1") {
		t.Errorf("bad --set: error %v", err)
	}
}

func TestLineHandler(t *testing.T) {
	var buf bytes.Buffer
	l := slog.New(NewLineHandler(&buf, slog.LevelInfo))
	l.Debug("hidden")
	l.Info("[stage=a transform=b] [SUMMARY] matches=1 | time: 0.1ms")
	l.With("rank", 1).WithGroup("g").Info("msg", "k", "two words", slog.Group("s", "x", 2))
	want := "[stage=a transform=b] [SUMMARY] matches=1 | time: 0.1ms\nmsg rank=1 g.k=\"two words\" g.s.x=2\n"
	if buf.String() != want {
		t.Errorf("log =\n%q\nwant\n%q", buf.String(), want)
	}
}

func TestRegisterChecks(t *testing.T) {
	run := func(context.Context, *Context, *graph.Graph, any) (Info, error) { return Info{}, nil }
	tests := []struct {
		name string
		t    *Transform
		want string
	}{
		{"bad name", &Transform{Name: "Fuse-GEMMs", Stage: PostExport, Doc: "d", Run: run}, "snake case"},
		{"bad stage", &Transform{Name: "x", Stage: 42, Doc: "d", Run: run}, "invalid stage"},
		{"no doc", &Transform{Name: "x", Stage: PostExport, Run: run}, "no Doc"},
		{"no run", &Transform{Name: "x", Stage: PostExport, Doc: "d"}, "exactly one of Run and RunRanks"},
		{"pointer config", &Transform{Name: "x", Stage: PostExport, Doc: "d", Run: run, Config: &CSEConfig{}}, "struct value"},
		{"reserved option", &Transform{Name: "x", Stage: PostExport, Doc: "d", Run: run, Config: struct {
			Enabled bool `yaml:"enabled"`
		}{}}, "reserved"},
		{"dep on nothing", &Transform{Name: "x", Stage: PostExport, Doc: "d", Run: run, After: []Dep{{nil, "why"}}}, "After[0] names no transform"},
		{"dep on itself", &Transform{Name: "cleanup_cse", Stage: PostExport, Doc: "d", Run: run, After: []Dep{{CleanupCSE, "why"}}}, "the transform itself"},
		{"dep without a reason", &Transform{Name: "x", Stage: PostExport, Doc: "d", Run: run, After: []Dep{{CleanupNoop, ""}}}, "After[0] (cleanup_noop) gives no reason"},
		{"dep on a later stage", &Transform{Name: "x", Stage: PatternMatcher, Doc: "d", Run: run, After: []Dep{{FuseGEMMs, "why"}}},
			"x (stage pattern_matcher) cannot run after fuse_gemms of the later stage post_load_fusion"},
	}
	for _, tt := range tests {
		err := tt.t.check()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: check() = %v, want an error containing %q", tt.name, err, tt.want)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("registering a duplicate did not panic")
		}
	}()
	Register(&Transform{Name: "cleanup_cse", Stage: PostExport, Doc: "d", Run: run})
}

func TestTyped(t *testing.T) {
	run := Typed(func(_ context.Context, _ *Context, _ *graph.Graph, cfg CSEConfig) (Info, error) {
		return Info{Matches: len(cfg.ExcludeOps)}, nil
	})
	if info, err := run(context.Background(), nil, nil, CSEConfig{ExcludeOps: []string{"a"}}); err != nil || info.Matches != 1 {
		t.Errorf("typed config: %+v, %v", info, err)
	}
	if _, err := run(context.Background(), nil, nil, NoopConfig{}); err == nil || !strings.Contains(err.Error(), "transform.NoopConfig") {
		t.Errorf("wrong config type: error %v", err)
	}
}

func TestStages(t *testing.T) {
	var names []string
	for _, s := range Stages() {
		names = append(names, s.String())
		if s.Reason() == "" {
			t.Errorf("stage %s has no reason", s)
		}
		if back, err := ParseStage(s.String()); err != nil || back != s {
			t.Errorf("ParseStage(%q) = %v, %v", s, back, err)
		}
	}
	want := []string{"post_export", "pattern_matcher", "sharding", "post_load_fusion", "cache_init"}
	if !reflect.DeepEqual(names, want) {
		t.Errorf("stages %v, want %v", names, want)
	}
	if _, err := ParseStage("later"); err == nil {
		t.Error("ParseStage(later): no error")
	}
	if s := Stage(99).String(); s != "stage(99)" {
		t.Errorf("Stage(99) = %s", s)
	}
}

func TestContext(t *testing.T) {
	var c Context
	if c.World() != 1 || c.Log() == nil {
		t.Errorf("zero Context: world %d, logger %v", c.World(), c.Log())
	}
	plan := NewKey[*ShardingPlan]("plan")
	count := NewKey[int]("plan") // the same name, another key
	if _, ok := plan.Get(&c); ok {
		t.Error("Get on an empty context")
	}
	p := &ShardingPlan{Size: 2}
	plan.Set(&c, p)
	if v, ok := plan.Get(&c); !ok || v != p {
		t.Errorf("Get = %v, %v", v, ok)
	}
	if v, ok := count.Get(&c); ok || v != 0 {
		t.Errorf("a key of the same name: Get = %v, %v; want nothing", v, ok)
	}
	count.Set(&c, 3)
	if v, _ := plan.Get(&c); v != p {
		t.Errorf("after setting another key of the same name, Get = %v", v)
	}
	if plan.String() != "plan" {
		t.Errorf("String() = %q", plan.String())
	}
}
