package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/loom-ml/loom/backend"
	_ "github.com/loom-ml/loom/backend/cpu" // the default device, "cpu"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model"
	_ "github.com/loom-ml/loom/model/all" // register every frontend
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform"
)

// LoadOptions choose how a checkpoint becomes executables: the device and the ranks, the
// graph that runs, and the backend's options.
type LoadOptions struct {
	// Device names the backend that runs the model (see package backend's registry): "cpu"
	// (or empty: backend/cpu, always registered), "cuda" (backend/cuda, registered by
	// importing it or backend/all), or "auto": the backend of highest priority that can run
	// the deployment on this machine (backend.Resolve).
	Device string
	// ActivationDType is the dtype activations are computed in (f32 when unset).
	ActivationDType tensor.DType
	// Optimize runs the transform pipeline over the plain graph, with the paged KV cache
	// (insert_cached_attention) turned on unless WholeSequences is set, so that the result
	// runs in an Engine; otherwise the plain graph runs.
	Optimize bool
	// WholeSequences keeps the optimized graph on whole sequences: the cache stage stays off
	// (as --set transforms.insert_cached_attention.enabled=false would), the graph takes
	// input_ids and positions [B,S] and returns logits [B,S,vocab], for GreedyRecompute.
	WholeSequences bool
	// Transforms configures the pipeline: extra YAML files, --set overrides, dumps, checks.
	Transforms transform.Flags
	// Mesh is the deployment's ranks, such as tp=2 or tp=2,dp=2 (see MeshFor); the zero Mesh
	// is one rank. On the CPU the ranks are goroutines of this process that talk through
	// dist/local; on CUDA each rank has a GPU and the ranks talk through NCCL. More than one
	// rank needs Optimize: sharding is a transform.
	Mesh dist.Mesh
	// DistBackend is the communicator implementation: auto (""), local or nccl; the device
	// decides what it may be (backend.Backend.Check).
	DistBackend string
	// Process, when set, makes this process one rank of a world of one process per rank
	// (Process.WorldSize, which must be Mesh's size and at least 2): it compiles rank
	// Process.Rank only, joins the other processes through the backend's communicator, and
	// connects to them through the step transport (package engine/steps). Rank 0 then runs
	// the engine (New) or GreedyRecompute (Model.Executable) over every rank; the others
	// follow it (Model.Follow). ProcessOptions bound the waits for the other processes.
	Process        *dist.ProcessEnv
	ProcessOptions dist.ProcessOptions
	// EagerCUDA turns off CUDA graphs: on CUDA, the graph on the paged KV cache otherwise
	// captures each engine step's kernels once per bucket of shapes and replays them.
	EagerCUDA bool
	// Quantize quantizes the checkpoint while loading (--quantize): "" loads the weights as
	// stored; "fp8" makes every linear projection of the decoder layers a linear_fp8 on an
	// f8e4m3 weight with per-output-channel f32 scales, computed from the stored bf16, f16 or
	// f32 weight as it is read (model.Config.WithLoadQuantization,
	// model.Checkpoint.QuantizeWhileLoading). The embeddings, the LM head and the norms stay
	// as stored. A checkpoint that is already quantized, and any other value, are errors.
	Quantize string
	// ProfileCUDA times every step of a CUDA program per op (steps run eagerly); read it
	// through backend.Profiler on Model.Program.
	ProfileCUDA bool
}

// cacheStage lists the transforms a graph needs to run in an Engine: the paged KV cache, and
// the LM head on each sequence's last token only.
var cacheStage = []*transform.Transform{transform.InsertCachedAttention, transform.GatherLogits}

// withCacheStage returns flags that turn the cache stage's transforms on (transform.Flags.Enable:
// over the configuration files, under the user's --set overrides, which still win).
func withCacheStage(flags transform.Flags) transform.Flags {
	flags.Enable = append(slices.Clip(flags.Enable), cacheStage...)
	return flags
}

