package transform

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/graph"
)

// DetectShardingConfig holds the options of detect_sharding.
type DetectShardingConfig struct {
	// ShardingSource lists where a weight's split comes from, in order; for each weight the
	// first source that names it wins: "factory" (the architecture's own plan, see
	// SetSharding), "manual" (TPPlan) and "heuristic" (the column-then-row linear regions
	// between residual adds, and the LM head).
	ShardingSource []string `yaml:"sharding_source"`
	// ShardingDims lists the kinds of parallelism to shard for: "tp" (the tp axis of the
	// mesh) and "ep" (the ep axis: the experts of moe ops split by whole experts). A kind
	// whose axis the mesh lacks shards nothing.
	ShardingDims []string `yaml:"sharding_dims"`
	// SimpleShardOnly turns every split into a column split followed by an all_gather: no
	// row-parallel regions, no head arithmetic; simple and always correct, slower.
	SimpleShardOnly bool `yaml:"simple_shard_only"`
	// TPPlan is the manual plan: weight name patterns (see model.TPPlan) to colwise,
	// rowwise, gather or replicate.
	TPPlan map[string]string `yaml:"tp_plan"`
	// Mesh is the device mesh, such as "tp=2" or "tp=2,dp=2". Empty: the caller's (see
	// SetSharding), else tp over every rank of the world.
	Mesh string `yaml:"mesh"`
	// RefuseFallback makes a plan that leaves weights whole on every rank because the tp
	// size does not divide them (or their heads) an error instead of a fallback; loom's
	// commands set it unless --allow-replicated (see checkFallback).
	RefuseFallback bool `yaml:"refuse_fallback"`
}

// DetectSharding decides how each weight splits over the tensor-parallel ranks.
var DetectSharding = &Transform{
	Name:  "detect_sharding",
	Stage: Sharding,
	Doc: `Decides how every linear weight splits over the tensor-parallel axis ("tp") of the
mesh and keeps the plan for sharding_executor: colwise (output features split; what follows
stays split), rowwise (input features split; an all_reduce completes the partial sums), gather
(colwise, then an all_gather) or replicate. Each weight's split comes from the first of the
sharding_source list that names it: the architecture's own plan (factory), tp_plan (manual,
patterns with * wildcards) or the heuristic, which finds the column-then-row linear regions
between residual adds and splits the LM head by vocabulary; weights none names are
replicated, and so are embedding lookups. Attention splits by whole heads: the q/k/v
projections must cut on head boundaries. When there are fewer KV heads than ranks, each KV
head is replicated on the ranks whose query heads use it. When the heads do not divide by the
tp size, that layer falls back to replicated q/k/v and a column split + all_gather of its
output projection. The log gets one line for all such fallbacks (each one at debug level);
with refuse_fallback set they are an error instead, before any weight is read. A manual plan that names no weight, or that
splits a dimension the tp size does not divide, is an error.

The stacked expert weights of moe ops (match_moe_pattern) split over the ep axis of the mesh
by whole experts: each ep rank reads E/ep experts and an all_reduce over ep adds the ranks'
outputs (attention and the other layers stay replicated over ep, or split over tp when the
mesh has both axes, each of a rank's experts then cut over tp as well, gate and up by rows and
down by columns, when the plan splits the experts as a dense MLP). Without an ep
axis, the experts split over tp as a dense MLP does (gate and up by output features, down by
input features, an all_reduce over tp after the op) when the plan says so. An ep size that
does not divide the experts of every moe op, or an ep axis with no moe op to split, is an
error, before any weight is read. Matches counts the weights that split.`,
	Config: DetectShardingConfig{
		ShardingSource: []string{"factory", "manual", "heuristic"},
		ShardingDims:   []string{"tp", "ep"},
		TPPlan:         map[string]string{},
	},
	Run: Typed(runDetectSharding),
}

func init() { Register(DetectSharding) }

// The split kinds of a ShardingPlan (the values of model.TPPlan and of tp_plan).
const (
	ShardColwise   = "colwise"
	ShardRowwise   = "rowwise"
	ShardGather    = "gather"
	ShardReplicate = "replicate"
	// ShardExperts splits the stacked expert weights of a moe op along their expert
	// dimension over the ep axis (expert parallelism); it is never asked for by a plan.
	ShardExperts = "experts"
)

// TPAxis is the mesh axis tensor parallelism runs along.
const TPAxis = "tp"

