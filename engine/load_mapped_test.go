package engine

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loom-ml/loom/internal/parity"
)

// TestLoadMapsCPUWeights: on the CPU the weights kept as stored, and the fused gate/up
// weight, are views of the checkpoint's mapping; only the fused qkv weight is read as a copy;
// no weight both ways; the model computes Hugging Face's logits from them.
func TestLoadMapsCPUWeights(t *testing.T) {
	for _, name := range []string{"tiny-llama", "tiny-qwen2"} {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("..", "testdata", name)
			ref := loadReference(t, dir)
			m, err := Load(context.Background(), dir, LoadOptions{Optimize: true, Device: "cpu"})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			ck := m.Checkpoint
			if ck.BytesMapped() == 0 || ck.BytesRead() == 0 {
				t.Errorf("bytes mapped %d, read %d: want the unfused weights mapped and the fused ones read", ck.BytesMapped(), ck.BytesRead())
			}
			// The fused gate/up weight is a view too (gate_proj and up_proj lie one after the
			// other in the file); q, k and v do not, so their fused weight (and bias) is read.
			var total, qkv int64
			for _, n := range ck.Names() {
				info, _ := ck.Info(n)
				size := int64(info.DType.Size())
				for _, d := range info.Shape {
					size *= int64(d)
				}
				total += size
				if strings.Contains(n, ".self_attn.q_proj.") || strings.Contains(n, ".self_attn.k_proj.") || strings.Contains(n, ".self_attn.v_proj.") {
					qkv += size
				}
			}
			if ck.BytesRead() != qkv {
				t.Errorf("read %d bytes, want those of q, k and v (%d)", ck.BytesRead(), qkv)
			}
			if got := ck.BytesMapped() + ck.BytesRead(); got > total {
				t.Errorf("mapped %d + read %d bytes of a %d byte checkpoint: a weight was read twice", ck.BytesMapped(), ck.BytesRead(), total)
			}
			e, err := New(context.Background(), m, Options{Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			p := ref.Prompts[0]
			if err := parity.CheckLogits(cachedPromptLogits(t, e, p.IDs, len(p.IDs)), p, logitTol); err != nil {
				t.Errorf("logits from mapped weights: %v", err)
			}
			e.Close()
		})
	}
}
