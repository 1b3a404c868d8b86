package transform

import (
	"math"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform/pattern"
)

// Patterns and checks that several pattern_matcher transforms share: the primitive forms of
// graph/decompose.go (repeat_kv, the causal mask, the rotary tables) and small predicates on
// matched values. The example types given to wildcards only let the pattern builder infer
// types; every check on the graph's types is explicit.

var (
	symB = graph.Sym("B")
	symS = graph.Sym("S")
)

// scalarConst returns the value of the constant matched by pv when it is of dtype dt and has
// one element (rank 0, or every dimension 1). The fused ops rebuild such constants as dt
// scalars, so the dtype must agree for the decomposition to compute the same thing.
func scalarConst(m *pattern.Match, pv *graph.Value, dt tensor.DType) (float64, bool) {
	v := m.Get(pv)
	if v == nil || v.Producer == nil || v.Producer.Op != graph.OpConst || v.Type.DType != dt {
		return 0, false
	}
	for _, d := range v.Type.Shape {
		if d != graph.D(1) {
			return 0, false
		}
	}
	return m.Scalar(pv)
}

// isAxis reports whether axis (possibly negative) names axis want of a rank-rank tensor.
func isAxis(axis, rank, want int) bool {
	a, err := graph.NormAxis(axis, rank)
	return err == nil && a == want
}

// isLastAxisOnly reports whether axes lists exactly the last axis of a rank-rank tensor.
func isLastAxisOnly(axes []int, rank int) bool {
	return len(axes) == 1 && isAxis(axes[0], rank, rank-1)
}

// castTo reports whether the optional cast matched by pv is absent or casts to dt.
func castTo(m *pattern.Match, pv *graph.Value, dt tensor.DType) bool {
	n := m.Node(pv)
	return n == nil || n.Attrs.DType("dtype") == dt
}

// shapeIs reports whether s has exactly the given dimensions.
func shapeIs(s graph.Shape, dims ...graph.Dim) bool { return s.Equal(graph.Shape(dims)) }

// isPositions reports whether v can be the positions input of a fused op: integer [B,S].
func isPositions(v *graph.Value) bool {
	return v != nil && v.Type.DType.IsInt() && len(v.Type.Shape) == 2
}

// repeatKV is the pattern of graph.DecomposeRepeatKV: x[B,KV,S,D] reshaped to
// [B,KV,1,S,D], expanded to [B,KV,n,S,D] and reshaped to [B,KV*n,S,D].
type repeatKV struct {
	p                *pattern.Pattern
	x, r1, exp, root *graph.Value
}

func newRepeatKV() *repeatKV {
	r := &repeatKV{p: pattern.New("repeat_kv")}
	r.x = r.p.Any("x", tensor.F32, graph.Shape{symB, graph.D(2), symS, graph.D(16)})
	b := r.p.Builder()
	r.r1 = b.Reshape(r.x, symB, graph.D(2), graph.D(1), symS, graph.D(16))
	r.exp = b.Expand(r.r1, symB, graph.D(2), graph.D(3), symS, graph.D(16))
	r.root = b.Reshape(r.exp, symB, graph.D(6), symS, graph.D(16))
	for _, v := range []*graph.Value{r.r1, r.exp, r.root} {
		r.p.IgnoreAttrs(v, "shape")
	}
	r.p.Root(r.root)
	r.p.Where(func(m *pattern.Match) bool {
		_, ok := r.factor(m)
		return ok
	})
	return r
}

// factor checks the shapes of a match and returns the repeat count n.
func (r *repeatKV) factor(m *pattern.Match) (int, bool) {
	s := m.Get(r.x).Type.Shape
	if len(s) != 4 || s[1].IsSym() || s[1].Size < 1 {
		return 0, false
	}
	e := m.Get(r.exp).Type.Shape
	if len(e) != 5 || e[2].IsSym() || e[2].Size < 1 {
		return 0, false
	}
	n := e[2].Size
	ok := shapeIs(m.Get(r.r1).Type.Shape, s[0], s[1], graph.D(1), s[2], s[3]) &&
		shapeIs(e, s[0], s[1], graph.D(n), s[2], s[3]) &&
		shapeIs(m.Get(r.root).Type.Shape, s[0], graph.D(s[1].Size*n), s[2], s[3])
	return n, ok
}

// causalMask is the pattern of graph.DecomposeCausalMask, with or without the sliding window
// term: where(le(k, q) [and gt(k + window, q)], 0, -inf) with q = positions as [B,1,S,1]
// and k = positions as [B,1,1,S].
type causalMask struct {
	p                        *pattern.Pattern
	pos, qp, kp, win, result *graph.Value
	windowed                 bool
}

