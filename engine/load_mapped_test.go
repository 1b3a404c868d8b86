package engine

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loom-ml/loom/internal/parity"
)

// TestLoadMapsCPUWeights: on the CPU every weight matrix is a view of the checkpoint's
// mapping: those kept as stored, the fused gate/up weight (its parts lie one after the other
// in the file) and the parts of the fused q/k/v weight (they do not: the linear reads them in
// place, backend/cpu/parted.go). Only the fused q/k/v bias is read as a copy (a vector, not a
// matrix of whole row groups); no weight is read both ways; the model computes Hugging Face's
// logits from them.
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
			var total, qkvBias int64
			for _, n := range ck.Names() {
				info, _ := ck.Info(n)
				size := int64(info.DType.Size())
				for _, d := range info.Shape {
					size *= int64(d)
				}
				total += size
				for _, p := range []string{"q", "k", "v"} {
					if strings.HasSuffix(n, ".self_attn."+p+"_proj.bias") {
						qkvBias += size
					}
				}
			}
			if ck.BytesRead() != qkvBias {
				t.Errorf("read %d bytes, want those of the q, k and v biases (%d)", ck.BytesRead(), qkvBias)
			}
			if ck.BytesMapped() == 0 {
				t.Error("no weight is a view of the mapping")
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
