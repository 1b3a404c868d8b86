package cuda

import (
	"context"
	"errors"
	"fmt"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// The collective ops of sharded graphs (graph/catalog_collective*.go) on the GPU: all_reduce,
// all_gather, reduce_scatter and the fused all_reduce_add_rmsnorm and linear_all_reduce.
// Each runs on device buffers on the device's stream through a Collectives (NCCL, see
// dist/nccl) or, for all-reduces, through a PeerRank (the one-shot kernel over NVLink), so
// that they are captured in CUDA graphs with the rest of a step.

// Collectives is one rank's communicator as a Program's collective ops call it: each call
// queues work on stream s over device buffers, for the ranks of group g (as dist.Mesh.Group
// gives them). Wait waits for the work queued on the rank's stream before the event done,
// and must report a failed or missing peer within a timeout instead of waiting forever.
type Collectives interface {
	AllReduce(g dist.Group, send, recv cubind.DevicePtr, count int, dt tensor.DType, op dist.ReduceOp, s cubind.Stream) error
	AllGather(g dist.Group, send, recv cubind.DevicePtr, sendCount int, dt tensor.DType, s cubind.Stream) error
	ReduceScatter(g dist.Group, send, recv cubind.DevicePtr, recvCount int, dt tensor.DType, op dist.ReduceOp, s cubind.Stream) error
	Wait(ctx context.Context, done cubind.Event) error
}

// OneShotMaxBytes is the one threshold of the one-shot all-reduce: the largest all-reduce
// (bytes per rank) that allreduce_strategy auto sends through the one-shot peer kernel when
// the program has a PeerRank, and the size of the buffers that Deploy (deploy.go) gives
// every peer group, in one process and across processes; larger all-reduces go to NCCL. 4 MiB
// holds a decode step of 64 sequences of width 8192 in bf16 (1 MiB) with room to spare. On
// 2 H200s the one-shot kernel beat NCCL at every size measured, 8 KB to 16 MB (bf16, in CUDA
// graphs: 7.6 µs against 13.6 at 512 KB, 12.2 against 27.9 at 2 MB; docs/PERFORMANCE.md), so
// the buffers' memory, not the crossover, sets it; the crossover for 4 and 8 GPUs is not
// measured. (It was two numbers, 16 MiB here and 4 MiB for the engine's buffers, of which the
// smaller ruled.)
const OneShotMaxBytes = 4 << 20

// collective is a collective node bound to this rank at compile time.
type collective struct {
	b    *dist.Bound
	c    dist.Collective
	comm Collectives
	peer *PeerRank // set when the one-shot kernel serves this group
}

func init() {
	for _, op := range []string{"all_reduce", "all_gather", "reduce_scatter", "all_reduce_add_rmsnorm", "linear_all_reduce"} {
		opKernels[op] = &opKernel{collective: true, workspace: collectiveWorkspace, run: runCollective}
	}
}

// bindCollective binds collective node n to this program's rank of its mesh.
func (p *Program) bindCollective(n *graph.Node) (*collective, error) {
	if p.comm == nil {
		return nil, fmt.Errorf("%s needs a communicator: compile with Options.Comm and Options.Mesh", nodeText(n))
	}
	c := dist.Collective{
		Op: n.Op, Group: n.Attrs.String("group"), GroupSize: n.Attrs.Int("group_size"), Reduce: n.Attrs.String("op"),
		Strategy: n.Attrs.String("strategy"), Axis: n.Attrs.Int("axis"),
	}
	switch n.Op {
	case "all_reduce_add_rmsnorm", "linear_all_reduce":
		c.Op, c.Reduce = "all_reduce", "sum"
	case "all_gather":
		c.Strategy = ""
	case "reduce_scatter":
		c.Strategy = ""
	case "ring_shift": // bound as an all_gather along a new leading axis, as on the CPU (cp.go)
		c.Op, c.Strategy, c.Axis = "all_gather", "", 0
	}
	b, err := c.Bind(p.mesh, p.rank)
	if err != nil {
		return nil, err
	}
	col := &collective{b: b, c: c, comm: p.comm}
	if p.peer != nil && p.peer.Size() == b.Group().Size() && p.peer.Rank() == b.Group().Rank() {
		col.peer = p.peer
	}
	if c.Op == "all_reduce" && c.Strategy == dist.StrategyOneShot && col.peer == nil {
		return nil, fmt.Errorf("%s: strategy oneshot needs a peer group (Options.Peer) over group %s", nodeText(n), b.Group())
	}
	return col, nil
}

// oneShot reports whether an all-reduce of bytes goes through the peer kernel.
func (c *collective) oneShot(bytes int) bool {
	if c.peer == nil || bytes > c.peer.MaxBytes() {
		return false
	}
	switch c.c.Strategy {
	case dist.StrategyOneShot:
		return true
	case "", dist.StrategyAuto:
		return bytes <= OneShotMaxBytes
	}
	return false // nccl; twoshot is NCCL's own reduce-scatter + all-gather ring
}

// collectiveWorkspace gives the scratch a collective needs: the gathered or reduced value
// before it is laid out (all_gather, reduce_scatter on an inner axis) or the reduced x of a
// fused all_reduce_add_rmsnorm.
func collectiveWorkspace(n *graph.Node, in [][]int) int64 {
	x := in[0]
	size := int64(tensor.Numel(x)) * int64(n.Inputs[0].Type.DType.Size())
	switch n.Op {
	case "all_gather":
		return size * int64(n.Attrs.Int("group_size"))
	case "reduce_scatter", "all_reduce_add_rmsnorm":
		return size
	}
	return 0
}

func runCollective(d *Device, n *graph.Node, in, out []*Tensor, state any) error {
	c := state.(*collective)
	g := c.b.Group()
	x := in[0]
	op := dist.Sum
	if n.Attrs.String("op") == "max" {
		op = dist.Max
	}
	switch n.Op {
	case "all_reduce":
		if err := checkOut("output", out[0], x.DType, x.Shape); err != nil {
			return err
		}
		return c.allReduce(d, out[0], x, op)
	case "linear_all_reduce":
		if err := linear(d, out[0], x, in[1]); err != nil {
			return err
		}
		return c.allReduce(d, out[0], out[0], dist.Sum)
	case "all_reduce_add_rmsnorm":
		eps := float32(n.Attrs.Float("eps"))
		if c.oneShot(x.Bytes()) {
			return c.peer.allReduceAddRMSNorm(out[0], out[1], x, in[1], in[2], eps)
		}
		red := workspaceTensor(out[2], x.DType, x.Shape)
		if err := c.comm.AllReduce(g, x.ptr, red.ptr, x.Numel(), x.DType, dist.Sum, d.stream); err != nil {
			return err
		}
		return addRMSNorm(d, out[0], out[1], red, in[1], in[2], eps)
	case "all_gather":
		return c.allGather(d, out[0], x, out[1], n.Attrs.Int("axis"))
	case "reduce_scatter":
		return c.reduceScatter(d, out[0], x, out[1], n.Attrs.Int("axis"), op)
	}
	return fmt.Errorf("no CUDA collective for op %q", n.Op)
}

func (c *collective) allReduce(d *Device, out, x *Tensor, op dist.ReduceOp) error {
	if op == dist.Sum && c.oneShot(x.Bytes()) {
		return c.peer.allReduce(out, x)
	}
	return c.comm.AllReduce(c.b.Group(), x.ptr, out.ptr, x.Numel(), x.DType, op, d.stream)
}

// splitAt views shape as [pre, size of axis, post] around axis.
func splitAt(shape []int, axis int) (pre, mid, post int) {
	return tensor.Numel(shape[:axis]), shape[axis], tensor.Numel(shape[axis+1:])
}

// allGather gathers x along axis into out: NCCL gathers whole buffers rank after rank, so
// unless everything before axis has size 1, the gathered [G, pre, A, post] goes through ws
// and is copied into out's [pre, G*A, post] layout.
func (c *collective) allGather(d *Device, out, x, ws *Tensor, axis int) error {
	ax, err := graph.NormAxis(axis, len(x.Shape))
	if err != nil {
		return err
	}
	G := c.b.Group().Size()
	pre, A, post := splitAt(x.Shape, ax)
	if pre == 1 {
		return c.comm.AllGather(c.b.Group(), x.ptr, out.ptr, x.Numel(), x.DType, d.stream)
	}
	tmp := workspaceTensor(ws, x.DType, []int{G * x.Numel()})
	if err := c.comm.AllGather(c.b.Group(), x.ptr, tmp.ptr, x.Numel(), x.DType, d.stream); err != nil {
		return err
	}
	dims := []int{G, pre, A, post}
	src := []int64{int64(pre * A * post), int64(A * post), int64(post), 1}
	dst := []int64{int64(A * post), int64(G * A * post), int64(post), 1}
	return copyStrided(d, out, tmp, dims, src, dst, 0, 0)
}

// reduceScatter reduces x over the group and keeps this rank's piece along axis: unless
// everything before axis has size 1, x is first laid out as [G, pre, A/G, post] in ws so
// that each rank's piece is contiguous, as NCCL scatters it.
func (c *collective) reduceScatter(d *Device, out, x, ws *Tensor, axis int, op dist.ReduceOp) error {
	ax, err := graph.NormAxis(axis, len(x.Shape))
	if err != nil {
		return err
	}
	G := c.b.Group().Size()
	pre, A, post := splitAt(x.Shape, ax)
	if A%G != 0 {
		return fmt.Errorf("reduce_scatter: axis %d of %v does not split into %d pieces", axis, x.Shape, G)
	}
	piece := A / G
	src := x
	if pre != 1 {
		src = workspaceTensor(ws, x.DType, x.Shape)
		dims := []int{G, pre, piece, post}
		from := []int64{int64(piece * post), int64(A * post), int64(post), 1}
		to := []int64{int64(pre * piece * post), int64(piece * post), int64(post), 1}
		if err := copyStrided(d, src, x, dims, from, to, 0, 0); err != nil {
			return err
		}
	}
	return c.comm.ReduceScatter(c.b.Group(), src.ptr, out.ptr, out.Numel(), x.DType, op, d.stream)
}

// workspaceTensor views the start of a step's workspace as a tensor.
func workspaceTensor(ws *Tensor, dt tensor.DType, shape []int) *Tensor {
	return &Tensor{DType: dt, Shape: shape, ptr: ws.ptr, dev: ws.dev}
}

// syncCollectives waits, through the communicator, for the work queued so far when the
// program has collectives: a peer that failed ends the wait with an error naming it,
// where a plain stream synchronisation could wait forever.
func (p *Program) syncCollectives(ctx context.Context) error {
	if p.comm == nil || !p.hasCollectives {
		return nil
	}
	if p.synced == 0 {
		e, err := cubind.EventCreate(cubind.EventDisableTiming)
		if err != nil {
			return fmt.Errorf("rank %d: %w", p.rank, err)
		}
		p.synced = e
	}
	if err := p.synced.Record(p.dev.stream); err != nil {
		return fmt.Errorf("rank %d: %w", p.rank, err)
	}
	if err := p.comm.Wait(ctx, p.synced); err != nil {
		return errors.Join(fmt.Errorf("rank %d", p.rank), err)
	}
	return nil
}
