package transformtest

// The numeric check of a golden case: the text goldens are written by the code under test
// (go test -update), so besides comparing text, runCase runs the input graph and the
// transformed graph on the CPU backend with the same random inputs and weights and holds
// their outputs to each other: bit for bit where the transform is exact, within a few
// rounding units of the coarsest float dtype the graphs compute in where it reorders
// arithmetic.

import (
	"context"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loom-ml/loom/backend/cpu"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/dist/local"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform"
	"go.yaml.in/yaml/v3"
)

// exactTransforms are the transforms whose output graph computes every output bit for bit
// as the input graph does on the CPU backend: cleanups, views and collective rewrites that
// keep every kernel's arithmetic. The others (pattern matchers and fusions, which swap
// primitives for fused kernels, and sharding, which splits sums over ranks) are held to
// tolerance. A case whose graph comes out unchanged is always held to bit equality.
var exactTransforms = map[string]bool{
	"cleanup_cse":                      true,
	"cleanup_dead_code":                true,
	"cleanup_noop":                     true,
	"detect_sharding":                  true, // computes a plan; the graph is unchanged
	"match_repeat_kv":                  true, // repeat_kv copies what expand+reshape copy
	"fuse_attention_transpose":         true, // token_major writes the same values transposed
	"gather_logits":                    true, // the same rows of the same linear
	"rewrite_all_gather_as_all_reduce": true, // each element is one rank's value plus exact zeros
	"fuse_linear_allreduce":            true, // the same linear kernel, the same reduction
	"fuse_allreduce_residual_rmsnorm":  true, // the same reduction, then add_rmsnorm
	"fuse_gemms":                       true, // a feature's sum ignores the rows beside it
}

// toleranceUnits is the tolerance of the inexact transforms in rounding units of the
// coarsest float dtype the graphs compute in, relative to the largest magnitude of the
// expected output (at least 1): a fused kernel rounds once where the primitives round at
// every step, and the difference of a few roundings can grow by a few units through the
// ops that follow (a dot product, a softmax, a norm). A wrong operand, a dropped scale or a
// swapped half moves outputs by a good fraction of their magnitude, far above this.
const toleranceUnits = 8

// symbolSizes are the sizes of the symbols of the graphs' inputs: small, with S long enough
// for the sliding windows of the cases (3 and 8 positions) to cut, two batch rows and two
// logit rows (gather_logits' N). Graphs that hold paged_attention or block tables run one
// flattened row (B = 1) of one sequence (N = 1) whose S tokens fit one cache block (M = 1)
// of NB.
var symbolSizes = map[string]int{"B": 2, "S": 9, "T": 5, "N": 2, "M": 1, "NB": 2}

// numericRun is one side of a comparison: the rank graphs and each rank's inputs.
type numericRun struct {
	graphs []*graph.Graph
	inputs []map[string]*tensor.Tensor
	mesh   dist.Mesh // the ranks' mesh, when it has more axes than one
}

// checkNumeric runs the case's input graph in (as parsed, before the transform) and the
// transformed graph out, holds their outputs to each other and reports what differs as
// errors of t.
func checkNumeric(t *testing.T, file string, tr *transform.Transform, in, out *graph.Graph, options []byte) {
	t.Helper()
	summary, diffs, err := numericDiffs(tr, in, out, options)
	if err != nil {
		t.Fatalf("%s: numeric check: %v", file, err)
	}
	t.Logf("numeric check: %s", summary)
	for _, d := range diffs {
		t.Errorf("%s: numeric check: %s", file, d)
	}
}