// EPAxis is the mesh axis expert parallelism runs along.
const EPAxis = "ep"

// WeightShard is how one weight splits.
type WeightShard struct {
	Kind string // ShardColwise, ShardRowwise, ShardGather or ShardReplicate
	// Parts is how many equal parts the weight is cut into along its split dimension
	// (rows for colwise and gather, columns for rowwise): the tp size, or for the K/V
	// projections of attention with fewer KV heads than ranks, the KV heads, each part then
	// serving tp/Parts ranks. 0 for replicate.
	Parts int
	// Source is where the split came from: "factory", "manual", "heuristic", or
	// "embedding" and "default" for weights that no source split.
	Source string
	// Note says why the split differs from what the source asked, when it does.
	Note string
	// PerExpert, for stacked expert weights split over ep (ShardExperts), says how each of
	// the rank's experts splits over tp as well: ShardColwise (gate and up, by rows) or
	// ShardRowwise (down, by columns); empty: whole on every tp rank.
	PerExpert string
}

// ShardingPlan is detect_sharding's result, which sharding_executor applies.
type ShardingPlan struct {
	Mesh dist.Mesh
	// Size is the size of the tp axis.
	Size int
	// EP is the size of the ep axis (1 without one): moe ops split their experts over it.
	EP int
	// Weights maps each checkpoint key that a linear or an embedding reads to its split.
	Weights map[string]WeightShard
	// Notes are the per-layer decisions worth a log line (attention fallbacks, KV heads
	// replicated).
	Notes []string
}

// String lists the plan, one weight per line in key order, then the notes.
func (p *ShardingPlan) String() string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "tp=%d", p.Size)
	if p.EP > 1 {
		fmt.Fprintf(&sb, " ep=%d", p.EP)
	}
	fmt.Fprintf(&sb, " over mesh %s\n", p.Mesh)
	keys := make([]string, 0, len(p.Weights))
	for k := range p.Weights {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		w := p.Weights[k]
		fmt.Fprintf(&sb, "%s: %s", k, w.Kind)
		if w.Parts != 0 && w.Parts != p.Size {
			fmt.Fprintf(&sb, " in %d parts", w.Parts)
		}
		fmt.Fprintf(&sb, " (%s)", w.Source)
		if w.Note != "" {
			fmt.Fprintf(&sb, ": %s", w.Note)
		}
		sb.WriteByte('\n')
	}
	for _, n := range p.Notes {
		fmt.Fprintf(&sb, "note: %s\n", n)
	}
	return sb.String()
}

// ShardingSetup is what the caller tells the sharding transforms about the deployment.
type ShardingSetup struct {
	// Mesh arranges the ranks (tp=2,dp=2); its size is Context.WorldSize. The zero Mesh
	// means tp over every rank.
	Mesh dist.Mesh
	// FactoryPlan is the architecture's own plan (model.Architecture.TPPlan): weight name
	// patterns to split kinds, the "factory" source of detect_sharding.
	FactoryPlan map[string]string
}

// The values the sharding transforms pass on through a Context.
var (
	// shardingSetupKey holds the caller's ShardingSetup (SetSharding).
	shardingSetupKey = NewKey[ShardingSetup]("the caller's sharding setup")
	// shardingPlanKey holds detect_sharding's plan, which sharding_executor applies and
	// rewrite_all_gather_as_all_reduce reads the mesh of.
	shardingPlanKey = NewKey[*ShardingPlan]("detect_sharding's plan")
)

// SetSharding records the deployment's mesh and the architecture's plan for the sharding
// transforms of c's pipeline.
func SetSharding(c *Context, s ShardingSetup) { shardingSetupKey.Set(c, s) }

func shardingSetup(c *Context) ShardingSetup {
	setup, _ := shardingSetupKey.Get(c)
	return setup
}

// ShardingPlanOf returns the plan detect_sharding kept in c, if it ran.
func ShardingPlanOf(c *Context) (*ShardingPlan, bool) {
	p, ok := shardingPlanKey.Get(c)
	return p, ok && p != nil
}

