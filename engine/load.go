package engine

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/loom-ml/loom/backend/cpu"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model"
	_ "github.com/loom-ml/loom/model/all" // register every frontend
	"github.com/loom-ml/loom/tensor"
)

// LoadOptions choose how a checkpoint becomes an executable.
type LoadOptions struct {
	// ActivationDType is the dtype activations are computed in (f32 when unset).
	ActivationDType tensor.DType
}

// Model is a loaded checkpoint with its graph and executable.
type Model struct {
	*model.Model
	Graph   *graph.Graph
	Program *cpu.Program
}

// Load opens the checkpoint in dir, builds its graph and compiles it for the CPU.
func Load(ctx context.Context, dir string, opts LoadOptions) (*Model, error) {
	start := time.Now()
	m, err := model.Open(dir)
	if err != nil {
		return nil, err
	}
	g, err := model.BuildGraph(m.Config, model.BuildOptions{ActivationDType: opts.ActivationDType, Tensors: m.Checkpoint})
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	if err := m.Checkpoint.Check(g); err != nil {
		m.Close()
		return nil, err
	}
	prog, err := cpu.Compile(ctx, g, m.Checkpoint)
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("compile %s: %w", dir, err)
	}
	slog.Info("model loaded", "dir", dir, "architecture", m.Config.Architectures[0], "nodes", len(g.Nodes), "time", time.Since(start).Round(time.Millisecond))
	return &Model{Model: m, Graph: g, Program: prog}, nil
}
