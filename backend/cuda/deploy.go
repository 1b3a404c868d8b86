package cuda

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"time"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/dist/nccl"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Deploy opens one GPU per rank this process runs and compiles each rank's program on it.
// In one process (spec.Process nil) rank r runs on GPU r; the collectives of a mesh run
// through NCCL communicators made together (nccl.InitAll, sub-communicators per mesh group)
// and, on a mesh of one axis, all-reduces up to OneShotMaxBytes through the one-shot peer
// kernel over NVLink (NewPeerGroup). With one process per rank this process opens GPU
// LOCAL_RANK, joins the NCCL world of the processes (nccl.Init, a rendezvous at
// spec.Process.Addr() bounded by spec.ProcessOptions and ctx) and, when every rank can map
// every other's memory, a one-shot peer group across the processes through CUDA IPC
// (joinPeerIPC). An op without a CUDA kernel is an error naming it.
func (cudaBackend) Deploy(ctx context.Context, s backend.Spec) (*backend.Deployment, error) {
	n := max(s.Mesh.Size(), 1)
	proc := s.Process
	if len(s.Graphs) == 0 {
		return nil, errors.New("cuda: deploy: no graph")
	}
	dep := &deployment{}
	fail := func(err error) (*backend.Deployment, error) {
		dep.close()
		return nil, err
	}
	// ranks are the ranks this process compiles: all of them, or with proc its own.
	ranks := make([]int, n)
	for r := range ranks {
		ranks[r] = r
	}
	if proc != nil {
		ranks = []int{proc.Rank}
		d, err := Open(proc.LocalRank)
		if err != nil {
			return fail(fmt.Errorf("rank %d: %w", proc.Rank, err))
		}
		dep.devs = append(dep.devs, d)
		w, err := nccl.Init(ctx, *proc, s.Mesh, s.ProcessOptions)
		if err != nil {
			return fail(err)
		}
		dep.worlds = []*nccl.World{w}
	}
	for r := range n {
		if proc == nil {
			d, err := Open(r)
			if err != nil {
				return fail(err)
			}
			dep.devs = append(dep.devs, d)
		}
	}
	copts := make([]Options, n)
	oneAxis := false
	if n > 1 {
		tp, _ := s.Mesh.AxisSize(s.Mesh.Axes()[0].Name)
		oneAxis = tp == n
	}
	var err error
	if proc != nil {
		copts[proc.Rank] = Options{Comm: ncclRank{dep.worlds[0]}, Mesh: s.Mesh, Rank: proc.Rank}
		if oneAxis {
			// The one-shot peer kernel across processes, through CUDA IPC, when every rank
			// can map every other's memory (all agree, or all go through NCCL).
			if dep.peerRank, err = joinPeerIPC(ctx, dep.worlds[0], dep.devs[0], proc.Rank, n); err != nil {
				return fail(err)
			}
			if dep.peerRank != nil {
				copts[proc.Rank].Peer = dep.peerRank
			}
		}
	} else if n > 1 {
		devices := make([]int, n)
		for r := range devices {
			devices[r] = r
		}
		if dep.worlds, err = nccl.InitAll(devices, s.Mesh); err != nil {
			return fail(err)
		}
		if oneAxis {
			// One axis: the one-shot peer kernel serves the whole world's small all-reduces.
			if dep.peers, err = NewPeerGroup(dep.devs, OneShotMaxBytes); err != nil {
				slog.Warn("one-shot all-reduce unavailable; every all-reduce goes through NCCL", "err", err)
				dep.peers = nil
			}
		}
		for r := range n {
			copts[r] = Options{Comm: ncclRank{dep.worlds[r]}, Mesh: s.Mesh, Rank: r}
			if dep.peers != nil {
				copts[r].Peer = dep.peers.Rank(r)
			}
		}
	}
	act := s.ActivationDType
	if act == tensor.Invalid {
		act = tensor.F32
	}
	for i, r := range ranks {
		rg := s.Graphs[min(r, len(s.Graphs)-1)]
		o := &copts[r]
		o.ExactF32Linear = act == tensor.F32
		o.Graphs = s.Capture
		o.Profile = s.Profile
		o.Resident = residentInputs(rg, s.Resident)
		prog, err := Compile(ctx, dep.devs[i], rg, s.Weights, o)
		if err != nil {
			return fail(fmt.Errorf("compile for CUDA (rank %d): %w", r, err))
		}
		dep.progs = append(dep.progs, prog)
	}
	info := dep.devs[0].Info()
	warnFP8Batches(s.Graphs[0], info.Major, info.Minor)
	out := &backend.Deployment{
		Ranks: ranks, Device: info.String(), WeightBytes: dep.progs[0].WeightBytes(),
		FreeMemory: dep.freeMemory, Close: dep.close,
	}
	for _, p := range dep.progs {
		out.Programs = append(out.Programs, p)
	}
	if proc != nil {
		out.Timeout = dep.worlds[0].Timeout()
	}
	return out, nil
}

// residentInputs names the inputs of g that keep says live on the device.
func residentInputs(g *graph.Graph, keep func(string) bool) []string {
	if keep == nil {
		return nil
	}
	var names []string
	for _, in := range g.Inputs {
		if keep(in.Name) {
			names = append(names, in.Name)
		}
	}
	return names
}

// deployment is what Deploy opened, closed in the reverse order of their use: the
// programs' device memory, the peer groups, the communicators, the GPUs.
type deployment struct {
	progs  []*Program
	devs   []*Device
	worlds []*nccl.World
	peers  *PeerGroup
	// peerRank is this process's rank of the one-shot all-reduce across processes (CUDA
	// IPC); nil when the ranks cannot map each other's memory.
	peerRank *PeerRank
}

func (d *deployment) close() error {
	var errs []error
	for _, p := range d.progs {
		errs = append(errs, p.Close())
	}
	if d.peers != nil {
		errs = append(errs, d.peers.Close())
	}
	if d.peerRank != nil {
		// Close meets the other processes twice; a dead one must not hold this one up.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		errs = append(errs, d.peerRank.Close(ctx))
		cancel()
	}
	for _, w := range d.worlds {
		errs = append(errs, w.Close())
	}
	for _, dv := range d.devs {
		errs = append(errs, dv.Close())
	}
	*d = deployment{}
	return errors.Join(errs...)
}

// freeMemory is the least memory free on the deployment's GPUs.
func (d *deployment) freeMemory() (uint64, error) {
	least := uint64(math.MaxUint64)
	for _, dv := range d.devs {
		free, _, err := dv.MemInfo()
		if err != nil {
			return 0, err
		}
		least = min(least, free)
	}
	return least, nil
}

// joinPeerIPC makes this process rank `rank` of a one-shot peer group of n processes
// (NewPeerRankIPC), trading descriptions over the NCCL world, when every rank can map
// every other's memory: all on one host, each GPU able to access the others' (peer
// access over NVLink or PCIe). The ranks first agree on that through two exchanges, so
// that all of them use the peer group or none does; nil, nil when none does.
func joinPeerIPC(ctx context.Context, w *nccl.World, d *Device, rank, n int) (*PeerRank, error) {
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
	pr, err := NewPeerRankIPC(ctx, d, rank, n, OneShotMaxBytes, w.AllGatherBytes)
	if err != nil {
		return nil, fmt.Errorf("one-shot all-reduce: %w", err)
	}
	slog.Info("one-shot all-reduce across processes through CUDA IPC", "rank", rank, "ranks", n)
	return pr, nil
}

// ncclRank adapts a rank's NCCL world to the executor's Collectives.
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