// numericDiffs runs in and out on the CPU backend with the same random inputs and weights
// and returns how they were compared and every output that differs. options are the case's
// options; for graphs with collectives of more than one rank it re-runs the transform for
// every rank. An error means the check could not run.
func numericDiffs(tr *transform.Transform, in, out *graph.Graph, options []byte) (summary string, diffs []string, err error) {
	ranks := max(graph.CollectiveRanks(in), graph.CollectiveRanks(out))
	exact := exactTransforms[tr.Name] || in.String() == out.String()

	var want, got numericRun
	switch {
	case ranks == 1:
		want.graphs, got.graphs = []*graph.Graph{in}, []*graph.Graph{out}
	case tr.RunRanks != nil:
		// A transform that splits the graph over ranks: every rank's graph against the
		// single-rank input graph, with the same inputs on every rank. The world is the
		// options' mesh (tp=2,ep=2: 4 ranks), else the largest group.
		want.graphs = []*graph.Graph{in}
		var opts struct {
			Mesh string `yaml:"mesh"`
		}
		if err := yaml.Unmarshal(options, &opts); err == nil && opts.Mesh != "" {
			if got.mesh, err = dist.ParseMesh(opts.Mesh); err != nil {
				return "", nil, err
			}
			ranks = max(ranks, got.mesh.Size())
		}
		if got.graphs, err = shardRanks(tr, in, out, options, ranks); err != nil {
			return "", nil, err
		}
	default:
		// A graph that already holds collectives is one rank's: build every rank's graph
		// (its own slices of the sliced params) and transform each as that rank.
		if want.graphs, got.graphs, err = rankGraphs(tr, in, out, options, ranks); err != nil {
			return "", nil, err
		}
	}

	env, err := bindSymbols(in, out)
	if err != nil {
		return "", nil, err
	}
	weights, err := randomWeights(in, out)
	if err != nil {
		return "", nil, err
	}
	for _, r := range []*numericRun{&want, &got} {
		for rank := range r.graphs {
			// Ranks of one graph split by sharding read the same inputs; ranks of a graph
			// that is already one rank's get their own activations.
			seed := ""
			if len(want.graphs) > 1 {
				seed = fmt.Sprintf("#%d", rank)
			}
			inputs, err := randomInputs(env, seed, in, out)
			if err != nil {
				return "", nil, err
			}
			r.inputs = append(r.inputs, inputs)
		}
	}
	wantOut, err := runGraphs(want, weights)
	if err != nil {
		return "", nil, fmt.Errorf("the input graph: %w", err)
	}
	gotOut, err := runGraphs(got, weights)
	if err != nil {
		return "", nil, fmt.Errorf("the transformed graph: %w", err)
	}
	units := coarsestUnit(in, out)
	summary = fmt.Sprintf("%d rank(s) against %d, bit for bit", len(got.graphs), len(want.graphs))
	if !exact {
		summary = fmt.Sprintf("%d rank(s) against %d, within %d·%.3g of the largest magnitude", len(got.graphs), len(want.graphs), toleranceUnits, units)
	}
	gathers := out.Input("logit_rows") != nil && in.Input("logit_rows") == nil
	for rank, outs := range gotOut {
		w := wantOut[min(rank, len(wantOut)-1)]
		if len(outs) != len(w) {
			return "", nil, fmt.Errorf("%d outputs, the input graph has %d", len(outs), len(w))
		}
		for i := range outs {
			wi := w[i]
			if gathers {
				if wi, err = gatherRows(wi, got.inputs[rank]["logit_rows"]); err != nil {
					return "", nil, fmt.Errorf("output %d: %w", i, err)
				}
			}
			where := fmt.Sprintf("output %d", i)
			if len(gotOut) > 1 {
				where = fmt.Sprintf("rank %d output %d", rank, i)
			}
			if msg := compare(wi, outs[i], exact, units); msg != "" {
				diffs = append(diffs, fmt.Sprintf("%s differs from the input graph's: %s", where, msg))
			}
		}
	}
	return summary, diffs, nil
}

// gatherRows is what gather_logits makes of an output of the input graph: the positions
// that logit_rows names, along axis 1 of [B,S,V] logits.
func gatherRows(want, rows *tensor.Tensor) (*tensor.Tensor, error) {
	if len(want.Shape) != 3 {
		return nil, fmt.Errorf("logit_rows was added, but the output %v is not [B,S,V]", want.Shape)
	}
	shape := []int{want.Shape[0], rows.Numel(), want.Shape[2]}
	out := tensor.New(want.DType, shape...)
	row := want.Shape[2]
	for b := range shape[0] {
		for j, r := range rows.Int64s() {
			if r < 0 || int(r) >= want.Shape[1] {
				return nil, fmt.Errorf("logit row %d outside [0,%d)", r, want.Shape[1])
			}
			tensor.CopyRange(out, (b*shape[1]+j)*row, want, (b*want.Shape[1]+int(r))*row, row)
		}
	}
	return out, nil
}

