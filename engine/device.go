package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/loom-ml/loom/backend/cuda"
	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform"
)

// Device names where a model runs.
type Device string

// The devices a model runs on.
const (
	// DeviceAuto is CUDA when this machine can run the CUDA backend (cubind.Available), else
	// the CPU.
	DeviceAuto Device = "auto"
	// DeviceCPU is backend/cpu.
	DeviceCPU Device = "cpu"
	// DeviceCUDA is backend/cuda on GPU 0.
	DeviceCUDA Device = "cuda"
)

// ParseDevice reads auto, cpu or cuda.
func ParseDevice(s string) (Device, error) {
	switch d := Device(s); d {
	case DeviceAuto, DeviceCPU, DeviceCUDA:
		return d, nil
	}
	return "", fmt.Errorf("unknown device %q: want auto, cpu or cuda", s)
}

// ResolveDevice turns d into the device that runs: auto becomes cuda when cubind.Available
// reports no problem, else cpu; cuda without a usable GPU is an error saying what is
// missing. The reason says why the device was picked, for a log line.
func ResolveDevice(d Device) (Device, string, error) {
	switch d {
	case DeviceCPU:
		return DeviceCPU, "asked for", nil
	case DeviceCUDA:
		if err := cubind.Available(); err != nil {
			return "", "", fmt.Errorf("device cuda: no GPU can be used: %w", err)
		}
		return DeviceCUDA, "asked for", nil
	case DeviceAuto, "":
		if err := cubind.Available(); err != nil {
			msg, _, _ := strings.Cut(err.Error(), "\n")
			return DeviceCPU, "auto: no GPU found (" + strings.TrimSuffix(msg, "; tried:") + ")", nil
		}
		return DeviceCUDA, "auto: CUDA is available", nil
	}
	return "", "", fmt.Errorf("unknown device %q: want auto, cpu or cuda", d)
}

// CUDAModel is a checkpoint compiled for one GPU by backend/cuda. Without the cache stage
// (LoadOptions.PagedCache) its graph runs whole sequences (input_ids and positions [B,S],
// logits [B,S,vocab]) and serves GreedyRecompute; with it, the graph runs on the paged KV
// cache and serves an Engine (NewCUDA).
type CUDAModel struct {
	*model.Model
	// Graph is the graph that runs: the optimized one unless LoadOptions.Optimize is off.
	Graph *graph.Graph
	// Transforms holds the optimizer's per-transform results (nil without the optimizer).
	Transforms []transform.Result
	// Program is the compiled graph on the GPU.
	Program *cuda.Program
	dev     *cuda.Device
}

// Executable returns what runs the model: its CUDA program.
func (m *CUDAModel) Executable() Executable { return m.Program }

// Device returns the GPU the model runs on.
func (m *CUDAModel) Device() *cuda.Device { return m.dev }

// Close frees the program's device memory, releases the GPU and closes the checkpoint.
func (m *CUDAModel) Close() error {
	var errs []error
	if m.Program != nil {
		errs = append(errs, m.Program.Close())
	}
	if m.dev != nil {
		errs = append(errs, m.dev.Close())
	}
	if m.Model != nil {
		errs = append(errs, m.Model.Close())
	}
	return errors.Join(errs...)
}

// LoadCUDA opens the checkpoint in dir, builds its graph, optimizes it when opts.Optimize is
// set (with the cache stage only when opts.PagedCache is set or a --set turns it on) and
// compiles it for GPU 0. With the cache stage on, the graph runs on the paged KV cache
// and serves an Engine (see NewCUDA): its cache inputs kv_cache.* stay resident on the GPU,
// updated in place by paged_attention, and the engine's host copies are never read. An op
// of the graph without a CUDA kernel is an error naming it. With f32 activations every
// linear multiplies in f32 (bf16 weights widened once, at load time), so that logits and
// greedy tokens match the CPU backend's. One rank only: opts.Mesh must be a single rank.
func LoadCUDA(ctx context.Context, dir string, opts LoadOptions) (*CUDAModel, error) {
	start := time.Now()
	if opts.Mesh.Size() > 1 {
		return nil, fmt.Errorf("%s: the CUDA backend runs one rank; the mesh %s has %d", dir, opts.Mesh, opts.Mesh.Size())
	}
	if err := cubind.Available(); err != nil {
		return nil, fmt.Errorf("%s: device cuda: no GPU can be used: %w", dir, err)
	}
	m, g, err := OpenGraph(dir, opts)
	if err != nil {
		return nil, err
	}
	var results []transform.Result
	if opts.Optimize {
		flags := opts.Transforms
		if opts.PagedCache {
			flags = withCacheStage(flags)
		}
		if g, results, err = Optimize(ctx, &flags, m, g); err != nil {
			m.Close()
			return nil, err
		}
	}
	dev, err := cuda.Open(0)
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	act := opts.ActivationDType
	if act == tensor.Invalid {
		act = tensor.F32
	}
	var resident []string
	for _, in := range g.Inputs {
		if strings.HasPrefix(in.Name, "kv_cache.") {
			resident = append(resident, in.Name)
		}
	}
	prog, err := cuda.Compile(ctx, dev, g, m.Checkpoint, &cuda.Options{
		ExactF32Linear: act == tensor.F32, Resident: resident, Graphs: opts.PagedCache && !opts.EagerCUDA,
		Profile: opts.ProfileCUDA,
	})
	if err != nil {
		dev.Close()
		m.Close()
		return nil, fmt.Errorf("compile %s for CUDA: %w", dir, err)
	}
	slog.Info("model loaded", "dir", dir, "architecture", m.Config.Architectures[0], "device", dev.Info().String(),
		"nodes", len(g.Nodes), "weight_bytes", prog.WeightBytes(), "time", time.Since(start).Round(time.Millisecond))
	return &CUDAModel{Model: m, Graph: g, Transforms: results, Program: prog, dev: dev}, nil
}

// The default KV cache size on a GPU: this fraction of the memory free after loading,
// keeping cudaReserveBytes back for activations, cuBLAS and captured graphs.
const (
	cudaCacheFraction = 0.9
	cudaReserveBytes  = 4 << 30
)

// NewCUDA starts an engine on a model LoadCUDA compiled with the cache stage on. The engine
// must be closed before the model. The KV cache lives on the GPU only; when opts sets no
// size for it (KVBlocks, KVCacheBytes), it takes cudaCacheFraction of the GPU memory still
// free after the weights, less cudaReserveBytes for activations.
func NewCUDA(ctx context.Context, m *CUDAModel, opts Options) (*Engine, error) {
	if m == nil || m.Model == nil || m.Program == nil {
		return nil, errors.New("engine: no CUDA model")
	}
	if opts.KVBlocks == 0 && opts.KVCacheBytes == 0 {
		free, _, err := m.dev.MemInfo()
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		if free <= cudaReserveBytes {
			return nil, fmt.Errorf("engine: the GPU has %d MiB free after the weights, too little for a KV cache", free>>20)
		}
		opts.KVCacheBytes = int64(float64(free-cudaReserveBytes) * cudaCacheFraction)
	}
	info := ModelInfo{Name: m.Dir, MaxPositions: m.Config.MaxPositionEmbeddings, EOSTokenIDs: m.EOSTokenIDs()}
	return NewRanks(ctx, []Rank{{Graph: m.Graph, Exe: m.Program}}, info, opts)
}
