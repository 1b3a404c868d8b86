package transform

import (
	"context"
	"fmt"
	"slices"

	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/graph"
)

// ShardingExecutorConfig holds the options of sharding_executor.
type ShardingExecutorConfig struct {
	// AllReduceStrategy is the strategy attribute of the all_reduce nodes inserted: auto,
	// nccl, oneshot or twoshot (see package dist).
	AllReduceStrategy string `yaml:"allreduce_strategy"`
	// EPStrategy is how the ranks of the ep axis share the work of a moe op whose experts
	// split over ep: all_reduce (every rank runs its experts on the tokens routed to them,
	// 0 elsewhere, and an all_reduce over ep adds the ranks' outputs) or all_to_all (each
	// rank routes the tokens it owns, an all_to_all sends each token to the ranks of its
	// experts and another brings the results back; see the moe_dispatch op).
	EPStrategy string `yaml:"ep_strategy"`
	// Mesh is used only when detect_sharding did not run (it is disabled, or in a test): the
	// executor then detects the plan itself with detect_sharding's defaults over this mesh
	// (empty: the caller's, else tp over every rank).
	Mesh string `yaml:"mesh"`
}

// ShardingExecutor turns the one graph into one graph per rank.
var ShardingExecutor = &Transform{
	Name:  "sharding_executor",
	Stage: Sharding,
	Doc: `Applies detect_sharding's plan: turns the one graph into one graph per rank of the
mesh, each reading only its own slices of the weights. A colwise linear reads its rows of the
weight (and of its bias), and what follows computes on the split values: the reshapes around
attention get the local head counts, and rope, sdpa, per-head norms and SwiGLU run on the
local heads and features as they are. A rowwise linear reads its columns and an all_reduce
over the tp group follows it (a bias is added after the reduction, whole). A gather linear
(the LM head, split by vocabulary) is followed by an all_gather along the last axis.
Embedding lookups stay replicated; a table tied to the LM head is read whole for the lookup
and by vocabulary slice for the head. Wherever a whole value is needed and a split one is at
hand, an all_gather joins it; a whole value where a split one is needed is sliced. The
collectives name the tp axis of the mesh, never the world. A moe op whose experts split over
ep reads its rank's experts (a slice of each stacked param along the experts, with the
op's expert_offset set to the first) and an all_reduce over the ep axis follows it; on a
mesh with tp as well, each of the rank's experts is cut over tp as a dense MLP when the plan
says so, and an all_reduce over tp comes first. With ep_strategy all_to_all the op becomes
moe_route, moe_dispatch, an all_to_all over ep of the routed tokens, moe_experts on the
rank's experts, an all_to_all back and moe_combine: each rank computes only the tokens it
owns, and an all_reduce over ep gives every rank every token (attention is replicated over
ep); the result is the fused op's, bit for bit with ep alone. One whose experts split over
tp alone reads its part of every expert, followed by an all_reduce over tp. Ranks of other mesh axes (dp) get the graph of their tp and ep coordinates. With one rank in the world and a mesh of more (a dry
run: loom compile with a mesh option), the graph becomes rank 0's. Matches counts rank 0's
sliced params and inserted collectives.`,
	Config: ShardingExecutorConfig{AllReduceStrategy: dist.StrategyAuto, EPStrategy: EPAllReduce},
	After: []Dep{
		{DetectSharding, "detect_sharding keeps the plan that sharding_executor applies (without it, sharding_executor detects one with the defaults)"},
	},
	RunRanks: runShardingExecutor,
}

func init() { Register(ShardingExecutor) }

