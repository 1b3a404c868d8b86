package cuda

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/backend/memplan"
	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Program is a graph compiled for one GPU: its kernels chosen, its parameters and constants
// on the device. Run binds the symbolic dimensions from the inputs, lays all intermediate
// values out in one arena by a static memory plan (made once per set of bindings), runs
// the kernels in order on the device's stream and copies the outputs back. Runs of one
// Program, and of Programs on one Device, take turns.
type Program struct {
	dev     *Device
	g       *graph.Graph
	values  []*graph.Value // per slot: graph inputs, then node outputs in order
	inputs  []int          // slot of each graph input
	fixed   []*Tensor      // per slot: params, consts and values folded at compile time
	root    []int          // per slot: the slot whose memory it uses (views share their input's)
	steps   []step
	outputs []int
	states  []*Tensor // device memory prepared for steps, freed by Close

	mu    sync.Mutex
	plans map[string]*memPlan
	arena *Tensor // the largest arena any run needed so far, reused by every run

	// resident holds the slots of the inputs Options.Resident names.
	resident []int
	// graphs is Options.Graphs.
	graphs bool
	// comm, mesh, rank and peer are Options.Comm, Mesh, Rank and Peer; hasCollectives is
	// set when the graph has collective ops.
	comm           Collectives
	mesh           dist.Mesh
	rank           int
	peer           *PeerRank
	hasCollectives bool
	// prof collects per-op GPU time with Options.Profile.
	prof *profiler
	// busy times each run's kernels on the device (from before the inputs are copied in
	// to after the last step), for DeviceTime.
	busy deviceClock
	// synced marks the end of a run that syncCollectives waits for; launches holds what
	// Launch keeps between launches.
	synced   cubind.Event
	launches launchState

	// Folded counts the nodes evaluated at compile time.
	Folded int
}

type step struct {
	node    *graph.Node
	k       *opKernel
	in, out []int
	state   any
}

// Options tune Compile. The zero value is the default.
type Options struct {
	// ExactF32Linear makes every linear whose activations are f32 and whose weight is a bf16
	// param multiply in f32: the weight is widened to f32 once, at compile time (twice its
	// memory; the bf16 copy is dropped when nothing else reads it). The results then match
	// the CPU backend to f32 rounding. Without it such a linear rounds its activations to
	// bf16 and runs a bf16 GEMM with an f32 result (about 2^-9 relative error per input).
	ExactF32Linear bool
	// Graphs captures the kernels of a run as a CUDA graph and replays it, so that a step costs
	// one launch instead of one per kernel. A graph is made per set of symbol bindings (a
	// bucket): the first run of a bucket runs eagerly (compiling kernels, checking shapes),
	// the second captures and replays, later ones replay. Inputs are copied in before and
	// outputs out after the graph, so replays see new inputs. A bucket whose capture fails
	// (a kernel that must allocate, for instance) keeps running eagerly.
	Graphs bool
	// Profile times every step on the GPU with events and adds the time up per op (see
	// Program.Profile). Steps then run eagerly, one at a time, without CUDA graphs: a
	// profile shows where the GPU time goes, not the overlapped speed.
	Profile bool
	// Comm is this rank's communicator for the collective ops of a sharded graph; Mesh is
	// the deployment's mesh and Rank this program's rank in it. A graph with collectives
	// needs all three.
	Comm Collectives
	Mesh dist.Mesh
	Rank int
	// Peer, when set, is this rank's place in a one-shot peer group (NewPeerGroup) that
	// all-reduces over the group of the same ranks: small all-reduces (OneShotMaxBytes) go
	// through it instead of Comm.
	Peer *PeerRank
	// Resident names graph inputs that live on the device, such as the engine's KV caches
	// (kv_cache.<layer>.k/.v): the first Run uploads the tensor passed for each (or, for a
	// tensor with a shape but no elements stored, such as kvcache.NewCacheShapes makes,
	// allocates it zeroed on the device), later Runs use the device copy, which kernels
	// update in place (paged_attention writes the caches), and never copy it in again nor
	// back. Every Run must still pass a tensor of the same shape for each (its contents are
	// then ignored). Close frees them.
	Resident []string
}

