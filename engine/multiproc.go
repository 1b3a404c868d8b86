package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/engine/steps"
	"github.com/loom-ml/loom/kvcache"
)

// process is this process's rank of a deployment with one process per rank (see
// LoadOptions.Process), connected to the other ranks by the step transport (package
// engine/steps): rank 0 runs the engine or GreedyRecompute and sends every step's inputs to
// the other ranks, the followers, which run their own programs on them (Model.Follow).
type process struct {
	env       dist.ProcessEnv
	followers []*steps.Remote // rank 0: ranks 1..n-1
	conn      net.Conn        // a follower: its connection to rank 0
}

// connectRanks connects the processes of a deployment once each has compiled its rank:
// rank 0 listens at steps.Addr(env) and waits for every other rank, which connects and
// says how much device memory it has left. It waits at most the backend's timeout for the
// other processes and no longer than ctx.
func connectRanks(ctx context.Context, m *Model, env dist.ProcessEnv) (*process, error) {
	addr, err := steps.Addr(env)
	if err != nil {
		return nil, fmt.Errorf("engine: rank %d: %w", env.Rank, err)
	}
	if m.dep.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, m.dep.Timeout)
		defer cancel()
	}
	p := &process{env: env}
	if env.Rank != 0 {
		var free uint64
		if m.dep.FreeMemory != nil {
			if free, err = m.dep.FreeMemory(); err != nil {
				return nil, fmt.Errorf("engine: rank %d: %w", env.Rank, err)
			}
		}
		_, launches := m.Program.(backend.Launcher)
		if p.conn, err = steps.Dial(ctx, addr, env.Rank, env.WorldSize, free, launches); err != nil {
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
	if p.followers, err = steps.Accept(ctx, ln, env.WorldSize); err != nil {
		return nil, fmt.Errorf("engine: rank 0 at %s: %w", addr, err)
	}
	// A follower that has not replied within the collectives' timeout and a margin is
	// lost: its own communicator would have reported a failure by then.
	for _, rr := range p.followers {
		if m.dep.Timeout > 0 {
			rr.SetTimeout(m.dep.Timeout + 30*time.Second)
		}
		rr.SetResident(cacheInputs(m.Graphs[rr.Rank()]))
	}
	slog.Info("ranks connected", "world_size", env.WorldSize, "steps_at", addr)
	return p, nil
}

// leader reports whether this process is rank 0, which runs the engine.
func (p *process) leader() bool { return p.env.Rank == 0 }

// ranks are rank 0's ranks: its program, then the followers.
func (p *process) ranks(m *Model) []Rank {
	ranks := []Rank{{Graph: m.Graphs[0], Exe: m.Program}}
	for _, rr := range p.followers {
		ranks = append(ranks, Rank{Graph: m.Graphs[rr.Rank()], Exe: rr.Executable()})
	}
	return ranks
}

// leastFree is the least device memory free on any rank: rank 0's now, the followers' when
// they connected.
func (p *process) leastFree(m *Model) (uint64, error) {
	least, err := m.dep.FreeMemory()
	if err != nil {
		return 0, err
	}
	for _, rr := range p.followers {
		least = min(least, rr.Free())
	}
	return least, nil
}

// follow runs a follower's loop (steps.Follow) on its program.
func (p *process) follow(ctx context.Context, m *Model) error {
	var spec kvcache.Spec
	if l, err := CacheLayout(m.Graph); err == nil {
		spec = l.Cache
	}
	slog.Info("following rank 0", "rank", p.env.Rank, "world_size", p.env.WorldSize)
	if err := steps.Follow(ctx, m.Program, spec, p.conn); err != nil {
		return fmt.Errorf("engine: rank %d: %w", p.env.Rank, err)
	}
	return nil
}

// close ends the step transport: rank 0 says goodbye to every follower (whose Follow then
// returns nil); a follower closes its connection.
func (p *process) close() error {
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
