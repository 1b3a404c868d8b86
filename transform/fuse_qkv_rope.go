package transform

import (
	"context"
	"errors"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform/pattern"
)

// FuseQKVRoPE replaces the split of a fused q/k/v projection, the layout of its three parts
// as heads and the rope of q and k (with per-head norms of q and k between, where the model
// has them) with one qkv_rope or qkv_norm_rope op.
var FuseQKVRoPE = &Transform{
	Name:  "fuse_qkv_rope",
	Stage: PostLoadFusion,
	Doc: `Replaces what follows a fused q/k/v linear (fuse_gemms) with one qkv_rope op: the
split of x[B,S,(H+2*KV)*D] along its last axis into sizes H*D, KV*D and KV*D, the reshape
of each part to [B,S,heads,D], the transpose of each to [B,heads,S,D] (perm [0,2,1,3]) and
the rope of the q and k parts. qkv_rope's v output replaces the v transpose. Where an
rmsnorm over each head of q and of k (Qwen3's q_norm and k_norm, one eps and one weight
dtype) sits between the reshapes and the transposes, the op made is qkv_norm_rope, which
takes the two norm weights. Every value in between must have no other reader and be no
graph output, and nothing else may sit between the steps. Run after fuse_gemms, which makes the split, and after sharding,
so that the head counts are the rank's own. Matches counts the nodes made, one per layer.`,
	After: []Dep{
		{FuseGEMMs, "fuse_gemms makes the split of the fused q/k/v linear that fuse_qkv_rope replaces"},
		{ShardingExecutor, "sharding_executor gives each rank's graph its own head counts, which qkv_rope takes"},
	},
	Run: runFuseQKVRoPE,
}

func init() { Register(FuseQKVRoPE) }

// qkvRoPEPattern is qkv_rope's decomposition as the graph holds it after fuse_gemms: the
// rope pattern (rooted at rope, reading the q and k layouts) and the v pattern (rooted at
// the v transpose, reading the same split).
type qkvRoPEPattern struct {
	p, pv              *pattern.Pattern
	x, pos, split      *graph.Value // split: the pattern split's first output
	rq, rk, tq, tk, qk *graph.Value // qk: rope's first output (the root)
	vx, vSplit, rv, tv *graph.Value // the v pattern's wildcard, split, reshape and transpose
	// With norms: the norms of the q and k layouts (the transposes read them) and their
	// weights; nil without.
	nq, nk, wq, wk *graph.Value
}

// newQKVRoPEPattern builds the pattern without norms, or with the per-head q and k norms.
func newQKVRoPEPattern(norms bool) *qkvRoPEPattern {
	q := &qkvRoPEPattern{p: pattern.New("qkv_rope"), pv: pattern.New("qkv_rope_v")}
	// Example types: H=2, KV=1, D=8.
	q.x = q.p.Any("x", tensor.F32, graph.Shape{symB, symS, graph.D(32)})
	q.pos = q.p.Any("positions", tensor.I32, graph.Shape{symB, symS})
	b := q.p.Builder()
	parts := b.Split(q.x, -1, 16, 8, 8)
	q.split = parts[0]
	q.rq = b.Reshape(parts[0], symB, symS, graph.D(2), graph.D(8))
	q.rk = b.Reshape(parts[1], symB, symS, graph.D(1), graph.D(8))
	lq, lk := q.rq, q.rk
	if norms {
		q.wq = q.p.Any("q_norm", tensor.F32, graph.Shape{graph.D(8)})
		q.wk = q.p.Any("k_norm", tensor.F32, graph.Shape{graph.D(8)})
		q.nq = b.Op("rmsnorm", graph.Attrs{"eps": 1e-6}, q.rq, q.wq)
		q.nk = b.Op("rmsnorm", graph.Attrs{"eps": 1e-6}, q.rk, q.wk)
		q.p.IgnoreAttrs(q.nq, "eps") // both the same: checked by check
		q.p.IgnoreAttrs(q.nk, "eps")
		lq, lk = q.nq, q.nk
	}
	q.tq = b.Transpose(lq, 0, 2, 1, 3)
	q.tk = b.Transpose(lk, 0, 2, 1, 3)
	rope := b.Apply("rope", graph.Attrs{"inv_freq": []float64{1, 0.1, 0.01, 0.001}}, q.tq, q.tk, q.pos)
	q.qk = rope[0]
	q.p.IgnoreAttrs(q.split) // axis and sizes: checked by check
	q.p.IgnoreAttrs(q.rq, "shape")
	q.p.IgnoreAttrs(q.rk, "shape")
	q.p.IgnoreAttrs(q.qk, "inv_freq", "scaling")
	q.p.Root(q.qk)

	q.vx = q.pv.Any("x", tensor.F32, graph.Shape{symB, symS, graph.D(32)})
	bv := q.pv.Builder()
	vparts := bv.Split(q.vx, -1, 16, 8, 8)
	q.vSplit = vparts[0]
	q.rv = bv.Reshape(vparts[2], symB, symS, graph.D(1), graph.D(8))
	q.tv = bv.Transpose(q.rv, 0, 2, 1, 3)
	q.pv.IgnoreAttrs(q.vSplit)
	q.pv.IgnoreAttrs(q.rv, "shape")
	q.pv.Root(q.tv)
	return q
}