// resolveMesh decides the mesh: the option, else the caller's, else tp over the world.
func resolveMesh(c *Context, option string) (dist.Mesh, error) {
	var mesh dist.Mesh
	switch setup := shardingSetup(c); {
	case option != "":
		m, err := dist.ParseMesh(option)
		if err != nil {
			return dist.Mesh{}, fmt.Errorf("option mesh: %w", err)
		}
		mesh = m
	case len(setup.Mesh.Axes()) > 0:
		mesh = setup.Mesh
	case c.World() > 1:
		m, err := dist.NewMesh(dist.Axis{Name: TPAxis, Size: c.World()})
		if err != nil {
			return dist.Mesh{}, err
		}
		mesh = m
	default:
		return dist.Mesh{}, nil
	}
	if c.World() > 1 && mesh.Size() != c.World() {
		return dist.Mesh{}, fmt.Errorf("mesh %q has %d ranks, the world %d", mesh, mesh.Size(), c.World())
	}
	return mesh, nil
}

func tpSize(m dist.Mesh) int { return axisSize(m, TPAxis) }

// axisSize is the size of a mesh axis, 1 when the mesh has none of that name.
func axisSize(m dist.Mesh, axis string) int {
	if n, err := m.AxisSize(axis); err == nil {
		return n
	}
	return 1
}

// weightUse is a weight's readers.
type weightUse struct {
	key        string
	shape      []int // the full stored shape
	linears    []*graph.Node
	embeddings []*graph.Node
}

// shardableWeights lists the params that linears read as weights or embeddings as tables.
func shardableWeights(g *graph.Graph) (map[string]*weightUse, []string) {
	uses := map[string]*weightUse{}
	var order []string
	get := func(v *graph.Value) *weightUse {
		if !isParam(v) {
			return nil
		}
		ref, err := graph.ParamOf(v.Producer)
		if err != nil || len(ref.Shape) != 2 {
			return nil
		}
		u := uses[ref.Key]
		if u == nil {
			u = &weightUse{key: ref.Key, shape: ref.Shape}
			uses[ref.Key] = u
			order = append(order, ref.Key)
		}
		return u
	}
	for _, n := range g.Nodes {
		switch n.Op {
		case "linear", "linear_fp8":
			if u := get(n.Inputs[1]); u != nil {
				u.linears = append(u.linears, n)
			}
		case "embedding":
			if u := get(n.Inputs[0]); u != nil {
				u.embeddings = append(u.embeddings, n)
			}
		}
	}
	return uses, order
}

func runDetectSharding(_ context.Context, c *Context, g *graph.Graph, cfg DetectShardingConfig) (Info, error) {
	plan, err := DetectPlan(c, g, cfg)
	if err != nil {
		return Info{}, err
	}
	shardingPlanKey.Set(c, plan)
	if plan.Size <= 1 && plan.EP <= 1 {
		return Info{Skipped: true}, nil
	}
	if err := checkFallback(c, plan, cfg.RefuseFallback); err != nil {
		return Info{}, err
	}
	split := 0
	for _, w := range plan.Weights {
		if w.Kind != ShardReplicate {
			split++
		}
	}
	return Info{Matches: split, Clean: true, ValidShapes: true}, nil
}

// DetectPlan computes the sharding plan of g for the mesh that cfg and c give.
func DetectPlan(c *Context, g *graph.Graph, cfg DetectShardingConfig) (*ShardingPlan, error) {
	mesh, err := resolveMesh(c, cfg.Mesh)
	if err != nil {
		return nil, err
	}
	tp, ep := 1, 1
	for _, d := range cfg.ShardingDims {
		switch d {
		case "tp":
			tp = tpSize(mesh)
		case "ep":
			ep = axisSize(mesh, EPAxis)
		default:
			return nil, fmt.Errorf("sharding_dims: unknown dimension %q (want tp or ep)", d)
		}
	}
	plan := &ShardingPlan{Mesh: mesh, Size: tp, EP: ep, Weights: map[string]WeightShard{}}
	if tp <= 1 && ep <= 1 {
		return plan, nil
	}
	moes, err := moeOps(g, ep)
	if err != nil {
		return nil, err
	}
	moeKinds := map[string]WeightShard{} // what the sources say of the stacked expert weights
	if tp > 1 {
		if err := planLinears(c, g, cfg, plan, moes, moeKinds); err != nil {
			return nil, err
		}
	}
	planMoE(plan, moes, moeKinds)
	return plan, nil
}

