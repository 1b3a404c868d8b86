package engine

import (
	"context"
	"path/filepath"
	"slices"
	"testing"
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