func newCausalMask(windowed bool) *causalMask {
	name := "causal_mask"
	if windowed {
		name = "sliding_window_mask"
	}
	c := &causalMask{p: pattern.New(name), windowed: windowed}
	c.pos = c.p.Any("positions", tensor.I32, graph.Shape{symB, symS})
	b := c.p.Builder()
	c.qp = b.Reshape(c.pos, symB, graph.D(1), symS, graph.D(1))
	c.kp = b.Reshape(c.pos, symB, graph.D(1), graph.D(1), symS)
	c.p.IgnoreAttrs(c.qp, "shape")
	c.p.IgnoreAttrs(c.kp, "shape")
	allowed := b.Compare("le", c.kp, c.qp)
	if windowed {
		c.win = c.p.Const("window", tensor.I32)
		allowed = b.And(allowed, b.Compare("gt", b.Add(c.kp, c.win), c.qp))
	}
	c.result = b.Where(allowed, b.Scalar(tensor.F32, 0), b.Scalar(tensor.F32, math.Inf(-1)))
	c.p.Root(c.result)
	c.p.Where(func(m *pattern.Match) bool {
		_, ok := c.window(m)
		return ok
	})
	return c
}

// window checks a match and returns its window (0 for the plain causal mask).
func (c *causalMask) window(m *pattern.Match) (int, bool) {
	pos := m.Get(c.pos)
	if !isPositions(pos) || m.Get(c.result).Type.DType != tensor.F32 {
		return 0, false
	}
	ps := pos.Type.Shape
	if !shapeIs(m.Get(c.qp).Type.Shape, ps[0], graph.D(1), ps[1], graph.D(1)) ||
		!shapeIs(m.Get(c.kp).Type.Shape, ps[0], graph.D(1), graph.D(1), ps[1]) {
		return 0, false
	}
	if !c.windowed {
		return 0, true
	}
	w, ok := scalarConst(m, c.win, pos.Type.DType)
	if !ok || w < 1 || w != math.Trunc(w) || w > math.MaxInt32 {
		return 0, false
	}
	return int(w), true
}

// maskInfo is what a recognised causal mask tells a fused attention op.
type maskInfo struct {
	positions *graph.Value
	window    int
}

// maskMatcher recognises the mask values that attention reads. The mask is computed once
// and shared by every layer, so it is matched with MatchShared and remembered.
type maskMatcher struct {
	g        *graph.Graph
	patterns []*causalMask
	seen     map[*graph.Value]*maskInfo
}

func newMaskMatcher(g *graph.Graph) *maskMatcher {
	return &maskMatcher{g: g, patterns: []*causalMask{newCausalMask(true), newCausalMask(false)}, seen: map[*graph.Value]*maskInfo{}}
}

// match returns the positions and window of mask, or nil when it is not a causal mask.
func (mm *maskMatcher) match(mask *graph.Value) *maskInfo {
	if info, ok := mm.seen[mask]; ok {
		return info
	}
	var info *maskInfo
	if mask != nil && mask.Producer != nil {
		for _, c := range mm.patterns {
			if m, ok := c.p.MatchShared(mm.g, mask.Producer); ok {
				w, _ := c.window(m)
				info = &maskInfo{positions: m.Get(c.pos), window: w}
				break
			}
		}
	}
	mm.seen[mask] = info
	return info
}

// rotaryTable is the pattern of one table of graph.DecomposeRotaryTables as ApplyRotary
// reads it: fn(concat(f, f)) with f = reshape(cast(positions, f32), [B,S,1]) * inv_freq,
// optionally times a scaling constant, optionally cast, then reshaped to [B,1,S,D].
type rotaryTable struct {
	p                        *pattern.Pattern
	pos, pf, inv, freqs, emb *graph.Value
	scale, cast, root        *graph.Value
	scaled                   bool
}

