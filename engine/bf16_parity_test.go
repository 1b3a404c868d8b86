package engine

import (
	"context"
	"path/filepath"
	"slices"
	"testing"

	"github.com/loom-ml/loom/internal/parity"
	"github.com/loom-ml/loom/tensor"
)

// TestBF16HuggingFace holds bf16 activations on the CPU to Hugging Face's f32 logits on every
// fixture, the mixture-of-experts ones included, through the optimized graph (fused ops, moe
// kernels): each prompt's last-position row within parity.BF16Bound of the reference (16 bf16
// ulps of its largest logit; the CPU measures at most 4), and greedy tokens equal to Hugging
// Face's, teacher-forced past steps whose margin is under twice that bound. The CUDA programs
// are held to the same bound on one GPU (backend/cuda TestProgramBF16HuggingFace and
// TestMoEFusedOnGPU, which also holds the GPU's bf16 MoE logits to these CPU ones).
func TestBF16HuggingFace(t *testing.T) {
	for _, name := range slices.Concat(supportedFixtures, moeFixtures) {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("..", "testdata", name)
			ref := loadReference(t, dir)
			m, err := Load(context.Background(), dir, LoadOptions{Optimize: true, Transforms: wholeSequences, ActivationDType: tensor.BF16})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			worst := 0.0
			for _, p := range ref.Prompts {
				logits, V := runAll(t, m.Executable(), p.IDs)
				bound := parity.BF16Bound(p.LastLogits)
				d, at := parity.MaxAbsDiff(logits[(len(p.IDs)-1)*V:], p.LastLogits)
				if !(d <= bound) {
					t.Errorf("%q (%d tokens): bf16 last-position logits differ from Hugging Face's by %.3g at token %d, bound %.3g",
						p.Text, len(p.IDs), d, at, bound)
				}
				worst = max(worst, d/bound*parity.BF16Ulps)
				res, err := parity.CheckGreedy(forcedGen(t, m.Executable(), p), p, 2*bound)
				if err != nil {
					t.Error(err)
				} else if len(res.Ties) > 0 {
					t.Logf("%q: near ties at %v forced, %d of %d steps compared", p.Text, res.Ties, res.Compared, res.Steps)
				}
			}
			t.Logf("bf16 logits within %.1f bf16 ulps of the row's largest", worst)
		})
	}
}
