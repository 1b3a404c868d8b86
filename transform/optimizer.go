package transform

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"testing"
	"time"

	"github.com/loom-ml/loom/graph"
)

// DumpEnv is the environment variable that, when set to a directory, makes every Optimizer
// without a DumpDir dump the graph after each transform there.
const DumpEnv = "LOOM_DUMP_GRAPHS_DIR"

// Optimizer runs the enabled transforms of a configuration in stage order.
//
// It holds one graph until a transform with RunRanks (the sharding executor) returns one
// graph per rank; from then on every per-rank transform runs once on each rank's graph, with
// Context.Rank set, and the summary and the dumps show rank 0.
type Optimizer struct {
	// Config is the resolved configuration; nil means default.yaml alone.
	Config *Config
	// Check runs the verifier after every transform. Under go test it is always on.
	Check bool
	// DumpDir, when set, receives the graph text after every transform and an index.html
	// that shows them side by side (see Dump). Empty means $LOOM_DUMP_GRAPHS_DIR.
	DumpDir string
}

// Result is what the optimizer records for one transform.
type Result struct {
	Stage    Stage
	Name     string
	Disabled bool
	// Info is rank 0's report; Ranks holds every rank's when there are several.
	Info     Info
	Ranks    []Info
	Duration time.Duration
}

// Summary is the result's log line, exactly
//
//	[stage=<stage> transform=<name>] [SUMMARY] matches=<n> | time: <duration>
//
// or, for a transform that did not run, "... [SUMMARY] skipped" or "... [SUMMARY] disabled".
func (r Result) Summary() string {
	prefix := fmt.Sprintf("[stage=%s transform=%s] [SUMMARY] ", r.Stage, r.Name)
	switch {
	case r.Disabled:
		return prefix + "disabled"
	case r.Info.Skipped:
		return prefix + "skipped"
	}
	return fmt.Sprintf("%smatches=%d | time: %s", prefix, r.Info.Matches, FormatDuration(r.Duration))
}

// FormatDuration prints a duration in milliseconds for the summary lines: 0.4ms, 12.3ms,
// 0.05ms; from 10 s on in seconds.
func FormatDuration(d time.Duration) string {
	ms := float64(d) / float64(time.Millisecond)
	switch {
	case d >= 10*time.Second:
		return fmt.Sprintf("%.1fs", d.Seconds())
	case ms >= 0.1 || d == 0:
		return fmt.Sprintf("%.1fms", ms)
	}
	return fmt.Sprintf("%.2fms", ms)
}

// Run optimizes g: it runs every enabled transform in stage order, logs one summary line per
// transform to c's logger, verifies the graph after each transform when checking is on, and
// dumps it when a dump directory is set. It returns the final graphs, one per rank (a single
// graph when no transform split it), and a result per transform. On an error the results
// and the dump cover the transforms up to and including the failing one.
func (o *Optimizer) Run(ctx context.Context, c *Context, g *graph.Graph) (graphs []*graph.Graph, results []Result, err error) {
	if g == nil {
		return nil, nil, errors.New("optimize: nil graph")
	}
	if c == nil {
		c = &Context{}
	}
	cfg := o.Config
	if cfg == nil {
		if cfg, err = DefaultConfig(); err != nil {
			return nil, nil, err
		}
	}
	check := o.Check || testing.Testing()
	dir := o.DumpDir
	if dir == "" {
		dir = os.Getenv(DumpEnv)
	}
	var dump *dumper
	if dir != "" {
		if dump, err = newDumper(dir, g); err != nil {
			return nil, nil, err
		}
		defer func() {
			if derr := dump.finish(); derr != nil && err == nil {
				err = derr
			}
		}()
	}
	enabled := map[string]bool{}
	for _, e := range cfg.entries {
		enabled[e.Transform.Name] = e.Enabled
	}
	enabledKey.Set(c, enabled)
	graphs = []*graph.Graph{g}
	for _, e := range cfg.entries {
		if err := ctx.Err(); err != nil {
			return graphs, results, fmt.Errorf("optimize %s: %w", g.Name, err)
		}
		t := e.Transform
		r := Result{Stage: t.Stage, Name: t.Name, Disabled: !e.Enabled}
		if r.Disabled {
			results = append(results, r)
			c.Log().Info(r.Summary())
			continue
		}
		start := time.Now()
		var runErr error
		graphs, r.Info, r.Ranks, runErr = apply(ctx, c, t, e.Options, graphs)
		r.Duration = time.Since(start)
		results = append(results, r)
		if runErr == nil {
			c.Log().Info(r.Summary())
		}
		if runErr == nil && check {
			runErr = verifyAll(graphs)
		}
		if dump != nil {
			if derr := dump.add(r, graphs[0]); derr != nil && runErr == nil {
				runErr = derr
			}
		}
		if runErr != nil {
			return graphs, results, fmt.Errorf("transform %s (stage %s): %w", t.Name, t.Stage, runErr)
		}
	}
	return graphs, results, nil
}

