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
	worldSize       int
	mesh            string
	distBackend     string
	allowReplicated bool
	quantize        string // --quantize, read by loadWithProgress
	cmd             *cobra.Command
}

func addMeshFlags(cmd *cobra.Command, f *meshFlags) {
	fl := cmd.Flags()
	fl.IntVar(&f.worldSize, "world-size", 0, "number of ranks, tensor-parallel (tp=N): on the CPU goroutines of this process, on CUDA one GPU each")
	fl.StringVar(&f.mesh, "mesh", "", "device mesh, innermost axis first, e.g. tp=2 or tp=2,dp=2 (its size is the world size)")
	fl.StringVar(&f.distBackend, "dist-backend", "auto", "communicator: auto, local (goroutine ranks) or nccl (CUDA)")
	fl.StringVar(&f.quantize, "quantize", "", "quantize a bf16, f16 or f32 checkpoint while loading: fp8 (f8e4m3 decoder-layer projections with per-output-channel scales; embeddings, LM head and norms stay as stored)")
	fl.BoolVar(&f.allowReplicated, "allow-replicated", false, "run a mesh whose tp size does not divide the model's heads or sizes, those weights whole on every rank (refused without it)")
	f.cmd = cmd
}

// resolve turns the flags into a mesh; the zero Mesh is one rank. On several ranks without
// --allow-replicated it sets detect_sharding's refuse_fallback through the command's --set
// (the transform flags the command loads with), so that a tp size the model's heads or
// sizes do not divide fails before any weight is read instead of loading a copy per rank.
func (f meshFlags) resolve() (dist.Mesh, error) {
	m, err := engine.MeshFor(f.worldSize, f.mesh)
	if err != nil {
		return dist.Mesh{}, fmt.Errorf("--world-size/--mesh: %w", err)
	}
	if m.Size() > 1 && !f.allowReplicated && f.cmd != nil {
		if set := f.cmd.Flags().Lookup("set"); set != nil {
			if err := set.Value.Set(refuseFallbackSet); err != nil {
				return dist.Mesh{}, err
			}
		}
	}
	return m, nil
}

// refuseFallbackSet is the --set that refuses sharding fallbacks (see resolve).
const refuseFallbackSet = "transforms.detect_sharding.refuse_fallback=true"
