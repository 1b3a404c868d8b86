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

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/engine"
)

// One process per GPU: under `loom launch --nproc N` (or torchrun), every process has
// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. serve, bench, chat and
// generate then load only their own rank (engine.LoadOptions.Process, on GPU LOCAL_RANK),
// which connects the ranks: rank 0 runs the command as it would alone, sending each step's
// inputs to the other ranks, which follow it until it ends.

// processEnv reads the multi-process world from the environment (lookup is os.LookupEnv
// outside tests): multi is set when WORLD_SIZE is more than 1, and then every variable
// must be valid. WORLD_SIZE unset or 1 is a process on its own.
func processEnv(lookup func(string) (string, bool)) (env dist.ProcessEnv, multi bool, err error) {
	ws, ok := lookup(dist.EnvWorldSize)
	if ws = strings.TrimSpace(ws); !ok || ws == "" {
		return dist.ProcessEnv{}, false, nil
	}
	if n, err := strconv.Atoi(ws); err == nil && n == 1 {
		return dist.ProcessEnv{}, false, nil
	}
	if env, err = dist.ParseProcessEnv(lookup); err != nil {
		return dist.ProcessEnv{}, false, fmt.Errorf("one process per rank: %w", err)
	}
	return env, true, nil
}

// checkProcessWorld says why this process's flags cannot run as one rank of env's world:
// ranks in their own processes run on a backend that runs one process per rank (CUDA), and
// the mesh of --world-size/--mesh must have WORLD_SIZE ranks.
func checkProcessWorld(env dist.ProcessEnv, mesh dist.Mesh, dev backend.Backend) error {
	if err := dev.Check(backend.Needs{Process: &env}); errors.Is(err, backend.ErrProcesses) {
		return fmt.Errorf("%s=%d: one process per rank runs on CUDA, not --device %s (on the CPU the ranks of --world-size are goroutines of one process: run it without loom launch)",
			dist.EnvWorldSize, env.WorldSize, dev.Name())
	}
	if n := max(mesh.Size(), 1); n != env.WorldSize {
		return fmt.Errorf("%s=%d (loom launch --nproc), but --world-size/--mesh give %d rank(s): pass --world-size %d or a mesh of that size",
			dist.EnvWorldSize, env.WorldSize, n, env.WorldSize)
	}
	return nil
}

// withProcessEnv makes opts load this process's rank only when the environment describes a
// multi-process world (see processEnv), after checking that the flags fit it.
func withProcessEnv(opts *engine.LoadOptions, dev backend.Backend) error {
	env, multi, err := processEnv(os.LookupEnv)
	if err != nil || !multi {
		return err
	}
	if err := checkProcessWorld(env, opts.Mesh, dev); err != nil {
		return err
	}
	slog.Info("one process per rank", "rank", env.Rank, "world_size", env.WorldSize, "gpu", env.LocalRank, "rendezvous", env.Addr())
	opts.Process = &env
	return nil
}

// follow runs a follower until rank 0 ends, then closes its model (and connection). A
// signal does not stop it: rank 0 gets the same one (loom launch forwards it), finishes
// the requests in flight and says goodbye, and a rank 0 that dies ends it as well.
func follow(m *engine.Model) error {
	rank := m.Rank()
	err := errors.Join(m.Follow(context.Background()), m.Close())
	if err == nil {
		slog.Info("rank 0 is done; this rank exits", "rank", rank)
	}
	return err
}

// exitProcess ends the process (os.Exit; tests replace it).
var exitProcess = os.Exit

// startFollower is what engineFlags.start does on a rank other than 0 of a multi-process
// world: it never returns, but follows rank 0 and then ends the process, with status 0
// when rank 0 ended normally and 1 (the error on stderr) otherwise, so that serve, bench
// and chat need no follower path of their own.
func startFollower(cmd *cobra.Command, m *engine.Model) {
	if err := follow(m); err != nil {
		fmt.Fprintln(cmd.ErrOrStderr(), "loom:", err)
		exitProcess(1)
	}
	exitProcess(0)
}
