package cpu

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/dist/local"
	"github.com/loom-ml/loom/graph"
)

// The CPU backend in the registry (package backend): device "cpu", the lowest priority of
// "auto". It runs every graph, plain or optimized, and the ranks of a mesh as goroutines of
// this process that talk through dist/local.

func init() { backend.Register(cpuBackend{}) }

type cpuBackend struct{}

func (cpuBackend) Name() string          { return "cpu" }
func (cpuBackend) Priority() int         { return 0 }
func (cpuBackend) Devices() (int, error) { return 1, nil }

func (cpuBackend) Check(n backend.Needs) error {
	if n.Process != nil {
		return fmt.Errorf("%w: the ranks of a mesh on the CPU are goroutines of one process", backend.ErrProcesses)
	}
	_, err := dist.ResolveBackend(n.DistBackend, "cpu")
	return err
}

// Deploy compiles every rank in this process: one program (Compile), or on a mesh of
// several ranks one per rank bound to its communicator of a new local world (CompileRanks).
func (cpuBackend) Deploy(ctx context.Context, s backend.Spec) (*backend.Deployment, error) {
	n := max(s.Mesh.Size(), 1)
	if s.Process != nil {
		return nil, fmt.Errorf("cpu: %w", backend.ErrProcesses)
	}
	if len(s.Graphs) == 0 {
		return nil, errors.New("cpu: deploy: no graph")
	}
	logKernelSet()
	var progs []*Program
	if n > 1 {
		var err error
		if progs, err = CompileRanks(ctx, s.Graphs, s.Weights, s.Mesh); err != nil {
			return nil, err
		}
	} else {
		p, err := Compile(ctx, s.Graphs[0], s.Weights)
		if err != nil {
			return nil, err
		}
		progs = []*Program{p}
	}
	for _, p := range progs {
		p.keepResident(s.Resident)
	}
	d := &backend.Deployment{Device: "cpu", WeightBytes: progs[0].WeightBytes(), Close: func() error {
		var errs []error
		for _, p := range progs {
			errs = append(errs, p.Release())
		}
		return errors.Join(errs...)
	}}
	for r, p := range progs {
		d.Ranks = append(d.Ranks, r)
		d.Programs = append(d.Programs, p)
	}
	return d, nil
}

// CompileRanks compiles one program per rank of mesh, each bound to its communicator of a
// new local world (ranks are goroutines of this process). graphs holds one graph per rank,
// or one graph that every rank runs. Each rank reads only its own slices of the weights.
func CompileRanks(ctx context.Context, graphs []*graph.Graph, w backend.Weights, mesh dist.Mesh) ([]*Program, error) {
	n := mesh.Size()
	if len(graphs) != 1 && len(graphs) != n {
		return nil, fmt.Errorf("%d rank graphs for mesh %q of %d ranks", len(graphs), mesh, n)
	}
	comms, err := local.New(n, local.Options{})
	if err != nil {
		return nil, err
	}
	progs := make([]*Program, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		g := graphs[0]
		if len(graphs) == n {
			g = graphs[r]
		}
		wg.Go(func() {
			progs[r], errs[r] = CompileWith(ctx, g, w, Options{Comm: comms[r], Mesh: mesh})
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
