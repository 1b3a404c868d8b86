package engine

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/loom-ml/loom/internal/parity"
)

// TestCUDAFP8 runs the FP8 fixtures (fp8Fixtures: block scales of 16x16 and 8x8, channel
// and tensor scales) and tiny-llama with --quantize fp8 on CUDA, linear_fp8 on its kernels
// (backend/cuda/fp8.go): the FP8 GEMV for prompts and steps of up to 8 tokens, the weight
// dequantized into the workspace and cuBLAS for longer ones.
//
// Tolerances: these graphs compute activations in f32, on CUDA as on the CPU (linear_fp8
// does not round its f32 activations; the GEMV applies the scale to f32 sums instead of to
// each weight, a change of f32 operation order only). So CUDA is held to the same reference
// the CPU meets in TestFP8HuggingFaceParity and TestQuantizeFP8 with the same tolerance
// (parity.LogitTol on every position's logits, greedy tokens up to near ties), and so
// directly to the CPU's logits within 2·LogitTol (both within LogitTol of the reference).
// The paged engine, decode steps captured in CUDA graphs, gives the CPU engine's greedy
// tokens.
func TestCUDAFP8(t *testing.T) {
	needGPU(t)
	for _, name := range fp8Fixtures {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("..", "testdata", name)
			checkCUDAFP8(t, dir, loadReference(t, dir), LoadOptions{})
		})
	}
	t.Run("tiny-llama/quantize", func(t *testing.T) {
		fixture := filepath.Join("..", "testdata", "tiny-llama")
		refDir, _ := dequantizedCopy(t, fixture)
		checkCUDAFP8(t, fixture, dequantizedReference(t, fixture, refDir), LoadOptions{Quantize: "fp8"})
	})
}

// checkCUDAFP8 holds the checkpoint in dir, loaded with opts on CUDA, to ref and to the
// CPU: the optimized whole-sequence graph's logits and greedy tokens, then the paged
// engine's greedy tokens against the CPU engine's on the same load options.
func checkCUDAFP8(t *testing.T, dir string, ref *parity.Reference, opts LoadOptions) {
	t.Helper()
	whole := opts
	whole.Optimize, whole.WholeSequences = true, true
	gm, err := Load(context.Background(), dir, onCUDA(whole))
	if err != nil {
		t.Fatal(err)
	}
	defer gm.Close()
	if countOps(gm, "linear_fp8") == 0 {
		t.Fatal("the optimized graph has no linear_fp8")
	}
	cm, err := Load(context.Background(), dir, whole)
	if err != nil {
		t.Fatal(err)
	}
	defer cm.Close()
	for _, p := range ref.Prompts {
		logits, _ := runAll(t, gm.Executable(), p.IDs)
		checkLogits(t, logits, p)
		want, _ := runAll(t, cm.Executable(), p.IDs)
		if d, i := maxAbsDiff(logits, want); d > 2*logitTol {
			t.Errorf("%q: CUDA logits differ from the CPU's by %.3g at %d (allowed %.3g)", p.Text, d, i, 2*logitTol)
		}
		gen := recomputeGen(gm.Executable())
		if len(p.IDs) > 64 {
			gen = forcedGen(t, gm.Executable(), p)
		}
		checkGreedy(t, gen, p)
	}

	paged := opts
	paged.Optimize = true
	eo := Options{MaxTokensPerStep: 16, KVBlocks: 64, Logger: quiet}
	engines := make([]*Engine, 2)
	for i, o := range []LoadOptions{onCUDA(paged), paged} {
		m, err := Load(context.Background(), dir, o)
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		e, err := New(context.Background(), m, eo)
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		engines[i] = e
	}
	for _, p := range ref.Prompts {
		got, _ := generate(t, engines[0], Request{Prompt: p.IDs, MaxTokens: 10, IgnoreEOS: true})
		want, _ := generate(t, engines[1], Request{Prompt: p.IDs, MaxTokens: 10, IgnoreEOS: true})
		if !slices.Equal(got, want) {
			t.Errorf("%q: CUDA tokens %v, CPU %v", p.Text, got, want)
		}
	}
}