// Model is a loaded checkpoint with its graph and executables, on any device and mesh, in
// one process or as one rank of a world of one process per rank.
type Model struct {
	*model.Model
	// Device is the name of the backend that runs the model ("cpu", "cuda").
	Device string
	// Graph is the graph that runs (rank 0's on several ranks, or this process's rank's):
	// the optimized one when LoadOptions.Optimize is set.
	Graph *graph.Graph
	// Transforms holds the optimizer's per-transform results (nil without the optimizer).
	Transforms []transform.Result
	// Program is rank 0's executable (the only one on one rank), or with one process per
	// rank this process's rank's. Its powers beyond Run are package backend's interfaces.
	Program Executable
	// Mesh and Graphs describe a deployment on several ranks (LoadOptions.Mesh): rank r
	// runs Graphs[r]. Programs holds one executable per rank, in rank order, when this
	// process runs them all. Nil on one rank (Programs also with one process per rank).
	Mesh     dist.Mesh
	Graphs   []*graph.Graph
	Programs []Executable

	dep *backend.Deployment
	// proc is set with LoadOptions.Process: this process's rank of the world, connected to
	// the others by the step transport.
	proc *process
}

// Ranks returns the model's ranks for NewRanks, in rank order: on several ranks one per
// rank (the ranks of other processes, on rank 0, as the step transport's remote ranks).
func (m *Model) Ranks() []Rank {
	if m.proc != nil && m.proc.leader() {
		return m.proc.ranks(m)
	}
	if len(m.Programs) > 1 {
		ranks := make([]Rank, len(m.Programs))
		for r, p := range m.Programs {
			ranks[r] = Rank{Graph: m.Graphs[r], Exe: p}
		}
		return ranks
	}
	return []Rank{{Graph: m.Graph, Exe: m.Program}}
}

// Executable returns what runs the model as a whole: its program on one rank, else a
// RankGroup that runs every rank on the same inputs and returns rank 0's outputs (on rank
// 0 of a world of processes, its program and the other processes' ranks). On a follower
// (Follower) it returns an executable that fails: rank 0 runs the model.
func (m *Model) Executable() Executable {
	if m.proc != nil {
		if !m.proc.leader() {
			return followerExe{m.proc.env.Rank}
		}
		return rankGroup(m.proc.ranks(m))
	}
	if len(m.Programs) > 1 {
		rg := rankGroup(m.Ranks())
		rg.Mesh = m.Mesh
		return rg
	}
	return m.Program
}

// Rank is this process's rank: 0 unless the model was loaded as one rank of a world of
// processes (LoadOptions.Process).
func (m *Model) Rank() int {
	if m.proc == nil {
		return 0
	}
	return m.proc.env.Rank
}

// Follower reports whether this process is a rank other than 0 of a world of processes:
// it runs Follow instead of an engine.
func (m *Model) Follower() bool { return m.proc != nil && !m.proc.leader() }

// Follow runs, on a follower, the steps rank 0 sends until rank 0 says goodbye (nil) or is
// lost (an error naming rank 0; see steps.Follow).
func (m *Model) Follow(ctx context.Context) error {
	if !m.Follower() {
		return errors.New("engine: only a rank other than 0 of a world of processes follows rank 0")
	}
	return m.proc.follow(ctx, m)
}

// Close ends the step transport (rank 0 says goodbye to its followers), frees the
// executables and what the backend holds (devices, communicators), and closes the
// checkpoint. Close the engine first.
func (m *Model) Close() error {
	var errs []error
	if m.proc != nil {
		errs = append(errs, m.proc.close())
		m.proc = nil
	}
	if m.dep != nil {
		errs = append(errs, m.dep.Close())
		m.dep = nil
	}
	if m.Model != nil {
		errs = append(errs, m.Model.Close())
	}
	return errors.Join(errs...)
}