// qkvMatch is one place to fuse: the rope match, the v match and qkv_rope's attributes.
type qkvMatch struct {
	m, mv   *pattern.Match
	heads   int
	kvHeads int
	invFreq []float64
	scaling float64
	eps     float64 // the norms' (with norms)
}

// check completes a match of the rope pattern with the v layout of the same split and holds
// every shape to qkv_rope's; nil when the place cannot be fused.
func (q *qkvRoPEPattern) check(g *graph.Graph, sc *pattern.Scanner, m *pattern.Match, users map[*graph.Value][]*graph.Node) *qkvMatch {
	x, split := m.Get(q.x), m.Node(q.split)
	xs := x.Type.Shape
	if len(xs) != 3 || !x.Type.DType.IsFloat() || len(split.Outputs) != 3 || !isAxis(split.Attrs.Int("axis"), 3, 2) {
		return nil
	}
	qt, kt := m.Get(q.tq).Type, m.Get(q.tk).Type
	if len(qt.Shape) != 4 || len(kt.Shape) != 4 || qt.Shape[1].IsSym() || kt.Shape[1].IsSym() || qt.Shape[3].IsSym() {
		return nil
	}
	H, KV, D := qt.Shape[1].Size, kt.Shape[1].Size, qt.Shape[3].Size
	if H < 1 || KV < 1 || D < 2 || qt.DType != x.Type.DType || kt.DType != x.Type.DType {
		return nil
	}
	sizes := split.Attrs.Ints("sizes")
	if len(sizes) != 3 || sizes[0] != H*D || sizes[1] != KV*D || sizes[2] != KV*D {
		return nil
	}
	if !shapeIs(m.Get(q.rq).Type.Shape, xs[0], xs[1], graph.D(H), graph.D(D)) ||
		!shapeIs(m.Get(q.rk).Type.Shape, xs[0], xs[1], graph.D(KV), graph.D(D)) {
		return nil
	}
	pos := m.Get(q.pos)
	if !isPositions(pos) || !shapeIs(pos.Type.Shape, xs[0], xs[1]) {
		return nil
	}
	rope := m.Node(q.qk)
	if 2*len(rope.Attrs.Floats("inv_freq")) != D {
		return nil
	}
	// The v part: split output 2, read by one reshape to [B,S,KV,D], read by one transpose.
	vs := users[split.Outputs[2]]
	if len(vs) != 1 || vs[0].Op != "reshape" {
		return nil
	}
	ts := users[vs[0].Out()]
	if len(ts) != 1 || ts[0].Op != "transpose" {
		return nil
	}
	mv, ok := sc.MatchShared(q.pv, ts[0])
	if !ok || mv.Node(q.vSplit) != split || !shapeIs(mv.Get(q.rv).Type.Shape, xs[0], xs[1], graph.D(KV), graph.D(D)) {
		return nil
	}
	// Nothing outside reads a value in between (the rope outputs and the v transpose are
	// what is replaced).
	inner := []*graph.Value{split.Outputs[0], split.Outputs[1], split.Outputs[2], m.Get(q.rq), m.Get(q.rk), m.Get(q.tq), m.Get(q.tk), mv.Get(q.rv)}
	within := map[*graph.Node]bool{split: true, rope: true, mv.Root: true}
	for _, v := range []*graph.Value{q.rq, q.rk, q.tq, q.tk} {
		within[m.Node(v)] = true
	}
	eps := 0.0
	if q.nq != nil {
		nq, nk := m.Node(q.nq), m.Node(q.nk)
		eps = nq.Attrs.Float("eps")
		wq, wk := m.Get(q.wq).Type, m.Get(q.wk).Type
		if nk.Attrs.Float("eps") != eps || wq.DType != wk.DType || !shapeIs(wq.Shape, graph.D(D)) || !shapeIs(wk.Shape, graph.D(D)) {
			return nil
		}
		inner = append(inner, m.Get(q.nq), m.Get(q.nk))
		within[nq], within[nk] = true, true
	}
	within[mv.Node(q.rv)] = true
	for _, v := range inner {
		if g.IsOutput(v) {
			return nil
		}
		for _, u := range users[v] {
			if !within[u] {
				return nil
			}
		}
	}
	return &qkvMatch{m: m, mv: mv, heads: H, kvHeads: KV, invFreq: rope.Attrs.Floats("inv_freq"),
		scaling: rope.Attrs.Float("scaling"), eps: eps}
}

