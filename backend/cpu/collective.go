package cpu

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Collectives. A graph that sharding split over ranks holds collective ops (all_reduce,
// all_gather, reduce_scatter, all_to_all and the fused all_reduce_add_rmsnorm and
// linear_all_reduce); CompileWith binds each to the rank's communicator (package dist) along
// the mesh axis it names. A program records how many ranks it needs, the largest group_size
// over its collectives (Ranks); compiling one that needs more than one rank without a
// communicator, or with a communicator and mesh that do not fit, is an error that says both
// numbers.
//
// Without a communicator, the collectives of groups of one rank are the identity, so that a
// graph sharded for tp=1 runs anywhere; their reference kernels do just that.

// Options configure CompileWith.
type Options struct {
	// Comm is this rank's communicator. nil compiles a single-rank program: every collective
	// must then be over a group of one rank.
	Comm dist.Communicator
	// Mesh arranges the communicator's ranks on named axes (tp=2,dp=2); every collective's
	// group names one of its axes, whose size must be the collective's group_size. The zero
	// Mesh, with a communicator, means one axis, the one the graph's collectives name, as
	// long as the communicator; the program's Ranks must then equal Comm.Size().
	Mesh dist.Mesh
}

// CompileWith is Compile for one rank of a multi-rank deployment: it also binds every
// collective node to opts.Comm along its group's axis of opts.Mesh. Binding checks every
// collective's group and group_size against the mesh and the mesh against the
// communicator, so a program never runs with a communicator of another size.
func CompileWith(ctx context.Context, g *graph.Graph, w backend.Weights, opts Options) (*Program, error) {
	start := time.Now()
	p, err := compileWith(ctx, g, w, Lookup, &opts)
	if err != nil {
		return nil, err
	}
	rank := 0
	if opts.Comm != nil {
		rank = opts.Comm.Rank()
	}
	slog.Debug("cpu: compiled", "graph", g.Name, "rank", rank, "ranks", p.ranks, "nodes", len(g.Nodes), "steps", len(p.steps),
		"params", p.params, "param_bytes", p.paramBytes, "folded", p.folded, "held_bytes", p.WeightBytes(), "elapsed", time.Since(start))
	return p, nil
}

// Ranks is the number of ranks the program needs: the largest group_size over its
// collective ops, 1 when it has none.
func (p *Program) Ranks() int { return max(p.ranks, 1) }

// ctxKernel is a kernel that blocks on peers: it takes the run's context.
type ctxKernel func(ctx context.Context, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error)

func isCollective(n *graph.Node) bool {
	spec := n.Spec()
	return spec != nil && spec.Collective
}

// binder binds a program's collectives to one rank's communicator.
type binder struct {
	comm dist.Communicator
	mesh dist.Mesh
}

// newBinder checks the options against g and returns the binder, nil when the program runs
// without a communicator.
func newBinder(g *graph.Graph, opts *Options) (*binder, error) {
	ranks := graph.CollectiveRanks(g)
	if opts == nil || opts.Comm == nil {
		if ranks > 1 {
			return nil, fmt.Errorf("the graph needs %d ranks (its largest collective group) and no communicator was given; compile each rank with CompileWith and a communicator of %d ranks", ranks, ranks)
		}
		if opts != nil && opts.Mesh.Size() > 1 {
			return nil, fmt.Errorf("mesh %q has %d ranks, but no communicator was given", opts.Mesh, opts.Mesh.Size())
		}
		return nil, nil
	}
	c, mesh := opts.Comm, opts.Mesh
	if len(mesh.Axes()) == 0 {
		axes := groupAxes(g)
		if ranks != c.Size() {
			return nil, fmt.Errorf("the graph needs %d ranks (its largest collective group), the communicator has %d", ranks, c.Size())
		}
		switch len(axes) {
		case 0:
			return &binder{comm: c}, nil // nothing to bind
		case 1:
			var err error
			if mesh, err = dist.NewMesh(dist.Axis{Name: axes[0], Size: c.Size()}); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("the graph's collectives run over the axes %q: give the mesh that arranges them", axes)
		}
	}
	if mesh.Size() != c.Size() {
		return nil, fmt.Errorf("mesh %q has %d ranks, the communicator has %d", mesh, mesh.Size(), c.Size())
	}
	if r := c.Rank(); r < 0 || r >= c.Size() {
		return nil, fmt.Errorf("communicator rank %d out of range for %d ranks", r, c.Size())
	}
	return &binder{comm: c, mesh: mesh}, nil
}

// groupAxes lists the mesh axes the collectives of g name, sorted, the world excluded.
func groupAxes(g *graph.Graph) []string {
	var axes []string
	for _, n := range g.Nodes {
		if isCollective(n) {
			if a := n.Attrs.String("group"); a != dist.WorldAxis && !slices.Contains(axes, a) {
				axes = append(axes, a)
			}
		}
	}
	slices.Sort(axes)
	return axes
}

// describe turns a collective node into the plain description dist binds; the fused ops
// reduce like all_reduce.
func describe(n *graph.Node) dist.Collective {
	c := dist.Collective{
		Op: n.Op, Group: n.Attrs.String("group"), GroupSize: n.Attrs.Int("group_size"),
		Reduce: n.Attrs.String("op"), Strategy: n.Attrs.String("strategy"),
		Axis: n.Attrs.Int("axis"), SplitAxis: n.Attrs.Int("split_axis"), ConcatAxis: n.Attrs.Int("concat_axis"),
	}
	switch n.Op {
	case "all_reduce_add_rmsnorm", "linear_all_reduce":
		c.Op, c.Reduce = "all_reduce", "sum"
	case "ring_shift": // an all_gather along a new leading axis (ringShift)
		c.Op, c.Axis = "all_gather", 0
	}
	return c
}

// kernel returns the bound kernel of collective node n; lookup gives the kernels of the
// computation that fused collectives carry (linear, add_rmsnorm).
func (b *binder) kernel(n *graph.Node, lookup func(string) (Kernel, bool)) (ctxKernel, error) {
	if b.mesh.Size() == 0 || len(b.mesh.Axes()) == 0 {
		return nil, fmt.Errorf("no mesh to bind %s over %q to", n.Op, n.Attrs.String("group"))
	}
	bound, err := describe(n).Bind(b.mesh, b.comm.Rank())
	if err != nil {
		return nil, err
	}
	comm := b.comm
	switch n.Op {
	case "all_reduce":
		return func(ctx context.Context, in []*tensor.Tensor, _ []Out) ([]*tensor.Tensor, error) {
			return runBound(ctx, bound, comm, in[0].Clone())
		}, nil
	case "all_gather", "reduce_scatter", "all_to_all":
		return func(ctx context.Context, in []*tensor.Tensor, _ []Out) ([]*tensor.Tensor, error) {
			return runBound(ctx, bound, comm, in[0])
		}, nil
	case "all_reduce_add_rmsnorm":
		addNorm, ok := lookup("add_rmsnorm")
		if !ok {
			return nil, fmt.Errorf("no kernel for add_rmsnorm")
		}
		return func(ctx context.Context, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
			r, err := runBound(ctx, bound, comm, in[0].Clone())
			if err != nil {
				return nil, err
			}
			return addNorm(n, []*tensor.Tensor{r[0], in[1], in[2]}, out)
		}, nil
	case "ring_shift":
		return func(ctx context.Context, in []*tensor.Tensor, _ []Out) ([]*tensor.Tensor, error) {
			return ringShift(ctx, bound, comm, in[0])
		}, nil
	case "linear_all_reduce":
		lin, ok := lookup("linear")
		if !ok {
			return nil, fmt.Errorf("no kernel for linear")
		}
		return func(ctx context.Context, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
			return linearAllReduce(ctx, n, lin, bound, comm, in, out)
		}, nil
	}
	return nil, fmt.Errorf("the CPU backend has no collective kernel for %s", n.Op)
}

// runBound runs a bound collective and hands back a tensor the caller owns.
func runBound(ctx context.Context, b *dist.Bound, c dist.Communicator, x *tensor.Tensor) ([]*tensor.Tensor, error) {
	y, err := b.Run(ctx, c, x)
	if err != nil {
		return nil, err
	}
	return []*tensor.Tensor{y}, nil
}

// OverlapChunkBytes is the output size, in bytes per chunk, from which linear_all_reduce cuts
// its output into chunks (at most maxOverlapChunks) so that the reduction of one chunk runs
// while the next is computed. Smaller outputs are computed whole, then reduced.
var OverlapChunkBytes = 64 << 10

const maxOverlapChunks = 8

// overlapChunks cuts the N output features of a linear with M rows into chunks of whole
// groups of four features (the linear kernel's unit), the same way on every rank.
func overlapChunks(M, N, size int) [][2]int {
	n := 1
	if OverlapChunkBytes > 0 {
		n = min(M*N*size/OverlapChunkBytes, maxOverlapChunks, N/4)
	}
	if n < 2 {
		return [][2]int{{0, N}}
	}
	step := (N/n + 3) / 4 * 4
	var out [][2]int
	for lo := 0; lo < N; lo += step {
		out = append(out, [2]int{lo, min(lo+step, N)})
	}
	return out
}

// linearAllReduce computes all_reduce(linear(x, w)) by chunks of output features: the
// reduction of each finished chunk runs on another goroutine while the next chunk is
// computed, in the same order on every rank, so the reductions pair up across ranks and
// their sums are those of the whole output (reductions are elementwise).
func linearAllReduce(ctx context.Context, n *graph.Node, lin Kernel, b *dist.Bound, c dist.Communicator, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	x, w, o := in[0], in[1], out[0]
	if len(w.Shape) != 2 || len(o.Shape) == 0 || o.Shape[len(o.Shape)-1] != w.Shape[0] {
		return nil, fmt.Errorf("linear_all_reduce: weight %v does not fit output %v", w.Shape, o.Shape)
	}
	N, K := w.Shape[0], w.Shape[1]
	M := tensor.Numel(o.Shape) / max(N, 1)
	chunks := overlapChunks(M, N, o.DType.Size())
	if len(chunks) == 1 {
		y, err := lin(n, in, out)
		if err != nil {
			return nil, err
		}
		return runBound(ctx, b, c, y[0])
	}
	parts := make([]*tensor.Tensor, len(chunks))
	ready := make(chan int, len(chunks))
	done := make(chan error, 1)
	go func() { // the reductions, in chunk order
		var err error
		for i := range ready {
			if err == nil {
				_, err = b.Run(ctx, c, parts[i])
			}
		}
		done <- err
	}()
	var linErr error
	for i, ch := range chunks {
		wc := w.View(ch[0]*K, ch[1]-ch[0], K)
		shape := slices.Clone(o.Shape)
		shape[len(shape)-1] = ch[1] - ch[0]
		y, err := lin(n, []*tensor.Tensor{x, wc}, []Out{{DType: o.DType, Shape: shape}})
		if err != nil {
			linErr = err
			break
		}
		parts[i] = y[0]
		ready <- i
	}
	close(ready)
	if err := <-done; err != nil {
		return nil, err
	}
	if linErr != nil {
		return nil, linErr
	}
	res := tensor.New(o.DType, o.Shape...)
	for i, ch := range chunks {
		copyColumns(res, parts[i], M, N, ch[0], ch[1]-ch[0])
	}
	return []*tensor.Tensor{res}, nil
}

// copyColumns writes part [M,width] into columns [lo, lo+width) of dst [M,N].
func copyColumns(dst, part *tensor.Tensor, M, N, lo, width int) {
	for r := range M {
		d, s := r*N+lo, r*width
		switch dst.DType {
		case tensor.F32:
			copy(dst.F32[d:d+width], part.F32[s:s+width])
		case tensor.BF16, tensor.F16:
			copy(dst.Half[d:d+width], part.Half[s:s+width])
		}
	}
}

// Reference kernels of the plain collectives: the identity over a group of one rank. Over
// more ranks they need a communicator, which only CompileWith binds.
func collectiveReference(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
	if err := checkArgs(n, in, out, 1, 1); err != nil {
		return nil, err
	}
	if size := n.Attrs.Int("group_size"); size != 1 {
		return nil, fmt.Errorf("%s over %q of %d ranks needs a communicator (compile with CompileWith)", n.Op, n.Attrs.String("group"), size)
	}
	return []*tensor.Tensor{in[0].Clone()}, nil
}

func init() {
	for _, op := range []string{"all_reduce", "all_gather", "reduce_scatter", "all_to_all"} {
		registerReference(op, collectiveReference)
	}
}