// Apply runs one transform on g the way the optimizer does: it decodes options (YAML, as
// under the transform's key in a config file; nil for the defaults), runs the transform,
// removes dead nodes when it reports the graph unclean, re-infers types when it reports them
// invalid, and verifies the result. Golden tests use it.
func Apply(ctx context.Context, c *Context, t *Transform, g *graph.Graph, options []byte) (Info, error) {
	if c == nil {
		c = &Context{}
	}
	cfg, err := DecodeOptions(t, "options", options)
	if err != nil {
		return Info{}, err
	}
	gs, info, _, err := apply(ctx, c, t, cfg, []*graph.Graph{g})
	if err == nil {
		err = verifyAll(gs)
	}
	if err != nil {
		return info, fmt.Errorf("transform %s: %w", t.Name, err)
	}
	if len(gs) != 1 || gs[0] != g {
		return info, fmt.Errorf("transform %s: Apply runs per-graph transforms only", t.Name)
	}
	return info, nil
}

// apply runs one enabled transform over the rank graphs and tidies up after it.
func apply(ctx context.Context, c *Context, t *Transform, cfg any, graphs []*graph.Graph) ([]*graph.Graph, Info, []Info, error) {
	if t.RunRanks != nil {
		c.Rank = 0
		out, info, err := safeRunRanks(ctx, c, t, cfg, graphs)
		if err != nil {
			return graphs, info, nil, err
		}
		if len(out) != 1 && len(out) != c.World() {
			return graphs, info, nil, fmt.Errorf("returned %d graphs for a world of %d ranks", len(out), c.World())
		}
		for rank, g := range out {
			if g == nil {
				return graphs, info, nil, fmt.Errorf("returned a nil graph for rank %d", rank)
			}
			if err := tidy(g, info); err != nil {
				return out, info, nil, rankErr(len(out), rank, err)
			}
		}
		return out, info, nil, nil
	}
	infos := make([]Info, len(graphs))
	defer func() { c.Rank = 0 }()
	for rank, g := range graphs {
		c.Rank = rank
		info, err := safeRun(ctx, c, t, cfg, g)
		infos[rank] = info
		if err == nil {
			err = tidy(g, info)
		}
		if err != nil {
			return graphs, infos[0], nil, rankErr(len(graphs), rank, err)
		}
	}
	var ranks []Info
	if len(graphs) > 1 {
		ranks = infos
	}
	return graphs, infos[0], ranks, nil
}

func rankErr(n, rank int, err error) error {
	if n == 1 {
		return err
	}
	return fmt.Errorf("rank %d: %w", rank, err)
}

// tidy removes dead code and re-infers types as the transform's Info asks.
func tidy(g *graph.Graph, info Info) error {
	if info.Skipped {
		return nil
	}
	if !info.Clean {
		RemoveDeadCode(g)
	}
	if !info.ValidShapes {
		if err := graph.ReinferTypes(g); err != nil {
			return fmt.Errorf("re-infer types: %w", err)
		}
	}
	return nil
}

func verifyAll(graphs []*graph.Graph) error {
	for rank, g := range graphs {
		if err := graph.Verify(g); err != nil {
			return rankErr(len(graphs), rank, fmt.Errorf("verify: %w", err))
		}
	}
	return nil
}

// safeRun calls t.Run, turning a panic into an error.
func safeRun(ctx context.Context, c *Context, t *Transform, cfg any, g *graph.Graph) (info Info, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v\n%s", p, debug.Stack())
		}
	}()
	return t.Run(ctx, c, g, cfg)
}

// safeRunRanks calls t.RunRanks, turning a panic into an error.
func safeRunRanks(ctx context.Context, c *Context, t *Transform, cfg any, graphs []*graph.Graph) (out []*graph.Graph, info Info, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panic: %v\n%s", p, debug.Stack())
		}
	}()
	return t.RunRanks(ctx, c, append([]*graph.Graph(nil), graphs...), cfg)
}
