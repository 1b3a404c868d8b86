package engine

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/loom-ml/loom/internal/parity"
	"github.com/loom-ml/loom/model/synth"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tensor"
)

// longContextEnv turns on TestCUDALongContextBF16: it writes a 16 GB checkpoint and holds
// an 8B model twice (bf16 and f32, ~48 GB) on one GPU.
const longContextEnv = "LOOM_LONG_CONTEXT"

// TestCUDALongContextBF16 runs a 32,000-token prompt through the paged CUDA engine on a
// llama-3.1-8b-shaped checkpoint from loom synth (llama3 rope scaling, 131,072 positions),
// once with bf16 activations and once with f32, prefilled through the KV cache in chunks
// of 2,048 tokens, and compares the last position's logits: the same top-1 token (unless
// f32's top two are closer than the bf16 error allows), and the error within 16 bf16 ulps
// of the row's largest logit (see backend/cuda's bf16Ulps). Rotary frequencies rounded to
// bf16 scramble positions this far out; with f32 frequencies only activation rounding is
// left. Run it with LOOM_LONG_CONTEXT=1 on a GPU host.
func TestCUDALongContextBF16(t *testing.T) {
	if os.Getenv(longContextEnv) != "1" {
		t.Skipf("set %s=1 to run (one GPU with ~60 GB free, 16 GB of disk)", longContextEnv)
	}
	needGPU(t)
	ctx := testCtx(t)
	dir := t.TempDir()
	if err := synth.Write(ctx, "llama-3.1-8b", dir, synth.Options{Seed: 3}); err != nil {
		t.Fatal(err)
	}
	const promptLen, chunk = 32000, 2048
	rng := rand.New(rand.NewPCG(5, 5))
	prompt := make([]int, promptLen)
	prompt[0] = 128000 // <|begin_of_text|>
	for i := 1; i < promptLen; i++ {
		prompt[i] = rng.IntN(128000)
	}
	last := func(act tensor.DType) []float32 {
		m, err := Load(ctx, dir, onCUDA(LoadOptions{Optimize: true, ActivationDType: act}))
		if err != nil {
			t.Fatal(err)
		}
		defer m.Close()
		e, err := New(ctx, m, Options{MaxTokensPerStep: chunk, KVBlocks: promptLen/16 + 8, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		return cachedPromptLogits(t, e, prompt, chunk)
	}
	want, got := last(tensor.F32), last(tensor.BF16)
	scale := 0.0
	for _, v := range want {
		scale = max(scale, math.Abs(float64(v)))
	}
	bound := 16 * scale / 128
	d, at := parity.MaxAbsDiff(got, want)
	wi, gi := sample.Argmax(want), sample.Argmax(got)
	t.Logf("32,000-token prompt: bf16 top-1 %d, f32 top-1 %d; max error %.4g at %d (%.1f bf16 ulps of %.3g)", gi, wi, d, at, d/scale*128, scale)
	if !(d <= bound) {
		t.Errorf("bf16 last-position logits differ from f32 by %.4g, bound %.4g", d, bound)
	}
	if gi != wi && float64(want[wi]-want[gi]) > 2*bound {
		t.Errorf("bf16 picks token %d, f32 %d, whose logits differ by %.4g (more than twice the bound %.4g)", gi, wi, want[wi]-want[gi], bound)
	}
}