func runShardingExecutor(_ context.Context, c *Context, graphs []*graph.Graph, cfgAny any) ([]*graph.Graph, Info, error) {
	cfg, ok := cfgAny.(ShardingExecutorConfig)
	if !ok {
		return nil, Info{}, fmt.Errorf("config has type %T, want ShardingExecutorConfig", cfgAny)
	}
	if _, err := dist.ParseStrategy(cfg.AllReduceStrategy); err != nil {
		return nil, Info{}, fmt.Errorf("option allreduce_strategy: %w", err)
	}
	if cfg.EPStrategy != EPAllReduce && cfg.EPStrategy != EPAllToAll {
		return nil, Info{}, fmt.Errorf("option ep_strategy: %q is not %s or %s", cfg.EPStrategy, EPAllReduce, EPAllToAll)
	}
	if len(graphs) != 1 {
		return nil, Info{}, fmt.Errorf("the graph is already split into %d rank graphs", len(graphs))
	}
	g := graphs[0]
	plan, ok := ShardingPlanOf(c)
	if !ok {
		dc, _ := DetectSharding.DefaultConfig().(DetectShardingConfig)
		dc.Mesh = cfg.Mesh
		var err error
		if plan, err = DetectPlan(c, g, dc); err != nil {
			return nil, Info{}, err
		}
	}
	if plan.Size <= 1 && plan.EP <= 1 {
		return graphs, Info{Skipped: true}, nil
	}
	world := c.World()
	if world != 1 && world != plan.Mesh.Size() {
		return nil, Info{}, fmt.Errorf("the plan's mesh %q has %d ranks, the world %d", plan.Mesh, plan.Mesh.Size(), world)
	}
	ranks := []int{c.Rank}
	if world > 1 {
		ranks = make([]int, world)
		for r := range ranks {
			ranks[r] = r
		}
	}
	out := make([]*graph.Graph, len(ranks))
	for i := len(ranks) - 1; i >= 0; i-- { // rank 0 last: it rewrites g itself
		out[i] = g
		if i > 0 {
			out[i] = g.Clone()
		}
	}
	var info Info
	for i, rank := range ranks {
		s := &sharder{plan: plan, tp: plan.Size, ep: max(plan.EP, 1), strategy: cfg.AllReduceStrategy, epStrategy: cfg.EPStrategy}
		if s.tp > 1 {
			grp, err := plan.Mesh.Group(rank, TPAxis)
			if err != nil {
				return nil, Info{}, err
			}
			s.index = grp.Index
		}
		if s.ep > 1 {
			grp, err := plan.Mesh.Group(rank, EPAxis)
			if err != nil {
				return nil, Info{}, err
			}
			s.epIndex = grp.Index
		}
		n, err := s.rewrite(out[i])
		if err != nil {
			return nil, Info{}, rankErr(len(ranks), rank, err)
		}
		if i == 0 {
			info = Info{Matches: n, ValidShapes: true}
		}
	}
	return out, info, nil
}

// layout says how a value is split: along axis, in parts equal parts, of which the rank
// holds the one its tp index maps to (index*parts/tp). parts 0 means whole.
type layout struct{ axis, parts int }

func (l layout) split() bool { return l.parts > 1 }

func whole() layout { return layout{} }

// paramKey names one slice of a param.
type paramKey struct {
	v                 *graph.Value
	dim, parts, index int
}

// sharder rebuilds one rank's graph.
type sharder struct {
	plan     *ShardingPlan
	tp       int
	index    int // this rank's position along tp
	ep       int // the ep size (1: experts are not split by ep)
	epIndex  int // this rank's position along ep
	strategy string
	// epStrategy is EPAllReduce or EPAllToAll.
	epStrategy string

	g        *graph.Graph
	m        map[*graph.Value]*graph.Value // old value -> its new value, in layout lay[old]
	lay      map[*graph.Value]layout
	params   map[paramKey]*graph.Value
	gathered map[*graph.Value]*graph.Value
	sliced   map[paramKey]*graph.Value
	matches  int
	scope    string
}

// rewrite rebuilds g, in place, as the sharder's rank sees it, and returns the number of
// params sliced and collectives inserted.
func (s *sharder) rewrite(g *graph.Graph) (int, error) {
	old := slices.Clone(g.Nodes) // RemoveNodes clears the slice it compacts
	outputs := g.Outputs
	dead := make(map[*graph.Node]bool, len(old))
	for _, n := range old {
		dead[n] = true
	}
	g.RemoveNodes(dead) // frees their names for the rebuilt nodes
	g.Nodes = nil
	s.g = g
	s.m = map[*graph.Value]*graph.Value{}
	s.lay = map[*graph.Value]layout{}
	s.params = map[paramKey]*graph.Value{}
	s.gathered = map[*graph.Value]*graph.Value{}
	s.sliced = map[paramKey]*graph.Value{}
	for _, v := range g.Inputs {
		s.m[v] = v
	}
	for _, n := range old {
		if n.Op == graph.OpParam {
			continue // emitted where read, in the slice the reader needs
		}
		s.scope = n.Scope
		if err := s.node(n); err != nil {
			return 0, fmt.Errorf("shard %s: %w", n, err)
		}
	}
	g.Outputs = make([]*graph.Value, len(outputs))
	for i, o := range outputs {
		v, err := s.get(o, whole())
		if err != nil {
			return 0, fmt.Errorf("shard output %d: %w", i, err)
		}
		g.Outputs[i] = v
	}
	return s.matches, nil
}

