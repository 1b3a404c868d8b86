package engine

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/loom-ml/loom/model/safetensors"
	"github.com/loom-ml/loom/tensor"
)

// copyFixture copies testdata/name to a new directory, with config.json's fields set as
// edits says (nil deletes one) and the tensors named in drop left out of model.safetensors.
func copyFixture(t *testing.T, name string, edits map[string]any, drop ...string) string {
	t.Helper()
	src, dir := filepath.Join("..", "testdata", name), t.TempDir()
	entries, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if e.Name() == "config.json" && edits != nil {
			var cfg map[string]any
			if err := json.Unmarshal(data, &cfg); err != nil {
				t.Fatal(err)
			}
			for k, v := range edits {
				if v == nil {
					delete(cfg, k)
				} else {
					cfg[k] = v
				}
			}
			if data, err = json.Marshal(cfg); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if len(drop) > 0 {
		f, err := safetensors.Open(filepath.Join(src, "model.safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		kept := map[string]*tensor.Tensor{}
		for _, n := range f.Names() {
			if !slices.Contains(drop, n) {
				if kept[n], err = f.Tensor(n); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := safetensors.Write(filepath.Join(dir, "model.safetensors"), kept); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// The MoE references tell routing rules apart: the fixture with its router changed (top-1
// instead of top-2; renormalised or not) misses Hugging Face's logits by far more than the
// tolerance, so TestHuggingFaceParity holds the routing itself, not only the experts.
func TestMoEReferencesSeeRouting(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edits map[string]any
	}{
		{"tiny-mixtral", map[string]any{"num_experts_per_tok": 1}},
		{"tiny-qwen2moe", map[string]any{"norm_topk_prob": true}},
		{"tiny-qwen3moe", map[string]any{"norm_topk_prob": false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ref := loadReference(t, filepath.Join("..", "testdata", tc.name))
			m, err := Load(context.Background(), copyFixture(t, tc.name, tc.edits), LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			worst := 0.0
			for _, p := range ref.Prompts[:3] {
				logits, V := runAll(t, m.Program, p.IDs)
				d, _ := maxAbsDiff(logits[(len(p.IDs)-1)*V:], p.LastLogits)
				worst = max(worst, d)
			}
			if worst < 100*logitTol {
				t.Errorf("with %v the logits still agree within %.3g", tc.edits, worst)
			}
		})
	}
}

// A checkpoint that lacks an expert's weight fails to load, naming the tensor and the field
// that counts the experts.
func TestMoEMissingExpert(t *testing.T) {
	const missing = "model.layers.1.mlp.experts.3.down_proj.weight"
	_, err := Load(context.Background(), copyFixture(t, "tiny-qwen3moe", nil, missing), LoadOptions{})
	if err == nil || !strings.Contains(err.Error(), "checkpoint has no tensor "+missing+", though num_local_experts is 4") {
		t.Errorf("error %v", err)
	}
	_, err = Load(context.Background(), copyFixture(t, "tiny-mixtral", map[string]any{"num_experts_per_tok": 5}), LoadOptions{})
	if err == nil || !strings.Contains(err.Error(), "num_experts_per_tok must be in [1, 4] (num_local_experts), got 5") {
		t.Errorf("error %v", err)
	}
}
