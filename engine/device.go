package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"time"

	"github.com/loom-ml/loom/backend/cuda"
	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/dist/nccl"
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

// CUDAModel is a checkpoint compiled for GPUs by backend/cuda: one GPU per rank of its
// mesh. Without the cache stage (LoadOptions.PagedCache) its graph runs whole sequences
// (input_ids and positions [B,S], logits [B,S,vocab]) and serves GreedyRecompute; with it,
// the graph runs on the paged KV cache and serves an Engine (NewCUDA).
type CUDAModel struct {
	*model.Model
	// Graph is the graph that runs (rank 0's on several ranks): the optimized one unless
	// LoadOptions.Optimize is off.
	Graph *graph.Graph
	// Transforms holds the optimizer's per-transform results (nil without the optimizer).
	Transforms []transform.Result
	// Program is the compiled graph on the GPU (rank 0's).
	Program *cuda.Program
	// Mesh, Graphs and Programs describe a deployment on several GPUs (LoadOptions.Mesh):
	// rank r runs Graphs[r] as Programs[r] on GPU r. Nil on one rank.
	Mesh     dist.Mesh
	Graphs   []*graph.Graph
	Programs []*cuda.Program

	devs   []*cuda.Device
	worlds []*nccl.World
	peers  *cuda.PeerGroup
	// peerRank is this process's rank of the one-shot all-reduce across processes (CUDA
	// IPC), with proc; nil when the ranks cannot map each other's memory.
	peerRank *cuda.PeerRank
	// proc is set by LoadCUDARank: this process runs rank proc.Rank of the mesh only
	// (Program, on devs[0], with worlds[0]); Graphs holds every rank's graph.
	proc *nccl.Env
}

// Executable returns what runs the model: its CUDA program, or on several ranks a
// RankGroup of them.
func (m *CUDAModel) Executable() Executable {
	if len(m.Programs) > 1 {
		return newRankGroup(m.Programs, m.Graphs)
	}
	return m.Program
}

// Device returns the GPU rank 0 runs on.
func (m *CUDAModel) Device() *cuda.Device { return m.devs[0] }

// Close frees the programs' device memory, the communicators and the GPUs, and closes the
// checkpoint.
func (m *CUDAModel) Close() error {
	var errs []error
	progs := m.Programs
	if len(progs) == 0 && m.Program != nil {
		progs = []*cuda.Program{m.Program}
	}
	for _, p := range progs {
		errs = append(errs, p.Close())
	}
	if m.peers != nil {
		errs = append(errs, m.peers.Close())
	}
	if m.peerRank != nil {
		// Close meets the other processes twice; a dead one must not hold this one up.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		errs = append(errs, m.peerRank.Close(ctx))
		cancel()
	}
	for _, w := range m.worlds {
		errs = append(errs, w.Close())
	}
	for _, d := range m.devs {
		errs = append(errs, d.Close())
	}
	if m.Model != nil {
		errs = append(errs, m.Model.Close())
	}
	return errors.Join(errs...)
}

// LoadCUDA opens the checkpoint in dir, builds its graph, optimizes it when opts.Optimize is
// set (with the cache stage only when opts.PagedCache is set or a --set turns it on) and
// compiles it for GPU 0, or with a mesh of several ranks for GPUs 0..n-1, one rank each,
// whose collectives run through NCCL communicators of this process (dist/nccl) and, for
// small all-reduces, the one-shot peer kernel over NVLink. With the cache stage on, the
// graph runs on the paged KV cache and serves an Engine (see NewCUDA): its cache inputs
// kv_cache.* stay resident on the GPU, updated in place by paged_attention, and each
// engine step is captured once per bucket of shapes as a CUDA graph and replayed (unless
// opts.EagerCUDA). An op of the graph without a CUDA kernel is an error naming it. With f32
// activations every linear multiplies in f32 (bf16 weights widened once, at load time), so
// that logits and greedy tokens match the CPU backend's.
func LoadCUDA(ctx context.Context, dir string, opts LoadOptions) (*CUDAModel, error) {
	return loadCUDA(ctx, dir, opts, nil, nccl.Options{})
}