// emit appends a node to the rebuilt graph.
func (s *sharder) emit(op string, attrs graph.Attrs, inputs []*graph.Value, hints ...string) (*graph.Node, error) {
	return s.g.Append(op, attrs, inputs, s.scope, hints...)
}

// param returns old param value v whole (parts 0) or cut along dim into parts, the part of
// the rank's tp index.
func (s *sharder) param(v *graph.Value, dim, parts int) (*graph.Value, error) {
	return s.paramPart(v, dim, parts, s.index*parts/max(s.tp, 1))
}

// paramPart returns old param value v whole (parts 0) or cut along dim into parts, part index.
func (s *sharder) paramPart(v *graph.Value, dim, parts, index int) (*graph.Value, error) {
	if parts <= 1 {
		index = 0
	}
	k := paramKey{v: v, dim: dim, parts: parts, index: index}
	if p, ok := s.params[k]; ok {
		return p, nil
	}
	n := v.Producer
	attrs := n.Attrs.Clone()
	if parts > 1 {
		attrs["slice_dim"], attrs["slice_index"], attrs["slice_count"] = dim, index, parts
		s.matches++
	}
	prev := s.scope
	s.scope = n.Scope
	p, err := s.emit(graph.OpParam, attrs, nil, v.Name)
	s.scope = prev
	if err != nil {
		return nil, fmt.Errorf("param %q: %w", attrs.String("key"), err)
	}
	s.params[k] = p.Out()
	return p.Out(), nil
}

// get returns old value v's new value in layout want: a param read in that slice, a split
// value all_gathered, a whole value sliced.
func (s *sharder) get(v *graph.Value, want layout) (*graph.Value, error) {
	if isParam(v) {
		if !want.split() {
			return s.param(v, 0, 0)
		}
		return s.param(v, want.axis, want.parts)
	}
	cur := s.lay[v]
	nv, ok := s.m[v]
	if !ok {
		return nil, fmt.Errorf("value %s has not been rebuilt (internal error)", v)
	}
	switch {
	case cur == want || !cur.split() && !want.split():
		return nv, nil
	case cur.split() && !want.split():
		if g, ok := s.gathered[v]; ok {
			return g, nil
		}
		if cur.parts != s.tp {
			return nil, fmt.Errorf("%s is split in %d parts over tp=%d; it cannot be gathered whole", v, cur.parts, s.tp)
		}
		n, err := s.emit("all_gather", graph.Attrs{"group": TPAxis, "group_size": s.tp, "axis": cur.axis}, []*graph.Value{nv})
		if err != nil {
			return nil, err
		}
		s.matches++
		s.gathered[v] = n.Out()
		return n.Out(), nil
	case !cur.split() && want.split():
		k := paramKey{v: v, dim: want.axis, parts: want.parts, index: s.index * want.parts / s.tp}
		if sl, ok := s.sliced[k]; ok {
			return sl, nil
		}
		d := nv.Type.Shape[want.axis]
		if d.IsSym() || d.Size%want.parts != 0 {
			return nil, fmt.Errorf("%s cannot be sliced in %d parts along axis %d", nv, want.parts, want.axis)
		}
		part := d.Size / want.parts
		i := s.index * want.parts / s.tp
		n, err := s.emit("slice", graph.Attrs{"axis": want.axis, "start": i * part, "end": (i + 1) * part}, []*graph.Value{nv})
		if err != nil {
			return nil, err
		}
		s.sliced[k] = n.Out()
		return n.Out(), nil
	}
	return nil, fmt.Errorf("%s is split along axis %d in %d parts, wanted along axis %d in %d", v, cur.axis, cur.parts, want.axis, want.parts)
}

// wholeInputs returns every input of n whole.
func (s *sharder) wholeInputs(n *graph.Node) ([]*graph.Value, error) {
	ins := make([]*graph.Value, len(n.Inputs))
	for i, in := range n.Inputs {
		v, err := s.get(in, whole())
		if err != nil {
			return nil, err
		}
		ins[i] = v
	}
	return ins, nil
}

