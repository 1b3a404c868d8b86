package transform

import (
	"context"
	"errors"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform/pattern"
)

// MatchRoPE replaces the rotary embedding of each layer's q and k with one rope op.
var MatchRoPE = &Transform{
	Name:  "match_rope_pattern",
	Stage: PatternMatcher,
	Doc: `Replaces rotary position embedding with one rope op per layer. Each application
x*cos + rotate_half(x)*sin (graph.ApplyRotary) on x[B,heads,S,D] is matched with cos and sin
as wildcards, since they are computed once and shared by every layer; the tables are then
recognised where they are computed (graph.DecomposeRotaryTables: positions ⊗ inv_freq,
concatenated twice, cos and sin, an optional scaling multiply, an optional cast to x's dtype,
reshaped to [B,1,S,D]), which gives rope its positions and its inv_freq and scaling
attributes. The two applications of one layer that read the same tables (the same scope, in
graph order; q is the one with more heads, or the first) become one rope node with outputs
(q, k). An application left without a partner is not replaced. The shared tables stay until
the last layer is rewritten; dead code removal then takes them. Matches counts the rope nodes
made, one per layer.`,
	Run: runMatchRoPE,
}

func init() { Register(MatchRoPE) }

// rotaryPattern is graph.ApplyRotary with the tables as wildcards.
type rotaryPattern struct {
	p                *pattern.Pattern
	x, cos, sin      *graph.Value
	hi, lo, rot, out *graph.Value
}

func newRotaryPattern() *rotaryPattern {
	r := &rotaryPattern{p: pattern.New("apply_rotary")}
	r.x = r.p.Any("x", tensor.F32, graph.Shape{symB, graph.D(4), symS, graph.D(16)})
	table := graph.Shape{symB, graph.D(1), symS, graph.D(16)}
	r.cos, r.sin = r.p.Any("cos", tensor.F32, table), r.p.Any("sin", tensor.F32, table)
	b := r.p.Builder()
	r.hi = b.Slice(r.x, -1, 8, 16)
	r.lo = b.Slice(r.x, -1, 0, 8)
	r.rot = b.Concat(-1, b.Neg(r.hi), r.lo)
	for _, v := range []*graph.Value{r.hi, r.lo, r.rot} {
		r.p.IgnoreAttrs(v)
	}
	r.out = b.Add(b.Mul(r.x, r.cos), b.Mul(r.rot, r.sin))
	r.p.Root(r.out)
	r.p.Where(r.check)
	return r
}

// check holds an application to what rope computes for one input, tables aside.
func (r *rotaryPattern) check(m *pattern.Match) bool {
	x := m.Get(r.x)
	s := x.Type.Shape
	if len(s) != 4 || s[3].IsSym() || s[3].Size == 0 || s[3].Size%2 != 0 {
		return false
	}
	d := s[3].Size
	slice := func(pv *graph.Value, start, end int) bool {
		a := m.Node(pv).Attrs
		return isAxis(a.Int("axis"), 4, 3) && a.Int("start") == start && a.Int("end") == end && a.Int("step") == 1
	}
	if !slice(r.hi, d/2, d) || !slice(r.lo, 0, d/2) || !isAxis(m.Node(r.rot).Attrs.Int("axis"), 4, 3) {
		return false
	}
	want := graph.Type{DType: x.Type.DType, Shape: graph.Shape{s[0], graph.D(1), s[2], s[3]}}
	return m.Get(r.cos).Type.Equal(want) && m.Get(r.sin).Type.Equal(want) && m.Get(r.out).Type.Equal(x.Type)
}

// application is one matched rotary application with its tables recognised.
type application struct {
	m      *pattern.Match
	x      *graph.Value
	tables *tableInfo
	key    [2]*graph.Value // cos and sin
}

func runMatchRoPE(_ context.Context, _ *Context, g *graph.Graph, _ any) (Info, error) {
	r := newRotaryPattern()
	ms, err := r.p.FindAll(g)
	if err != nil {
		return Info{}, err
	}
	tables := newTableMatcher(g)
	var apps []*application
	for _, m := range ms {
		x, cos, sin := m.Get(r.x), m.Get(r.cos), m.Get(r.sin)
		t := tables.pair(cos, sin)
		if t == nil || t.dtype != x.Type.DType || 2*len(t.invFreq) != x.Type.Shape[3].Size {
			continue
		}
		if ps := t.positions.Type.Shape; ps[0] != x.Type.Shape[0] || ps[1] != x.Type.Shape[2] {
			continue
		}
		apps = append(apps, &application{m: m, x: x, tables: t, key: [2]*graph.Value{cos, sin}})
	}
	made := 0
	for _, pair := range pairApplications(apps) {
		q, k := pair[0], pair[1]
		if k.x.Type.Shape[1].Size > q.x.Type.Shape[1].Size {
			q, k = k, q
		}
		t := q.tables
		err := pattern.ReplaceJointly([]*pattern.Match{q.m, k.m}, func(b *graph.Builder) ([]*graph.Value, error) {
			attrs := graph.Attrs{"inv_freq": t.invFreq, "scaling": t.scaling}
			return b.Apply("rope", attrs, q.m.Get(r.x), k.m.Get(r.x), t.positions), nil
		})
		if errors.Is(err, pattern.ErrNoPlace) {
			continue // q and k that no single place can serve: leave them be
		}
		if err != nil {
			return Info{}, err
		}
		made++
	}
	// The shared tables die with the last layer's rewrite; the optimizer sweeps them.
	return Info{Matches: made, Clean: made == 0, ValidShapes: true}, nil
}

// pairApplications pairs the applications (in graph order) that read the same tables: each
// with the next unpaired one of the same scope, or failing that the next unpaired one.
func pairApplications(apps []*application) [][2]*application {
	var pairs [][2]*application
	paired := make([]bool, len(apps))
	for i, a := range apps {
		if paired[i] {
			continue
		}
		partner := -1
		for j := i + 1; j < len(apps); j++ {
			if paired[j] || apps[j].key != a.key {
				continue
			}
			if apps[j].m.Root.Scope == a.m.Root.Scope {
				partner = j
				break
			}
			if partner < 0 {
				partner = j
			}
		}
		if partner < 0 {
			continue
		}
		paired[i], paired[partner] = true, true
		pairs = append(pairs, [2]*application{a, apps[partner]})
	}
	return pairs
}
