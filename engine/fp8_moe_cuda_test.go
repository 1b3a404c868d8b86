package engine

import (
	"context"
	"testing"

	"github.com/loom-ml/loom/tensor"
)

// TestCUDAFP8MoE loads the tiny FP8 mixture-of-experts checkpoints of TestFP8MoECheckpoints
// (experts dequantized to bf16 while loading, attention as linear_fp8) on CUDA and on the
// CPU, optimized, and holds CUDA's logits at every position to the CPU's: within twice
// logitTol in f32 activations (the fused moe kernels and the FP8 GEMV sum in their own
// order), and within parity's bf16 bound of the CPU's bf16 logits, where prompts of more than
// 8 tokens also run the attention's linears on the FP8 GEMM (e4m3 activations: the bound is
// fp8ActUlps of the row's largest logit).
func TestCUDAFP8MoE(t *testing.T) {
	needGPU(t)
	for _, s := range fp8MoEShapes {
		t.Run(s.name, func(t *testing.T) {
			_, fp8 := writeFP8MoE(t, s.from, "test-cuda-fp8-moe-"+s.name, s.edits)
			varyScales(t, fp8)
			if s.ct {
				toCompressedTensors(t, fp8)
			}
			for _, act := range []tensor.DType{tensor.F32, tensor.BF16} {
				opts := LoadOptions{Optimize: true, WholeSequences: true, ActivationDType: act}
				var logits [2][]float32
				for i, o := range []LoadOptions{onCUDA(opts), opts} {
					m, err := Load(context.Background(), fp8, o)
					if err != nil {
						t.Fatal(err)
					}
					if countOps(m, "moe") != s.sparse || countOps(m, "linear_fp8") == 0 {
						t.Errorf("%s: %d moe ops (want %d), %d linear_fp8", o.Device, countOps(m, "moe"), s.sparse, countOps(m, "linear_fp8"))
					}
					logits[i], _ = runAll(t, m.Executable(), fp8MoEPrompts[1])
					m.Close()
				}
				tol := 2 * logitTol
				if act == tensor.BF16 {
					scale := 0.0
					for _, v := range logits[1] {
						scale = max(scale, float64(v), -float64(v))
					}
					tol = fp8ActUlps * scale / 128
				}
				if d, at := maxAbsDiff(logits[0], logits[1]); !(d <= tol) {
					t.Errorf("%s activations: CUDA logits differ from the CPU's by %.3g at %d (allowed %.3g)", act, d, at, tol)
				}
			}
		})
	}
}
