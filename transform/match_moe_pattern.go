package transform

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform/pattern"
)

// MatchMoE replaces the frontends' masked-dense mixture-of-experts blocks with moe ops.
var MatchMoE = &Transform{
	Name:  "match_moe_pattern",
	Stage: PatternMatcher,
	Doc: `Replaces each sparse mixture-of-experts block that the frontends write in primitives
(graph.DecomposeMoE: router linear, softmax in f32, topk, optional renormalisation, the
one-hot scatter of the top-k weights into dense [...,E] weights, then every expert's SwiGLU on
every token weighed by its column and summed in expert order) with one moe op, which computes
only the experts each token chose. The experts' weights become three stacked params (gate and
up [E,I,H], down [E,H,I]) whose members are the experts' own checkpoint tensors: their keys
must differ only in the expert index (experts.0.w1.weight, experts.1.w1.weight, ...). The
expert activation may be silu(gate) * up or swiglu. Everything inside the block must be read
only inside it, the routing weights' columns must each be read by exactly one expert, and the
experts must be summed in order ((e0 + e1) + e2) + ...; anything else is left as it is. A
shared expert (Qwen2-MoE) stays a dense MLP beside the moe op. Matches counts the MoE layers
replaced.`,
	Run: runMatchMoE,
}

func init() { Register(MatchMoE) }

// moeBlock is one matched block: what the moe op needs and the value it replaces.
type moeBlock struct {
	x, router       *graph.Value
	gate, up, down  []*graph.Value // the experts' params, in expert order
	routing         graph.MoERouting
	out             *graph.Value // the sum of the experts' outputs
	scope, template [3]string    // the gate/up/down params' scopes and stacked keys
}

func runMatchMoE(_ context.Context, _ *Context, g *graph.Graph, _ any) (Info, error) {
	users := g.Users()
	var blocks []moeBlock
	for _, n := range g.Nodes {
		if n.Op != "topk" {
			continue
		}
		if blk, ok := matchMoEBlock(g, n, users); ok {
			blocks = append(blocks, blk)
		}
	}
	for _, blk := range blocks {
		err := pattern.Rewrite(g, []*graph.Value{blk.out}, func(b *graph.Builder) ([]*graph.Value, error) {
			stacked := make([]*graph.Value, 3)
			for i, members := range [][]*graph.Value{blk.gate, blk.up, blk.down} {
				shape := append(graph.Dims(len(members)), members[0].Type.Shape...)
				prev := b.SetScope(blk.scope[i])
				stacked[i] = b.Named(strings.Replace(blk.template[i], "."+graph.StackWildcard+".", ".", 1), graph.OpParam, graph.Attrs{
					"key": blk.template[i], "dtype": members[0].Type.DType, "shape": shape, "stack": len(members),
				})
				b.SetScope(prev)
			}
			return []*graph.Value{b.MoE(blk.x, blk.router, stacked[0], stacked[1], stacked[2], blk.routing, 0)}, nil
		})
		if err != nil {
			return Info{}, fmt.Errorf("replace the MoE block at %s: %w", blk.out, err)
		}
	}
	return Info{Matches: len(blocks), Clean: len(blocks) == 0, ValidShapes: true}, nil
}

// moeMatcher follows one candidate block through the graph.
type moeMatcher struct {
	g     *graph.Graph
	users map[*graph.Value][]*graph.Node
}

// only returns the one node that reads v, when v is read by exactly one node and is no
// graph output.
func (m moeMatcher) only(v *graph.Value) (*graph.Node, bool) {
	us := m.users[v]
	if len(us) != 1 || m.g.IsOutput(v) {
		return nil, false
	}
	return us[0], true
}

// onlyOp is only, with the reader's op checked.
func (m moeMatcher) onlyOp(v *graph.Value, op string) (*graph.Node, bool) {
	n, ok := m.only(v)
	return n, ok && n.Op == op
}