// Compile prepares g to run on d: it verifies the graph, replaces every node whose op has
// no CUDA kernel but a decomposition in the graph catalog by that decomposition (expand.go;
// Program.Graph is then the expanded graph), checks that every op has a CUDA kernel (naming
// each op that has none), uploads every param (read through w, several at once through pinned
// buffers: upload.go) and const, and evaluates
// once every node whose inputs are all params or consts. w may be nil for a graph without
// params; opts may be nil for the defaults.
func Compile(ctx context.Context, d *Device, g *graph.Graph, w backend.Weights, opts *Options) (*Program, error) {
	if opts == nil {
		opts = &Options{}
	}
	if g == nil {
		return nil, errors.New("cuda: compile: nil graph")
	}
	if err := graph.Verify(g); err != nil {
		return nil, fmt.Errorf("cuda: compile %s: %w", g.Name, err)
	}
	eg, from, err := expandGraph(g)
	if err != nil {
		return nil, fmt.Errorf("cuda: compile %s: %w", g.Name, err)
	}
	g = eg
	if err := missingKernels(g, from); err != nil {
		return nil, fmt.Errorf("cuda: compile %s: %w", g.Name, err)
	}
	if err := graph.CheckSymbolsBound(g); err != nil {
		return nil, fmt.Errorf("cuda: compile %s: %w", g.Name, err)
	}
	if d == nil {
		return nil, fmt.Errorf("cuda: compile %s: no device", g.Name)
	}
	p, slot := newProgram(d, g)
	p.graphs = opts.Graphs
	p.comm, p.mesh, p.rank, p.peer = opts.Comm, opts.Mesh, opts.Rank, opts.Peer
	if opts.Profile {
		p.prof = &profiler{ops: map[string]*OpTime{}}
	}
	for _, name := range opts.Resident {
		s := slices.IndexFunc(p.inputs, func(s int) bool { return p.values[s].Name == name })
		if s < 0 {
			return nil, fmt.Errorf("cuda: compile %s: resident input %q is not a graph input", g.Name, name)
		}
		p.resident = append(p.resident, p.inputs[s])
	}
	err = d.do(func() error {
		var params []*graph.Node
		for _, n := range g.Nodes {
			if n.Op == graph.OpParam {
				params = append(params, n)
			}
		}
		if err := p.uploadParams(ctx, params, slot, w); err != nil {
			return err
		}
		for _, n := range g.Nodes {
			if err := ctx.Err(); err != nil {
				return err
			}
			if n.Op == graph.OpParam {
				continue
			}
			if err := p.compileNode(ctx, n, slot, w); err != nil {
				return err
			}
		}
		if opts.ExactF32Linear {
			if err := p.widenLinearWeights(); err != nil {
				return err
			}
		}
		return d.sync()
	})
	if err != nil {
		p.Close()
		return nil, fmt.Errorf("cuda: compile %s: %w", g.Name, err)
	}
	return p, nil
}

// newProgram numbers g's values (graph inputs, then node outputs) and records the inputs
// and outputs; Compile then fills in the nodes.
func newProgram(d *Device, g *graph.Graph) (*Program, map[*graph.Value]int) {
	p := &Program{dev: d, g: g, plans: map[string]*memPlan{}}
	slot := map[*graph.Value]int{}
	add := func(v *graph.Value) int {
		slot[v] = len(p.values)
		p.values = append(p.values, v)
		p.root = append(p.root, len(p.root))
		return slot[v]
	}
	for _, v := range g.Inputs {
		p.inputs = append(p.inputs, add(v))
	}
	for _, n := range g.Nodes {
		for _, o := range n.Outputs {
			add(o)
		}
	}
	for _, o := range g.Outputs {
		p.outputs = append(p.outputs, slot[o])
	}
	p.fixed = make([]*Tensor, len(p.values))
	return p, slot
}

