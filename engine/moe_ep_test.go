package engine

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loom-ml/loom/internal/parity"
)

// An ep size that does not divide a MoE model's experts fails the load naming both, while
// the graph is optimized, before any weight is read.
func TestLoadExpertParallelNotDividing(t *testing.T) {
	dir := filepath.Join("..", "testdata", "tiny-qwen2moe") // 4 experts
	for _, mesh := range []string{"ep=3", "tp=2,ep=3", "ep=8"} {
		_, err := Load(context.Background(), dir, LoadOptions{Optimize: true, Mesh: mustMeshFor(t, 0, mesh)})
		if err == nil || !strings.Contains(err.Error(), "does not divide the 4 experts of the moe op of model.layers.0.mlp") {
			t.Errorf("mesh %s: error %v", mesh, err)
		}
	}
}

// TestMoEAllToAllHuggingFaceParity holds the second expert-parallel strategy, all_to_all
// dispatch and combine of the routed tokens (sharding_executor's ep_strategy), to Hugging
// Face's last-position logits on the cached engine at ep=2, ep=4 and tp=2,ep=2, with the
// prompts fed in chunks of 7 tokens, and to the all_reduce strategy: bit for bit with ep
// alone (both are then the unsharded engine's bits, which this also checks), within the
// parity tolerance at tp=2,ep=2, where the strategies reduce the tp partial sums of the
// experts at different points (all_to_all per expert row, all_reduce after the weighted
// sum).
func TestMoEAllToAllHuggingFaceParity(t *testing.T) {
	if testing.Short() {
		t.Skip("sharded runs skipped in -short mode")
	}
	run := func(t *testing.T, dir, meshText, strategy string, check func(*Model)) [][]float32 {
		t.Helper()
		mesh := mustMeshFor(t, 0, meshText)
		if meshText == "" {
			mesh = mustMeshFor(t, 1, "")
		}
		opts := LoadOptions{Optimize: true, Mesh: mesh}
		opts.Transforms.Sets = []string{"transforms.sharding_executor.ep_strategy=" + strategy}
		m, err := Load(context.Background(), dir, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		if check != nil {
			check(m)
		}
		ref := loadReference(t, dir)
		e := parityEngine(t, m, ref)
		var out [][]float32
		for _, p := range ref.Prompts {
			out = append(out, cachedPromptLogits(t, e, p.IDs, 7))
		}
		return out
	}
	for _, name := range moeFixtures {
		dir := filepath.Join("..", "testdata", name)
		ref := loadReference(t, dir)
		unsharded := run(t, dir, "", "all_reduce", nil)
		for _, meshText := range []string{"ep=2", "ep=4", "tp=2,ep=2"} {
			t.Run(name+"/"+meshText, func(t *testing.T) {
				ep, err := mustMeshFor(t, 0, meshText).AxisSize("ep")
				if err != nil {
					t.Fatal(err)
				}
				a2a := run(t, dir, meshText, "all_to_all", func(m *Model) {
					ops := map[string]int{}
					for _, n := range m.Graph.Nodes {
						ops[n.Op]++
						if n.Op == "moe_experts" {
							if L, E := n.Inputs[2].Type.Shape[0].Size, n.Inputs[2].Producer.Attrs.Shape("shape")[0].Size; L*ep != E {
								t.Errorf("rank 0 runs %d of %d experts over ep=%d", L, E, ep)
							}
						}
					}
					if ops["moe"] != 0 || ops["moe_dispatch"] == 0 || ops["moe_dispatch"] != ops["moe_combine"] || ops["all_to_all"] != 3*ops["moe_dispatch"] {
						t.Errorf("rank 0's graph runs %v", ops)
					}
				})
				reduced := run(t, dir, meshText, "all_reduce", nil)
				for i, p := range ref.Prompts {
					if err := parity.CheckLogits(a2a[i], p, logitTol); err != nil {
						t.Error(err)
					}
					d, at := maxAbsDiff(a2a[i], reduced[i])
					u, _ := maxAbsDiff(a2a[i], unsharded[i])
					h, _ := maxAbsDiff(a2a[i][len(a2a[i])-len(p.LastLogits):], p.LastLogits)
					t.Logf("prompt %d (%d tokens): all_to_all within %.3g of Hugging Face, %.3g of all_reduce, %.3g of unsharded", i, len(p.IDs), h, d, u)
					switch {
					case strings.Contains(meshText, "tp"):
						if d > logitTol {
							t.Errorf("prompt %d: all_to_all and all_reduce differ by %.3g at %d", i, d, at)
						}
					case d != 0 || u != 0:
						t.Errorf("prompt %d: all_to_all differs from all_reduce by %.3g at %d, from the unsharded engine by %.3g", i, d, at, u)
					}
				}
			})
		}
	}
}
