package cpu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/backend/memplan"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Program is a graph compiled for the CPU: its kernels chosen, its parameters loaded and its
// constants evaluated. Run may be called concurrently; runs share only read-only state.
type Program struct {
	g       *graph.Graph
	values  []*graph.Value // per slot: graph inputs, then node outputs in order
	inputs  []inputSlot
	fixed   []*tensor.Tensor // per slot: loaded params and evaluated consts, nil otherwise
	steps   []step
	outputs []int // slot of each graph output

	params, paramBytes int // how many params were loaded, and their size
	folded             int // how many nodes were evaluated at compile time
	ranks              int // the ranks the graph needs: its largest collective group

	// parts maps the slot of a fused weight kept as its parts (parted.go) to the parts'
	// slots, in order; such a slot has no fixed value and no step reads it.
	parts map[int][]int

	// resident, when set (a deployment with a Resident predicate), holds the inputs the
	// program keeps itself: the KV caches, off the Go heap (resident.go).
	resident *residentSet

	// onFree, when set (by tests), is told of every value a run releases.
	onFree func(v *graph.Value)

	// bufs holds the activation buffers runs have given back, for the next steps and runs
	// (arena.go); noArena (tests) makes runs allocate every output from the Go heap.
	bufs     *bufPool
	noArena  bool
	isOutput []bool // per slot: a graph output, made without the arena
}

type inputSlot struct {
	v    *graph.Value
	slot int
}

// step runs one node.
type step struct {
	node   *graph.Node
	kernel Kernel
	in     []int // slots read
	out    []int // slots written
	free   []int // slots whose last use is this step
	outs   []Out // the outputs' concrete types when they hold no symbol, else nil
	// run, set on collectives bound to a communicator (see CompileWith), replaces kernel.
	run ctxKernel
}

// Graph returns the graph the program was compiled from. It must not be modified.
func (p *Program) Graph() *graph.Graph { return p.g }

// Compile prepares g to run on the CPU. It verifies the graph, checks that every op has a
// kernel (see Lookup), loads every param through w and evaluates every const node once.
// It also folds constants: every node whose inputs are all params or consts, directly or
// through other such nodes, and whose outputs have constant shapes, is evaluated here once
// (a fused GEMM's concat(w_q, w_k, w_v), say, becomes one contiguous weight), and the params
// and intermediate values that only such nodes read are dropped, so the program holds each
// weight once; where w is a graph.WeightsInto, such a concat of params along axis 0 is read
// straight into its one tensor instead (load_into.go), or, where w's tensors are views of a
// file mapping and the linears that read the concat can take it in parts, not joined at all:
// each param stays the view w gave (parted.go). w may be nil for a graph without
// params. The kernels are fixed at this point: a later Register does not change a compiled
// program.
func Compile(ctx context.Context, g *graph.Graph, w backend.Weights) (*Program, error) {
	start := time.Now()
	p, err := compile(ctx, g, w, Lookup)
	if err != nil {
		return nil, err
	}
	slog.Debug("cpu: compiled", "graph", g.Name, "nodes", len(g.Nodes), "steps", len(p.steps),
		"params", p.params, "param_bytes", p.paramBytes, "folded", p.folded,
		"held_bytes", p.WeightBytes(), "elapsed", time.Since(start))
	return p, nil
}

// compile is Compile with the kernel lookup as a parameter (Lookup, or Reference for the
// reference decomposition of fused ops).
func compile(ctx context.Context, g *graph.Graph, w backend.Weights, lookup func(string) (Kernel, bool)) (*Program, error) {
	return compileWith(ctx, g, w, lookup, nil)
}