// compileNode loads a const, evaluates a node of fixed inputs, or records a step.
func (p *Program) compileNode(ctx context.Context, n *graph.Node, slot map[*graph.Value]int, w backend.Weights) error {
	d := p.dev
	switch n.Op {
	case graph.OpConst:
		h, err := constTensor(n)
		if err != nil {
			return err
		}
		t, err := d.upload(h)
		if err != nil {
			return fmt.Errorf("const %s: %w", n.Out(), err)
		}
		p.fixed[slot[n.Out()]] = t
		return nil
	}
	k := opKernels[n.Op]
	st := step{node: n, k: k}
	for _, in := range n.Inputs {
		st.in = append(st.in, slot[in])
	}
	for _, o := range n.Outputs {
		st.out = append(st.out, slot[o])
	}
	if k.collective {
		c, err := p.bindCollective(n)
		if err != nil {
			return err
		}
		st.state = c
		p.hasCollectives = true
	}
	if k.prepare != nil {
		s, err := k.prepare(d, n)
		if err != nil {
			return fmt.Errorf("%s: %w", nodeText(n), err)
		}
		st.state = s
		if t, ok := s.(*Tensor); ok {
			p.states = append(p.states, t)
		}
		if ls, ok := s.(*linearState); ok && ls.invFreq != nil {
			p.states = append(p.states, ls.invFreq)
		}
	}
	if k.view {
		p.root[st.out[0]] = p.root[st.in[0]]
	}
	// Fold nodes whose inputs are all fixed and whose outputs have constant shapes.
	foldable := true
	for _, s := range st.in {
		foldable = foldable && p.fixed[s] != nil
	}
	var outs []*Tensor
	for _, o := range n.Outputs {
		shape, err := o.Type.Shape.Resolve(nil)
		if err != nil {
			foldable = false
			break
		}
		outs = append(outs, &Tensor{DType: o.Type.DType, Shape: shape})
	}
	if !foldable {
		p.steps = append(p.steps, st)
		return nil
	}
	in := make([]*Tensor, len(st.in))
	for i, s := range st.in {
		in[i] = p.fixed[s]
	}
	if k.view {
		v, err := in[0].View(outs[0].Shape...)
		if err != nil {
			return err
		}
		p.fixed[st.out[0]] = v
		p.Folded++
		return nil
	}
	for i, o := range outs {
		t, err := d.allocTensor(o.DType, o.Shape)
		if err != nil {
			return err
		}
		outs[i] = t
		p.fixed[st.out[i]] = t
	}
	if err := k.run(d, n, in, outs, st.state); err != nil {
		return fmt.Errorf("fold %s: %w", nodeText(n), err)
	}
	p.Folded++
	return nil
}

// widenLinearWeights gives every linear step with f32 activations and a fixed bf16 weight
// an f32 copy of the weight (shared by steps that read the same weight), and frees bf16
// weights that nothing else reads.
func (p *Program) widenLinearWeights() error {
	d := p.dev
	uses := make([]int, len(p.values))
	for _, st := range p.steps {
		for _, s := range st.in {
			uses[s]++
		}
	}
	for _, s := range p.outputs {
		uses[s]++
	}
	wide := map[int]*Tensor{}
	for i := range p.steps {
		st := &p.steps[i]
		if !linearOps[st.node.Op] || p.fixed[st.in[1]] == nil {
			continue
		}
		x, w := st.node.Inputs[0].Type.DType, p.fixed[st.in[1]]
		if x != tensor.F32 || w.DType != tensor.BF16 {
			continue
		}
		wt, ok := wide[st.in[1]]
		if !ok {
			var err error
			if wt, err = d.allocTensor(tensor.F32, w.Shape); err != nil {
				return fmt.Errorf("widen %s: %w", nodeText(st.node), err)
			}
			if err := cast(d, wt, w); err != nil {
				return fmt.Errorf("widen %s: %w", nodeText(st.node), err)
			}
			wide[st.in[1]] = wt
			p.states = append(p.states, wt)
		}
		if ls, ok := st.state.(*linearState); ok {
			ls.wide = wt
		} else {
			st.state = &linearState{wide: wt}
		}
		uses[st.in[1]]--
	}
	for s := range wide {
		if uses[s] == 0 && p.fixed[s].blk != nil && !p.aliased(s) {
			d.Free(p.fixed[s]) // queued casts read it first: the stream orders the reuse
			p.fixed[s] = &Tensor{DType: p.fixed[s].DType, Shape: p.fixed[s].Shape, dev: d}
		}
	}
	return nil
}

