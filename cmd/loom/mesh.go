package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/engine"
)

// meshFlags are --world-size and --mesh: the ranks a model is deployed on. On the CPU the
// ranks are goroutines of this process.
type meshFlags struct {
	worldSize   int
	mesh        string
	distBackend string
}

func addMeshFlags(cmd *cobra.Command, f *meshFlags) {
	fl := cmd.Flags()
	fl.IntVar(&f.worldSize, "world-size", 0, "number of ranks, tensor-parallel (tp=N): on the CPU goroutines of this process, on CUDA one GPU each")
	fl.StringVar(&f.mesh, "mesh", "", "device mesh, innermost axis first, e.g. tp=2 or tp=2,dp=2 (its size is the world size)")
	fl.StringVar(&f.distBackend, "dist-backend", "auto", "communicator: auto, local (goroutine ranks) or nccl (CUDA)")
}

// resolve turns the flags into a mesh; the zero Mesh is one rank.
func (f meshFlags) resolve() (dist.Mesh, error) {
	m, err := engine.MeshFor(f.worldSize, f.mesh)
	if err != nil {
		return dist.Mesh{}, fmt.Errorf("--world-size/--mesh: %w", err)
	}
	return m, nil
}