// compileWith is compile with the communicator options of CompileWith (nil: none).
func compileWith(ctx context.Context, g *graph.Graph, w backend.Weights, lookup func(string) (Kernel, bool), opts *Options) (*Program, error) {
	if g == nil {
		return nil, errors.New("cpu: compile: nil graph")
	}
	if err := graph.Verify(g); err != nil {
		return nil, fmt.Errorf("cpu: compile %s: %w", g.Name, err)
	}
	bind, err := newBinder(g, opts)
	if err != nil {
		return nil, fmt.Errorf("cpu: compile %s: %w", g.Name, err)
	}
	p := &Program{g: g, ranks: graph.CollectiveRanks(g)}
	p.bufs = newPool(p)
	slot := map[*graph.Value]int{}
	for _, v := range g.Inputs {
		slot[v] = len(p.values)
		p.inputs = append(p.inputs, inputSlot{v: v, slot: len(p.values)})
		p.values = append(p.values, v)
	}
	for _, n := range g.Nodes {
		for _, o := range n.Outputs {
			slot[o] = len(p.values)
			p.values = append(p.values, o)
		}
	}
	p.fixed = make([]*tensor.Tensor, len(p.values))
	// Kernels first, so that a graph we cannot run fails before any weight is read.
	var missing []error
	kernels := make([]Kernel, len(g.Nodes))
	runs := make([]ctxKernel, len(g.Nodes))
	for i, n := range g.Nodes {
		if n.Op == graph.OpParam {
			continue
		}
		if bind != nil && isCollective(n) {
			r, err := bind.kernel(n, lookup)
			if err != nil {
				missing = append(missing, fmt.Errorf("node %s: %w", n, err))
			}
			runs[i] = r
			continue
		}
		k, ok := lookup(n.Op)
		if !ok {
			missing = append(missing, fmt.Errorf("no CPU kernel for op %q (node %s)", n.Op, n))
			continue
		}
		kernels[i] = k
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("cpu: compile %s: %w", g.Name, errors.Join(missing...))
	}
	if err := graph.CheckSymbolsBound(g); err != nil {
		return nil, fmt.Errorf("cpu: compile %s: %w", g.Name, err)
	}
	// uses counts, per slot, the node inputs that read it, plus one if it is a graph output:
	// a fixed value is dropped once every reader has been folded.
	uses := make([]int, len(p.values))
	for _, n := range g.Nodes {
		for _, in := range n.Inputs {
			uses[slot[in]]++
		}
	}
	p.isOutput = make([]bool, len(p.values))
	for _, o := range g.Outputs {
		p.outputs = append(p.outputs, slot[o])
		p.isOutput[slot[o]] = true
		uses[slot[o]]++
	}
	directs, deferred := directConcats(g, w, slot, uses)
	partable := partableConcats(g, w, directs, lookup)
	for i, n := range g.Nodes {
		if deferred[i] {
			continue // read by its concat (loadConcat)
		}
		if directs[i] {
			outs, _ := resolveOuts(n, nil)
			if err := p.loadConcat(ctx, n, outs, w.(graph.WeightsInto), partable[i], slot, uses); err != nil {
				return nil, fmt.Errorf("cpu: compile %s: %w", g.Name, err)
			}
			continue
		}
		if n.Op == graph.OpParam {
			t, err := backend.LoadParam(ctx, n, w)
			if err != nil {
				return nil, fmt.Errorf("cpu: compile %s: %w", g.Name, err)
			}
			p.fixed[slot[n.Out()]] = t
			p.params++
			p.paramBytes += t.Numel() * t.DType.Size()
			continue
		}
		outs, symErr := resolveOuts(n, nil) // an error: the output shapes hold symbols
		if symErr == nil && !isCollective(n) && p.foldable(n, slot) {
			if err := p.fold(ctx, n, kernels[i], outs, slot, uses); err != nil {
				return nil, fmt.Errorf("cpu: compile %s: %w", g.Name, err)
			}
			continue
		}
		st := step{node: n, kernel: kernels[i], run: runs[i]}
		if symErr == nil {
			st.outs = outs
		}
		for _, in := range n.Inputs {
			st.in = append(st.in, slot[in])
		}
		for _, o := range n.Outputs {
			st.out = append(st.out, slot[o])
		}
		p.partedStep(&st)
		p.steps = append(p.steps, st)
	}
	for s, u := range uses {
		if u == 0 {
			p.fixed[s] = nil // a param nobody reads
		}
	}
	p.planFrees()
	return p, nil
}

// foldable reports whether every input of n is already a fixed value (a param, a const or
// a folded node); nodes without inputs (const, iota) are foldable too.
func (p *Program) foldable(n *graph.Node, slot map[*graph.Value]int) bool {
	for _, in := range n.Inputs {
		if p.fixed[slot[in]] == nil {
			return false
		}
	}
	return true
}