// LoadCUDARank is LoadCUDA for one process per rank (see ConnectRanks): this process
// compiles rank env.Rank of opts.Mesh only (whose size must be env.WorldSize), on GPU
// env.LocalRank, and joins the NCCL world of the processes through nccl.Init (a
// rendezvous at env.Addr(), bounded by nopts.Timeout and ctx). Every rank's graph is
// optimized (CUDAModel.Graphs), so that rank 0 knows the others' caches.
func LoadCUDARank(ctx context.Context, dir string, opts LoadOptions, env nccl.Env, nopts nccl.Options) (*CUDAModel, error) {
	if opts.Mesh.Size() != env.WorldSize || env.WorldSize < 2 {
		return nil, fmt.Errorf("%s: rank %d: the mesh %q has %d ranks, %s=%d; one process per rank needs them equal and at least 2",
			dir, env.Rank, opts.Mesh, opts.Mesh.Size(), nccl.EnvWorldSize, env.WorldSize)
	}
	return loadCUDA(ctx, dir, opts, &env, nopts)
}

// loadCUDA is LoadCUDA, or with proc LoadCUDARank.
func loadCUDA(ctx context.Context, dir string, opts LoadOptions, proc *nccl.Env, nopts nccl.Options) (*CUDAModel, error) {
	start := time.Now()
	if err := cubind.Available(); err != nil {
		return nil, fmt.Errorf("%s: device cuda: no GPU can be used: %w", dir, err)
	}
	n := max(opts.Mesh.Size(), 1)
	if n > 1 {
		if !opts.Optimize {
			return nil, fmt.Errorf("%s: a mesh of %d ranks (%s) needs the optimizer: sharding is a transform", dir, n, opts.Mesh)
		}
		if b, err := dist.ResolveBackend(opts.DistBackend, "cuda"); err != nil {
			return nil, err
		} else if b != dist.BackendNCCL {
			return nil, fmt.Errorf("%s: on CUDA the ranks talk through nccl, not %s", dir, b)
		}
		if count, err := cubind.DeviceCount(); err != nil {
			return nil, err
		} else if proc != nil && count <= proc.LocalRank {
			return nil, fmt.Errorf("%s: rank %d runs on GPU %s=%d, this machine has %d GPUs", dir, proc.Rank, nccl.EnvLocalRank, proc.LocalRank, count)
		} else if proc == nil && count < n {
			return nil, fmt.Errorf("%s: the mesh %s needs %d GPUs, this machine has %d", dir, opts.Mesh, n, count)
		}
	}
	m, g, err := OpenGraph(dir, opts)
	if err != nil {
		return nil, err
	}
	cm := &CUDAModel{Model: m, proc: proc}
	fail := func(err error) (*CUDAModel, error) {
		cm.Close()
		return nil, err
	}
	graphs := []*graph.Graph{g}
	if opts.Optimize {
		flags := opts.Transforms
		if opts.PagedCache {
			flags = withCacheStage(flags)
		}
		if n > 1 {
			graphs, cm.Transforms, err = OptimizeRanks(ctx, &flags, m, g, opts.Mesh)
		} else {
			g, cm.Transforms, err = Optimize(ctx, &flags, m, g)
			graphs = []*graph.Graph{g}
		}
		if err != nil {
			return fail(err)
		}
	}
	// ranks are the ranks this process compiles: all of them, or with proc its own.
	ranks := make([]int, n)
	for r := range ranks {
		ranks[r] = r
	}
	if proc != nil {
		ranks = []int{proc.Rank}
		d, err := cuda.Open(proc.LocalRank)
		if err != nil {
			return fail(fmt.Errorf("%s: rank %d: %w", dir, proc.Rank, err))
		}
		cm.devs = append(cm.devs, d)
		w, err := nccl.Init(ctx, *proc, opts.Mesh, nopts)
		if err != nil {
			return fail(fmt.Errorf("%s: %w", dir, err))
		}
		cm.worlds = []*nccl.World{w}
	}
	for r := range n {
		if proc == nil {
			d, err := cuda.Open(r)
			if err != nil {
				return fail(fmt.Errorf("%s: %w", dir, err))
			}
			cm.devs = append(cm.devs, d)
		}
	}
	copts := make([]cuda.Options, n)
	oneAxis := false
	if n > 1 {
		tp, _ := opts.Mesh.AxisSize(opts.Mesh.Axes()[0].Name)
		oneAxis = tp == n
	}
	if proc != nil {
		copts[proc.Rank] = cuda.Options{Comm: ncclRank{cm.worlds[0]}, Mesh: opts.Mesh, Rank: proc.Rank}
		if oneAxis {
			// The one-shot peer kernel across processes, through CUDA IPC, when every rank
			// can map every other's memory (all agree, or all go through NCCL).
			if cm.peerRank, err = joinPeerIPC(ctx, cm.worlds[0], cm.devs[0], proc.Rank, n); err != nil {
				return fail(fmt.Errorf("%s: %w", dir, err))
			}
			if cm.peerRank != nil {
				copts[proc.Rank].Peer = cm.peerRank
			}
		}
	} else if n > 1 {
		devices := make([]int, n)
		for r := range devices {
			devices[r] = r
		}
		if cm.worlds, err = nccl.InitAll(devices, opts.Mesh); err != nil {
			return fail(fmt.Errorf("%s: %w", dir, err))
		}
		if oneAxis {
			// One axis: the one-shot peer kernel serves the whole world's small all-reduces.
			if cm.peers, err = cuda.NewPeerGroup(cm.devs, peerMaxBytes); err != nil {
				slog.Warn("one-shot all-reduce unavailable; every all-reduce goes through NCCL", "err", err)
				cm.peers = nil
			}
		}
		for r := range n {
			copts[r] = cuda.Options{Comm: ncclRank{cm.worlds[r]}, Mesh: opts.Mesh, Rank: r}
			if cm.peers != nil {
				copts[r].Peer = cm.peers.Rank(r)
			}
		}
	}
	act := opts.ActivationDType
	if act == tensor.Invalid {
		act = tensor.F32
	}
	for i, r := range ranks {
		rg := graphs[min(r, len(graphs)-1)]
		o := &copts[r]
		o.ExactF32Linear = act == tensor.F32
		o.Graphs = opts.PagedCache && !opts.EagerCUDA
		o.Profile = opts.ProfileCUDA
		o.Resident = cacheInputs(rg)
		prog, err := cuda.Compile(ctx, cm.devs[i], rg, m.Checkpoint, o)
		if err != nil {
			return fail(fmt.Errorf("compile %s for CUDA (rank %d): %w", dir, r, err))
		}
		cm.Programs = append(cm.Programs, prog)
	}
	cm.Program, cm.Graph = cm.Programs[0], graphs[min(ranks[0], len(graphs)-1)]
	if n > 1 {
		cm.Mesh = opts.Mesh
		for r := range n {
			cm.Graphs = append(cm.Graphs, graphs[min(r, len(graphs)-1)])
		}
	}
	if n == 1 || proc != nil {
		cm.Programs = nil
	}
	slog.Info("model loaded", "dir", dir, "architecture", m.Config.Architectures[0], "device", cm.devs[0].Info().String(),
		"ranks", n, "this_process", rankList(ranks), "nodes", len(cm.Graph.Nodes), "weight_bytes_rank0", cm.Program.WeightBytes(), "time", time.Since(start).Round(time.Millisecond))
	return cm, nil
}