// lastAxis reports whether attribute axis (or axes, a single entry) of n names the last
// axis of a rank-r value, counting from the back by offset (0: the last one).
func lastAxis(n *graph.Node, r, offset int) bool {
	ax := n.Attrs.Int("axis")
	if axes, ok := n.Attrs["axes"]; ok {
		as, _ := axes.([]int)
		if len(as) != 1 {
			return false
		}
		ax = as[0]
	}
	a, err := graph.NormAxis(ax, r)
	return err == nil && a == r-1-offset
}

// plainParam reports whether v is an unsliced, unstacked 2-D param.
func plainParam(v *graph.Value) bool {
	if !isParam(v) || len(v.Type.Shape) != 2 || !v.Type.Shape.IsConst() {
		return false
	}
	a := v.Producer.Attrs
	return a.Int("slice_dim") < 0 && a.Int("stack") == 0
}

// matchMoEBlock matches the block around topk node n (see MatchMoE).
func matchMoEBlock(g *graph.Graph, n *graph.Node, users map[*graph.Value][]*graph.Node) (moeBlock, bool) {
	m := moeMatcher{g: g, users: users}
	var blk moeBlock
	k := n.Attrs.Int("k")
	vals, idx := n.Outputs[0], n.Outputs[1]
	rank := len(vals.Type.Shape)

	// Router: linear(x, router) [, cast to f32] -> softmax over the experts -> topk.
	sm := n.Inputs[0].Producer
	if sm == nil || sm.Op != "softmax" || !lastAxis(sm, rank, 0) || len(m.users[sm.Out()]) != 1 || g.IsOutput(sm.Out()) {
		return blk, false
	}
	logits := sm.Inputs[0]
	if p := logits.Producer; p != nil && p.Op == "cast" {
		if len(m.users[logits]) != 1 || g.IsOutput(logits) {
			return blk, false
		}
		logits = p.Inputs[0]
	}
	lin := logits.Producer
	if lin == nil || lin.Op != "linear" || !plainParam(lin.Inputs[1]) || len(m.users[logits]) != 1 || g.IsOutput(logits) {
		return blk, false
	}
	blk.x, blk.router = lin.Inputs[0], lin.Inputs[1]
	act := blk.x.Type.DType
	if logits.Type.DType != act || sm.Out().Type.DType != tensor.F32 {
		return blk, false
	}
	E := blk.router.Type.Shape[0].Size
	if E < 1 || k > E {
		return blk, false
	}
	blk.routing = graph.MoERouting{TopK: k, WeightDType: tensor.F32}

	// The top-k weights: [sum and div,] [cast,] reshape [...,k,1].
	w := vals
	if us := m.users[vals]; len(us) == 2 && !g.IsOutput(vals) {
		sum, div := us[0], us[1]
		if sum.Op == "div" {
			sum, div = div, sum
		}
		if sum.Op != "sum" || !lastAxis(sum, rank, 0) || !sum.Attrs.Bool("keepdim") || div.Op != "div" ||
			div.Inputs[0] != vals || div.Inputs[1] != sum.Out() || len(m.users[sum.Out()]) != 1 || g.IsOutput(sum.Out()) {
			return blk, false
		}
		blk.routing.Renormalize, w = true, div.Out()
	}
	next, ok := m.only(w)
	if !ok {
		return blk, false
	}
	if next.Op == "cast" {
		blk.routing.WeightDType = next.Attrs.DType("dtype")
		if next, ok = m.only(next.Out()); !ok {
			return blk, false
		}
	}
	if w.Type.DType != tensor.F32 || !isSlotShape(next, rank, k) {
		return blk, false
	}
	wSlots := next.Out()

	// The one-hot scatter: eq(reshape(idx) [...,k,1], iota [E]) selects where the weights go.
	rs, ok := m.onlyOp(idx, "reshape")
	if !ok || !isSlotShape(rs, rank, k) {
		return blk, false
	}
	eq, ok := m.onlyOp(rs.Out(), "eq")
	if !ok {
		return blk, false
	}
	iota := eq.Inputs[1]
	if eq.Inputs[0] != rs.Out() {
		iota = eq.Inputs[0]
	}
	if p := iota.Producer; p == nil || p.Op != "iota" || !iota.Type.Shape.Equal(graph.Dims(E)) || p.Attrs.Int("axis") != 0 || !iota.Type.DType.IsInt() {
		return blk, false
	}
	where, ok := m.onlyOp(eq.Out(), "where")
	if !ok || where.Inputs[0] != eq.Out() || where.Inputs[1] != wSlots || !isZero(where.Inputs[2]) {
		return blk, false
	}
	if u, ok := m.only(wSlots); !ok || u != where {
		return blk, false
	}
	sum, ok := m.onlyOp(where.Out(), "sum")
	if !ok || !lastAxis(sum, rank+1, 1) || sum.Attrs.Bool("keepdim") {
		return blk, false
	}
	weights := sum.Out()
	if weights.Type.DType != blk.routing.WeightDType || g.IsOutput(weights) {
		return blk, false
	}

	// The experts: column e of the weights is read by one slice, which weighs expert e's
	// SwiGLU output.
	terms := make([]*graph.Value, E)
	blk.gate, blk.up, blk.down = make([]*graph.Value, E), make([]*graph.Value, E), make([]*graph.Value, E)
	if len(m.users[weights]) != E {
		return blk, false
	}
	for _, s := range m.users[weights] {
		e := s.Attrs.Int("start")
		if s.Op != "slice" || !lastAxis(s, rank, 0) || e < 0 || e >= E || s.Attrs.Int("end") != e+1 || s.Attrs.Int("step") > 1 || terms[e] != nil {
			return blk, false
		}
		term, ok := matchExpert(m, s.Out(), blk.x, act, &blk, e)
		if !ok {
			return blk, false
		}
		terms[e] = term
	}

	// The sum in expert order: ((t0 + t1) + t2) + ...
	acc := terms[0]
	for e := 1; e < E; e++ {
		add, ok := m.onlyOp(acc, "add")
		if !ok || !(add.Inputs[0] == acc && add.Inputs[1] == terms[e] || add.Inputs[1] == acc && add.Inputs[0] == terms[e]) {
			return blk, false
		}
		if u, ok := m.only(terms[e]); !ok || u != add {
			return blk, false
		}
		acc = add.Out()
	}
	if !acc.Type.Equal(blk.x.Type) {
		return blk, false
	}
	blk.out = acc

	// The experts' keys must differ in the index only: they become stacked params.
	for i, members := range [][]*graph.Value{blk.gate, blk.up, blk.down} {
		keys := make([]string, E)
		for e, p := range members {
			if p.Type.DType != members[0].Type.DType || !p.Type.Shape.Equal(members[0].Type.Shape) {
				return blk, false
			}
			keys[e] = p.Producer.Attrs.String("key")
		}
		t, ok := stackTemplate(keys)
		if !ok {
			return blk, false
		}
		blk.template[i], blk.scope[i] = t, members[0].Producer.Scope
	}
	return blk, true
}