// shardRanks runs a RunRanks transform over a world of the given size and returns every
// rank's graph; rank 0's must be the golden output, which the transform made for world 1.
func shardRanks(tr *transform.Transform, in, out *graph.Graph, options []byte, world int) ([]*graph.Graph, error) {
	cfg, err := transform.DecodeOptions(tr, "options", options)
	if err != nil {
		return nil, err
	}
	c := &transform.Context{WorldSize: world}
	graphs, info, err := tr.RunRanks(context.Background(), c, []*graph.Graph{in.Clone()}, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s over %d ranks: %w", tr.Name, world, err)
	}
	if len(graphs) != world {
		return nil, fmt.Errorf("%s over %d ranks returned %d graphs", tr.Name, world, len(graphs))
	}
	for rank, g := range graphs {
		if err := tidy(g, info); err != nil {
			return nil, fmt.Errorf("rank %d: %w", rank, err)
		}
	}
	if got, want := graphs[0].String(), out.String(); got != want {
		return nil, fmt.Errorf("rank 0 of %d differs from the output of one rank (-want +got):\n%s", world, Diff(want, got))
	}
	return graphs, nil
}

// rankGraphs makes every rank's input graph from in, one rank's graph: rank r reads the
// slice of each sliced param r*count/ranks places after in's own. It transforms each as
// rank r of the world (rank 0's must be out, the golden output) and returns both lists.
func rankGraphs(tr *transform.Transform, in, out *graph.Graph, options []byte, ranks int) (ins, outs []*graph.Graph, err error) {
	if tr.Run == nil {
		return nil, nil, fmt.Errorf("%s has no per-graph Run", tr.Name)
	}
	cfg, err := transform.DecodeOptions(tr, "options", options)
	if err != nil {
		return nil, nil, err
	}
	for rank := range ranks {
		g := in.Clone()
		for _, n := range g.Nodes {
			if count := n.Attrs.Int("slice_count"); n.Op == graph.OpParam && count > 1 {
				n.Attrs["slice_index"] = (n.Attrs.Int("slice_index") + rank*count/ranks) % count
			}
		}
		if err := graph.Verify(g); err != nil {
			return nil, nil, fmt.Errorf("rank %d's input graph: %w", rank, err)
		}
		ins = append(ins, g)
		tg := g.Clone()
		c := &transform.Context{WorldSize: ranks, Rank: rank}
		info, err := tr.Run(context.Background(), c, tg, cfg)
		if err == nil {
			err = tidy(tg, info)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("%s as rank %d of %d: %w", tr.Name, rank, ranks, err)
		}
		outs = append(outs, tg)
	}
	if got, want := outs[0].String(), out.String(); got != want {
		return nil, nil, fmt.Errorf("rank 0 of %d differs from the golden output (-want +got):\n%s", ranks, Diff(want, got))
	}
	return ins, outs, nil
}

// tidy does what the optimizer does after a transform: it removes dead nodes and re-infers
// types unless the transform says it need not, then verifies.
func tidy(g *graph.Graph, info transform.Info) error {
	if !info.Skipped {
		if !info.Clean {
			transform.RemoveDeadCode(g)
		}
		if !info.ValidShapes {
			if err := graph.ReinferTypes(g); err != nil {
				return err
			}
		}
	}
	return graph.Verify(g)
}

