// Package transform is Loom's graph transform pipeline: the stages, the registry of
// transforms, their layered YAML configuration, and the Optimizer that runs the enabled
// transforms in stage order, logs a one-line summary for each, verifies the graph after each
// and can dump it after each (as text files and one HTML page).
//
// A transform is a declared value in its own file, in the manner of
// golang.org/x/tools/go/analysis:
//
//	// CSEConfig holds the options of cleanup_cse.
//	type CSEConfig struct {
//		Commutative bool     `yaml:"commutative"`
//		ExcludeOps  []string `yaml:"exclude_ops"`
//	}
//
//	var CleanupCSE = &Transform{
//		Name:   "cleanup_cse",
//		Stage:  PostExport,
//		Doc:    "Merges nodes that compute the same thing ...",
//		Config: CSEConfig{Commutative: true, ExcludeOps: []string{}},
//		After:  []Dep{{CleanupNoop, "cleanup_noop removes the no-op views that hide duplicates from cleanup_cse"}},
//		Run:    Typed(runCSE), // func(ctx, *Context, *graph.Graph, CSEConfig) (Info, error)
//	}
//
//	func init() { Register(CleanupCSE) }
//
// After declares what must run earlier, and why; loading a configuration checks its order
// against every declaration (see Dep). Transforms hand results to later ones through typed
// Context keys (Key), never through names.
//
// Golden tests live in testdata/<name>/*.txtar and run through package transformtest; the
// verifier runs after every transform under go test.
//
// default.yaml, embedded in the binary, lists every transform with its stage, whether it is
// enabled and its options; see LoadConfig for how overlays, files and --set flags layer on
// top of it.
package transform

import (
	"context"
	"fmt"
	"reflect"
	"regexp"
	"sort"

	"github.com/loom-ml/loom/graph"
)

// Transform declares one graph transform.
type Transform struct {
	// Name identifies the transform in configuration, logs and dumps: lower snake case, such
	// as "match_rmsnorm_pattern".
	Name string
	// Stage is the pipeline stage the transform belongs to.
	Stage Stage
	// Doc says what the transform does; the first sentence is its summary.
	Doc string
	// Config holds the transform's options with their defaults: a struct value (not a
	// pointer) whose fields carry yaml tags, or nil when the transform has no options. The
	// optimizer decodes the merged YAML options over a copy of it and passes that copy, of
	// the same type, to Run. Options must not be named "stage" or "enabled".
	Config any
	// Run transforms one graph in place. The optimizer calls it once per rank graph. Exactly
	// one of Run and RunRanks is set.
	Run RunFunc
	// RunRanks sees every rank's graph at once and returns the new list; the sharding
	// executor uses it to turn one graph into one graph per rank (see Optimizer).
	RunRanks RanksFunc
	// After lists the transforms that must run before this one, each with the reason (see
	// Dep).
	After []Dep
}

// Dep is one ordering constraint: the transform that declares it must run after Transform,
// for the reason Why. It says "if both run, Transform first" and nothing more: it does not
// turn Transform on, and either may be disabled. The order is a property of the
// configuration's listing (stages in order, then default.yaml's order within a stage), so
// LoadConfig checks it whatever is enabled, and a configuration that breaks a dependency is
// an error naming both transforms and the reason; enabling a transform later with --set
// never exposes one. A Dep may name a transform of an earlier stage (stage order then keeps
// it), never one of a later stage (Register refuses it).
type Dep struct {
	// Transform must come earlier in the pipeline.
	Transform *Transform
	// Why says what the later transform needs from it, as a clause: "fuse_gemms makes the
	// split that fuse_qkv_rope replaces".
	Why string
}

// RunFunc is the signature of Transform.Run. cfg has the dynamic type of Transform.Config
// (nil when the transform has no options); Typed adapts a function taking the typed config.
type RunFunc func(ctx context.Context, c *Context, g *graph.Graph, cfg any) (Info, error)

// RanksFunc is the signature of Transform.RunRanks: it receives every rank's graph (one before
// sharding) and returns the graphs that later transforms see, either one or c.WorldSize of
// them. The returned Info describes rank 0.
type RanksFunc func(ctx context.Context, c *Context, graphs []*graph.Graph, cfg any) ([]*graph.Graph, Info, error)