// fold evaluates n at compile time, stores its outputs as fixed values and drops the fixed
// inputs that no other node or graph output reads.
func (p *Program) fold(ctx context.Context, n *graph.Node, k Kernel, outs []Out, slot map[*graph.Value]int, uses []int) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("fold %s: %w", n, err)
	}
	in := make([]*tensor.Tensor, len(n.Inputs))
	for j, v := range n.Inputs {
		in[j] = p.fixed[slot[v]]
	}
	res, err := runKernel(k, n, in, outs)
	if err != nil {
		return err
	}
	for j, o := range n.Outputs {
		p.fixed[slot[o]] = res[j]
	}
	for _, v := range n.Inputs {
		s := slot[v]
		if uses[s]--; uses[s] == 0 {
			p.fixed[s] = nil
		}
	}
	if n.Op != graph.OpConst {
		p.folded++
	}
	return nil
}

// WeightBytes is the size in bytes of the tensors the program holds between runs: loaded
// params, consts and values folded at compile time, less what folding dropped.
func (p *Program) WeightBytes() int {
	total := 0
	for _, t := range p.fixed {
		if t != nil {
			total += t.Numel() * t.DType.Size()
		}
	}
	return total
}

// planFrees records on each step the slots it reads for the last time (memplan.Lifetimes).
// Graph outputs and fixed values (params, consts) are never released; a value nobody reads
// is released right after the step that makes it.
func (p *Program) planFrees() {
	keep := make([]bool, len(p.values))
	for _, s := range p.outputs {
		keep[s] = true
	}
	for s, t := range p.fixed {
		keep[s] = keep[s] || t != nil
	}
	steps := make([]memplan.Step, len(p.steps))
	for i, st := range p.steps {
		steps[i] = memplan.Step{In: st.in, Out: st.out}
	}
	// Inputs and outputs are left out: an input is released after its last reader like any
	// value, and outputs are kept.
	for s, live := range memplan.Lifetimes(len(p.values), nil, nil, steps, nil) {
		if live.Used() && live.Last >= 0 && !keep[s] {
			p.steps[live.Last].free = append(p.steps[live.Last].free, s)
		}
	}
}

// resolveOuts gives the concrete dtype and shape of each of n's outputs.
func resolveOuts(n *graph.Node, env map[string]int) ([]Out, error) {
	outs := make([]Out, len(n.Outputs))
	for i, o := range n.Outputs {
		shape, err := o.Type.Shape.Resolve(env)
		if err != nil {
			return nil, err
		}
		outs[i] = Out{DType: o.Type.DType, Shape: shape}
	}
	return outs, nil
}

// runKernel calls k and checks that it kept its contract; errors carry the node's text.
func runKernel(k Kernel, n *graph.Node, in []*tensor.Tensor, outs []Out) ([]*tensor.Tensor, error) {
	res, err := k(n, in, outs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", n, err)
	}
	if len(res) != len(outs) {
		return nil, fmt.Errorf("%s: kernel returned %d outputs, want %d", n, len(res), len(outs))
	}
	for i, r := range res {
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("%s: kernel output %d: %w", n, i, err)
		}
		if r.DType != outs[i].DType || !slices.Equal(r.Shape, outs[i].Shape) {
			return nil, fmt.Errorf("%s: kernel output %d is %s%v, want %s", n, i, r.DType, r.Shape, outs[i])
		}
	}
	return res, nil
}