func newRotaryTable(fn string, scaled bool) *rotaryTable {
	name := "rotary_" + fn
	if scaled {
		name += "_scaled"
	}
	r := &rotaryTable{p: pattern.New(name), scaled: scaled}
	r.pos = r.p.Any("positions", tensor.I32, graph.Shape{symB, symS})
	r.inv = r.p.Const("inv_freq", tensor.F32)
	b := r.p.Builder()
	r.pf = b.Reshape(b.Cast(r.pos, tensor.F32), symB, symS, graph.D(1))
	r.p.IgnoreAttrs(r.pf, "shape")
	r.freqs = b.Mul(r.pf, r.inv)
	r.emb = b.Concat(-1, r.freqs, r.freqs)
	r.p.IgnoreAttrs(r.emb, "axis")
	t := b.Unary(fn, r.emb)
	if scaled {
		r.scale = r.p.Const("scaling", tensor.F32)
		t = b.Mul(t, r.scale)
	}
	r.cast = b.Cast(t, tensor.F32)
	r.p.Optional(r.cast)
	r.p.IgnoreAttrs(r.cast, "dtype")
	r.root = b.Reshape(r.cast, symB, graph.D(1), symS, graph.D(2))
	r.p.IgnoreAttrs(r.root, "shape")
	r.p.Root(r.root)
	r.p.Where(func(m *pattern.Match) bool {
		_, ok := r.read(m)
		return ok
	})
	return r
}

// tableInfo is what a recognised rotary table tells the rope op.
type tableInfo struct {
	positions *graph.Value
	emb       *graph.Value // the shared concat(f, f), to pair a cos table with its sin table
	invFreq   []float64
	scaling   float64
	dtype     tensor.DType
}

// read checks a match and returns what it computes.
func (r *rotaryTable) read(m *pattern.Match) (*tableInfo, bool) {
	pos := m.Get(r.pos)
	if !isPositions(pos) {
		return nil, false
	}
	ps := pos.Type.Shape
	emb := m.Get(r.emb).Type.Shape
	if len(emb) != 3 || emb[2].IsSym() || emb[2].Size%2 != 0 || emb[2].Size == 0 {
		return nil, false
	}
	d := emb[2].Size
	if !shapeIs(m.Get(r.pf).Type.Shape, ps[0], ps[1], graph.D(1)) ||
		!shapeIs(m.Get(r.freqs).Type.Shape, ps[0], ps[1], graph.D(d/2)) ||
		!isAxis(m.Node(r.emb).Attrs.Int("axis"), 3, 2) ||
		!shapeIs(m.Get(r.root).Type.Shape, ps[0], graph.D(1), ps[1], graph.D(d)) {
		return nil, false
	}
	inv := m.Get(r.inv)
	vals, _ := m.Const(r.inv)
	if inv.Type.DType != tensor.F32 || !shapeIs(inv.Type.Shape, graph.D(d/2)) {
		return nil, false
	}
	invFreq := make([]float64, d/2)
	for i := range invFreq {
		switch len(vals) {
		case 1:
			invFreq[i] = vals[0]
		case d / 2:
			invFreq[i] = vals[i]
		default:
			return nil, false
		}
	}
	scaling := 1.0
	if r.scaled {
		s, ok := scalarConst(m, r.scale, tensor.F32)
		if !ok {
			return nil, false
		}
		scaling = s
	}
	return &tableInfo{positions: pos, emb: m.Get(r.emb), invFreq: invFreq, scaling: scaling, dtype: m.Get(r.root).Type.DType}, true
}

// tableMatcher recognises the cos and sin values that rotary applications read; they are
// shared by every layer, so they are matched with MatchShared and remembered.
type tableMatcher struct {
	g        *graph.Graph
	patterns map[string][]*rotaryTable
	seen     map[tableKey]*tableInfo
}

type tableKey struct {
	fn string
	v  *graph.Value
}

func newTableMatcher(g *graph.Graph) *tableMatcher {
	return &tableMatcher{g: g, seen: map[tableKey]*tableInfo{}, patterns: map[string][]*rotaryTable{
		"cos": {newRotaryTable("cos", true), newRotaryTable("cos", false)},
		"sin": {newRotaryTable("sin", true), newRotaryTable("sin", false)},
	}}
}

// match returns what the table v of function fn (cos or sin) computes, or nil.
func (tm *tableMatcher) match(fn string, v *graph.Value) *tableInfo {
	key := tableKey{fn, v}
	if info, ok := tm.seen[key]; ok {
		return info
	}
	var info *tableInfo
	if v != nil && v.Producer != nil {
		for _, r := range tm.patterns[fn] {
			if m, ok := r.p.MatchShared(tm.g, v.Producer); ok {
				info, _ = r.read(m)
				break
			}
		}
	}
	tm.seen[key] = info
	return info
}

// pair returns the rope attributes of the cos and sin tables when they belong together: the
// same positions and frequencies, the same scaling and dtype.
func (tm *tableMatcher) pair(cos, sin *graph.Value) *tableInfo {
	c, s := tm.match("cos", cos), tm.match("sin", sin)
	if c == nil || s == nil || c.emb != s.emb || c.scaling != s.scaling || c.dtype != s.dtype {
		return nil
	}
	return c
}
