package engine

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/loom-ml/loom/internal/parity"
	"github.com/loom-ml/loom/tensor"
)

// fp8ActUlps bounds, in bf16 ulps of a row's largest |logit|, how far the FP8 fixtures'
// logits may move from Hugging Face's (f32 on the dequantized weights) when bf16 activations
// go through the FP8 GEMM, which also rounds every linear's input to e4m3: 2^-4 relative at
// most, 16 times bf16's 2^-8, on the 7 linears of each layer. bf16 alone measures 2-4 ulps
// (parity.BF16Ulps); with the GEMM an H200 measured 14.1 (tiny-llama-fp8-ct) and 17.3
// (tiny-qwen3-fp8-ct): 36 leaves about twice that.
const fp8ActUlps = 36

// TestCUDAFP8GemmHuggingFace loads the FP8 fixtures whose checkpoints ask for FP8
// activations with scales the GEMM takes (tiny-llama-fp8-ct: channel scales, dynamic;
// tiny-qwen3-fp8-ct: a tensor scale, static) on CUDA with bf16 activations, so that prompts
// of more than 8 tokens run their linears on the FP8 GEMM, and holds the last position's
// logits to Hugging Face's within fp8ActUlps bf16 ulps of the row's largest, greedy tokens
// teacher-forced past margins under twice that.
func TestCUDAFP8GemmHuggingFace(t *testing.T) {
	needGPU(t)
	for _, name := range []string{"tiny-llama-fp8-ct", "tiny-qwen3-fp8-ct"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("..", "testdata", name)
			ref := loadReference(t, dir)
			m, err := Load(context.Background(), dir, onCUDA(LoadOptions{Optimize: true, Transforms: wholeSequences, ActivationDType: tensor.BF16}))
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if countOps(m, "linear_fp8") == 0 {
				t.Fatal("the optimized graph has no linear_fp8")
			}
			worst, long := 0.0, 0
			for _, p := range ref.Prompts {
				if len(p.IDs) > 8 {
					long++
				}
				logits, V := runAll(t, m.Executable(), p.IDs)
				bound := parity.BF16Bound(p.LastLogits) * fp8ActUlps / parity.BF16Ulps
				d, at := parity.MaxAbsDiff(logits[(len(p.IDs)-1)*V:], p.LastLogits)
				if !(d <= bound) {
					t.Errorf("%q (%d tokens): logits differ from Hugging Face's by %.3g at token %d, bound %.3g (%d bf16 ulps of the row's largest)",
						p.Text, len(p.IDs), d, at, bound, fp8ActUlps)
				}
				worst = max(worst, d/bound*fp8ActUlps)
				res, err := parity.CheckGreedy(forcedGen(t, m.Executable(), p), p, 2*bound)
				if err != nil {
					t.Error(err)
				} else if len(res.Ties) > 0 {
					t.Logf("%q: near ties at %v forced, %d of %d steps compared", p.Text, res.Ties, res.Compared, res.Steps)
				}
			}
			if long == 0 {
				t.Fatal("no prompt of more than 8 tokens: the FP8 GEMM never ran")
			}
			t.Logf("logits within %.1f bf16 ulps of the row's largest", worst)
		})
	}
}
