package nccl

import "github.com/loom-ml/loom/dist"

// The torchrun-style variables that describe one process of a multi-process world (see
// dist.ProcessEnv, which they fill). `loom launch` sets them for each process it starts.
const (
	EnvRank       = dist.EnvRank
	EnvWorldSize  = dist.EnvWorldSize
	EnvLocalRank  = dist.EnvLocalRank
	EnvMasterAddr = dist.EnvMasterAddr
	EnvMasterPort = dist.EnvMasterPort
)

// Env is one process's place in a multi-process world: dist.ProcessEnv.
type Env = dist.ProcessEnv

// EnvFromOS reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT from the
// process environment (dist.ProcessEnvFromOS).
func EnvFromOS() (Env, error) { return dist.ProcessEnvFromOS() }

// ParseEnv reads the world variables through lookup (dist.ParseProcessEnv).
func ParseEnv(lookup func(string) (string, bool)) (Env, error) { return dist.ParseProcessEnv(lookup) }