// aliased reports whether a fixed value other than s is a view of s's memory.
func (p *Program) aliased(s int) bool {
	for o, t := range p.fixed {
		if o != s && t != nil && p.fixed[s] != nil && t.ptr == p.fixed[s].ptr && t.ptr != 0 {
			return true
		}
	}
	return false
}

// Close frees the program's device memory (params, consts, folded values, arenas).
func (p *Program) Close() error {
	if p == nil || p.dev == nil {
		return nil
	}
	return p.dev.do(func() error {
		owned := map[*block]bool{}
		for _, t := range append(slices.Clone(p.fixed), p.states...) {
			if t != nil && t.blk != nil && !owned[t.blk] {
				owned[t.blk] = true
				p.dev.Free(t)
			}
		}
		p.fixed, p.states = nil, nil
		p.mu.Lock()
		defer p.mu.Unlock()
		p.dev.Free(p.arena)
		p.arena = nil
		var errs []error
		for _, pl := range p.plans {
			errs = append(errs, pl.dropGraph())
		}
		if p.prof != nil {
			errs = append(errs, p.prof.close())
		}
		p.busy.destroy()
		errs = append(errs, p.launches.release(p.dev))
		if p.synced != 0 {
			errs = append(errs, p.synced.Destroy())
			p.synced = 0
		}
		p.plans = map[string]*memPlan{}
		return errors.Join(errs...)
	})
}

// Resident returns the names of the inputs that live on the device (Options.Resident).
func (p *Program) Resident() []string {
	names := make([]string, len(p.resident))
	for i, s := range p.resident {
		names[i] = p.values[s].Name
	}
	return names
}

// Graph returns the graph the program was compiled from.
func (p *Program) Graph() *graph.Graph { return p.g }

// WeightBytes is the device memory the program holds between runs for params, consts,
// folded values and what steps prepared (such as widened weights).
func (p *Program) WeightBytes() int {
	n := 0
	for _, t := range append(slices.Clone(p.fixed), p.states...) {
		if t != nil && t.blk != nil {
			n += int(t.blk.size)
		}
	}
	return n
}

// memPlan is the static memory layout of one run for one binding of the symbols: every
// value that is not fixed gets an offset in one arena, and values whose lifetimes overlap
// never share bytes.
type memPlan struct {
	shapes  [][]int // per slot: concrete shape
	offsets []int64 // per root slot: byte offset in the arena (-1: not planned)
	// work holds per step the byte offset and size of its workspace (size 0: none).
	work []workspace
	size int64

	// runs counts the runs of this plan; graph is its captured steps (with Options.Graphs),
	// valid while the arena stays at graphArena; noGraph records a failed capture.
	runs       int
	graph      cubind.GraphExec
	graphArena cubind.DevicePtr
	noGraph    bool
	// vals is the run's tensor per slot at the arena valsArena (see Program.layout).
	vals      []*Tensor
	valsArena cubind.DevicePtr
}