// copyNode emits n over the given new inputs with attrs and records the layouts of its
// outputs.
func (s *sharder) copyNode(n *graph.Node, attrs graph.Attrs, ins []*graph.Value, lays ...layout) error {
	hints := make([]string, len(n.Outputs))
	for i, o := range n.Outputs {
		hints[i] = o.Name
	}
	nn, err := s.emit(n.Op, attrs, ins, hints...)
	if err != nil {
		return err
	}
	for i, o := range n.Outputs {
		s.m[o] = nn.Outputs[i]
		if i < len(lays) {
			s.lay[o] = lays[i]
		}
	}
	return nil
}

var unaryOps = map[string]bool{
	"cast": true, "neg": true, "abs": true, "exp": true, "log": true, "sqrt": true, "rsqrt": true,
	"reciprocal": true, "sin": true, "cos": true, "tanh": true, "sigmoid": true, "silu": true,
}

var binaryOps = map[string]bool{
	"add": true, "sub": true, "mul": true, "div": true, "pow": true, "maximum": true, "minimum": true, "swiglu": true,
}

// node rebuilds one node of the old graph.
func (s *sharder) node(n *graph.Node) error {
	attrs := n.Attrs.Clone()
	switch {
	case graph.IsLinear(n):
		return s.linear(n)
	case n.Op == "moe":
		if ok, err := s.moe(n); ok || err != nil {
			return err
		}
	case unaryOps[n.Op]:
		in, err := s.get(n.Inputs[0], s.lay[n.Inputs[0]])
		if err != nil {
			return err
		}
		return s.copyNode(n, attrs, []*graph.Value{in}, s.lay[n.Inputs[0]])
	case binaryOps[n.Op]:
		if ok, err := s.elementwise(n); ok || err != nil {
			return err
		}
	case n.Op == "transpose":
		l := s.lay[n.Inputs[0]]
		if l.split() {
			perm := attrs.Ints("perm")
			for j, p := range perm {
				if p == l.axis {
					l.axis = j
					break
				}
			}
		}
		in, err := s.get(n.Inputs[0], s.lay[n.Inputs[0]])
		if err != nil {
			return err
		}
		return s.copyNode(n, attrs, []*graph.Value{in}, l)
	case n.Op == "reshape":
		if ok, err := s.reshape(n); ok || err != nil {
			return err
		}
	case n.Op == "rmsnorm" || n.Op == "repeat_kv":
		l := s.lay[n.Inputs[0]]
		rank := len(n.Inputs[0].Type.Shape)
		if l.split() && l.axis != rank-1 && (n.Op == "rmsnorm" || l.axis == 1) {
			ins := []*graph.Value{s.m[n.Inputs[0]]}
			for _, w := range n.Inputs[1:] {
				v, err := s.get(w, whole())
				if err != nil {
					return err
				}
				ins = append(ins, v)
			}
			return s.copyNode(n, attrs, ins, l)
		}
	case n.Op == "rope":
		q, k := s.lay[n.Inputs[0]], s.lay[n.Inputs[1]]
		if (!q.split() || q.axis == 1) && (!k.split() || k.axis == 1) {
			pos, err := s.get(n.Inputs[2], whole())
			if err != nil {
				return err
			}
			return s.copyNode(n, attrs, []*graph.Value{s.m[n.Inputs[0]], s.m[n.Inputs[1]], pos}, q, k)
		}
	case n.Op == "sdpa":
		q, k, v := s.lay[n.Inputs[0]], s.lay[n.Inputs[1]], s.lay[n.Inputs[2]]
		if q.split() && q.axis == 1 && k == v && k.split() && k.axis == 1 {
			pos, err := s.get(n.Inputs[3], whole())
			if err != nil {
				return err
			}
			return s.copyNode(n, attrs, []*graph.Value{s.m[n.Inputs[0]], s.m[n.Inputs[1]], s.m[n.Inputs[2]], pos}, q)
		}
	}
	ins, err := s.wholeInputs(n)
	if err != nil {
		return err
	}
	return s.copyNode(n, attrs, ins)
}

// plannedShard returns the plan for linear n's weight, or replicate.
func (s *sharder) plannedShard(n *graph.Node) WeightShard {
	if !isParam(n.Inputs[1]) {
		return WeightShard{Kind: ShardReplicate}
	}
	return s.plan.Weights[n.Inputs[1].Producer.Attrs.String("key")]
}