// matchExpert matches expert e's term from its routing column col: mul(down(act(gate(x),
// up(x))), col) [, cast to the activations' dtype], recording the expert's params in blk.
func matchExpert(m moeMatcher, col, x *graph.Value, act tensor.DType, blk *moeBlock, e int) (*graph.Value, bool) {
	mul, ok := m.onlyOp(col, "mul")
	if !ok {
		return nil, false
	}
	y := mul.Inputs[0]
	if y == col {
		y = mul.Inputs[1]
	}
	term := mul.Out()
	if term.Type.DType != act {
		c, ok := m.onlyOp(term, "cast")
		if !ok || c.Out().Type.DType != act {
			return nil, false
		}
		if _, ok := m.only(term); !ok {
			return nil, false
		}
		term = c.Out()
	}
	down := y.Producer
	if down == nil || down.Op != "linear" || !plainParam(down.Inputs[1]) {
		return nil, false
	}
	if u, ok := m.only(y); !ok || u != mul {
		return nil, false
	}
	h := down.Inputs[0]
	if u, ok := m.only(h); !ok || u != down || h.Producer == nil {
		return nil, false
	}
	var gate, up *graph.Value
	var readers [2]*graph.Node // the nodes that must be the only readers of gate and up
	switch p := h.Producer; p.Op {
	case "swiglu":
		gate, up = p.Inputs[0], p.Inputs[1]
		readers = [2]*graph.Node{p, p}
	case "mul":
		s, other := p.Inputs[0], p.Inputs[1]
		if s.Producer == nil || s.Producer.Op != "silu" {
			s, other = other, s
		}
		if s.Producer == nil || s.Producer.Op != "silu" || s == other || !isReadBy(m, s, p) {
			return nil, false
		}
		gate, up = s.Producer.Inputs[0], other
		readers = [2]*graph.Node{s.Producer, p}
	default:
		return nil, false
	}
	var w [2]*graph.Value
	for i, v := range []*graph.Value{gate, up} {
		lin := v.Producer
		if lin == nil || lin.Op != "linear" || lin.Inputs[0] != x || !plainParam(lin.Inputs[1]) || v.Type.DType != act || !isReadBy(m, v, readers[i]) {
			return nil, false
		}
		w[i] = lin.Inputs[1]
	}
	if gate == up || h.Type.DType != act || y.Type.DType != act {
		return nil, false
	}
	blk.gate[e], blk.up[e], blk.down[e] = w[0], w[1], down.Inputs[1]
	return term, true
}

