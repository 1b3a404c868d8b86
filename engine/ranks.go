package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/loom-ml/loom/dist"
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

// rankGroup makes a RankGroup of ranks.
func rankGroup(ranks []Rank) *RankGroup {
	rg := &RankGroup{}
	for _, r := range ranks {
		rg.Ranks = append(rg.Ranks, r.Exe)
		rg.Graphs = append(rg.Graphs, r.Graph)
	}
	return rg
}

// RankGroup runs the ranks of a deployment together as one Executable: every rank gets the
// same inputs (each its own copy of the KV cache inputs, whose contents it changes) and runs
// concurrently with the others, its collectives meeting theirs; the outputs are rank 0's.
// When a rank fails, the others are cancelled, so that none waits for it in a collective.
type RankGroup struct {
	Ranks  []Executable
	Graphs []*graph.Graph // one per rank, for callers that read the graph (GreedyRecompute)
	// Mesh arranges the ranks; with a cp axis of more than one rank, Run gives each rank its
	// share of the sequence and returns the outputs in token order (engine/cp.go).
	Mesh dist.Mesh
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
	if cg, err := newCPGroup(rg.Mesh); err != nil || cg != nil {
		if err != nil {
			return nil, fmt.Errorf("rank group: %w", err)
		}
		return rg.runCP(ctx, cg, inputs)
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
				if isCacheInput(k) {
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