// runGraphs compiles and runs every rank graph of r (over an in-process communicator when
// there are several) and returns each rank's outputs.
func runGraphs(r numericRun, w cpu.MapWeights) ([][]*tensor.Tensor, error) {
	ctx := context.Background()
	n := len(r.graphs)
	progs := make([]*cpu.Program, n)
	var comms []*local.Comm
	if n > 1 {
		var err error
		if comms, err = local.New(n, local.Options{Timeout: 10 * time.Second}); err != nil {
			return nil, err
		}
	}
	for rank, g := range r.graphs {
		var err error
		if n > 1 {
			progs[rank], err = cpu.CompileWith(ctx, g, w, cpu.Options{Comm: comms[rank], Mesh: r.mesh})
		} else {
			progs[rank], err = cpu.Compile(ctx, g, w)
		}
		if err != nil {
			return nil, fmt.Errorf("rank %d: compile: %w", rank, err)
		}
	}
	outs := make([][]*tensor.Tensor, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for rank, p := range progs {
		wg.Go(func() {
			inputs := map[string]*tensor.Tensor{}
			for _, v := range r.graphs[rank].Inputs {
				inputs[v.Name] = r.inputs[rank][v.Name].Clone() // paged_attention writes its caches
			}
			outs[rank], errs[rank] = p.Run(ctx, inputs)
		})
	}
	wg.Wait()
	for rank, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("rank %d: %w", rank, err)
		}
	}
	return outs, nil
}

// bindSymbols gives every symbol of the graphs' inputs a size (symbolSizes, with the paged
// attention layout's where either graph holds paged_attention or block tables).
func bindSymbols(graphs ...*graph.Graph) (map[string]int, error) {
	env := map[string]int{}
	for k, v := range symbolSizes {
		env[k] = v
	}
	for _, g := range graphs {
		for _, n := range g.Nodes {
			if n.Op == "paged_attention" {
				env["B"] = 1
			}
		}
		if g.Input("block_tables") != nil {
			env["N"] = 1
		}
		if in := g.Input("kv_positions"); in != nil && len(in.Type.Shape) == 2 {
			env[in.Type.Shape[1].Sym] = env["M"] * blockSizeOf(g) // every slot of the table's blocks
		}
	}
	for _, g := range graphs {
		for _, v := range g.Inputs {
			for _, d := range v.Type.Shape {
				if _, ok := env[d.Sym]; d.IsSym() && !ok {
					return nil, fmt.Errorf("input %s: no size for symbol %s (add it to symbolSizes)", v, d.Sym)
				}
			}
		}
	}
	return env, nil
}

// blockSizeOf is the block size of g's first KV cache input (16 without one).
func blockSizeOf(g *graph.Graph) int {
	for _, v := range g.Inputs {
		if strings.HasPrefix(v.Name, "kv_cache.") && len(v.Type.Shape) == 4 && !v.Type.Shape[1].IsSym() {
			return v.Type.Shape[1].Size
		}
	}
	return 16
}

// seeded returns a random source determined by name.
func seeded(name string) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(name))
	s := h.Sum64()
	return rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15))
}

// randomFloats fills a float tensor (f8 too) with uniform values in [-1, 1), rounded to its
// dtype.
func randomFloats(dt tensor.DType, shape []int, name string) (*tensor.Tensor, error) {
	t := tensor.New(dt, shape...)
	r := seeded(name)
	for i := range t.Numel() {
		v := float32(2*r.Float64() - 1)
		switch dt {
		case tensor.F32:
			t.F32[i] = v
		case tensor.BF16:
			t.Half[i] = tensor.F32ToBF16(v)
		case tensor.F16:
			t.Half[i] = tensor.F32ToF16(v)
		case tensor.F8E4M3:
			t.U8[i] = tensor.F32ToF8E4M3(v)
		case tensor.F8E5M2:
			t.U8[i] = tensor.F32ToF8E5M2(v)
		default:
			return nil, fmt.Errorf("%s: random %s values", name, dt)
		}
	}
	return t, nil
}

// randomWeights makes one tensor of random values per param key of the graphs, of the
// param's full stored shape and dtype (MapWeights cuts the slices that sliced params read);
// a stacked param gets one per member key, so that it reads the tensors that the members'
// own params read in another graph.
func randomWeights(graphs ...*graph.Graph) (cpu.MapWeights, error) {
	w := cpu.MapWeights{}
	for _, g := range graphs {
		for _, n := range g.Params() {
			ref, err := graph.ParamOf(n)
			if err != nil {
				return nil, err
			}
			shape := ref.Shape
			if ref.Stack > 0 { // one tensor per member, as the checkpoint holds them
				if err := ref.CheckStack(); err != nil {
					return nil, err
				}
				shape = ref.Shape[1:]
			}
			for _, key := range ref.Keys() {
				if t, ok := w[key]; ok {
					if t.DType != ref.DType || !slices.Equal(t.Shape, shape) {
						return nil, fmt.Errorf("param %q is %s%v in one graph and %s%v in another", key, t.DType, t.Shape, ref.DType, shape)
					}
					continue
				}
				if w[key], err = randomFloats(ref.DType, shape, "param "+key); err != nil {
					return nil, err
				}
			}
		}
	}
	return w, nil
}