// isReadBy reports whether v's one reader is n.
func isReadBy(m moeMatcher, v *graph.Value, n *graph.Node) bool {
	u, ok := m.only(v)
	return ok && u == n
}

// isSlotShape reports whether n reshapes a [...,k] value of rank r to [...,k,1].
func isSlotShape(n *graph.Node, r, k int) bool {
	if n.Op != "reshape" {
		return false
	}
	in, out := n.Inputs[0].Type.Shape, n.Out().Type.Shape
	return len(in) == r && len(out) == r+1 && in[r-1] == graph.D(k) && out[r-1] == graph.D(k) && out[r] == graph.D(1) && in[:r-1].Equal(out[:r-1])
}

// isZero reports whether v is a constant whose every value is 0.
func isZero(v *graph.Value) bool {
	p := v.Producer
	if p == nil || p.Op != graph.OpConst {
		return false
	}
	for _, x := range p.Attrs.Floats("values") {
		if x != 0 {
			return false
		}
	}
	return len(p.Attrs.Floats("values")) > 0
}

// stackTemplate finds the key with a wildcard in place of the expert index that gives
// keys[e] for every e: the index must stand where a 0 stands in keys[0], as a whole
// dot-separated part when it can.
func stackTemplate(keys []string) (string, bool) {
	first := keys[0]
	if strings.Contains(first, graph.StackWildcard) {
		return "", false
	}
	var candidates []string
	for i := range first {
		if first[i] != '0' {
			continue
		}
		t := first[:i] + graph.StackWildcard + first[i+1:]
		whole := (i == 0 || first[i-1] == '.') && (i+1 == len(first) || first[i+1] == '.')
		if whole {
			candidates = append([]string{t}, candidates...)
		} else {
			candidates = append(candidates, t)
		}
	}
	for _, t := range candidates {
		ok := true
		for e, k := range keys {
			if strings.Replace(t, graph.StackWildcard, strconv.Itoa(e), 1) != k {
				ok = false
				break
			}
		}
		if ok {
			return t, true
		}
	}
	return "", false
}