// planLinears plans the tp splits of the weights that linears read (and records in moeKinds
// what the sources say of the stacked expert weights of moes).
func planLinears(c *Context, g *graph.Graph, cfg DetectShardingConfig, plan *ShardingPlan, moes []moeOp, moeKinds map[string]WeightShard) error {
	tp := plan.Size
	uses, order := shardableWeights(g)
	if len(uses) == 0 && len(moes) == 0 {
		return nil
	}
	named := slices.Clone(order) // the keys the sources' patterns may name
	for _, m := range moes {
		named = append(named, m.keys[:]...)
	}
	// Sources, in order: the first one that names a weight decides it.
	var err error
	for _, src := range cfg.ShardingSource {
		var kinds map[string]string
		switch src {
		case "factory":
			if kinds, err = applyPatterns(shardingSetup(c).FactoryPlan, uses, named, false); err != nil {
				return fmt.Errorf("factory plan of %s: %w", nonEmpty(c.Arch, g.Name), err)
			}
		case "manual":
			if kinds, err = applyPatterns(cfg.TPPlan, uses, named, true); err != nil {
				return fmt.Errorf("tp_plan: %w", err)
			}
		case "heuristic":
			kinds = heuristicPlan(g)
			for _, m := range moes { // an MLP's region: gate and up by columns, down by rows
				kinds[m.keys[0]], kinds[m.keys[1]], kinds[m.keys[2]] = ShardColwise, ShardColwise, ShardRowwise
			}
		default:
			return fmt.Errorf("sharding_source: unknown source %q (want factory, manual or heuristic)", src)
		}
		for key, kind := range kinds {
			if _, done := plan.Weights[key]; !done && uses[key] != nil {
				plan.Weights[key] = WeightShard{Kind: kind, Source: src}
			}
			if _, done := moeKinds[key]; !done && uses[key] == nil {
				moeKinds[key] = WeightShard{Kind: kind, Source: src}
			}
		}
	}
	for _, key := range order {
		u := uses[key]
		w, named := plan.Weights[key]
		switch {
		case len(u.linears) == 0:
			if named && w.Kind != ShardReplicate && w.Source == "manual" {
				return fmt.Errorf("tp_plan: %s is read only by an embedding lookup, which is always replicated; it cannot be %s", key, w.Kind)
			}
			plan.Weights[key] = WeightShard{Kind: ShardReplicate, Source: "embedding"}
			continue
		case !named:
			w = WeightShard{Kind: ShardReplicate, Source: "default"}
		}
		if cfg.SimpleShardOnly && (w.Kind == ShardColwise || w.Kind == ShardRowwise) {
			w.Kind, w.Note = ShardGather, "simple_shard_only"
		}
		if w.Kind != ShardReplicate {
			w.Parts = tp
			dim := 0
			if w.Kind == ShardRowwise {
				dim = 1
			}
			if u.shape[dim]%tp != 0 {
				msg := fmt.Sprintf("%s %v: %s splits dimension %d (%d) into %d parts, which does not divide it", key, u.shape, w.Kind, dim, u.shape[dim], tp)
				if w.Source == "manual" {
					return fmt.Errorf("tp_plan: %s", msg)
				}
				w = WeightShard{Kind: ShardReplicate, Source: w.Source, Note: "not split: " + msg}
				plan.Notes = append(plan.Notes, "not split: "+msg)
			}
		}
		if len(u.embeddings) > 0 && w.Kind != ShardReplicate && w.Note == "" {
			w.Note = "tied: the embedding lookup reads it whole"
		}
		plan.Weights[key] = w
	}
	if !cfg.SimpleShardOnly {
		planAttention(g, plan, uses)
	}
	return nil
}

// moeOp is a moe node whose expert weights are stacked params.
type moeOp struct {
	n       *graph.Node
	keys    [3]string // the stacked keys of gate, up and down
	experts int       // the router's experts
	width   int       // the experts' intermediate size
}