// randomInputs makes the inputs of the graphs (the union of their inputs, one tensor per
// name): floats at random (seeded by name and seed), integers by what the name means:
// token ids below the vocabulary of the embedding that reads them, positions 0..S-1 (row b
// from b), and the paged attention layout of one sequence in cache block 1, 2, ... .
func randomInputs(env map[string]int, seed string, graphs ...*graph.Graph) (map[string]*tensor.Tensor, error) {
	types := map[string]graph.Type{}
	var names []string
	for _, g := range graphs {
		for _, v := range g.Inputs {
			if t, ok := types[v.Name]; ok {
				if !t.Equal(v.Type) {
					return nil, fmt.Errorf("input %s is %s in one graph and %s in another", v.Name, t, v.Type)
				}
				continue
			}
			types[v.Name] = v.Type
			names = append(names, v.Name)
		}
	}
	out := map[string]*tensor.Tensor{}
	for _, name := range names {
		typ := types[name]
		shape, err := typ.Shape.Resolve(env)
		if err != nil {
			return nil, fmt.Errorf("input %s: %w", name, err)
		}
		if typ.DType.IsFloat() {
			if out[name], err = randomFloats(typ.DType, shape, "input "+name+seed); err != nil {
				return nil, err
			}
			continue
		}
		if !typ.DType.IsInt() {
			return nil, fmt.Errorf("input %s: no values for %s inputs", name, typ)
		}
		vals := make([]int64, tensor.Numel(shape))
		switch {
		case name == "input_ids":
			vocab, err := vocabOf(name, graphs)
			if err != nil {
				return nil, err
			}
			r := seeded("input " + name + seed)
			for i := range vals {
				vals[i] = int64(r.IntN(vocab))
			}
		case name == "positions" && len(shape) == 2:
			for i := range vals {
				vals[i] = int64(i%shape[1] + i/shape[1])
			}
		case name == "slot_mapping" && len(shape) == 1: // token t at position t of block 1
			bs := blockSize(types)
			for i := range vals {
				vals[i] = int64((1+i/bs)*bs + i%bs)
			}
		case name == "token_seq" && len(shape) == 1: // every token of sequence 0
		case name == "block_tables" && len(shape) == 2: // sequence s in blocks 1+s*M, ...
			for i := range vals {
				vals[i] = int64(1 + i)
			}
		case name == "kv_positions" && len(shape) == 2: // cp_cached_attention: the rank caches positions 0..S-1
			for i := range vals {
				vals[i] = -1
				if j := i % shape[1]; j < env["S"] {
					vals[i] = int64(j)
				}
			}
		case name == "logit_rows" && len(shape) == 1: // the last position, then 0, 1, ...
			for i := range vals {
				vals[i] = int64((env["S"] - 1 + i) % env["S"])
			}
		default:
			return nil, fmt.Errorf("input %s %s: no rule for its values (add one to randomInputs)", name, typ)
		}
		t := tensor.New(typ.DType, shape...)
		for i, v := range vals {
			if typ.DType == tensor.I32 {
				t.I32[i] = int32(v)
			} else {
				t.I64[i] = v
			}
		}
		out[name] = t
	}
	return out, nil
}

// vocabOf is the number of rows of the smallest embedding table that the input ids index,
// 1 when nothing reads them.
func vocabOf(name string, graphs []*graph.Graph) (int, error) {
	vocab, read := 0, false
	for _, g := range graphs {
		for _, n := range g.Nodes {
			for i, v := range n.Inputs {
				if v.Name != name || v.Producer != nil {
					continue
				}
				read = true
				if n.Op != "embedding" || i != 1 {
					continue
				}
				if d := n.Inputs[0].Type.Shape[0]; !d.IsSym() && (vocab == 0 || d.Size < vocab) {
					vocab = d.Size
				}
			}
		}
	}
	switch {
	case !read:
		return 1, nil
	case vocab == 0:
		return 0, fmt.Errorf("input %s: no embedding reads it, so no vocabulary bounds its values", name)
	}
	return vocab, nil
}