// dropGraph destroys the plan's captured graph, if any.
func (pl *memPlan) dropGraph() error {
	if pl.graph == 0 {
		return nil
	}
	err := pl.graph.Destroy()
	pl.graph, pl.graphArena = 0, 0
	return err
}

type workspace struct{ off, size int64 }

// maxPlans bounds the plans a Program keeps (one per set of symbol bindings).
const maxPlans = 256

// align is the alignment of every value in an arena.
const align = 256

func (p *Program) plan(env map[string]int) (*memPlan, error) {
	keys := slices.Sorted(maps.Keys(env))
	var kb strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&kb, "%s=%d,", k, env[k])
	}
	key := kb.String()
	if pl, ok := p.plans[key]; ok {
		return pl, nil
	}
	pl := &memPlan{shapes: make([][]int, len(p.values)), offsets: make([]int64, len(p.values))}
	for s, v := range p.values {
		shape, err := v.Type.Shape.Resolve(env)
		if err != nil {
			return nil, err
		}
		pl.shapes[s] = shape
		pl.offsets[s] = -1
	}
	// Lifetimes of root slots in step indices: graph inputs are defined before step 0, graph
	// outputs live past the last step.
	steps := make([]memplan.Step, len(p.steps))
	for i, st := range p.steps {
		steps[i] = memplan.Step{In: st.in, Out: st.out}
	}
	live := memplan.Lifetimes(len(p.values), p.root, p.inputs, steps, p.outputs)
	// The buffers: every root slot that is used and not fixed, then each step's workspace
	// (owner -1 - step), alive during its step only.
	var bufs []memplan.Buffer
	var owner []int
	for s := range p.values {
		if p.root[s] != s || p.fixed[s] != nil || !live[s].Used() {
			continue
		}
		size := int64(tensor.Numel(pl.shapes[s]) * p.values[s].Type.DType.Size())
		bufs = append(bufs, memplan.Buffer{Size: size, Live: live[s]})
		owner = append(owner, s)
	}
	pl.work = make([]workspace, len(p.steps))
	for i, st := range p.steps {
		if st.k.workspace == nil {
			continue
		}
		shapes := make([][]int, len(st.in))
		for j, s := range st.in {
			shapes[j] = pl.shapes[s]
		}
		if size := st.k.workspace(st.node, shapes); size > 0 {
			pl.work[i].size = size
			bufs = append(bufs, memplan.Buffer{Size: size, Live: memplan.Interval{First: i, Last: i}})
			owner = append(owner, -1-i)
		}
	}
	offs, size := memplan.Place(bufs, align)
	for j, s := range owner {
		if s < 0 {
			pl.work[-1-s].off = offs[j]
		} else {
			pl.offsets[s] = offs[j]
		}
	}
	pl.size = size
	if len(p.plans) >= maxPlans {
		for _, old := range p.plans {
			old.dropGraph()
		}
		clear(p.plans)
	}
	p.plans[key] = pl
	return pl, nil
}

// Run executes the program: inputs holds one host tensor per graph input, by name, of the
// input's dtype and rank (symbolic dimensions are bound from them). It returns the graph
// outputs in order as host tensors.
func (p *Program) Run(ctx context.Context, inputs map[string]*tensor.Tensor) ([]*tensor.Tensor, error) {
	var res []*tensor.Tensor
	err := p.execute(ctx, inputs, func(vals []*Tensor) error {
		res = make([]*tensor.Tensor, len(p.outputs))
		for i, s := range p.outputs {
			h, err := p.dev.download(vals[s])
			if err != nil {
				return fmt.Errorf("output %d: %w", i, err)
			}
			res[i] = h
		}
		return nil
	})
	return res, err
}

// RunDiscard executes the program as Run does but brings no output back: it returns once
// the step has finished on the device (and reports its errors). Ranks other than 0 of a
// tensor-parallel deployment run their steps so: only rank 0's logits are read.
func (p *Program) RunDiscard(ctx context.Context, inputs map[string]*tensor.Tensor) error {
	return p.execute(ctx, inputs, func([]*Tensor) error { return p.dev.sync() })
}