// moeOps lists the moe ops of g whose expert weights are whole stacked params, and checks
// that ep splits them: every one's experts divide by ep, and with ep > 1 there is one.
func moeOps(g *graph.Graph, ep int) ([]moeOp, error) {
	var out []moeOp
	for _, n := range g.Nodes {
		if n.Op != "moe" {
			continue
		}
		layer := nonEmpty(n.Scope, n.Out().Name)
		m := moeOp{n: n, experts: n.Inputs[1].Type.Shape[0].Size, width: n.Inputs[2].Type.Shape[1].Size}
		stacked := true
		for i, v := range n.Inputs[2:] {
			if !isParam(v) {
				stacked = false
				break
			}
			ref, err := graph.ParamOf(v.Producer)
			if err != nil || ref.Stack != m.experts || ref.SliceDim >= 0 {
				stacked = false
				break
			}
			m.keys[i] = ref.Key
		}
		if !stacked || n.Attrs.Int("expert_offset") != 0 {
			if ep > 1 {
				return nil, fmt.Errorf("ep=%d: the moe op of %s does not read all %d experts as whole stacked params; it cannot split by experts", ep, layer, m.experts)
			}
			continue
		}
		if ep > 1 && m.experts%ep != 0 {
			return nil, fmt.Errorf("ep=%d does not divide the %d experts of the moe op of %s: each ep rank takes whole experts, the same number each", ep, m.experts, layer)
		}
		out = append(out, m)
	}
	if ep > 1 && len(out) == 0 {
		return nil, fmt.Errorf("the mesh has ep=%d, but the graph has no moe op to split by experts (not a mixture-of-experts model, or match_moe_pattern is disabled)", ep)
	}
	return out, nil
}

// planMoE plans the stacked expert weights of the moe ops: by whole experts over ep, else
// over tp as a dense MLP splits when the sources ask for exactly that (gate and up colwise,
// down rowwise, the intermediate size divisible by tp), else replicated.
func planMoE(plan *ShardingPlan, moes []moeOp, kinds map[string]WeightShard) {
	tp, ep := plan.Size, plan.EP
	for _, m := range moes {
		layer := nonEmpty(m.n.Scope, m.n.Out().Name)
		g, u, d := kinds[m.keys[0]], kinds[m.keys[1]], kinds[m.keys[2]]
		var reason string
		switch {
		case tp <= 1:
			reason = "no tp axis"
		case g.Kind == "" && u.Kind == "" && d.Kind == "":
			reason = "no source names the experts"
		case g.Kind != ShardColwise || u.Kind != ShardColwise || d.Kind != ShardRowwise:
			reason = fmt.Sprintf("the experts split only as gate and up colwise, down rowwise; the plan says %s, %s, %s", nonEmpty(g.Kind, ShardReplicate), nonEmpty(u.Kind, ShardReplicate), nonEmpty(d.Kind, ShardReplicate))
		case m.width%tp != 0:
			reason = fmt.Sprintf("the experts' intermediate size %d does not divide by tp=%d", m.width, tp)
		}
		if ep > 1 { // whole experts over ep, each cut over tp as a dense MLP when the plan says so
			note := fmt.Sprintf("%d of %d experts per ep rank", m.experts/ep, m.experts)
			per := [3]string{ShardColwise, ShardColwise, ShardRowwise}
			switch {
			case tp > 1 && reason == "":
				note += fmt.Sprintf(", each split over tp=%d", tp)
			case tp > 1:
				note += ", whole on every tp rank: " + reason
				per = [3]string{}
				if g.Kind != "" || u.Kind != "" || d.Kind != "" {
					plan.Notes = append(plan.Notes, fmt.Sprintf("%s: each expert stays whole on every tp rank: %s", layer, reason))
				}
			default:
				per = [3]string{}
			}
			for i, k := range m.keys {
				plan.Weights[k] = WeightShard{Kind: ShardExperts, Parts: ep, Source: "ep", Note: note, PerExpert: per[i]}
			}
			continue
		}
		if reason != "" {
			for i, k := range m.keys {
				src := []WeightShard{g, u, d}[i].Source
				plan.Weights[k] = WeightShard{Kind: ShardReplicate, Source: nonEmpty(src, "default"), Note: "experts replicated: " + reason}
			}
			if g.Kind != "" || u.Kind != "" || d.Kind != "" {
				plan.Notes = append(plan.Notes, fmt.Sprintf("%s: the experts stay whole on every rank: %s", layer, reason))
			}
			continue
		}
		plan.Weights[m.keys[0]] = WeightShard{Kind: ShardColwise, Parts: tp, Source: g.Source}
		plan.Weights[m.keys[1]] = WeightShard{Kind: ShardColwise, Parts: tp, Source: u.Source}
		plan.Weights[m.keys[2]] = WeightShard{Kind: ShardRowwise, Parts: tp, Source: d.Source}
	}
}

func nonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// tpPattern is one compiled entry of a plan.
type tpPattern struct {
	text    string
	kind    string
	re      *regexp.Regexp
	stars   int // wildcards: the fewer, the more specific
	literal int // characters other than '*': the more, the more specific
}