// blockSize is the cache block size of the kv_cache inputs ([NB,BS,KV,D]), 16 without them.
func blockSize(types map[string]graph.Type) int {
	for name, t := range types {
		if strings.HasPrefix(name, "kv_cache.") && len(t.Shape) == 4 && !t.Shape[1].IsSym() {
			return t.Shape[1].Size
		}
	}
	return 16
}

// coarsestUnit is the unit roundoff of the coarsest float dtype that the graphs round
// values to: the dtypes of their inputs (caches, which paged_attention writes) and of the
// results of their arithmetic. Left out are params, constants and what is computed from
// them alone (both graphs read the same weights) and ops that only move values (a bf16
// embedding lookup rounds nothing).
func coarsestUnit(graphs ...*graph.Graph) float64 {
	u := 0x1p-24
	see := func(dt tensor.DType) {
		switch dt {
		case tensor.F16:
			u = max(u, 0x1p-11)
		case tensor.BF16:
			u = max(u, 0x1p-8)
		}
	}
	for _, g := range graphs {
		for _, v := range g.Inputs {
			see(v.Type.DType)
		}
		weight := map[*graph.Value]bool{}
		for _, n := range g.Nodes {
			fromWeights := true
			for _, v := range n.Inputs {
				fromWeights = fromWeights && weight[v]
			}
			if fromWeights { // params and consts have no inputs
				for _, v := range n.Outputs {
					weight[v] = true
				}
				continue
			}
			if movesOnly[n.Op] {
				continue
			}
			for _, v := range n.Outputs {
				see(v.Type.DType)
			}
		}
	}
	return u
}

// movesOnly are the ops whose outputs are elements of their inputs, unrounded.
var movesOnly = map[string]bool{
	"embedding": true, "gather": true, "reshape": true, "transpose": true, "slice": true,
	"split": true, "concat": true, "expand": true, "repeat_kv": true,
}

// compare holds got to want: same dtype and shape, then bit for bit (exact) or within
// toleranceUnits units u of the largest magnitude of want (at least 1). NaN, in either, is
// a difference. It returns "" when they agree, else what differs.
func compare(want, got *tensor.Tensor, exact bool, u float64) string {
	if want.DType != got.DType || !slices.Equal(want.Shape, got.Shape) {
		return fmt.Sprintf("got %s%v, want %s%v", got.DType, got.Shape, want.DType, want.Shape)
	}
	if !want.DType.IsFloat() {
		w, g := want.Int64s(), got.Int64s()
		for i := range w {
			if w[i] != g[i] {
				return fmt.Sprintf("element %d is %d, want %d", i, g[i], w[i])
			}
		}
		return ""
	}
	w, g := want.Float32s(), got.Float32s()
	scale := 1.0
	for _, v := range w {
		scale = max(scale, math.Abs(float64(v)))
	}
	tol := toleranceUnits * u * scale
	if exact {
		tol = 0
	}
	worst, at := 0.0, -1
	for i := range w {
		d := math.Abs(float64(g[i]) - float64(w[i]))
		if exact && d == 0 && math.Float32bits(g[i]) != math.Float32bits(w[i]) {
			d = math.SmallestNonzeroFloat64 // +0 and -0
		}
		if math.IsNaN(d) {
			worst, at = d, i
			break
		}
		if !(d <= tol) && d > worst {
			worst, at = d, i
		}
	}
	if at < 0 {
		return ""
	}
	kind := "bit for bit"
	if !exact {
		kind = fmt.Sprintf("tolerance %.3g = %d·%.3g·%.3g", tol, toleranceUnits, u, scale)
	}
	return fmt.Sprintf("element %d is %g, want %g (|diff| %.3g; %s)", at, g[at], w[at], worst, kind)
}
