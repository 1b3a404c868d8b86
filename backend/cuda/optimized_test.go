package cuda

import (
	"context"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform"
)

// optimizedGraph builds a fixture's graph with the frontend and runs the default transform
// pipeline over it (whole sequences: the cache stage stays off, as default.yaml has it).
func optimizedGraph(t *testing.T, m *model.Model, act tensor.DType) *graph.Graph {
	t.Helper()
	plain, err := model.BuildGraph(m.Config, model.BuildOptions{ActivationDType: act, Tensors: m.Checkpoint})
	if err != nil {
		t.Fatal(err)
	}
	o, err := (&transform.Flags{Check: true}).Optimizer(m.Config.ModelType)
	if err != nil {
		t.Fatal(err)
	}
	tc := &transform.Context{Arch: m.Config.ModelType, WorldSize: 1, Weights: m.Checkpoint}
	graphs, _, err := o.Run(context.Background(), tc, plain)
	if err != nil {
		t.Fatal(err)
	}
	return graphs[0]
}

// Every op of the optimized fixture graphs has a CUDA kernel (checked without a GPU).
func TestOptimizedGraphOpsHaveKernels(t *testing.T) {
	for _, name := range fixtures {
		for _, act := range []tensor.DType{tensor.F32, tensor.BF16} {
			m, _, _ := fixtureGraphs(t, name, act)
			g := optimizedGraph(t, m, act)
			ops := map[string]int{}
			for _, n := range g.Nodes {
				ops[n.Op]++
				if n.Op == graph.OpParam || n.Op == graph.OpConst {
					continue
				}
				if _, ok := opKernels[n.Op]; !ok {
					t.Errorf("%s %s: no CUDA kernel for op %q (%s)", name, act, n.Op, nodeText(n))
				}
			}
			t.Logf("%s %s: %v", name, act, ops)
		}
	}
}

// The CUDA executor runs the graphs the default transform pipeline makes of every fixture
// and gives the CPU backend's logits on them, with f32 and bf16 activations.
func TestOptimizedProgramFixtures(t *testing.T) {
	d := gpu(t)
	for _, name := range fixtures {
		for _, act := range []tensor.DType{tensor.F32, tensor.BF16} {
			t.Run(name+"/"+act.String(), func(t *testing.T) {
				m, _, _ := fixtureGraphs(t, name, act)
				checkAgainstCPU(t, d, name, act, m, optimizedGraph(t, m, act))
			})
		}
	}
}

// The optimized graphs, run by the CUDA executor with f32 activations and exact f32 GEMMs,
// give Hugging Face's logits within parity.LogitTol and its greedy tokens.
func TestOptimizedProgramHuggingFaceParity(t *testing.T) {
	d := gpu(t)
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			m, _, _ := fixtureGraphs(t, name, tensor.F32)
			checkHFParity(t, d, name, m, optimizedGraph(t, m, tensor.F32))
		})
	}
}