// execute binds the inputs, lays the run out, copies the inputs in, queues the steps and
// then calls finish with every value's device tensor (by slot), the device locked.
func (p *Program) execute(ctx context.Context, inputs map[string]*tensor.Tensor, finish func(vals []*Tensor) error) error {
	if p == nil || p.dev == nil || p.fixed == nil {
		return errors.New("cuda: run: program was not compiled or is closed")
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("cuda: run %s: %w", p.g.Name, err)
	}
	env, err := p.bind(inputs)
	if err != nil {
		return fmt.Errorf("cuda: run %s: %w", p.g.Name, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.loadResident(inputs); err != nil {
		return fmt.Errorf("cuda: run %s: %w", p.g.Name, err)
	}
	pl, err := p.plan(env)
	if err != nil {
		return fmt.Errorf("cuda: run %s: %w", p.g.Name, err)
	}
	err = p.dev.do(func() error {
		p.busy.start(p.dev.stream)
		vals, err := p.run(ctx, pl, inputs)
		if err != nil {
			return err
		}
		p.busy.stop(p.dev.stream)
		if err := p.syncCollectives(ctx); err != nil {
			return err
		}
		if err := finish(vals); err != nil {
			return err
		}
		p.busy.add()
		return nil
	})
	if err != nil {
		return fmt.Errorf("cuda: run %s: %w", p.g.Name, err)
	}
	return nil
}

// run lays out the values of one run in the arena, copies the inputs in and queues the
// steps; it returns every value's device tensor by slot.
func (p *Program) run(ctx context.Context, pl *memPlan, inputs map[string]*tensor.Tensor) ([]*Tensor, error) {
	d := p.dev
	if err := p.ensureArena(pl); err != nil {
		return nil, err
	}
	vals := p.layout(pl)
	for _, s := range p.inputs {
		v := p.values[s]
		if vals[s] == nil || p.fixed[s] != nil {
			continue // unused, or resident
		}
		if err := copyIn(d, vals[s], inputs[v.Name]); err != nil {
			return nil, fmt.Errorf("input %q: %w", v.Name, err)
		}
	}
	if err := p.runSteps(ctx, pl, vals); err != nil {
		return nil, err
	}
	return vals, nil
}

// ensureArena grows the arena to what plan pl needs. Work queued on the old one runs first
// (one stream), so it can be freed at once.
func (p *Program) ensureArena(pl *memPlan) error {
	if p.arena != nil && int64(p.arena.Bytes()) >= pl.size {
		return nil
	}
	p.dev.Free(p.arena)
	p.arena = nil
	a, err := p.dev.allocTensor(tensor.Bool, []int{int(max(pl.size, 1))}) // a byte buffer
	if err != nil {
		return err
	}
	p.arena = a
	return nil
}

// runSteps queues the steps of a run whose values are laid out in vals: eagerly, or by
// capturing and replaying a CUDA graph (Options.Graphs).
func (p *Program) runSteps(ctx context.Context, pl *memPlan, vals []*Tensor) error {
	d := p.dev
	defer func() { pl.runs++ }()
	if p.prof != nil {
		return p.prof.steps(p, ctx, pl, vals)
	}
	if !p.graphs || pl.noGraph || pl.runs == 0 {
		return p.queueSteps(ctx, pl, vals)
	}
	if pl.graph != 0 && pl.graphArena != p.arena.ptr {
		if err := pl.dropGraph(); err != nil {
			return err
		}
	}
	if pl.graph == 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		exec, err := p.capture(ctx, pl, vals)
		if err != nil {
			slog.Debug("cuda: capture failed; this bucket runs eagerly", "graph", p.g.Name, "err", err)
			pl.noGraph = true
			return p.queueSteps(ctx, pl, vals)
		}
		pl.graph, pl.graphArena = exec, p.arena.ptr
	}
	if err := pl.graph.Launch(d.stream); err != nil {
		return fmt.Errorf("replay the captured steps: %w", err)
	}
	return nil
}

// capture records the steps into a CUDA graph and instantiates it. Nothing runs.
func (p *Program) capture(ctx context.Context, pl *memPlan, vals []*Tensor) (cubind.GraphExec, error) {
	return p.dev.captureGraph(func() error { return p.queueSteps(ctx, pl, vals) })
}

// queueSteps queues the kernels of every step on the device's stream.
func (p *Program) queueSteps(ctx context.Context, pl *memPlan, vals []*Tensor) error {
	d := p.dev
	in, out := []*Tensor{}, []*Tensor{}
	for i, st := range p.steps {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("before %s: %w", nodeText(st.node), err)
		}
		if st.k.view {
			continue
		}
		in, out = p.stepArgs(pl, vals, i, in[:0], out[:0])
		if err := st.k.run(d, st.node, in, out, st.state); err != nil {
			return fmt.Errorf("%s: %w", nodeText(st.node), err)
		}
	}
	return nil
}