// linear rebuilds a linear as the plan splits its weight.
func (s *sharder) linear(n *graph.Node) error {
	w := s.plannedShard(n)
	last := len(n.Out().Type.Shape) - 1
	switch w.Kind {
	case ShardColwise, ShardGather:
		x, err := s.get(n.Inputs[0], whole())
		if err != nil {
			return err
		}
		wv, err := s.param(n.Inputs[1], 0, w.Parts)
		if err != nil {
			return err
		}
		ins, err := s.withScale(n, []*graph.Value{x, wv}, 0, w.Parts)
		if err != nil {
			return err
		}
		if err := s.copyNode(n, n.Attrs.Clone(), ins, layout{last, w.Parts}); err != nil {
			return err
		}
		if w.Kind == ShardGather {
			g, err := s.get(n.Out(), whole())
			if err != nil {
				return err
			}
			s.m[n.Out()], s.lay[n.Out()] = g, whole()
		}
		return nil
	case ShardRowwise:
		xin := n.Inputs[0]
		x, err := s.get(xin, layout{len(xin.Type.Shape) - 1, s.tp})
		if err != nil {
			return err
		}
		wv, err := s.param(n.Inputs[1], 1, s.tp)
		if err != nil {
			return err
		}
		ins, err := s.withScale(n, []*graph.Value{x, wv}, 1, s.tp)
		if err != nil {
			return err
		}
		if err := s.copyNode(n, n.Attrs.Clone(), ins); err != nil {
			return err
		}
		r, err := s.emit("all_reduce", graph.Attrs{"group": TPAxis, "group_size": s.tp, "strategy": s.strategy}, []*graph.Value{s.m[n.Out()]})
		if err != nil {
			return err
		}
		s.matches++
		s.m[n.Out()], s.lay[n.Out()] = r.Out(), whole()
		return nil
	}
	ins, err := s.wholeInputs(n)
	if err != nil {
		return err
	}
	return s.copyNode(n, n.Attrs.Clone(), ins)
}

// withScale appends a quantized linear's scale to its rebuilt inputs, sliced as its weight
// is (along dim, in parts): a tensor scale whole; a channel scale [N,1] cut by rows with
// the rows, whole when the columns are cut; a block scale cut along the same dimension,
// which must fall on block boundaries: a split that cuts a block is an error naming the
// weight (quantize with smaller blocks, or shard with a tp size that divides the blocks).
// A plain linear's inputs pass through.
func (s *sharder) withScale(n *graph.Node, ins []*graph.Value, dim, parts int) ([]*graph.Value, error) {
	if n.Op != "linear_fp8" {
		return ins, nil
	}
	scale := n.Inputs[2]
	if !isParam(scale) {
		return nil, fmt.Errorf("linear_fp8 %s: its scale is not a param; only params can be sliced with the weight", n.Out())
	}
	sdim, sparts := 0, 0
	switch n.Attrs.String("scheme") {
	case graph.QuantChannel:
		if dim == 0 {
			sdim, sparts = 0, parts
		}
	case graph.QuantBlock:
		w := n.Inputs[1]
		size, b := w.Type.Shape[dim].Size, n.Attrs.Ints("block")[dim]
		if parts > 1 && (size%parts != 0 || (size/parts)%b != 0) {
			what := [2]string{"rows", "columns"}[dim]
			return nil, fmt.Errorf("linear_fp8 weight %q: splitting its %d %s in %d parts cuts its blocks of %d %s (block scales only split on block boundaries; use a tp size for which %d/tp is a multiple of %d)",
				w.Producer.Attrs.String("key"), size, what, parts, b, what, size, b)
		}
		sdim, sparts = dim, parts
	}
	sv, err := s.param(scale, sdim, sparts)
	if err != nil {
		return nil, err
	}
	return append(ins, sv), nil
}

// The values of ShardingExecutorConfig.EPStrategy.
const (
	EPAllReduce = "all_reduce"
	EPAllToAll  = "all_to_all"
)

