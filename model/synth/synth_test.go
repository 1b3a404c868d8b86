package synth

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loom-ml/loom/backend/cpu"
	"github.com/loom-ml/loom/model"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/tokenizer"
)

func TestWriteLoadsAndRuns(t *testing.T) {
	Shapes["test-tiny"] = llama3("test-tiny", 300, 64, 128, 2, 4, 2, 8, false)
	defer delete(Shapes, "test-tiny")
	dir := t.TempDir()
	// A shard limit below the size of one layer's weights forces a sharded checkpoint.
	if err := Write(context.Background(), "test-tiny", dir, Options{Seed: 1, ShardBytes: 20000}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, model.IndexFile)); err != nil {
		t.Errorf("expected a sharded checkpoint: %v", err)
	}
	m, err := model.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	g, err := model.BuildGraph(m.Config, model.BuildOptions{Tensors: m.Checkpoint})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Checkpoint.Check(g); err != nil {
		t.Fatal(err)
	}
	prog, err := cpu.Compile(context.Background(), g, m.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	outs, err := prog.Run(context.Background(), map[string]*tensor.Tensor{
		"input_ids": tensor.FromI32([]int32{1, 2, 3}, 1, 3),
		"positions": tensor.FromI32([]int32{0, 1, 2}, 1, 3),
	})
	if err != nil {
		t.Fatal(err)
	}
	var spread float64
	for _, v := range outs[0].Float32s() {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("logit %v", v)
		}
		spread = math.Max(spread, math.Abs(float64(v)))
	}
	if spread == 0 {
		t.Error("all logits are zero: weights were not randomised")
	}

	tok, err := tokenizer.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	ids, err := tok.Encode("héllo", true)
	if err != nil {
		t.Fatal(err)
	}
	if len(ids) != 1+len("héllo") || ids[0] != 128000 {
		t.Errorf("encode = %v, want BOS then one id per byte", ids)
	}
	if text, err := tok.Decode(ids[1:], false); err != nil || text != "héllo" {
		t.Errorf("decode = %q, %v", text, err)
	}
}

func TestUnknownShape(t *testing.T) {
	err := Write(context.Background(), "gpt-5", t.TempDir(), Options{})
	if err == nil || !strings.Contains(err.Error(), "llama-3.1-8b") {
		t.Errorf("error %v should list the known shapes", err)
	}
}

// Every shipped shape builds a graph (without writing its weights).
func TestShapesBuild(t *testing.T) {
	for _, name := range Names() {
		s := Shapes[name]
		data := mustJSON(t, s.Config)
		cfg, err := model.ParseConfig(data, name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if _, err := model.BuildGraph(cfg, model.BuildOptions{}); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