// joinPeerIPC makes this process rank `rank` of a one-shot peer group of n processes
// (cuda.NewPeerRankIPC), trading descriptions over the NCCL world, when every rank can map
// every other's memory: all on one host, each GPU able to access the others' (peer
// access over NVLink or PCIe). The ranks first agree on that through two exchanges, so
// that all of them use the peer group or none does; nil, nil when none does.
func joinPeerIPC(ctx context.Context, w *nccl.World, d *cuda.Device, rank, n int) (*cuda.PeerRank, error) {
	host, _ := os.Hostname()
	dev, err := cubind.GetDevice(d.Info().Ordinal)
	if err != nil {
		return nil, err
	}
	bus, err := dev.PCIBusID()
	if err != nil {
		return nil, err
	}
	all, err := w.AllGatherBytes(ctx, []byte(host+"\x00"+bus))
	if err != nil {
		return nil, fmt.Errorf("one-shot all-reduce: %w", err)
	}
	ok := host != ""
	why := ""
	for q, b := range all {
		h, pb, _ := strings.Cut(string(b), "\x00")
		if q == rank || !ok {
			continue
		}
		if h != host {
			ok, why = false, fmt.Sprintf("rank %d runs on host %q, this rank on %q", q, h, host)
			break
		}
		peer, err := cubind.DeviceByPCIBusID(pb)
		if err != nil {
			ok, why = false, fmt.Sprintf("rank %d's GPU %s is not visible here: %v", q, pb, err)
			break
		}
		if can, err := dev.CanAccessPeer(peer); err != nil || !can {
			ok, why = false, fmt.Sprintf("GPU %s cannot access rank %d's GPU %s (%v)", bus, q, pb, err)
		}
	}
	flag := []byte{0}
	if ok {
		flag[0] = 1
	}
	votes, err := w.AllGatherBytes(ctx, flag)
	if err != nil {
		return nil, fmt.Errorf("one-shot all-reduce: %w", err)
	}
	for q, v := range votes {
		if len(v) != 1 || v[0] != 1 {
			if why == "" {
				why = fmt.Sprintf("rank %d cannot map the others' memory", q)
			}
			slog.Warn("one-shot all-reduce off across processes; every all-reduce goes through NCCL", "rank", rank, "why", why)
			return nil, nil
		}
	}
	pr, err := cuda.NewPeerRankIPC(ctx, d, rank, n, peerMaxBytes, w.AllGatherBytes)
	if err != nil {
		return nil, fmt.Errorf("one-shot all-reduce: %w", err)
	}
	slog.Info("one-shot all-reduce across processes through CUDA IPC", "rank", rank, "ranks", n)
	return pr, nil
}

