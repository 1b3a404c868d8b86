package dist

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// One process per rank. A deployment may run each rank in a process of its own (one per
// GPU), started by `loom launch` or torchrun, which describe each process with the
// variables below. ProcessEnv is one process's place in such a world; ProcessOptions bound
// how long its processes wait for each other. The communicator that joins the processes
// (dist/nccl) and the engine's step transport both read them.

// The torchrun-style variables that describe one process of a multi-process world. `loom
// launch` sets them for each process it starts.
const (
	EnvRank       = "RANK"        // this process's rank, 0 <= RANK < WORLD_SIZE
	EnvWorldSize  = "WORLD_SIZE"  // the number of processes (ranks)
	EnvLocalRank  = "LOCAL_RANK"  // this process's index on its host: its GPU ordinal (RANK when unset)
	EnvMasterAddr = "MASTER_ADDR" // host or IP address where rank 0 listens for the rendezvous
	EnvMasterPort = "MASTER_PORT" // TCP port of that listener
)

// ProcessEnv is one process's place in a multi-process world, as ProcessEnvFromOS reads it.
type ProcessEnv struct {
	Rank       int    // RANK
	WorldSize  int    // WORLD_SIZE
	LocalRank  int    // LOCAL_RANK: the device (GPU ordinal) this rank uses
	MasterAddr string // MASTER_ADDR
	MasterPort int    // MASTER_PORT, 1..65535
}

// Addr is the rendezvous address, MASTER_ADDR:MASTER_PORT.
func (e ProcessEnv) Addr() string {
	return net.JoinHostPort(e.MasterAddr, strconv.Itoa(e.MasterPort))
}

// String gives the variables as they would be set, e.g.
// "RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500".
func (e ProcessEnv) String() string {
	return fmt.Sprintf("%s=%d %s=%d %s=%d %s=%s %s=%d", EnvRank, e.Rank, EnvWorldSize, e.WorldSize,
		EnvLocalRank, e.LocalRank, EnvMasterAddr, e.MasterAddr, EnvMasterPort, e.MasterPort)
}

// ProcessEnvFromOS reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT from the
// process environment (see ParseProcessEnv).
func ProcessEnvFromOS() (ProcessEnv, error) { return ParseProcessEnv(os.LookupEnv) }

// ParseProcessEnv reads the world variables through lookup (os.LookupEnv, or a map in
// tests). RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are required; LOCAL_RANK defaults to
// RANK. Errors name the variable and say what is wrong with it.
func ParseProcessEnv(lookup func(string) (string, bool)) (ProcessEnv, error) {
	var e ProcessEnv
	intVar := func(name string, required bool, def int) (int, error) {
		s, ok := lookup(name)
		s = strings.TrimSpace(s)
		if !ok || s == "" {
			if required {
				return 0, fmt.Errorf("dist: %s is not set (a multi-process run needs %s, %s, %s and %s; `loom launch` sets them)",
					name, EnvRank, EnvWorldSize, EnvMasterAddr, EnvMasterPort)
			}
			return def, nil
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			return 0, fmt.Errorf("dist: %s=%q is not an integer", name, s)
		}
		return n, nil
	}
	var err error
	if e.WorldSize, err = intVar(EnvWorldSize, true, 0); err != nil {
		return ProcessEnv{}, err
	}
	if e.WorldSize < 1 {
		return ProcessEnv{}, fmt.Errorf("dist: %s=%d, want at least 1", EnvWorldSize, e.WorldSize)
	}
	if e.Rank, err = intVar(EnvRank, true, 0); err != nil {
		return ProcessEnv{}, err
	}
	if e.Rank < 0 || e.Rank >= e.WorldSize {
		return ProcessEnv{}, fmt.Errorf("dist: %s=%d out of range for %s=%d (want 0..%d)", EnvRank, e.Rank, EnvWorldSize, e.WorldSize, e.WorldSize-1)
	}
	if e.LocalRank, err = intVar(EnvLocalRank, false, e.Rank); err != nil {
		return ProcessEnv{}, err
	}
	if e.LocalRank < 0 {
		return ProcessEnv{}, fmt.Errorf("dist: %s=%d is negative", EnvLocalRank, e.LocalRank)
	}
	addr, _ := lookup(EnvMasterAddr)
	if e.MasterAddr = strings.TrimSpace(addr); e.MasterAddr == "" {
		return ProcessEnv{}, fmt.Errorf("dist: %s is not set (the host where rank 0 listens, e.g. 127.0.0.1)", EnvMasterAddr)
	}
	if e.MasterPort, err = intVar(EnvMasterPort, true, 0); err != nil {
		return ProcessEnv{}, err
	}
	if e.MasterPort < 1 || e.MasterPort > 65535 {
		return ProcessEnv{}, fmt.Errorf("dist: %s=%d is not a TCP port (want 1..65535)", EnvMasterPort, e.MasterPort)
	}
	return e, nil
}

// ProcessOptions bound how long the processes of a multi-process world wait for each other:
// the rendezvous, the liveness channel between them and each wait for the collectives.
type ProcessOptions struct {
	// Timeout bounds the rendezvous (every rank must have connected to rank 0 within it),
	// the communicators' initialisation, each wait for a collective and each wait for
	// another process. Zero means the communicator's default (dist/nccl: 120 s).
	Timeout time.Duration
	// Heartbeat is the interval between liveness messages. Zero means the default.
	Heartbeat time.Duration
	// PeerTimeout is how long a peer may stay silent before it counts as failed; it must
	// exceed Heartbeat. Zero means the default.
	PeerTimeout time.Duration
}