// moe rebuilds a moe op as the plan splits its stacked expert weights: by whole experts
// over ep (the rank's experts, expert_offset at the first, each cut over tp too when the
// plan says so; an all_reduce over tp, then one over ep, after), or by features over tp
// (gate and up by rows, down by columns, an all_reduce over tp after). With the all_to_all
// ep strategy it becomes the dispatch and combine ops (moeAllToAll). It reports false when
// the op runs whole.
func (s *sharder) moe(n *graph.Node) (bool, error) {
	gate, up, down := n.Inputs[2], n.Inputs[3], n.Inputs[4]
	if !isParam(gate) || !isParam(up) || !isParam(down) {
		return false, nil
	}
	var ws [3]WeightShard
	for i, v := range []*graph.Value{gate, up, down} {
		ws[i] = s.plan.Weights[v.Producer.Attrs.String("key")]
	}
	attrs := n.Attrs.Clone()
	ins, err := s.wholeInputs(&graph.Node{Inputs: n.Inputs[:2]})
	if err != nil {
		return false, err
	}
	var groups []string // the reductions after the op, in order
	switch ws[0].Kind {
	case ShardExperts:
		experts := gate.Type.Shape[0].Size
		if ws[0].Parts != s.ep || experts%s.ep != 0 {
			return false, fmt.Errorf("%d experts planned in %d parts over ep=%d", experts, ws[0].Parts, s.ep)
		}
		attrs["expert_offset"] = n.Attrs.Int("expert_offset") + s.epIndex*experts/s.ep
		for i, v := range []*graph.Value{gate, up, down} {
			p, err := s.expertsParam(v, ws[i])
			if err != nil {
				return false, err
			}
			ins = append(ins, p)
		}
		if ws[0].PerExpert != "" {
			groups = append(groups, TPAxis)
		}
		groups = append(groups, EPAxis)
	case ShardColwise:
		for i, v := range []*graph.Value{gate, up, down} {
			p, err := s.paramPart(v, [3]int{1, 1, 2}[i], s.tp, s.index)
			if err != nil {
				return false, err
			}
			ins = append(ins, p)
		}
		groups = append(groups, TPAxis)
	default:
		return false, nil
	}
	if ws[0].Kind == ShardExperts && s.epStrategy == EPAllToAll {
		return true, s.moeAllToAll(n, attrs, ins, groups[:len(groups)-1])
	}
	if err := s.copyNode(n, attrs, ins); err != nil {
		return false, err
	}
	out := s.m[n.Out()]
	for _, g := range groups {
		if out, err = s.reduce(out, g); err != nil {
			return false, err
		}
	}
	s.m[n.Out()], s.lay[n.Out()] = out, whole()
	return true, nil
}

// reduce emits an all_reduce (sum) of v over mesh axis group.
func (s *sharder) reduce(v *graph.Value, group string) (*graph.Value, error) {
	size := s.tp
	if group == EPAxis {
		size = s.ep
	}
	r, err := s.emit("all_reduce", graph.Attrs{"group": group, "group_size": size, "strategy": s.strategy}, []*graph.Value{v})
	if err != nil {
		return nil, err
	}
	s.matches++
	return r.Out(), nil
}

// expertsParam reads the rank's experts of stacked param v as w plans them: run epIndex of
// the ep runs of members, each member cut over tp as w.PerExpert says (gate and up by
// rows, down by columns).
func (s *sharder) expertsParam(v *graph.Value, w WeightShard) (*graph.Value, error) {
	n := v.Producer
	attrs := n.Attrs.Clone()
	if w.PerExpert == "" {
		return s.paramPart(v, 0, s.ep, s.epIndex)
	}
	attrs["member_part"], attrs["member_parts"] = s.epIndex, s.ep
	dim := 1
	if w.PerExpert == ShardRowwise {
		dim = 2
	}
	attrs["slice_dim"], attrs["slice_index"], attrs["slice_count"] = dim, s.index, s.tp
	prev := s.scope
	s.scope = n.Scope
	p, err := s.emit(graph.OpParam, attrs, nil, v.Name)
	s.scope = prev
	if err != nil {
		return nil, fmt.Errorf("param %q: %w", attrs.String("key"), err)
	}
	s.matches++
	return p.Out(), nil
}