// compare orders patterns by specificity: fewer wildcards first, then more literal
// characters. It is > 0 when p is more specific than q.
func (p tpPattern) compare(q tpPattern) int {
	if p.stars != q.stars {
		return q.stars - p.stars
	}
	return p.literal - q.literal
}

// compilePatterns checks and compiles a plan's entries, sorted by pattern.
func compilePatterns(plan map[string]string) ([]tpPattern, error) {
	var out []tpPattern
	for _, text := range slices.Sorted(func(yield func(string) bool) {
		for k := range plan {
			if !yield(k) {
				return
			}
		}
	}) {
		kind := plan[text]
		switch kind {
		case ShardColwise, ShardRowwise, ShardGather, ShardReplicate:
		default:
			return nil, fmt.Errorf("%q: unknown split %q (want %s, %s, %s or %s)", text, kind, ShardColwise, ShardRowwise, ShardGather, ShardReplicate)
		}
		if text == "" {
			return nil, errors.New("an empty weight pattern")
		}
		re, err := regexp.Compile("^" + strings.ReplaceAll(regexp.QuoteMeta(text), `\*`, `[^.]+`) + "$")
		if err != nil {
			return nil, fmt.Errorf("%q: %w", text, err)
		}
		out = append(out, tpPattern{text: text, kind: kind, re: re, stars: strings.Count(text, "*"), literal: len(text) - strings.Count(text, "*")})
	}
	return out, nil
}

// applyPatterns resolves a pattern plan against the weights: for each weight, the most
// specific matching pattern (the fewest wildcards, then the most literal characters). Two
// equally specific patterns that disagree are an error; so, when strict, is a pattern that
// matches no weight.
func applyPatterns(plan map[string]string, uses map[string]*weightUse, order []string, strict bool) (map[string]string, error) {
	pats, err := compilePatterns(plan)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	used := make([]bool, len(pats))
	for _, key := range order {
		module := strings.TrimSuffix(key, ".weight")
		best := -1
		for i, p := range pats {
			if !p.re.MatchString(key) && !p.re.MatchString(module) {
				continue
			}
			used[i] = true
			switch c := p.compare(pats[max(best, 0)]); {
			case best < 0 || c > 0:
				best = i
			case c == 0 && p.kind != pats[best].kind:
				return nil, fmt.Errorf("%s matches %q (%s) and %q (%s), equally specific", key, pats[best].text, pats[best].kind, p.text, p.kind)
			}
		}
		if best >= 0 {
			out[key] = pats[best].kind
		}
	}
	if strict {
		var unknown []string
		for i, p := range pats {
			if !used[i] {
				unknown = append(unknown, strconv.Quote(p.text))
			}
		}
		if len(unknown) > 0 {
			examples := order[:min(len(order), 3)]
			return nil, fmt.Errorf("pattern %s matches no weight that a linear or an embedding reads (such as %s)", strings.Join(unknown, ", "), strings.Join(examples, ", "))
		}
	}
	return out, nil
}

// heuristicPlan finds the column-then-row linear regions between residual adds: a linear
// whose output (plus a bias) is added to a value of its own shape is row-parallel, and the
// linears that feed its input through other ops, all reading one value, are
// column-parallel, provided nothing computed between them is read outside. A linear whose
// output is the graph's output (the LM head) is split by vocabulary and gathered.
func heuristicPlan(g *graph.Graph) map[string]string {
	users := g.Users()
	out := map[string]string{}
	key := func(n *graph.Node) string { return n.Inputs[1].Producer.Attrs.String("key") }
	for _, n := range g.Nodes {
		if !graph.IsLinear(n) || !isParam(n.Inputs[1]) {
			continue
		}
		y := followBias(n, users)
		if outputThroughCasts(g, y, users) {
			out[key(n)] = ShardGather
			continue
		}
		if !isResidualAdd(y, users) {
			continue
		}
		cols, ok := columnRegion(g, n, users)
		if !ok {
			continue
		}
		out[key(n)] = ShardRowwise
		for _, c := range cols {
			out[key(c)] = ShardColwise
		}
	}
	return out
}

