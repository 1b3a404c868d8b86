package cuda

import (
	"context"
	"fmt"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tensor"
)

// The CUDA backend in the registry (package backend): device "cuda", picked by "auto" over
// the CPU whenever a GPU can be used and the machine has one per rank. It runs optimized
// graphs only, one GPU per rank, in this process (NCCL communicators made together, the
// one-shot peer group over NVLink) or one process per rank (deploy.go).

func init() { backend.Register(cudaBackend{}) }

type cudaBackend struct{}

func (cudaBackend) Name() string  { return "cuda" }
func (cudaBackend) Priority() int { return 10 }

// Devices counts the GPUs, once cubind.Available says the driver and libraries are there.
func (cudaBackend) Devices() (int, error) {
	if err := cubind.Available(); err != nil {
		return 0, fmt.Errorf("no GPU can be used: %w", err)
	}
	return cubind.DeviceCount()
}

// Check: the optimized graph, a usable GPU, and with several ranks NCCL and one GPU per
// rank (the GPU LOCAL_RANK with one process per rank).
func (cudaBackend) Check(n backend.Needs) error {
	if n.PlainGraph {
		return fmt.Errorf("%w: the plain graph has ops without CUDA kernels", backend.ErrPlainGraph)
	}
	if err := cubind.Available(); err != nil {
		return fmt.Errorf("no GPU can be used: %w", err)
	}
	ranks := n.Ranks()
	if ranks < 2 {
		return nil
	}
	if b, err := dist.ResolveBackend(n.DistBackend, "cuda"); err != nil {
		return err
	} else if b != dist.BackendNCCL {
		return fmt.Errorf("on CUDA the ranks talk through nccl, not %s", b)
	}
	count, err := cubind.DeviceCount()
	switch {
	case err != nil:
		return err
	case n.Process != nil && count <= n.Process.LocalRank:
		return fmt.Errorf("rank %d runs on GPU %s=%d, this machine has %d GPUs", n.Process.Rank, dist.EnvLocalRank, n.Process.LocalRank, count)
	case n.Process == nil && count < ranks:
		return fmt.Errorf("the mesh %s needs %d GPUs, this machine has %d", n.Mesh, ranks, count)
	}
	return nil
}

// The powers of a Program, as package backend declares them.
var (
	_ backend.Executable  = (*Program)(nil)
	_ backend.Discarder   = (*Program)(nil)
	_ backend.Resident    = (*Program)(nil)
	_ backend.Launcher    = (*Program)(nil)
	_ backend.DeviceClock = (*Program)(nil)
	_ backend.Profiler    = (*Program)(nil)
	_ backend.Pending     = (*Launched)(nil)
)

// LaunchStep is Launch as backend.Launcher declares it: the step samples with draws, takes
// its input_ids from the previous launch's ids with feed, and brings its ids back with
// download.
func (p *Program) LaunchStep(ctx context.Context, inputs map[string]*tensor.Tensor, draws []sample.DeviceDraw, feed, download bool) (backend.Pending, error) {
	l, err := p.Launch(ctx, inputs, LaunchOptions{Draws: draws, FeedIDs: feed, Download: download})
	if err != nil {
		return nil, err
	}
	return l, nil
}

// OpTimes is Profile as backend.Profiler declares it.
func (p *Program) OpTimes() []backend.OpTime {
	prof := p.Profile()
	ops := make([]backend.OpTime, len(prof))
	for i, o := range prof {
		ops[i] = backend.OpTime{Op: o.Op, Calls: o.Calls, Time: o.Time}
	}
	return ops
}