func runFuseQKVRoPE(_ context.Context, _ *Context, g *graph.Graph, _ any) (Info, error) {
	made := 0
	for _, norms := range []bool{false, true} {
		n, err := fuseQKVRoPE(g, newQKVRoPEPattern(norms))
		if err != nil {
			return Info{}, err
		}
		made += n
	}
	return Info{Matches: made, Clean: true, ValidShapes: true}, nil
}

// fuseQKVRoPE replaces every place of q's pattern with a qkv_rope (qkv_norm_rope with
// norms) and returns how many it made.
func fuseQKVRoPE(g *graph.Graph, q *qkvRoPEPattern) (int, error) {
	ms, err := q.p.FindAllShared(g) // the split's v output is read outside the rope pattern
	if err != nil {
		return 0, err
	}
	users := g.Users()
	sc := pattern.NewScanner(g) // the graph does not change until every place is checked
	var found []*qkvMatch
	for _, m := range ms {
		if c := q.check(g, sc, m, users); c != nil {
			found = append(found, c)
		}
	}
	made := 0
	for _, c := range found {
		err := pattern.ReplaceJointly([]*pattern.Match{c.m, c.mv}, func(b *graph.Builder) ([]*graph.Value, error) {
			attrs := graph.Attrs{"heads": c.heads, "kv_heads": c.kvHeads, "inv_freq": c.invFreq, "scaling": c.scaling}
			if q.nq == nil {
				return b.Apply("qkv_rope", attrs, c.m.Get(q.x), c.m.Get(q.pos)), nil
			}
			attrs["eps"] = c.eps
			return b.Apply("qkv_norm_rope", attrs, c.m.Get(q.x), c.m.Get(q.wq), c.m.Get(q.wk), c.m.Get(q.pos)), nil
		})
		if errors.Is(err, pattern.ErrNoPlace) {
			continue
		}
		if err != nil {
			return 0, err
		}
		made++
	}
	return made, nil
}
