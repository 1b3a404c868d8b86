package engine

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/loom-ml/loom/tensor"
)

// The MoE fixtures on CUDA, their moe ops on the fused kernels (backend/cuda/moe.go): the
// optimized whole-sequence graph gives Hugging Face's logits and greedy tokens, as the dense
// fixtures do in TestCUDAHuggingFaceParity; and the paged engine, CUDA graphs capturing the
// decode steps with their on-device routing, gives the CPU engine's greedy tokens.
func TestCUDAMoEFused(t *testing.T) {
	needGPU(t)
	for _, name := range moeFixtures {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("..", "testdata", name)
			ref := loadReference(t, dir)
			m, err := Load(context.Background(), dir, onCUDA(LoadOptions{Optimize: true, WholeSequences: true}))
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range ref.Prompts {
				logits, _ := runAll(t, m.Executable(), p.IDs)
				checkLogits(t, logits, p)
				checkGreedy(t, recomputeGen(m.Executable()), p)
			}
			if err := m.Close(); err != nil {
				t.Error(err)
			}

			pm, err := Load(context.Background(), dir, onCUDA(LoadOptions{Optimize: true}))
			if err != nil {
				t.Fatal(err)
			}
			defer pm.Close()
			eo := Options{MaxTokensPerStep: 16, KVBlocks: 64, Logger: quiet}
			ge, err := New(context.Background(), pm, eo)
			if err != nil {
				t.Fatal(err)
			}
			defer ge.Close()
			ce := newEngine(t, name, eo)
			for _, p := range ref.Prompts {
				got, _ := generate(t, ge, Request{Prompt: p.IDs, MaxTokens: 10, IgnoreEOS: true})
				want, _ := generate(t, ce, Request{Prompt: p.IDs, MaxTokens: 10, IgnoreEOS: true})
				if !slices.Equal(got, want) {
					t.Errorf("%q: CUDA tokens %v, CPU %v", p.Text, got, want)
				}
			}
		})
	}
}

// Expert and tensor parallelism of the MoE fixtures on two GPUs (issue 23's runs): the
// paged CUDA engine at ep=2 (both strategies: the all_reduce of the weighted sums, and
// all_to_all dispatch and combine of the routed tokens) and at tp=2 (each expert cut over
// tp), with f32 activations, gives the CPU engine's greedy tokens, as one GPU does in
// TestCUDAMoEFused.
func TestCUDAMoESharded(t *testing.T) {
	needGPUs(t, 2)
	for _, name := range moeFixtures {
		dir := filepath.Join("..", "testdata", name)
		ref := loadReference(t, dir)
		eo := Options{MaxTokensPerStep: 16, KVBlocks: 64, Logger: quiet}
		ce := newEngine(t, name, eo)
		for _, tc := range []struct{ mesh, strategy string }{{"ep=2", "all_reduce"}, {"ep=2", "all_to_all"}, {"tp=2", "all_reduce"}} {
			t.Run(name+"/"+tc.mesh+"/"+tc.strategy, func(t *testing.T) {
				opts := onCUDA(LoadOptions{Optimize: true, Mesh: mustMeshFor(t, 0, tc.mesh), ActivationDType: tensor.F32})
				opts.Transforms.Sets = []string{"transforms.sharding_executor.ep_strategy=" + tc.strategy}
				m, err := Load(context.Background(), dir, opts)
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				ge, err := New(context.Background(), m, eo)
				if err != nil {
					t.Fatal(err)
				}
				defer ge.Close()
				for _, p := range ref.Prompts {
					got, _ := generate(t, ge, Request{Prompt: p.IDs, MaxTokens: 10, IgnoreEOS: true})
					want, _ := generate(t, ce, Request{Prompt: p.IDs, MaxTokens: 10, IgnoreEOS: true})
					if !slices.Equal(got, want) {
						t.Errorf("%q: CUDA tokens at %s (%s) %v, CPU %v", p.Text, tc.mesh, tc.strategy, got, want)
					}
				}
			})
		}
	}
}
