package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/dist/nccl"
	"github.com/loom-ml/loom/engine"
	"github.com/loom-ml/loom/model"
)

// One process per GPU: under `loom launch --nproc N` (or torchrun), every process has
// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. serve, bench, chat and
// generate then load only their own rank (engine.LoadCUDARank, on GPU LOCAL_RANK) and
// connect the ranks (engine.ConnectRanks): rank 0 runs the command as it would alone,
// sending each step's inputs to the other ranks, which follow it until it ends.

// processEnv reads the multi-process world from the environment (lookup is os.LookupEnv
// outside tests): multi is set when WORLD_SIZE is more than 1, and then every variable
// must be valid. WORLD_SIZE unset or 1 is a process on its own.
func processEnv(lookup func(string) (string, bool)) (env nccl.Env, multi bool, err error) {
	ws, ok := lookup(nccl.EnvWorldSize)
	if ws = strings.TrimSpace(ws); !ok || ws == "" {
		return nccl.Env{}, false, nil
	}
	if n, err := strconv.Atoi(ws); err == nil && n == 1 {
		return nccl.Env{}, false, nil
	}
	if env, err = nccl.ParseEnv(lookup); err != nil {
		return nccl.Env{}, false, fmt.Errorf("one process per rank: %w", err)
	}
	return env, true, nil
}

// checkProcessWorld says why this process's flags cannot run as one rank of env's world:
// ranks in their own processes run on CUDA, and the mesh of --world-size/--mesh must have
// WORLD_SIZE ranks.
func checkProcessWorld(env nccl.Env, mesh dist.Mesh, dev engine.Device) error {
	if dev != engine.DeviceCUDA {
		return fmt.Errorf("%s=%d: one process per rank runs on CUDA, not --device %s (on the CPU the ranks of --world-size are goroutines of one process: run it without loom launch)",
			nccl.EnvWorldSize, env.WorldSize, dev)
	}
	if n := max(mesh.Size(), 1); n != env.WorldSize {
		return fmt.Errorf("%s=%d (loom launch --nproc), but --world-size/--mesh give %d rank(s): pass --world-size %d or a mesh of that size",
			nccl.EnvWorldSize, env.WorldSize, n, env.WorldSize)
	}
	return nil
}

// loadRank loads this process's rank of the model in dir and connects it to the others.
func loadRank(cmd *cobra.Command, dir string, opts engine.LoadOptions, env nccl.Env) (*engine.CUDAModel, *engine.Process, error) {
	slog.Info("one process per rank", "rank", env.Rank, "world_size", env.WorldSize, "gpu", env.LocalRank, "rendezvous", env.Addr())
	m, err := engine.LoadCUDARank(cmd.Context(), dir, opts, env, nccl.Options{})
	if err != nil {
		return nil, nil, err
	}
	p, err := engine.ConnectRanks(cmd.Context(), m)
	if err != nil {
		m.Close()
		return nil, nil, err
	}
	return m, p, nil
}

// follow runs a follower until rank 0 ends, then closes its connection and model. A
// signal does not stop it: rank 0 gets the same one (loom launch forwards it), finishes
// the requests in flight and says goodbye, and a rank 0 that dies ends it as well.
func follow(p *engine.Process, m *engine.CUDAModel) error {
	err := p.Follow(context.Background())
	err = errors.Join(err, p.Close(), m.Close())
	if err == nil {
		slog.Info("rank 0 is done; this rank exits", "rank", p.Rank())
	}
	return err
}

// exitProcess ends the process (os.Exit; tests replace it).
var exitProcess = os.Exit

// startRank is engineFlags.start for one rank of a multi-process world. On rank 0 it
// returns the engine as start does. Another rank never returns: it follows rank 0 and
// then ends the process, with status 0 when rank 0 ended normally and 1 (the error on
// stderr) otherwise, so that serve, bench and chat need no follower path of their own.
func (e *engineFlags) startRank(cmd *cobra.Command, dir string, env nccl.Env, opts engine.LoadOptions, eopts engine.Options) (*model.Model, *engine.Engine, func() error, error) {
	m, p, err := loadRank(cmd, dir, opts, env)
	if err != nil {
		return nil, nil, nil, err
	}
	if !p.Leader() {
		if err := follow(p, m); err != nil {
			fmt.Fprintln(cmd.ErrOrStderr(), "loom:", err)
			exitProcess(1)
		}
		exitProcess(0)
		return nil, nil, nil, errors.New("unreachable: a follower exits")
	}
	eng, err := p.NewEngine(context.WithoutCancel(cmd.Context()), eopts)
	if err != nil {
		p.Close()
		m.Close()
		return nil, nil, nil, err
	}
	return m.Model, eng, e.closer(cmd, m.Program, func() error { return errors.Join(p.Close(), m.Close()) }), nil
}