// Run executes the program. inputs holds one tensor per graph input, by name, each of the
// input's dtype and rank, with its constant dimensions; symbolic dimensions are bound from
// the input shapes (a symbol must get one size across all inputs). It returns the graph
// outputs in order. The caller's input tensors are not modified; they may be returned as
// outputs if the graph passes them through.
func (p *Program) Run(ctx context.Context, inputs map[string]*tensor.Tensor) ([]*tensor.Tensor, error) {
	if p == nil || p.g == nil {
		return nil, errors.New("cpu: run: program was not compiled")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("cpu: run %s: %w", p.g.Name, err)
	}
	vals := slices.Clone(p.fixed)
	env, err := p.bindInputs(inputs, vals)
	if err != nil {
		return nil, fmt.Errorf("cpu: run %s: %w", p.g.Name, err)
	}
	var scratch []*tensor.Tensor // kernel inputs, reused from step to step
	var outScratch []Out         // kernel outputs with the run's arena
	var ar *arena
	if !p.noArena {
		ar = p.bufs.arena(len(p.values))
		defer func() {
			if ar != nil { // an error: every buffer goes back
				ar.finish(nil, nil)
			}
		}()
	}
	for _, st := range p.steps {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("cpu: run %s: before %s: %w", p.g.Name, st.node, err)
		}
		outs := st.outs
		if outs == nil {
			if outs, err = resolveOuts(st.node, env); err != nil {
				return nil, fmt.Errorf("cpu: run %s: %s: %w", p.g.Name, st.node, err)
			}
		}
		scratch = slices.Grow(scratch[:0], len(st.in))
		in := scratch[:len(st.in)]
		for i, s := range st.in {
			if in[i] = vals[s]; in[i] == nil {
				return nil, fmt.Errorf("cpu: run %s: %s: input %d was released early (internal error)", p.g.Name, st.node, i)
			}
		}
		if ar != nil {
			outScratch = append(outScratch[:0], outs...)
			for i, s := range st.out {
				if !p.isOutput[s] {
					outScratch[i].arena = ar
				}
			}
			outs = outScratch
		}
		clearVectorState()
		k := st.kernel
		if st.run != nil {
			k = func(_ *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error) {
				return st.run(ctx, in, out)
			}
		}
		res, err := runKernel(k, st.node, in, outs)
		if err != nil {
			return nil, fmt.Errorf("cpu: run %s: %w", p.g.Name, err)
		}
		for i, s := range st.out {
			vals[s] = res[i]
		}
		if ar != nil {
			ar.stepDone(st.out, res)
		}
		for _, s := range st.free {
			vals[s] = nil
			if ar != nil {
				ar.release(s)
			}
			if p.onFree != nil {
				p.onFree(p.values[s])
			}
		}
	}
	if ar != nil {
		ar.finish(p.outputs, vals)
		ar = nil
	}
	outs := make([]*tensor.Tensor, len(p.outputs))
	for i, s := range p.outputs {
		outs[i] = vals[s]
		if p.fixed[s] != nil {
			outs[i] = outs[i].Clone() // callers must not be able to change the weights
		}
	}
	return outs, nil
}

// bindInputs checks the inputs, stores them in vals and returns the symbol bindings.
func (p *Program) bindInputs(inputs map[string]*tensor.Tensor, vals []*tensor.Tensor) (map[string]int, error) {
	known := map[string]bool{}
	for _, in := range p.inputs {
		known[in.v.Name] = true
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(inputs)) {
		if !known[name] {
			errs = append(errs, fmt.Errorf("unknown input %q", name))
		}
	}
	type binding struct {
		size  int
		input string
		dim   int
	}
	bound := map[string]binding{}
	var shapeOnly []*tensor.Tensor // resident inputs passed shape-only, and their names
	var shapeNames []string
	for _, in := range p.inputs {
		name, want := in.v.Name, in.v.Type
		t, ok := inputs[name]
		if !ok {
			errs = append(errs, fmt.Errorf("missing input %q (%s)", name, want))
			continue
		}
		kept, err := p.residentInput(name, t)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if kept != t {
			if i := slices.Index(shapeOnly, t); i >= 0 {
				errs = append(errs, fmt.Errorf("inputs %q and %q are the same shape-only tensor: each resident input needs its own", shapeNames[i], name))
				continue
			}
			shapeOnly, shapeNames = append(shapeOnly, t), append(shapeNames, name)
			t = kept
		}
		if err := t.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("input %q: %w", name, err))
			continue
		}
		if t.DType != want.DType {
			errs = append(errs, fmt.Errorf("input %q is %s, want %s", name, t.DType, want.DType))
			continue
		}
		if len(t.Shape) != len(want.Shape) {
			errs = append(errs, fmt.Errorf("input %q has shape %v of rank %d, want %s", name, t.Shape, len(t.Shape), want.Shape))
			continue
		}
		for d, dim := range want.Shape {
			size := t.Shape[d]
			if !dim.IsSym() {
				if size != dim.Size {
					errs = append(errs, fmt.Errorf("input %q has shape %v, want %s (dimension %d)", name, t.Shape, want.Shape, d))
				}
				continue
			}
			if b, ok := bound[dim.Sym]; ok && b.size != size {
				errs = append(errs, fmt.Errorf("symbol %s is %d in input %q (dimension %d) but %d in input %q (dimension %d)",
					dim.Sym, b.size, b.input, b.dim, size, name, d))
				continue
			} else if !ok {
				bound[dim.Sym] = binding{size, name, d}
			}
		}
		vals[in.slot] = t
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	env := make(map[string]int, len(bound))
	for sym, b := range bound {
		env[sym] = b.size
	}
	return env, nil
}