// peerMaxBytes is the largest all-reduce, in bytes per rank, the one-shot peer group holds
// (a decode step of 64 sequences of width 8192 in bf16 is 1 MiB).
const peerMaxBytes = 4 << 20

// ncclRank adapts a rank's NCCL world to the CUDA executor's Collectives.
type ncclRank struct{ w *nccl.World }

func (r ncclRank) AllReduce(g dist.Group, send, recv cubind.DevicePtr, count int, dt tensor.DType, op dist.ReduceOp, s cubind.Stream) error {
	c, err := r.w.Group(g)
	if err != nil {
		return err
	}
	return c.AllReduce(send, recv, count, dt, op, s)
}

func (r ncclRank) AllGather(g dist.Group, send, recv cubind.DevicePtr, sendCount int, dt tensor.DType, s cubind.Stream) error {
	c, err := r.w.Group(g)
	if err != nil {
		return err
	}
	return c.AllGather(send, recv, sendCount, dt, s)
}

func (r ncclRank) ReduceScatter(g dist.Group, send, recv cubind.DevicePtr, recvCount int, dt tensor.DType, op dist.ReduceOp, s cubind.Stream) error {
	c, err := r.w.Group(g)
	if err != nil {
		return err
	}
	return c.ReduceScatter(send, recv, recvCount, dt, op, s)
}

func (r ncclRank) Wait(ctx context.Context, done cubind.Event) error { return r.w.WaitEvent(ctx, done) }

// The default KV cache size on a GPU: this fraction of the memory free after loading,
// keeping cudaReserveBytes back for activations, cuBLAS and captured graphs.
const (
	cudaCacheFraction = 0.9
	cudaReserveBytes  = 4 << 30
)

// cudaCacheBytes is the default KV cache budget per GPU when the emptiest GPU has least
// bytes free after the weights.
func cudaCacheBytes(least uint64) (int64, error) {
	if least <= cudaReserveBytes {
		return 0, fmt.Errorf("engine: a GPU has %d MiB free after the weights, too little for a KV cache", least>>20)
	}
	return int64(float64(least-cudaReserveBytes) * cudaCacheFraction), nil
}

// NewCUDA starts an engine on a model LoadCUDA compiled with the cache stage on. The engine
// must be closed before the model. The KV cache lives on the GPU only; when opts sets no
// size for it (KVBlocks, KVCacheBytes), it takes cudaCacheFraction of the GPU memory still
// free after the weights, less cudaReserveBytes for activations.
func NewCUDA(ctx context.Context, m *CUDAModel, opts Options) (*Engine, error) {
	if m == nil || m.Model == nil || m.Program == nil {
		return nil, errors.New("engine: no CUDA model")
	}
	if m.proc != nil {
		return nil, fmt.Errorf("engine: rank %d of a model loaded one process per rank (LoadCUDARank) runs through ConnectRanks, not NewCUDA", m.proc.Rank)
	}
	if opts.KVBlocks == 0 && opts.KVCacheBytes == 0 {
		least := uint64(math.MaxUint64)
		for _, d := range m.devs {
			free, _, err := d.MemInfo()
			if err != nil {
				return nil, fmt.Errorf("engine: %w", err)
			}
			least = min(least, free)
		}
		var err error
		if opts.KVCacheBytes, err = cudaCacheBytes(least); err != nil {
			return nil, err
		}
	}
	info := modelInfo(m.Model)
	ranks := []Rank{{Graph: m.Graph, Exe: m.Program}}
	if len(m.Programs) > 1 {
		ranks = make([]Rank, len(m.Programs))
		for r, p := range m.Programs {
			ranks[r] = Rank{Graph: m.Graphs[r], Exe: p}
		}
	}
	return NewRanks(ctx, ranks, info, opts)
}