// Load opens the checkpoint in dir, builds its graph, optimizes it (per rank on a mesh)
// when opts.Optimize is set, and compiles the ranks this process runs on the device that
// opts.Device names (see LoadOptions). It is the one way to load a model: every device,
// every mesh, in one process or as one rank of many.
func Load(ctx context.Context, dir string, opts LoadOptions) (*Model, error) {
	start := time.Now()
	n := max(opts.Mesh.Size(), 1)
	if p := opts.Process; p != nil && (n != p.WorldSize || p.WorldSize < 2) {
		return nil, fmt.Errorf("%s: rank %d: the mesh %q has %d ranks, %s=%d; one process per rank needs them equal and at least 2",
			dir, p.Rank, opts.Mesh, opts.Mesh.Size(), dist.EnvWorldSize, p.WorldSize)
	}
	if n > 1 && !opts.Optimize {
		return nil, fmt.Errorf("%s: a mesh of %d ranks (%s) needs the optimizer: sharding is a transform", dir, n, opts.Mesh)
	}
	device := opts.Device
	if device == "" {
		device = "cpu"
	}
	b, _, err := backend.Resolve(device, backend.Needs{Mesh: opts.Mesh, PlainGraph: !opts.Optimize, Process: opts.Process, DistBackend: opts.DistBackend})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	if err := checkCP(opts, b.Name()); err != nil {
		return nil, fmt.Errorf("%s: %w", dir, err)
	}
	mm, g, err := OpenGraph(dir, opts)
	if err != nil {
		return nil, err
	}
	m := &Model{Model: mm, Device: b.Name()}
	fail := func(err error) (*Model, error) {
		m.Close()
		return nil, err
	}
	graphs := []*graph.Graph{g}
	paged := opts.Optimize && !opts.WholeSequences
	if opts.Optimize {
		flags := opts.Transforms
		if paged {
			flags = withCacheStage(flags)
		}
		if n > 1 {
			graphs, m.Transforms, err = OptimizeRanks(ctx, &flags, mm, g, opts.Mesh)
		} else {
			g, m.Transforms, err = Optimize(ctx, &flags, mm, g)
			graphs = []*graph.Graph{g}
		}
		if err != nil {
			return fail(err)
		}
	}
	m.dep, err = b.Deploy(ctx, backend.Spec{
		Graphs: graphs, Weights: deployWeights(b.Name(), mm.Checkpoint), Mesh: opts.Mesh, Process: opts.Process, ProcessOptions: opts.ProcessOptions,
		ActivationDType: opts.ActivationDType, Resident: isCacheInput, Capture: paged && !opts.EagerCUDA, Profile: opts.ProfileCUDA,
	})
	if err != nil {
		return fail(fmt.Errorf("load %s on %s: %w", dir, b.Name(), err))
	}
	rankGraph := func(r int) *graph.Graph { return graphs[min(r, len(graphs)-1)] }
	m.Program, m.Graph = m.dep.Programs[0], rankGraph(m.dep.Ranks[0])
	if n > 1 {
		m.Mesh = opts.Mesh
		for r := range n {
			m.Graphs = append(m.Graphs, rankGraph(r))
		}
		if len(m.dep.Programs) > 1 {
			m.Programs = m.dep.Programs
		}
	}
	slog.Info("model loaded", "dir", dir, "architecture", mm.Config.Architectures[0], "device", b.Name()+": "+m.dep.Device,
		"ranks", n, "this_process", rankList(m.dep.Ranks), "nodes", len(m.Graph.Nodes), "weight_bytes_rank0", m.dep.WeightBytes,
		"bytes_read", mm.Checkpoint.BytesRead(), "bytes_mapped", mm.Checkpoint.BytesMapped(), "time", time.Since(start).Round(time.Millisecond))
	if opts.Process != nil {
		if m.proc, err = connectRanks(ctx, m, *opts.Process); err != nil {
			return fail(err)
		}
	}
	return m, nil
}