// Typed adapts a run function whose config parameter has the transform's own config type.
// A config of another type is reported as an error, not a panic.
func Typed[C any](run func(ctx context.Context, c *Context, g *graph.Graph, cfg C) (Info, error)) RunFunc {
	return func(ctx context.Context, c *Context, g *graph.Graph, cfg any) (Info, error) {
		typed, ok := cfg.(C)
		if !ok {
			var want C
			return Info{}, fmt.Errorf("config has type %T, want %T", cfg, want)
		}
		return run(ctx, c, g, typed)
	}
}

// Info is what one run of a transform reports.
type Info struct {
	// Skipped is set when the transform did not apply in this configuration (for example
	// sharding with one rank); the summary line then says "skipped".
	Skipped bool
	// Matches counts the places the transform changed (patterns replaced, nodes removed).
	Matches int
	// Clean is set when the transform left no dead nodes behind; otherwise the optimizer
	// removes them.
	Clean bool
	// ValidShapes is set when every recorded output type is still right; otherwise the
	// optimizer re-infers them.
	ValidShapes bool
}

var (
	registry = map[string]*Transform{}
	nameRE   = regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)
)

// Register adds a transform to the registry. Like graph.Register it panics on a malformed or
// duplicate declaration, a programming error found at init time.
func Register(t *Transform) {
	if err := t.check(); err != nil {
		panic("transform.Register: " + err.Error())
	}
	if _, dup := registry[t.Name]; dup {
		panic("transform.Register: duplicate transform " + t.Name)
	}
	registry[t.Name] = t
}

// check validates a declaration.
func (t *Transform) check() error {
	if !nameRE.MatchString(t.Name) {
		return fmt.Errorf("transform name %q is not lower snake case", t.Name)
	}
	if !t.Stage.Valid() {
		return fmt.Errorf("transform %s: invalid stage %d", t.Name, t.Stage)
	}
	if t.Doc == "" {
		return fmt.Errorf("transform %s has no Doc", t.Name)
	}
	if (t.Run == nil) == (t.RunRanks == nil) {
		return fmt.Errorf("transform %s must set exactly one of Run and RunRanks", t.Name)
	}
	for i, d := range t.After {
		switch {
		case d.Transform == nil:
			return fmt.Errorf("transform %s: After[%d] names no transform", t.Name, i)
		case d.Transform == t || d.Transform.Name == t.Name:
			return fmt.Errorf("transform %s: After[%d] names the transform itself", t.Name, i)
		case d.Why == "":
			return fmt.Errorf("transform %s: After[%d] (%s) gives no reason", t.Name, i, d.Transform.Name)
		case d.Transform.Stage > t.Stage:
			return fmt.Errorf("transform %s (stage %s) cannot run after %s of the later stage %s", t.Name, t.Stage, d.Transform.Name, d.Transform.Stage)
		}
	}
	if t.Config == nil {
		return nil
	}
	rt := reflect.TypeOf(t.Config)
	if rt.Kind() != reflect.Struct {
		return fmt.Errorf("transform %s: Config must be a struct value, not %s", t.Name, rt)
	}
	for _, f := range optionFields(rt) {
		if f.name == "stage" || f.name == "enabled" {
			return fmt.Errorf("transform %s: option name %q is reserved", t.Name, f.name)
		}
	}
	return nil
}

// Lookup finds a registered transform by name.
func Lookup(name string) (*Transform, bool) {
	t, ok := registry[name]
	return t, ok
}

// All returns every registered transform, sorted by stage and then name.
func All() []*Transform {
	out := make([]*Transform, 0, len(registry))
	for _, t := range registry {
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Stage != out[j].Stage {
			return out[i].Stage < out[j].Stage
		}
		return out[i].Name < out[j].Name
	})
	return out
}

// DefaultConfig returns a copy of the transform's option defaults (nil when it has none).
func (t *Transform) DefaultConfig() any {
	if t.Config == nil {
		return nil
	}
	v := reflect.New(reflect.TypeOf(t.Config)).Elem()
	v.Set(reflect.ValueOf(t.Config))
	return v.Interface()
}