// followBias returns the linear's output, or the output of the bias add that is its only
// reader.
func followBias(n *graph.Node, users map[*graph.Value][]*graph.Node) *graph.Value {
	y := n.Out()
	if us := users[y]; len(us) == 1 && us[0].Op == "add" {
		add := us[0]
		other := add.Inputs[0]
		if other == y {
			other = add.Inputs[1]
		}
		if isParam(other) && len(other.Type.Shape) == 1 && add.Out().Type.Shape.Equal(y.Type.Shape) {
			return add.Out()
		}
	}
	return y
}

// outputThroughCasts reports whether v, possibly cast, is a graph output.
func outputThroughCasts(g *graph.Graph, v *graph.Value, users map[*graph.Value][]*graph.Node) bool {
	for range 4 {
		if g.IsOutput(v) {
			return true
		}
		us := users[v]
		if len(us) != 1 || us[0].Op != "cast" {
			return false
		}
		v = us[0].Out()
	}
	return false
}

// isResidualAdd reports whether y is read by an add of two values of y's shape.
func isResidualAdd(y *graph.Value, users map[*graph.Value][]*graph.Node) bool {
	for _, u := range users[y] {
		if u.Op == "add" && u.Inputs[0].Type.Shape.Equal(u.Inputs[1].Type.Shape) && u.Out().Type.Shape.Equal(y.Type.Shape) {
			return true
		}
	}
	return false
}

// columnRegion walks back from the row-parallel linear's input to the linears that feed it.
// It fails when they do not all read one value, when none is found, or when a value computed
// in the region is read outside it.
func columnRegion(g *graph.Graph, row *graph.Node, users map[*graph.Value][]*graph.Node) ([]*graph.Node, bool) {
	region := map[*graph.Node]bool{}
	var cols []*graph.Node
	seen := map[*graph.Value]bool{}
	stack := []*graph.Value{row.Inputs[0]}
	for len(stack) > 0 {
		v := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if seen[v] {
			continue
		}
		seen[v] = true
		p := v.Producer
		if p == nil || p.Op == graph.OpParam || p.Op == graph.OpConst || p.Op == "iota" {
			continue // graph inputs (positions), weights, constants
		}
		if region[p] {
			continue
		}
		region[p] = true
		if graph.IsLinear(p) {
			if !isParam(p.Inputs[1]) {
				return nil, false
			}
			cols = append(cols, p)
			continue
		}
		if p.Op == "embedding" || len(region) > 256 {
			return nil, false
		}
		stack = append(stack, p.Inputs...)
	}
	if len(cols) == 0 {
		return nil, false
	}
	x := cols[0].Inputs[0]
	for _, c := range cols {
		if c.Inputs[0] != x {
			return nil, false
		}
	}
	for p := range region {
		for _, o := range p.Outputs {
			if g.IsOutput(o) {
				return nil, false
			}
			for _, u := range users[o] {
				if !region[u] && u != row {
					return nil, false
				}
			}
		}
	}
	slices.SortFunc(cols, func(a, b *graph.Node) int { return g.IndexOf(a) - g.IndexOf(b) })
	return cols, true
}

// attnLayer is one sdpa node and the projections around it.
type attnLayer struct {
	sdpa       *graph.Node
	q, k, v, o *graph.Node // the linears; o may be nil
	heads, kv  int
}

// findAttention traces each sdpa node's q, k and v back to their linears and its output
// forward to the output projection.
func findAttention(g *graph.Graph) []attnLayer {
	users := g.Users()
	var out []attnLayer
	for _, n := range g.Nodes {
		if n.Op != "sdpa" {
			continue
		}
		a := attnLayer{sdpa: n, q: projection(n.Inputs[0]), k: projection(n.Inputs[1]), v: projection(n.Inputs[2])}
		if a.q == nil || a.k == nil || a.v == nil {
			continue
		}
		a.heads, a.kv = n.Inputs[0].Type.Shape[1].Size, n.Inputs[1].Type.Shape[1].Size
		y := n.Out()
		for range 8 {
			us := users[y]
			if len(us) != 1 {
				break
			}
			u := us[0]
			if graph.IsLinear(u) && u.Inputs[0] == y {
				a.o = u
				break
			}
			if u.Op != "transpose" && u.Op != "reshape" && u.Op != "cast" {
				break
			}
			y = u.Out()
		}
		out = append(out, a)
	}
	return out
}

