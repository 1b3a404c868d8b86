package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/loom-ml/loom/dist/nccl"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/kvcache"
)

// Process is this process's rank of a deployment with one process per GPU (see
// LoadCUDARank), connected to the other ranks by the step transport: rank 0 runs the
// engine (NewEngine) or GreedyRecompute (Executable) and sends every step's inputs to the
// other ranks, the followers, which run their own programs on them (Follow).
type Process struct {
	model     *CUDAModel
	env       nccl.Env
	followers []*remoteRank // rank 0: ranks 1..n-1
	conn      net.Conn      // a follower: its connection to rank 0
}

// StepAddr is where rank 0 listens for the followers' step connections: MASTER_ADDR and
// the port after MASTER_PORT (the rendezvous's).
func StepAddr(env nccl.Env) (string, error) {
	if env.MasterPort >= 65535 {
		return "", fmt.Errorf("%s=%d: the step transport listens on the next port, and there is none", nccl.EnvMasterPort, env.MasterPort)
	}
	return net.JoinHostPort(env.MasterAddr, strconv.Itoa(env.MasterPort+1)), nil
}

// ConnectRanks connects the processes of a deployment that LoadCUDARank loaded, once
// each has compiled its rank: rank 0 listens at StepAddr(env) and waits for every other
// rank, which connects and says how much device memory it has left. It waits at most the
// NCCL world's timeout and no longer than ctx. Close the Process before the model.
func ConnectRanks(ctx context.Context, m *CUDAModel) (*Process, error) {
	if m == nil || m.proc == nil {
		return nil, errors.New("engine: ConnectRanks needs a model loaded by LoadCUDARank")
	}
	env := *m.proc
	addr, err := StepAddr(env)
	if err != nil {
		return nil, fmt.Errorf("engine: rank %d: %w", env.Rank, err)
	}
	ctx, cancel := context.WithTimeout(ctx, m.worlds[0].Timeout())
	defer cancel()
	p := &Process{model: m, env: env}
	if env.Rank != 0 {
		free, _, err := m.devs[0].MemInfo()
		if err != nil {
			return nil, fmt.Errorf("engine: rank %d: %w", env.Rank, err)
		}
		if p.conn, err = dialRank0(ctx, addr, env.Rank, env.WorldSize, free, launcherOf(m.Program) != nil); err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		return p, nil
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("engine: rank 0: listen for the other ranks' steps (is %s taken?): %w", addr, err)
	}
	defer ln.Close()
	if p.followers, err = acceptFollowers(ctx, ln, env.WorldSize); err != nil {
		return nil, fmt.Errorf("engine: rank 0 at %s: %w", addr, err)
	}
	// A follower that has not replied within the collectives' timeout and a margin is
	// lost: its own World.Sync would have reported a failure by then.
	timeout := m.worlds[0].Timeout() + 30*time.Second
	for _, rr := range p.followers {
		rr.timeout = timeout
		rr.resident = cacheInputs(m.Graphs[rr.rank])
	}
	slog.Info("ranks connected", "world_size", env.WorldSize, "steps_at", addr)
	return p, nil
}

// cacheInputs names the KV cache inputs of a rank's graph (none for a graph without the
// cache stage).
func cacheInputs(g *graph.Graph) []string {
	var names []string
	for _, in := range g.Inputs {
		if isCacheInput(in.Name) {
			names = append(names, in.Name)
		}
	}
	return names
}

// Rank is this process's rank.
func (p *Process) Rank() int { return p.env.Rank }

// Leader reports whether this process is rank 0, which runs the engine.
func (p *Process) Leader() bool { return p.env.Rank == 0 }

// ranks are rank 0's executables: its program, then the followers.
func (p *Process) ranks() ([]Executable, error) {
	if !p.Leader() {
		return nil, fmt.Errorf("engine: rank %d follows rank 0; only rank 0 runs the model", p.env.Rank)
	}
	exes := []Executable{p.model.Program}
	for _, rr := range p.followers {
		exes = append(exes, rr)
	}
	return exes, nil
}

// Executable is, on rank 0, what runs the whole model (as CUDAModel.Executable does in one
// process): a RankGroup of rank 0's program and the followers.
func (p *Process) Executable() (Executable, error) {
	exes, err := p.ranks()
	if err != nil {
		return nil, err
	}
	return &RankGroup{Ranks: exes, Graphs: p.model.Graphs}, nil
}

// NewEngine starts, on rank 0, an engine on every rank of the deployment (as NewCUDA does
// in one process). The KV cache, when opts sets no size for it, takes cudaCacheFraction of
// the memory the emptiest GPU had free after the weights, less cudaReserveBytes.
func (p *Process) NewEngine(ctx context.Context, opts Options) (*Engine, error) {
	exes, err := p.ranks()
	if err != nil {
		return nil, err
	}
	if opts.KVBlocks == 0 && opts.KVCacheBytes == 0 {
		least, _, err := p.model.devs[0].MemInfo()
		if err != nil {
			return nil, fmt.Errorf("engine: rank 0: %w", err)
		}
		for _, rr := range p.followers {
			least = min(least, rr.free)
		}
		if opts.KVCacheBytes, err = cudaCacheBytes(least); err != nil {
			return nil, err
		}
	}
	m := p.model
	info := modelInfo(m.Model)
	ranks := make([]Rank, len(exes))
	for r, exe := range exes {
		ranks[r] = Rank{Graph: m.Graphs[r], Exe: exe}
	}
	return NewRanks(ctx, ranks, info, opts)
}

// Follow runs, on a follower, the steps rank 0 sends until rank 0 says goodbye (nil) or
// is lost (an error naming rank 0). See the package function Follow.
func (p *Process) Follow(ctx context.Context) error {
	if p.Leader() {
		return errors.New("engine: rank 0 does not follow")
	}
	var spec kvcache.Spec
	if l, err := CacheLayout(p.model.Graph); err == nil {
		spec = l.Cache
	}
	slog.Info("following rank 0", "rank", p.env.Rank, "world_size", p.env.WorldSize)
	if err := Follow(ctx, p.model.Program, spec, p.conn); err != nil {
		return fmt.Errorf("engine: rank %d: %w", p.env.Rank, err)
	}
	return nil
}

// Close ends the step transport: rank 0 says goodbye to every follower (whose Follow then
// returns nil); a follower closes its connection.
func (p *Process) Close() error {
	var errs []error
	for _, rr := range p.followers {
		errs = append(errs, rr.Close())
	}
	if p.conn != nil {
		if err := p.conn.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("engine: rank %d: %w", p.env.Rank, err))
		}
	}
	return errors.Join(errs...)
}

// rankList writes ranks as "0,1,2".
func rankList(ranks []int) string {
	parts := make([]string, len(ranks))
	for i, r := range ranks {
		parts[i] = strconv.Itoa(r)
	}
	return strings.Join(parts, ",")
}
