package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/backend/cpu"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/dist/local"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform"
)

// MeshFor turns the --world-size and --mesh flags into a mesh: mesh as dist.ParseMesh reads
// it ("tp=2,dp=2"), else tp over worldSize ranks; both given must agree. Neither (0 and "")
// is the zero Mesh, one rank.
func MeshFor(worldSize int, mesh string) (dist.Mesh, error) {
	if worldSize < 0 {
		return dist.Mesh{}, fmt.Errorf("world size %d, want >= 1", worldSize)
	}
	if strings.TrimSpace(mesh) != "" {
		m, err := dist.ParseMesh(mesh)
		if err != nil {
			return dist.Mesh{}, err
		}
		if worldSize != 0 && worldSize != m.Size() {
			return dist.Mesh{}, fmt.Errorf("world size %d, but mesh %q has %d ranks", worldSize, m, m.Size())
		}
		return m, nil
	}
	if worldSize <= 1 {
		return dist.Mesh{}, nil
	}
	return dist.NewMesh(dist.Axis{Name: transform.TPAxis, Size: worldSize})
}

// OptimizeRanks runs the transform pipeline for a deployment on mesh: the sharding stage
// splits the graph with the architecture's own plan (model.Architecture.TPPlan) and the
// rest of the pipeline runs on every rank's graph. It returns one graph per rank, or a single
// graph when no transform split it (one rank, or no tp axis); the optimizer's results, its
// log and its dumps are rank 0's.
func OptimizeRanks(ctx context.Context, flags *transform.Flags, m *model.Model, g *graph.Graph, mesh dist.Mesh) ([]*graph.Graph, []transform.Result, error) {
	o, err := flags.Optimizer(m.Config.ModelType)
	if err != nil {
		return nil, nil, err
	}
	tc := &transform.Context{Arch: m.Config.ModelType, WorldSize: max(mesh.Size(), 1), Weights: m.Checkpoint, Logger: slog.Default()}
	setup := transform.ShardingSetup{Mesh: mesh}
	if a, err := model.LookupArchitecture(m.Config); err == nil {
		setup.FactoryPlan = a.TPPlan
	}
	transform.SetSharding(tc, setup)
	graphs, results, err := o.Run(ctx, tc, g)
	if err != nil {
		return nil, results, fmt.Errorf("optimize %s: %w", m.Dir, err)
	}
	return graphs, results, nil
}

// CompileRanks compiles one CPU program per rank of mesh, each bound to its communicator of
// a new local world (ranks are goroutines of this process). graphs holds one graph per rank,
// or one graph that every rank runs. Each rank reads only its own slices of the weights.
func CompileRanks(ctx context.Context, graphs []*graph.Graph, w backend.Weights, mesh dist.Mesh) ([]*cpu.Program, error) {
	n := mesh.Size()
	if len(graphs) != 1 && len(graphs) != n {
		return nil, fmt.Errorf("%d rank graphs for mesh %q of %d ranks", len(graphs), mesh, n)
	}
	comms, err := local.New(n, local.Options{})
	if err != nil {
		return nil, err
	}
	progs := make([]*cpu.Program, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		g := graphs[0]
		if len(graphs) == n {
			g = graphs[r]
		}
		wg.Go(func() {
			progs[r], errs[r] = cpu.CompileWith(ctx, g, w, cpu.Options{Comm: comms[r], Mesh: mesh})
			if errs[r] != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, errs[r])
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return progs, nil
}

// loadRanks is Load for a mesh of several ranks: flags are Load's, runtime settings included.
func loadRanks(ctx context.Context, m *model.Model, g *graph.Graph, dir string, flags *transform.Flags, mesh dist.Mesh, start time.Time) (*Model, error) {
	graphs, results, err := OptimizeRanks(ctx, flags, m, g, mesh)
	if err != nil {
		m.Close()
		return nil, err
	}
	progs, err := CompileRanks(ctx, graphs, m.Checkpoint, mesh)
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("compile %s: %w", dir, err)
	}
	rankGraphs := make([]*graph.Graph, len(progs))
	for r, p := range progs {
		rankGraphs[r] = p.Graph()
	}
	slog.Info("model loaded", "dir", dir, "architecture", m.Config.Architectures[0], "mesh", mesh.String(),
		"ranks", len(progs), "nodes", len(rankGraphs[0].Nodes), "bytes_read", m.Checkpoint.BytesRead(), "time", time.Since(start).Round(time.Millisecond))
	return &Model{Model: m, Graph: rankGraphs[0], Transforms: results, Program: progs[0], Mesh: mesh, Graphs: rankGraphs, Programs: progs}, nil
}

// Executable returns what runs the model as a whole: its program on one rank, else a
// RankGroup that runs every rank on the same inputs and returns rank 0's outputs.
func (m *Model) Executable() Executable {
	if len(m.Programs) > 1 {
		return newRankGroup(m.Programs, m.Graphs)
	}
	return m.Program
}

// newRankGroup makes a RankGroup of one executable per rank.
func newRankGroup[E Executable](progs []E, graphs []*graph.Graph) *RankGroup {
	exes := make([]Executable, len(progs))
	for r, p := range progs {
		exes[r] = p
	}
	return &RankGroup{Ranks: exes, Graphs: graphs}
}

// RankGroup runs the ranks of a deployment together as one Executable: every rank gets the
// same inputs (each its own copy of the KV cache inputs, whose contents it changes) and runs
// concurrently with the others, its collectives meeting theirs; the outputs are rank 0's.
// When a rank fails, the others are cancelled, so that none waits for it in a collective.
type RankGroup struct {
	Ranks  []Executable
	Graphs []*graph.Graph // one per rank, for callers that read the graph (GreedyRecompute)
}

// Graph is rank 0's graph.
func (rg *RankGroup) Graph() *graph.Graph {
	if len(rg.Graphs) == 0 {
		return nil
	}
	return rg.Graphs[0]
}

// Run runs every rank on inputs and returns rank 0's outputs.
func (rg *RankGroup) Run(ctx context.Context, inputs map[string]*tensor.Tensor) ([]*tensor.Tensor, error) {
	if len(rg.Ranks) == 0 {
		return nil, errors.New("rank group: no ranks")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	outs := make([][]*tensor.Tensor, len(rg.Ranks))
	errs := make([]error, len(rg.Ranks))
	// Every rank but 0 gets its own copy of the caches, made before any rank starts writing
	// to rank 0's.
	ins := make([]map[string]*tensor.Tensor, len(rg.Ranks))
	for r := range rg.Ranks {
		ins[r] = inputs
		if r > 0 {
			ins[r] = make(map[string]*tensor.Tensor, len(inputs))
			for k, v := range inputs {
				if strings.HasPrefix(k, "kv_cache.") {
					v = v.Clone() // the cache is the rank's own
				}
				ins[r][k] = v
			}
		}
	}
	var wg sync.WaitGroup
	for r, exe := range rg.Ranks {
		wg.Go(func() {
			if outs[r], errs[r] = exe.Run(ctx, ins[r]); errs[r] != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, errs[r])
				cancel()
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return outs[0], nil
}
