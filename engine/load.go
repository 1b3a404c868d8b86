package engine

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/loom-ml/loom/backend/cpu"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model"
	_ "github.com/loom-ml/loom/model/all" // register every frontend
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform"
)

// LoadOptions choose how a checkpoint becomes an executable.
type LoadOptions struct {
	// ActivationDType is the dtype activations are computed in (f32 when unset).
	ActivationDType tensor.DType
	// Optimize runs the transform pipeline over the plain graph, with the paged KV cache
	// (insert_cached_attention) turned on, so that the result runs in an Engine; otherwise
	// the plain graph runs. --set transforms.insert_cached_attention.enabled=false keeps the
	// optimized graph on whole sequences.
	Optimize bool
	// Transforms configures the pipeline: extra YAML files, --set overrides, dumps, checks.
	Transforms transform.Flags
	// Mesh is the deployment's ranks, such as tp=2 or tp=2,dp=2 (see MeshFor); the zero Mesh
	// is one rank. On the CPU the ranks are goroutines of this process that talk through
	// dist/local. More than one rank needs Optimize: sharding is a transform.
	Mesh dist.Mesh
	// DistBackend is the communicator implementation: auto (""), local or nccl. Loom's engine
	// runs on the CPU for now, where auto means local and nccl is an error.
	DistBackend string
	// PagedCache turns on the cache stage (insert_cached_attention, gather_logits) so that
	// the graph runs in an Engine. Load always turns it on when it optimizes; LoadCUDA only
	// when this is set (without it, the graph runs whole sequences for GreedyRecompute).
	PagedCache bool
	// EagerCUDA turns off CUDA graphs: LoadCUDA with PagedCache otherwise captures each
	// engine step's kernels once per bucket of shapes and replays them (cuda.Options.Graphs).
	EagerCUDA bool
	// ProfileCUDA times every step of the CUDA program per op (cuda.Options.Profile; steps
	// run eagerly); read it with CUDAModel.Program.Profile.
	ProfileCUDA bool
}

// cacheStage lists the transforms a graph needs to run in an Engine: the paged KV cache, and
// the LM head on each sequence's last token only.
var cacheStage = []*transform.Transform{transform.InsertCachedAttention, transform.GatherLogits}

// withCacheStage returns flags that turn the cache stage's transforms on (transform.Flags.Enable:
// over the configuration files, under the user's --set overrides, which still win).
func withCacheStage(flags transform.Flags) transform.Flags {
	flags.Enable = append(slices.Clip(flags.Enable), cacheStage...)
	return flags
}

// Model is a loaded checkpoint with its graph and executable.
type Model struct {
	*model.Model
	// Graph is the graph that runs: the optimized one when an optimizer was given.
	Graph *graph.Graph
	// Transforms holds the optimizer's per-transform results (nil without an optimizer).
	Transforms []transform.Result
	// Program is rank 0's executable (the only one on one rank).
	Program *cpu.Program
	// Mesh, Graphs and Programs describe a deployment on several ranks (see LoadOptions.Mesh):
	// one graph and one program per rank, in rank order. Nil on one rank.
	Mesh     dist.Mesh
	Graphs   []*graph.Graph
	Programs []*cpu.Program
}

// Ranks returns the model's ranks for NewRanks: one per rank of the mesh, or the whole graph
// on the CPU.
func (m *Model) Ranks() []Rank {
	if len(m.Programs) > 1 {
		ranks := make([]Rank, len(m.Programs))
		for r, p := range m.Programs {
			ranks[r] = Rank{Graph: m.Graphs[r], Exe: p}
		}
		return ranks
	}
	return []Rank{{Graph: m.Graph, Exe: m.Program}}
}

// Load opens the checkpoint in dir, builds its graph and compiles it for the CPU.
func Load(ctx context.Context, dir string, opts LoadOptions) (*Model, error) {
	start := time.Now()
	m, g, err := OpenGraph(dir, opts)
	if err != nil {
		return nil, err
	}
	if _, err := dist.ResolveBackend(opts.DistBackend, "cpu"); err != nil {
		m.Close()
		return nil, err
	}
	if opts.Mesh.Size() > 1 && !opts.Optimize {
		m.Close()
		return nil, fmt.Errorf("%s: a mesh of %d ranks (%s) needs the optimizer: sharding is a transform", dir, opts.Mesh.Size(), opts.Mesh)
	}
	var results []transform.Result
	if opts.Optimize {
		flags := withCacheStage(opts.Transforms)
		if opts.Mesh.Size() > 1 {
			return loadRanks(ctx, m, g, dir, &flags, opts.Mesh, start)
		}
		g, results, err = Optimize(ctx, &flags, m, g)
		if err != nil {
			m.Close()
			return nil, err
		}
	}
	prog, err := cpu.Compile(ctx, g, m.Checkpoint)
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("compile %s: %w", dir, err)
	}
	slog.Info("model loaded", "dir", dir, "architecture", m.Config.Architectures[0], "nodes", len(g.Nodes), "time", time.Since(start).Round(time.Millisecond))
	return &Model{Model: m, Graph: g, Transforms: results, Program: prog}, nil
}

// OpenGraph opens the checkpoint in dir, builds its plain graph and checks the graph's params
// against the checkpoint; the caller closes the model.
func OpenGraph(dir string, opts LoadOptions) (*model.Model, *graph.Graph, error) {
	m, err := model.Open(dir)
	if err != nil {
		return nil, nil, err
	}
	g, err := model.BuildGraph(m.Config, model.BuildOptions{ActivationDType: opts.ActivationDType, Tensors: m.Checkpoint})
	if err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("%s: %w", dir, err)
	}
	if err := m.Checkpoint.Check(g); err != nil {
		m.Close()
		return nil, nil, err
	}
	return m, g, nil
}

// Optimize runs the transform pipeline, configured by flags and the model's architecture
// overlay, over a model's plain graph and returns the final graph.
func Optimize(ctx context.Context, flags *transform.Flags, m *model.Model, g *graph.Graph) (*graph.Graph, []transform.Result, error) {
	o, err := flags.Optimizer(m.Config.ModelType)
	if err != nil {
		return nil, nil, err
	}
	tc := &transform.Context{Arch: m.Config.ModelType, WorldSize: 1, Weights: m.Checkpoint, Logger: slog.Default()}
	graphs, results, err := o.Run(ctx, tc, g)
	if err != nil {
		return nil, results, fmt.Errorf("optimize %s: %w", m.Dir, err)
	}
	return graphs[0], results, nil
}