// moeAllToAll emits moe op n, whose inputs ins are x, the router and the rank's experts
// (attrs its attributes with the rank's expert_offset), by all_to_all dispatch and combine
// over ep: moe_route, moe_dispatch, an all_to_all over ep of the rows and of their experts,
// moe_experts, the reductions over partial (tp, when each expert is cut over it), an
// all_to_all back, moe_combine, and an all_reduce over ep that gives every rank every
// token (each rank combines only the tokens it owns, 0 elsewhere).
func (s *sharder) moeAllToAll(n *graph.Node, attrs graph.Attrs, ins []*graph.Value, partial []string) error {
	x, router := ins[0], ins[1]
	E := router.Type.Shape[0].Size
	route, err := s.emit("moe_route", graph.Attrs{"top_k": attrs.Int("top_k"), "normalize": attrs.Bool("normalize"), "weight_dtype": attrs.DType("weight_dtype")}, []*graph.Value{x, router})
	if err != nil {
		return err
	}
	weights, experts := route.Outputs[0], route.Outputs[1]
	sent, err := s.emit("moe_dispatch", graph.Attrs{"num_experts": E, "group_size": s.ep, "rank": s.epIndex}, []*graph.Value{x, experts})
	if err != nil {
		return err
	}
	exchange := func(v *graph.Value) (*graph.Value, error) {
		a, err := s.emit("all_to_all", graph.Attrs{"group": EPAxis, "group_size": s.ep, "split_axis": 0, "concat_axis": 0}, []*graph.Value{v})
		if err != nil {
			return nil, err
		}
		s.matches++
		return a.Out(), nil
	}
	rows, err := exchange(sent.Outputs[0])
	if err != nil {
		return err
	}
	ids, err := exchange(sent.Outputs[1])
	if err != nil {
		return err
	}
	y, err := s.emit("moe_experts", graph.Attrs{"expert_offset": attrs.Int("expert_offset")}, append([]*graph.Value{rows, ids}, ins[2:]...))
	if err != nil {
		return err
	}
	out := y.Out()
	for _, g := range partial {
		if out, err = s.reduce(out, g); err != nil {
			return err
		}
	}
	if out, err = exchange(out); err != nil {
		return err
	}
	c, err := s.emit("moe_combine", graph.Attrs{"num_experts": E}, []*graph.Value{out, experts, weights}, n.Out().Name)
	if err != nil {
		return err
	}
	if out, err = s.reduce(c.Out(), EPAxis); err != nil {
		return err
	}
	s.m[n.Out()], s.lay[n.Out()] = out, whole()
	return nil
}

// elementwise rebuilds a broadcasting binary op with a split input: the other inputs are
// brought to the same split (a bias param read in its slice, a whole value sliced) unless
// they broadcast along the split axis. It reports false when the op must run whole.
func (s *sharder) elementwise(n *graph.Node) (bool, error) {
	rank := len(n.Out().Type.Shape)
	var target layout
	for _, in := range n.Inputs {
		l := s.lay[in]
		if !l.split() {
			continue
		}
		l.axis += rank - len(in.Type.Shape)
		if target.split() && target != l {
			return false, nil
		}
		target = l
	}
	if !target.split() {
		return false, nil
	}
	ins := make([]*graph.Value, len(n.Inputs))
	for i, in := range n.Inputs {
		ax := target.axis - (rank - len(in.Type.Shape))
		if ax < 0 || in.Type.Shape[ax] == graph.D(1) {
			v, err := s.get(in, whole()) // broadcasts along the split axis
			if err != nil {
				return false, err
			}
			ins[i] = v
			continue
		}
		v, err := s.get(in, layout{ax, target.parts})
		if err != nil {
			return false, err
		}
		ins[i] = v
	}
	return true, s.copyNode(n, n.Attrs.Clone(), ins, target)
}

// reshape rebuilds a reshape of a split value when the split carries over: the dimensions
// before the split axis are kept, and the split axis of the result divides into the parts.
// [B,S,H*D] split on features becomes [B,S,H/p,D] split on heads, and back.
func (s *sharder) reshape(n *graph.Node) (bool, error) {
	in := n.Inputs[0]
	l := s.lay[in]
	if !l.split() {
		return false, nil
	}
	from, to := in.Type.Shape, n.Attrs.Shape("shape")
	a := l.axis
	if a >= len(to) || !from[:a].Equal(to[:a]) || to[a].IsSym() || to[a].Size%l.parts != 0 {
		return false, nil
	}
	for _, d := range append(from[a:].Clone(), to[a:]...) {
		if d.IsSym() {
			return false, nil
		}
	}
	local := to.Clone()
	local[a] = graph.D(to[a].Size / l.parts)
	attrs := n.Attrs.Clone()
	attrs["shape"] = local
	return true, s.copyNode(n, attrs, []*graph.Value{s.m[in]}, l)
}