// projection follows a q, k or v input of attention back to the linear that computes it:
// through views, casts, rotary embedding, per-head norms, repeat_kv and a bias add.
func projection(v *graph.Value) *graph.Node {
	for range 16 {
		p := v.Producer
		if p == nil {
			return nil
		}
		switch p.Op {
		case "linear", "linear_fp8":
			if !isParam(p.Inputs[1]) {
				return nil
			}
			return p
		case "reshape", "transpose", "cast", "rmsnorm", "repeat_kv":
			v = p.Inputs[0]
		case "rope":
			v = p.Inputs[v.Index]
		case "add":
			switch {
			case isParam(p.Inputs[1]):
				v = p.Inputs[0]
			case isParam(p.Inputs[0]):
				v = p.Inputs[1]
			default:
				return nil
			}
		default:
			return nil
		}
	}
	return nil
}

// planAttention keeps attention splits on whole heads: the q projection splits by query
// heads, k and v by KV heads (or, with fewer KV heads than ranks, into one part per KV head,
// each replicated on the ranks whose query heads read it). A layer whose heads do not split
// falls back to replicated q/k/v and a column split + all_gather of the output projection.
func planAttention(g *graph.Graph, plan *ShardingPlan, uses map[string]*weightUse) {
	tp := plan.Size
	key := func(n *graph.Node) string { return n.Inputs[1].Producer.Attrs.String("key") }
	for _, a := range findAttention(g) {
		q, k, v := plan.Weights[key(a.q)], plan.Weights[key(a.k)], plan.Weights[key(a.v)]
		split := 0
		for _, w := range []WeightShard{q, k, v} {
			if w.Kind == ShardColwise {
				split++
			}
		}
		if split == 0 {
			continue
		}
		layer := nonEmpty(a.sdpa.Scope, a.sdpa.Out().Name)
		headDim := a.sdpa.Inputs[0].Type.Shape[3].Size
		shared := false // a projection read by other ops than this layer's attention
		for _, p := range []*graph.Node{a.q, a.k, a.v} {
			shared = shared || len(uses[key(p)].linears) > 1
		}
		var reason string
		switch {
		case split != 3:
			reason = "q, k and v are not all split by columns"
		case shared:
			reason = "a q/k/v weight is read by other linears too"
		case a.heads%tp != 0:
			reason = fmt.Sprintf("%d query heads do not divide by tp=%d", a.heads, tp)
		case a.kv >= tp && a.kv%tp != 0:
			reason = fmt.Sprintf("%d KV heads do not divide by tp=%d", a.kv, tp)
		case a.kv < tp && tp%a.kv != 0:
			reason = fmt.Sprintf("%d KV heads do not divide tp=%d evenly", a.kv, tp)
		case a.q.Inputs[1].Type.Shape[0].Size != a.heads*headDim || a.k.Inputs[1].Type.Shape[0].Size != a.kv*headDim:
			reason = "the projections are not whole heads"
		}
		if reason == "" {
			if a.kv < tp {
				note := fmt.Sprintf("%d KV heads over %d ranks: each KV head replicated on %d ranks", a.kv, tp, tp/a.kv)
				for _, p := range []*graph.Node{a.k, a.v} {
					w := plan.Weights[key(p)]
					w.Parts, w.Note = a.kv, note
					plan.Weights[key(p)] = w
				}
				plan.Notes = append(plan.Notes, fmt.Sprintf("%s: %s", layer, note))
			}
			continue
		}
		o := "the output projection"
		for _, p := range []*graph.Node{a.q, a.k, a.v} {
			w := plan.Weights[key(p)]
			plan.Weights[key(p)] = WeightShard{Kind: ShardReplicate, Source: w.Source, Note: "attention fallback: " + reason}
		}
		if a.o != nil {
			o = key(a.o)
			w := plan.Weights[key(a.o)]
			if w.Kind == ShardRowwise || w.Kind == ShardColwise {
				if rows := a.o.Inputs[1].Type.Shape[0].Size; rows%tp == 0 {
					w = WeightShard{Kind: ShardGather, Parts: tp, Source: w.Source, Note: "attention fallback: " + reason}
				} else {
					w = WeightShard{Kind: ShardReplicate, Source: w.Source, Note: "attention fallback: " + reason}
				}
				plan.Weights[key(a.o)] = w
			}
		}
		plan.Notes = append(plan.Notes, fmt.Sprintf("%s: attention falls back to replicated q/k/v and a column split + all_gather of %s: %s", layer, o, reason))
	}
}