// stepArgs appends step i's input and output tensors (and its workspace, after the
// outputs) to in and out.
func (p *Program) stepArgs(pl *memPlan, vals []*Tensor, i int, in, out []*Tensor) ([]*Tensor, []*Tensor) {
	st := p.steps[i]
	for _, s := range st.in {
		in = append(in, vals[s])
	}
	for _, s := range st.out {
		out = append(out, vals[s])
	}
	if w := pl.work[i]; w.size > 0 {
		out = append(out, &Tensor{DType: tensor.Bool, Shape: []int{int(w.size)}, ptr: p.arena.ptr + cubind.DevicePtr(w.off), dev: p.dev})
	}
	return in, out
}

// layout returns every value's device tensor (by slot) for a run of plan pl: fixed values,
// and the others at their planned offsets in the arena. It is made once per plan and arena,
// since the addresses are the same for every run of the plan.
func (p *Program) layout(pl *memPlan) []*Tensor {
	if pl.vals != nil && pl.valsArena == p.arena.ptr {
		return pl.vals
	}
	vals := make([]*Tensor, len(p.values))
	for s := range p.values {
		if p.fixed[s] != nil {
			vals[s] = p.fixed[s]
			continue
		}
		off := pl.offsets[p.root[s]]
		if off < 0 {
			continue // never used
		}
		vals[s] = &Tensor{DType: p.values[s].Type.DType, Shape: pl.shapes[s], ptr: p.arena.ptr + cubind.DevicePtr(off), dev: p.dev}
	}
	pl.vals, pl.valsArena = vals, p.arena.ptr
	return vals
}

// loadResident uploads each resident input on the first Run and checks later Runs pass the
// same shape. p.mu must be held.
func (p *Program) loadResident(inputs map[string]*tensor.Tensor) error {
	for _, s := range p.resident {
		v, h := p.values[s], inputs[p.values[s].Name]
		if t := p.fixed[s]; t != nil {
			if !slices.Equal(t.Shape, h.Shape) {
				return fmt.Errorf("resident input %q is %v on the device, got %v", v.Name, t.Shape, h.Shape)
			}
			continue
		}
		err := p.dev.do(func() error {
			if h.Len() == 0 && h.Numel() > 0 { // shape only: zeros on the device
				t, err := p.dev.allocTensor(h.DType, h.Shape)
				if err != nil {
					return err
				}
				p.fixed[s] = t
				return p.dev.memset8(t.ptr, 0, uint64(t.Bytes()))
			}
			t, err := p.dev.upload(h)
			if err != nil {
				return err
			}
			p.fixed[s] = t
			return nil
		})
		if err != nil {
			return fmt.Errorf("resident input %q: %w", v.Name, err)
		}
	}
	return nil
}
