package engine

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// An ep size that does not divide a MoE model's experts fails the load naming both, while
// the graph is optimized, before any weight is read.
func TestLoadExpertParallelNotDividing(t *testing.T) {
	dir := filepath.Join("..", "testdata", "tiny-qwen2moe") // 4 experts
	for _, mesh := range []string{"ep=3", "tp=2,ep=3", "ep=8"} {
		_, err := Load(context.Background(), dir, LoadOptions{Optimize: true, Mesh: mustMeshFor(t, 0, mesh)})
		if err == nil || !strings.Contains(err.Error(), "does not divide the 4 experts of the moe op of model.layers.0.mlp") {
			t.Errorf("mesh %s: error %v", mesh, err)
		}
	}
}