// OpenGraph opens the checkpoint in dir, builds its plain graph and checks the graph's params
// against the checkpoint; the caller closes the model.
func OpenGraph(dir string, opts LoadOptions) (*model.Model, *graph.Graph, error) {
	m, err := model.Open(dir)
	if err != nil {
		return nil, nil, err
	}
	if opts.Quantize != "" {
		if err := m.Config.WithLoadQuantization(opts.Quantize); err != nil {
			m.Close()
			return nil, nil, fmt.Errorf("%s: %w", dir, err)
		}
	}
	g, err := model.BuildGraph(m.Config, model.BuildOptions{ActivationDType: opts.ActivationDType, Tensors: m.Checkpoint})
	if err != nil {
		m.Close()
		return nil, nil, fmt.Errorf("%s: %w", dir, err)
	}
	if opts.Quantize != "" {
		if err := quantizeWhileLoading(m, g, opts.Quantize); err != nil {
			m.Close()
			return nil, nil, fmt.Errorf("%s: %w", dir, err)
		}
	}
	if err := m.Checkpoint.Check(g); err != nil {
		m.Close()
		return nil, nil, err
	}
	return m, g, nil
}

// quantizeWhileLoading makes the checkpoint quantize the weights of g's linear_fp8 ops (the
// frontend wrote one for each module the load quantization covers) as they are read.
func quantizeWhileLoading(m *model.Model, g *graph.Graph, method string) error {
	scales := map[string]string{}
	for _, n := range g.Nodes {
		if n.Op != "linear_fp8" {
			continue
		}
		w, s := n.Inputs[1].Producer, n.Inputs[2].Producer
		if w == nil || s == nil || w.Op != graph.OpParam || s.Op != graph.OpParam {
			return fmt.Errorf("--quantize %s: linear_fp8 %s does not read its weight and scale as params", method, n.Out())
		}
		scales[w.Attrs.String("key")] = s.Attrs.String("key")
	}
	if len(scales) == 0 {
		return fmt.Errorf("--quantize %s: the %s graph has no linear projection to quantize", method, m.Config.Architectures[0])
	}
	return m.Checkpoint.QuantizeWhileLoading(scales)
}

// Optimize runs the transform pipeline, configured by flags and the model's architecture
// overlay, over a model's plain graph and returns the final graph.
func Optimize(ctx context.Context, flags *transform.Flags, m *model.Model, g *graph.Graph) (*graph.Graph, []transform.Result, error) {
	o, err := flags.Optimizer(m.Config.ModelType)
	if err != nil {
		return nil, nil, err
	}
	tc := &transform.Context{Arch: m.Config.ModelType, WorldSize: 1, Weights: m.Checkpoint, Logger: slog.Default()}
	graphs, results, err := o.Run(ctx, tc, g)
	if err != nil {
		return nil, results, fmt.Errorf("optimize %s: %w", m.Dir, err)
	}
	return graphs[0], results, nil
}

// deployWeights is what the backend named reads the checkpoint through: on the CPU, which
// computes on host tensors that live as long as the model (and so the checkpoint, which
// Model.Close closes after the deployment), the weights it keeps as stored are views of the
// checkpoint's mapping and only the ones it builds (fused, converted) are copied
// (Checkpoint.Mapped); other backends copy each weight to their device and read copies.
func deployWeights(backendName string, c *model.Checkpoint) backend.Weights {
	if backendName == "cpu" {
		return c.Mapped()
	}
	return c
}

// isCacheInput reports whether an input is one of the KV caches (kv_cache.<layer>.k/.v)
// that each rank keeps itself, on its device where its executable can.
func isCacheInput(name string) bool { return strings.HasPrefix(name, "kv_cache.") }

// cacheInputs names the KV cache inputs of a rank's graph (none for a graph without the
// cache stage).
func cacheInputs(g *graph.Graph) []string {
	var names []string
	for _, in := range g.Inputs {
		if isCacheInput(in.Name) {
			names = append(names, in.Name)
		}
	}
	return names
}

// rankList writes ranks as "0,1,2".
func rankList(ranks []int) string {
	parts := make([]string, len(ranks))
	for i, r := range ranks {
		parts[i] = strconv.Itoa(r)
	}
	return strings.Join(parts, ",")
}

// followerExe is Model.Executable on a follower.
type followerExe struct{ rank int }

func (f followerExe) Run(context.Context, map[string]*tensor.Tensor) ([]*tensor.Tensor, error) {
	return nil, fmt.Errorf("engine: rank %d follows rank 0; only rank 0 runs the model", f.rank)
}
