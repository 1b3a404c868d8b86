package graph

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/loom-ml/loom/tensor"
)

var (
	symB = Sym("B")
	symS = Sym("S")
)

// roundTripGraphs builds graphs that together use every op of the catalog, symbolic dims,
// multi-output split, sliced and whole params, scopes that need quoting and awkward floats.
func roundTripGraphs(t testing.TB) map[string]*Graph {
	t.Helper()
	builders := map[string]func() (*Graph, error){
		"llama_block":  buildLlamaBlock,
		"everything":   buildEverything,
		"sharded":      buildSharded,
		"no_inputs":    buildNoInputs,
		"identity":     buildIdentity,
		"quoted_names": buildQuotedNames,
		"fused":        buildFused,
		"collective":   buildCollective,
		"cp":           buildCP,
		"packed":       buildPacked,
		"moe":          buildMoE,
		"moe_fused":    buildMoEFused,
		"moe_a2a":      buildMoEAllToAll,
		"fp8":          buildFP8,
	}
	out := map[string]*Graph{}
	for name, build := range builders {
		g, err := build()
		if err != nil {
			t.Fatalf("build %s: %v", name, err)
		}
		out[name] = g
	}
	return out
}

// buildLlamaBlock is one decoder layer the way a frontend writes it: RMSNorm, rotary
// embedding, causal attention with GQA (repeat by expand), SwiGLU.
func buildLlamaBlock() (*Graph, error) {
	const d, heads, kvHeads, hd, ff, vocab = 64, 4, 2, 16, 128, 512
	b := NewBuilder("llama")
	ids := b.Input("input_ids", tensor.I32, Shape{symB, symS})
	positions := b.Input("positions", tensor.I32, Shape{symB, symS})
	b.SetScope("model")
	emb := b.Param("model.embed_tokens.weight", tensor.BF16, Dims(vocab, d))
	x := b.Cast(b.Embedding(emb, ids), tensor.F32)

	rmsnorm := func(x *Value, key string) *Value {
		ms := b.Reduce("mean", b.Mul(x, x), true, -1)
		r := b.Unary("rsqrt", b.Add(ms, b.Scalar(tensor.F32, 1e-05)))
		return b.Mul(b.Mul(x, r), b.Cast(b.Param(key, tensor.BF16, Dims(d)), tensor.F32))
	}
	prev := b.SetScope("model.layers.0.input_layernorm")
	h := rmsnorm(x, "model.layers.0.input_layernorm.weight")

	b.SetScope("model.layers.0.self_attn")
	proj := func(x *Value, name string, out int) *Value {
		w := b.Param("model.layers.0.self_attn."+name+".weight", tensor.BF16, Dims(out, d))
		return b.Linear(x, b.Cast(w, tensor.F32))
	}
	heads4 := func(x *Value, n int) *Value { // [B,S,n*hd] -> [B,n,S,hd]
		return b.Transpose(b.Reshape(x, symB, symS, D(n), D(hd)), 0, 2, 1, 3)
	}
	q := heads4(proj(h, "q_proj", heads*hd), heads)
	k := heads4(proj(h, "k_proj", kvHeads*hd), kvHeads)
	v := heads4(proj(h, "v_proj", kvHeads*hd), kvHeads)

	// Rotary embedding: angles = positions * inv_freq, rotate halves.
	invFreq := b.Div(b.Scalar(tensor.F32, 1.0), b.Pow(b.Scalar(tensor.F32, 10000.0),
		b.Div(b.Cast(b.Iota(tensor.I32, Dims(hd/2), 0), tensor.F32), b.Scalar(tensor.F32, hd/2))))
	ang := b.Mul(b.Reshape(b.Cast(positions, tensor.F32), symB, D(1), symS, D(1)), invFreq) // [B,1,S,hd/2]
	cos := b.Concat(-1, b.Unary("cos", ang), b.Unary("cos", ang))
	sin := b.Concat(-1, b.Unary("sin", ang), b.Unary("sin", ang))
	rope := func(x *Value) *Value {
		halves := b.Split(x, -1, hd/2, hd/2)
		rot := b.Concat(-1, b.Neg(halves[1]), halves[0])
		return b.Add(b.Mul(x, cos), b.Mul(rot, sin))
	}
	q, k = rope(q), rope(k)

	repeat := func(x *Value) *Value { // [B,kv,S,hd] -> [B,heads,S,hd]
		x = b.Reshape(x, symB, D(kvHeads), D(1), symS, D(hd))
		x = b.Expand(x, symB, D(kvHeads), D(heads/kvHeads), symS, D(hd))
		return b.Reshape(x, symB, D(heads), symS, D(hd))
	}
	k, v = repeat(k), repeat(v)
	scores := b.Mul(b.Matmul(q, b.Transpose(k, 0, 1, 3, 2)), b.Scalar(tensor.F32, 0.25))
	row := b.Iota(tensor.I64, Shape{symS, symS}, 0)
	col := b.Iota(tensor.I64, Shape{symS, symS}, 1)
	mask := b.Compare("le", col, row)
	scores = b.Where(mask, scores, b.Scalar(tensor.F32, math.Inf(-1)))
	attn := b.Matmul(b.Softmax(scores, -1), v)
	attn = b.Reshape(b.Transpose(attn, 0, 2, 1, 3), symB, symS, D(heads*hd))
	x = b.Add(x, proj(attn, "o_proj", d))

	b.SetScope("model.layers.0.mlp")
	h = rmsnorm(x, "model.layers.0.post_attention_layernorm.weight")
	mlp := func(name string, out, in int) *Value {
		return b.Cast(b.Param("model.layers.0.mlp."+name+".weight", tensor.BF16, Dims(out, in)), tensor.F32)
	}
	gate := b.Unary("silu", b.Linear(h, mlp("gate_proj", ff, d)))
	up := b.Linear(h, mlp("up_proj", ff, d))
	x = b.Add(x, b.Linear(b.Mul(gate, up), mlp("down_proj", d, ff)))

	b.SetScope(prev)
	x = rmsnorm(x, "model.norm.weight")
	logits := b.Linear(x, b.Cast(emb, tensor.F32)) // tied embeddings: the same param twice
	b.Output(logits)
	return b.Build()
}

// buildEverything uses the ops the llama block does not.
func buildEverything() (*Graph, error) {
	b := NewBuilder("everything")
	x := b.Input("x", tensor.F32, Shape{symB, D(6)})
	y := b.Input("y", tensor.F32, Shape{D(6)})
	n := b.Input("n", tensor.I64, Shape{symB, D(1)})
	m := b.Input("m", tensor.I32, Shape{})
	b.SetScope("arith")
	a := b.Sub(x, y)
	a = b.Maximum(b.Minimum(a, b.Scalar(tensor.F32, 6.0)), b.Scalar(tensor.F32, -6.0))
	a = b.Div(b.Pow(a, b.Scalar(tensor.F32, 2.0)), b.Add(b.Unary("abs", a), b.Scalar(tensor.F32, 1.0)))
	for _, op := range []string{"exp", "log", "sqrt", "reciprocal", "tanh", "sigmoid"} {
		a = b.Unary(op, b.Unary("abs", a))
	}
	i := b.Add(b.Neg(b.Unary("abs", n)), m) // i64 with i32 promotes to i64
	b.SetScope("compare")
	c1 := b.And(b.Compare("eq", x, y), b.Compare("ne", x, y))
	c2 := b.Op("logical_or", nil, b.Compare("lt", x, y), b.Compare("gt", x, y))
	c3 := b.Op("logical_not", nil, b.And(b.Compare("ge", x, y), b.Compare("le", x, y)))
	c := b.Op("logical_or", nil, b.And(c1, c2), c3)
	a = b.Where(c, a, b.Cast(i, tensor.F32))
	b.SetScope("shape")
	s := b.Reduce("sum", a, false, 1)                                         // [B]
	mx := b.Reduce("max", a, true, 0, 1)                                      // [1,1]
	_ = b.Op("gather", Attrs{"axis": 1}, a, b.Iota(tensor.I32, Dims(2), 0))   // [B,2]
	sl := b.Op("slice", Attrs{"axis": 1, "start": 1, "end": 6, "step": 2}, a) // [B,3]
	parts := b.Split(a, 1, 1, 2, 3)
	cat := b.Concat(1, parts[2], parts[0], parts[1], sl) // [B,9]
	ex := b.Expand(b.Reshape(s, symB, D(1)), symB, D(9))
	out := b.Add(b.Add(cat, ex), mx)
	b.SetScope("")
	b.Output(out, parts[1], c)
	return b.Build()
}

// buildSharded has sliced params (as sharding leaves them) and a graph name and scopes that
// need quoting.
func buildSharded() (*Graph, error) {
	b := NewBuilder("tiny llama (tp=2, rank 1)")
	x := b.Input("hidden", tensor.BF16, Shape{symB, symS, D(64)})
	b.SetScope("model.layers.0 self_attn/q")
	wq := b.Op(OpParam, Attrs{"key": "model.layers.0.self_attn.q_proj.weight", "dtype": tensor.BF16,
		"shape": Dims(64, 64), "slice_dim": 0, "slice_index": 1, "slice_count": 2})
	b.SetScope(`quote"d\name`)
	wo := b.Op(OpParam, Attrs{"key": "model.layers.0.self_attn.o_proj.weight", "dtype": tensor.BF16,
		"shape": Dims(64, 64), "slice_dim": 1, "slice_index": 0, "slice_count": 4})
	b.SetScope("层.0")
	// A key that is not a valid value name: the value gets a number.
	bias := b.Param("weird key/with spaces", tensor.F32, Dims(16))
	h := b.Linear(x, wq)                                      // [B,S,32]
	h = b.Add(b.Cast(b.Slice(h, 2, 0, 16), tensor.F32), bias) // [B,S,16]
	h = b.Linear(b.Cast(h, tensor.BF16), wo)                  // [B,S,64]
	b.Output(h)
	return b.Build()
}

// buildNoInputs is made of constants only, with floats that are hard to print.
func buildNoInputs() (*Graph, error) {
	b := NewBuilder("consts")
	c := b.Const(tensor.F32, Dims(3, 3), 1e-05, math.Inf(-1), math.Inf(1), math.NaN(), 2.0, -0.5, 1e+20, 5e-324, 0.1)
	d := b.Const(tensor.F16, Dims(2, 1), math.Copysign(0, -1), 1.0/3)
	e := b.Iota(tensor.F32, Dims(3, 3), 1)
	b.Output(b.Mul(c, e), d, b.Scalar(tensor.Bool, 1), b.Const(tensor.I32, Shape{}, -7))
	return b.Build()
}

// buildIdentity returns its input unchanged.
func buildIdentity() (*Graph, error) {
	b := NewBuilder("id")
	x := b.Input("x", tensor.F32, Shape{})
	b.Output(x, x)
	return b.Build()
}

// buildQuotedNames uses value names that only the text form's name rules allow: numbers,
// dots, names that look like keywords.
func buildQuotedNames() (*Graph, error) {
	b := NewBuilder("")
	x := b.Input("return", tensor.F32, Shape{D(2), Sym("T_1")})
	y := b.Input("0", tensor.F32, Shape{D(2), Sym("T_1")})
	z := b.Named("graph", "add", nil, x, y)
	w := b.Named(".", "mul", nil, z, z)
	b.SetScope("inf")
	v := b.Named("1e-05", "softmax", Attrs{"axis": 0}, w)
	b.Output(v)
	return b.Build()
}

// buildFused uses the fused ops, as the pattern matcher leaves them.
func buildFused() (*Graph, error) {
	b := NewBuilder("fused")
	x := b.Input("x", tensor.BF16, Shape{symB, symS, D(64)})
	res := b.Input("residual", tensor.BF16, Shape{symB, symS, D(64)})
	pos := b.Input("positions", tensor.I64, Shape{symB, symS})
	b.SetScope("model.layers.0")
	w := b.Param("model.layers.0.input_layernorm.weight", tensor.BF16, Dims(64))
	h := b.Op("rmsnorm", Attrs{"eps": 1e-05}, x, w)
	normed := b.Apply("add_rmsnorm", Attrs{"eps": 1e-06}, h, res, w) // (normed, sum)
	q := b.Transpose(b.Reshape(normed[0], symB, symS, D(4), D(16)), 0, 2, 1, 3)
	k := b.Transpose(b.Reshape(b.Slice(normed[1], -1, 0, 32), symB, symS, D(2), D(16)), 0, 2, 1, 3)
	invFreq := make([]float64, 8)
	for i := range invFreq {
		invFreq[i] = math.Pow(10000, -float64(i)/8)
	}
	qk := b.Apply("rope", Attrs{"inv_freq": invFreq, "scaling": 0.5}, q, k, pos)
	att := b.Op("sdpa", Attrs{"scale": 0.25, "window": 4}, qk[0], qk[1], qk[1], pos)
	kc := b.Input("kv_cache.0.k", tensor.BF16, Shape{Sym("NB"), D(16), D(2), D(16)})
	vc := b.Input("kv_cache.0.v", tensor.BF16, Shape{Sym("NB"), D(16), D(2), D(16)})
	slots := b.Input("slot_mapping", tensor.I32, Shape{symS})
	seqs := b.Input("token_seq", tensor.I32, Shape{symS})
	tables := b.Input("block_tables", tensor.I32, Shape{Sym("N"), Sym("M")})
	att = b.Op("paged_attention", Attrs{"scale": 0.25}, att, qk[1], qk[1], pos, kc, vc, slots, seqs, tables)
	out := b.Op("swiglu", nil, att, b.Op("repeat_kv", Attrs{"n": 2}, qk[1]))
	b.Output(out)
	return b.Build()
}

// buildCollective uses the collective ops, as sharding leaves them on a tp=2,dp=2 mesh.
func buildCollective() (*Graph, error) {
	b := NewBuilder("collective (tp=2,dp=2)")
	x := b.Input("x", tensor.BF16, Shape{symB, D(8), D(32)})
	b.SetScope("model.layers.0.mlp")
	r := b.Op("all_reduce", Attrs{"group": "tp", "group_size": 2}, x)
	m := b.Op("all_reduce", Attrs{"group": "dp", "group_size": 2, "op": "max", "strategy": "oneshot"}, r)
	g := b.Op("all_gather", Attrs{"group": "tp", "group_size": 2, "axis": -1}, m)                        // [B,8,64]
	s := b.Op("reduce_scatter", Attrs{"group": "tp", "group_size": 2, "axis": 1, "op": "max"}, g)        // [B,4,64]
	a := b.Op("all_to_all", Attrs{"group": "tp", "group_size": 2, "split_axis": 2, "concat_axis": 1}, s) // [B,8,32]
	// The fused collectives of post_load_fusion: a row-parallel linear with its reduction, and
	// a reduction joined with the residual add and the next norm.
	b.SetScope("model.layers.1.mlp")
	w := b.Op(OpParam, Attrs{"key": "model.layers.1.mlp.down_proj.weight", "dtype": tensor.BF16, "shape": Dims(32, 64), "slice_dim": 1, "slice_index": 1, "slice_count": 2})
	l := b.Op("linear_all_reduce", Attrs{"group": "tp", "group_size": 2, "strategy": "twoshot"}, a, w) // [B,8,32]
	b.SetScope("model.layers.2.input_layernorm")
	nw := b.Param("model.layers.2.input_layernorm.weight", tensor.BF16, Dims(32))
	n := b.Apply("all_reduce_add_rmsnorm", Attrs{"group": "tp", "group_size": 2, "eps": 1e-06}, l, a, nw)
	b.Output(b.Add(a, x), n[0], n[1])
	return b.Build()
}

func TestRoundTrip(t *testing.T) {
	for name, g := range roundTripGraphs(t) {
		t.Run(name, func(t *testing.T) {
			text := g.String()
			p, err := Parse(text)
			if err != nil {
				t.Fatalf("Parse: %v\n%s", err, text)
			}
			if got := p.String(); got != text {
				t.Errorf("print(parse(print(g))) differs:\n--- want\n%s--- got\n%s", text, got)
			}
			if err := Equal(g, p); err != nil {
				t.Errorf("Equal(built, parsed): %v", err)
			}
			if err := Equal(p, g.Clone()); err != nil {
				t.Errorf("Equal(parsed, clone): %v", err)
			}
		})
	}
}

// TestRoundTripCoversCatalog makes sure a new op gets into a round-trip graph.
func TestRoundTripCoversCatalog(t *testing.T) {
	used := map[string]bool{}
	for _, g := range roundTripGraphs(t) {
		for _, n := range g.Nodes {
			used[n.Op] = true
		}
	}
	for _, s := range Ops() {
		if !used[s.Name] {
			t.Errorf("op %s appears in no round-trip graph; add it to one in parse_test.go", s.Name)
		}
	}
}

func TestRoundTripText(t *testing.T) {
	g, err := buildSharded()
	if err != nil {
		t.Fatal(err)
	}
	text := g.String()
	for _, want := range []string{
		`graph "tiny llama (tp=2, rank 1)"(hidden: bf16[B,S,64]) {`,
		`= param "model.layers.0.self_attn.q_proj.weight" {shape=[64,64], slice_dim=0, slice_index=1, slice_count=2} : bf16[32,64] @"model.layers.0 self_attn/q"`,
		`{shape=[64,64], slice_dim=1, slice_count=4} : bf16[64,16] @"quote\"d\\name"`,
		`%2 = param "weird key/with spaces" : f32[16] @"层.0"`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %s\n%s", want, text)
		}
	}
	c, err := buildNoInputs()
	if err != nil {
		t.Fatal(err)
	}
	text = c.String()
	for _, want := range []string{
		"graph consts() {",
		"values=[1e-05,-inf,inf,nan,2.0,-0.5,1e+20,5e-324,0.1]",
		"values=[-0.0,0.3333333333333333]",
		"= iota() {shape=[3,3], axis=1, dtype=f32} : f32[3,3]",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %s\n%s", want, text)
		}
	}
	f, err := buildFused()
	if err != nil {
		t.Fatal(err)
	}
	text = f.String()
	for _, want := range []string{
		"= rmsnorm(%x, %model.layers.0.input_layernorm.weight) {eps=1e-05} : bf16[B,S,64] @model.layers.0",
		"%1, %2 = add_rmsnorm(%0, %residual, %model.layers.0.input_layernorm.weight) {eps=1e-06} : bf16[B,S,64], bf16[B,S,64]",
		"{inv_freq=[1.0,0.31622776601683794,",
		", scaling=0.5} : bf16[B,4,S,16], bf16[B,2,S,16]",
		"{scale=0.25, window=4}",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %s\n%s", want, text)
		}
	}
}

// TestParseNames checks that values created after parsing never take a parsed name.
func TestParseNames(t *testing.T) {
	g, err := Parse(`graph g(x: f32[2]) {
  %3 = neg(%x) : f32[2]
  %7 = neg(%3) : f32[2]
  %a = neg(%7) : f32[2]
  return %a
}`)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{"x": true, "3": true, "7": true, "a": true}
	for i, hint := range []string{"", "", "a", "x", "7", "fresh", "fresh"} {
		n, err := g.Append("neg", nil, []*Value{g.Outputs[0]}, "", hint)
		if err != nil {
			t.Fatal(err)
		}
		name := n.Out().Name
		if seen[name] {
			t.Fatalf("append %d (hint %q): name %s collides with an existing value", i, hint, name)
		}
		seen[name] = true
	}
	if _, err := g.AddInput("x", Type{tensor.F32, Dims(1)}); err == nil {
		t.Error("AddInput with a parsed name succeeded")
	}
	if err := Verify(g); err != nil {
		t.Error(err)
	}
}

func TestParseAccepts(t *testing.T) {
	tests := []struct {
		name, text string
		want       string // the canonical text; empty: the input itself
	}{
		{
			name: "defaults written out, comments, loose spacing",
			text: "// a comment\ngraph g ( x : f32[ B , 4 ] ) {\n" +
				"  %s = softmax ( %x ) { axis = -1 } : f32[B,4] @\"scope\" // trailing\n" +
				"  %m = sum(%s) {axes=[ 1 ], keepdim=false} : f32[B]\n" +
				"  return %m , %s\n}\n",
			want: "graph g(x: f32[B,4]) {\n  %s = softmax(%x) : f32[B,4] @scope\n  %m = sum(%s) {axes=[1]} : f32[B]\n  return %m, %s\n}\n",
		},
		{
			name: "param with explicit dtype and shape",
			text: "graph p() {\n  %w = param \"w\" {dtype=f32, shape=[2,3], slice_dim=-1} : f32[2,3]\n  return %w\n}\n",
			want: "graph p() {\n  %w = param \"w\" : f32[2,3]\n  return %w\n}\n",
		},
		{
			name: "floats written as integers and in other spellings",
			text: "graph c() {\n  %c = const() {dtype=f32, shape=[4], values=[1, -2, 1E-5, +Inf]} : f32[4]\n  return %c\n}",
			want: "graph c() {\n  %c = const() {dtype=f32, shape=[4], values=[1.0,-2.0,1e-05,inf]} : f32[4]\n  return %c\n}\n",
		},
		{
			name: "windows line ends",
			text: "graph w(x: f32[]) {\r\n  %y = neg(%x) : f32[]\r\n  return %y\r\n}\r\n",
			want: "graph w(x: f32[]) {\n  %y = neg(%x) : f32[]\n  return %y\n}\n",
		},
		{
			name: "empty attribute braces",
			text: "graph e(x: f32[]) {\n  %y = neg(%x) {} : f32[]\n  return %y\n}\n",
			want: "graph e(x: f32[]) {\n  %y = neg(%x) : f32[]\n  return %y\n}\n",
		},
		{
			name: "multiple outputs",
			text: "graph s(x: i32[6]) {\n  %a, %b = split(%x) {axis=0, sizes=[2,4]} : i32[2], i32[4]\n  return %b, %a\n}\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := Parse(tt.text)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			want := tt.want
			if want == "" {
				want = tt.text
			}
			if got := g.String(); got != want {
				t.Errorf("got\n%s\nwant\n%s", got, want)
			}
		})
	}
}

// parseErrorTests are texts Parse must reject; want are substrings of the error.
var parseErrorTests = []struct {
	name, text string
	want       []string
}{
	{"empty", "", []string{"1:1:", `expected "graph", found end of input`}},
	{"not a graph", "grap g() {}", []string{"1:1:", `expected "graph", found "grap"`}},
	{"no paren", "graph g {", []string{"1:9:", `expected '(' after the graph name`}},
	{"unknown op", "graph g(x: f32[2]) {\n  %0 = frob(%x) : f32[2]\n  return %0\n}", []string{"2:8:", `unknown op "frob"`}},
	{"undefined value", "graph g(x: f32[2]) {\n  %0 = neg(%y) : f32[2]\n  return %0\n}", []string{"2:12:", "undefined value %y"}},
	{"undefined output", "graph g(x: f32[2]) {\n  return %z\n}", []string{"2:10:", "undefined value %z"}},
	{"used before definition", "graph g(x: f32[2]) {\n  %0 = neg(%1) : f32[2]\n  %1 = neg(%x) : f32[2]\n  return %0\n}",
		[]string{"2:12:", "value %1 is used before its definition at 3:3"}},
	{"self use", "graph g(x: f32[2]) {\n  %0 = neg(%0) : f32[2]\n  return %0\n}", []string{"2:12:", "value %0 is used before its definition at 2:3"}},
	{"defined twice", "graph g(x: f32[2]) {\n  %x = neg(%x) : f32[2]\n  return %x\n}", []string{"2:3:", "value %x is defined twice (first at 1:9)"}},
	{"input twice", "graph g(x: f32[2], x: f32[2]) {\n  return %x\n}", []string{"1:20:", "value %x is defined twice"}},
	{"bad int attribute", "graph g(x: f32[2]) {\n  %0 = softmax(%x) {axis=1.5} : f32[2]\n  return %0\n}",
		[]string{"2:26:", "bad value for attribute axis of op softmax", `want an integer, found "1.5"`}},
	{"bad bool attribute", "graph g(x: f32[2]) {\n  %0 = sum(%x) {axes=[0], keepdim=yes} : f32[]\n  return %0\n}",
		[]string{"2:35:", "bad value for attribute keepdim of op sum", `want true or false, found "yes"`}},
	{"bad dtype attribute", "graph g(x: f32[2]) {\n  %0 = cast(%x) {dtype=f31} : f32[2]\n  return %0\n}",
		[]string{"2:24:", "bad value for attribute dtype of op cast", `unknown dtype "f31"`}},
	{"bad ints attribute", "graph g(x: f32[2]) {\n  %0 = sum(%x) {axes=[0;1]} : f32[]\n  return %0\n}",
		[]string{"bad value for attribute axes of op sum", "want ',' or ']'"}},
	{"bad float", "graph g() {\n  %0 = const() {dtype=f32, shape=[], values=[1e400]} : f32[]\n  return %0\n}",
		[]string{"2:46:", "bad value for attribute values of op const", `want a number, found "1e400"`}},
	{"bad shape attribute", "graph g(x: f32[2]) {\n  %0 = reshape(%x) {shape=[2,B.x]} : f32[2]\n  return %0\n}",
		[]string{"2:30:", "bad value for attribute shape of op reshape", `bad dimension "B.x"`}},
	{"shape attribute not a list", "graph g(x: f32[2]) {\n  %0 = reshape(%x) {shape=2} : f32[2]\n  return %0\n}",
		[]string{"2:27:", "bad value for attribute shape of op reshape", "want a shape such as [B,S,64]"}},
	{"unknown attribute", "graph g(x: f32[2]) {\n  %0 = neg(%x) {alpha=1} : f32[2]\n  return %0\n}", []string{"2:17:", `op neg has no attribute "alpha"`}},
	{"attribute twice", "graph g(x: f32[2]) {\n  %0 = softmax(%x) {axis=0, axis=0} : f32[2]\n  return %0\n}", []string{"2:29:", "attribute axis of op softmax is given twice"}},
	{"missing required attribute", "graph g(x: f32[2,3]) {\n  %0 = transpose(%x) : f32[3,2]\n  return %0\n}",
		[]string{"2:8:", "%0: transpose: missing required attribute perm (ints)"}},
	{"wrong arity", "graph g(x: f32[2]) {\n  %0 = add(%x) : f32[2]\n  return %0\n}", []string{"2:8:", "add takes 2 inputs"}},
	{"param without key", "graph g() {\n  %0 = param : f32[2]\n  return %0\n}", []string{"2:14:", "expected a quoted string after param"}},
	{"param key attribute", "graph g() {\n  %0 = param \"w\" {key=\"w\"} : f32[2]\n  return %0\n}", []string{"2:19:", "not as key="}},
	{"param with inputs", "graph g(x: f32[2]) {\n  %0 = param(%x) : f32[2]\n  return %0\n}", []string{"2:13:", "expected a quoted string after param"}},
	{"sliced param without shape", "graph g() {\n  %0 = param \"w\" {slice_dim=0, slice_count=2} : f32[2]\n  return %0\n}",
		[]string{"2:49:", "%0 is written as f32[2] but param gives f32[1]"}},
	{"type disagrees", "graph g(x: f32[2], y: f32[2]) {\n  %0 = add(%x, %y) : f32[3]\n  return %0\n}", []string{"2:22:", "%0 is written as f32[3] but add gives f32[2]"}},
	{"dtype disagrees", "graph g(x: f32[2]) {\n  %0 = cast(%x) {dtype=bf16} : f32[2]\n  return %0\n}", []string{"2:32:", "but cast gives bf16[2]"}},
	{"inference fails", "graph g(x: f32[2], y: f32[3]) {\n  %0 = add(%x, %y) : f32[3]\n  return %0\n}", []string{"2:8:", "%0 = add(f32[2], f32[3])", "do not broadcast"}},
	{"too few types", "graph g(x: f32[6]) {\n  %a, %b = split(%x) {axis=0, sizes=[2,4]} : f32[2]\n  return %a\n}", []string{"2:46:", "2 results are named but 1 types are given"}},
	{"too many results", "graph g(x: f32[2]) {\n  %a, %b = neg(%x) : f32[2], f32[2]\n  return %a\n}", []string{"2:22:", "neg gives 1 results here, 2 are written"}},
	{"bad dtype", "graph g(x: f33[2]) {\n  return %x\n}", []string{"1:12:", "bad type", `unknown dtype "f33"`}},
	{"bad dim", "graph g(x: f32[2.5]) {\n  return %x\n}", []string{"1:16:", `bad dimension "2.5"`}},
	{"negative dim", "graph g(x: f32[-2]) {\n  return %x\n}", []string{"1:12:", "input x: bad type f32[-2]: dimension 0 is negative"}},
	{"bad symbol", "graph g(x: f32[B.1]) {\n  return %x\n}", []string{"1:16:", `bad dimension "B.1"`}},
	{"shape not closed", "graph g(x: f32[2) {\n  return %x\n}", []string{"1:17:", "expected ']' to close a shape"}},
	{"no type", "graph g(x: f32[2]) {\n  %0 = neg(%x)\n  return %0\n}", []string{"3:3:", "expected ':' before the result types"}},
	{"no return", "graph g(x: f32[2]) {\n  %0 = neg(%x) : f32[2]\n}", []string{"3:1:", "expected a node (%name = op ...) or return"}},
	{"unterminated string", "graph g() {\n  %0 = param \"w : f32[2]\n  return %0\n}", []string{"2:14:", "unterminated string"}},
	{"bad escape", "graph g() {\n  %0 = param \"\\q\" : f32[2]\n  return %0\n}", []string{"2:14:", "bad quoted string"}},
	{"scope missing", "graph g(x: f32[2]) {\n  %0 = neg(%x) : f32[2] @\n  return %0\n}", []string{"2:26:", "expected a scope right after @"}},
	{"trailing text", "graph g(x: f32[2]) {\n  return %x\n}\nextra", []string{"4:1:", `unexpected "extra" after the end of the graph`}},
	{"no outputs", "graph g(x: f32[2]) {\n  return\n}", []string{"graph g has no outputs"}},
	{"empty value name", "graph g(x: f32[2]) {\n  % = neg(%x) : f32[2]\n  return %x\n}", []string{"2:3:", "expected a value name after %"}},
	{"column counts characters", "graph g(é: f32[2]) {\n  return %x\n}", []string{"1:9:", "expected an input name"}},
	{"undefined wins over later errors", "graph g(x: f32[2]) {\n  %0 = neg(%q) : f32[2]\n  %1 = frob(%0) : f32[2]\n  return %1\n}", []string{"2:12:", "undefined value %q"}},
	{"symbolic const", "graph g() {\n  %0 = const() {dtype=f32, shape=[B], values=[1.0]} : f32[B]\n  return %0\n}", []string{"2:8:", "const has a symbolic shape [B]"}},
}

func TestParseErrors(t *testing.T) {
	for _, tt := range parseErrorTests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := Parse(tt.text)
			if err == nil {
				t.Fatalf("Parse succeeded:\n%s", g)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestParseErrorType(t *testing.T) {
	_, err := Parse("graph g(x: f32[2]) {\n  %0 = frob(%x) : f32[2]\n  return %0\n}")
	var pe *ParseError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v is not a *ParseError", err)
	}
	if pe.Line != 2 || pe.Col != 8 {
		t.Errorf("position %d:%d, want 2:8", pe.Line, pe.Col)
	}
}

func TestParseAttrValue(t *testing.T) {
	nan := math.NaN()
	tests := []struct {
		typ     AttrType
		text    string
		want    any
		wantErr string
	}{
		{AttrFloat, "1e-05", 1e-05, ""},
		{AttrFloat, "2.0", 2.0, ""},
		{AttrFloat, "2", 2.0, ""},
		{AttrFloat, "-3.5", -3.5, ""},
		{AttrFloat, "inf", math.Inf(1), ""},
		{AttrFloat, "-inf", math.Inf(-1), ""},
		{AttrFloat, "nan", nan, ""},
		{AttrFloat, "1.5e+300", 1.5e+300, ""},
		{AttrFloat, "-0.0", math.Copysign(0, -1), ""},
		{AttrFloat, "1e999", nil, `want a number, found "1e999"`},
		{AttrFloat, "x", nil, `want a number, found "x"`},
		{AttrFloat, "0x1p-2", nil, `want a number, found "0x1p"`},
		{AttrFloat, "1_0", nil, `want a number, found "1_0"`},
		{AttrFloat, "-Inf", math.Inf(-1), ""},
		{AttrFloat, "", nil, "want a number, found nothing"},
		{AttrInt, "-12", -12, ""},
		{AttrInt, "0", 0, ""},
		{AttrInt, "99999999999999999999", nil, "want an integer"},
		{AttrInt, "1e3", nil, `want an integer, found "1e3"`},
		{AttrString, `"a\"b\n\u00e9"`, "a\"b\né", ""},
		{AttrString, `abc`, nil, "expected a quoted string"},
		{AttrBool, "true", true, ""},
		{AttrBool, "false", false, ""},
		{AttrBool, "1", nil, "want true or false"},
		{AttrInts, "[]", []int{}, ""},
		{AttrInts, "[1, -2,3]", []int{1, -2, 3}, ""},
		{AttrInts, "[1,]", nil, "want an integer, found nothing"},
		{AttrInts, "1", nil, "want a list in brackets"},
		{AttrFloats, "[1e-05,-inf,nan,2.0]", []float64{1e-05, math.Inf(-1), nan, 2}, ""},
		{AttrFloats, "[1.0", nil, "want ',' or ']' in a list, found end of input"},
		{AttrShape, "[B,S,64]", Shape{symB, symS, D(64)}, ""},
		{AttrShape, "[]", Shape{}, ""},
		{AttrShape, "[,]", nil, "expected a dimension"},
		{AttrDType, "bf16", tensor.BF16, ""},
		{AttrDType, "invalid", nil, "unknown dtype"},
		{AttrType(99), "1", nil, "cannot be written in text"},
	}
	for _, tt := range tests {
		p := &parser{src: tt.text, defs: map[string]valueDef{}}
		got, err := p.parseAttrValue(tt.typ)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s %q: error %v, want %q", tt.typ, tt.text, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s %q: %v", tt.typ, tt.text, err)
			continue
		}
		if !AttrEqual(got, tt.want) {
			t.Errorf("%s %q: got %#v, want %#v", tt.typ, tt.text, got, tt.want)
		}
		if f, ok := tt.want.(float64); ok && math.Signbit(f) != math.Signbit(got.(float64)) {
			t.Errorf("%s %q: sign lost", tt.typ, tt.text)
		}
		// What parses prints back as text that parses to the same value.
		p = &parser{src: FormatAttr(got), defs: map[string]valueDef{}}
		again, err := p.parseAttrValue(tt.typ)
		if err != nil || !AttrEqual(again, got) {
			t.Errorf("%s %q: reparse of %s gave %v, %v", tt.typ, tt.text, FormatAttr(got), again, err)
		}
	}
}

// checkReparse is the property FuzzParse checks: text that parses prints as text that parses
// back to an equal graph printing the same.
func checkReparse(t *testing.T, text string) {
	t.Helper()
	g, err := Parse(text)
	if err != nil {
		if strings.Contains(err.Error(), "panicked") {
			t.Fatalf("inference panicked: %v\n%s", err, text)
		}
		return
	}
	once := g.String()
	g2, err := Parse(once)
	if err != nil {
		t.Fatalf("printed graph does not parse: %v\n%s", err, once)
	}
	if twice := g2.String(); twice != once {
		t.Fatalf("print(parse(print(parse(text)))) differs:\n--- once\n%s--- twice\n%s", once, twice)
	}
	if err := Equal(g, g2); err != nil {
		t.Fatalf("Equal: %v", err)
	}
}

// TestParseTruncated parses prefixes of the round-trip texts, and the texts with one byte
// dropped (at up to 500 places each): a cheap, deterministic cousin of FuzzParse.
func TestParseTruncated(t *testing.T) {
	for name, g := range roundTripGraphs(t) {
		text := g.String()
		step := max(1, len(text)/500)
		if testing.Short() {
			step = max(1, len(text)/50)
		}
		for i := 0; i < len(text); i += step {
			checkReparse(t, text[:i])
			checkReparse(t, text[:i]+text[i+1:])
		}
		if _, err := Parse(text[:len(text)-3]); err == nil {
			t.Errorf("%s: a graph without its closing brace parsed", name)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, g := range roundTripGraphs(f) {
		f.Add(g.String())
	}
	for _, tt := range parseErrorTests {
		f.Add(tt.text)
	}
	f.Fuzz(checkReparse)
}

// buildPacked uses the fused ops over packed projections, qkv_rope, qkv_norm_rope and
// swiglu_packed, and
// their fusions with the linear before them.
func buildPacked() (*Graph, error) {
	b := NewBuilder("packed")
	x := b.Input("x", tensor.BF16, Shape{symB, symS, D(64)})
	pos := b.Input("positions", tensor.I32, Shape{symB, symS})
	w := b.Input("w", tensor.BF16, Shape{D(64), D(16)})
	b.SetScope("model.layers.0.self_attn")
	attrs := Attrs{"heads": 4, "kv_heads": 2, "inv_freq": []float64{1, 0.1, 0.01, 0.001}, "scaling": 0.75}
	qkv := b.Apply("qkv_rope", attrs, x, pos)
	lqkv := b.Apply("linear_qkv_rope", attrs, b.Slice(x, -1, 0, 16), w, pos)
	nw := b.Input("norm", tensor.BF16, Shape{D(8)})
	nattrs := Attrs{"eps": 1e-6}
	for k, v := range attrs {
		nattrs[k] = v
	}
	nqkv := b.Apply("qkv_norm_rope", nattrs, x, nw, nw, pos)
	b.SetScope("model.layers.0.mlp")
	h := b.Op("swiglu_packed", nil, x)
	lh := b.Op("linear_swiglu", nil, b.Slice(x, -1, 0, 16), w)
	b.Output(qkv[0], qkv[1], qkv[2], h, lqkv[0], lqkv[1], lqkv[2], lh, nqkv[0], nqkv[1], nqkv[2])
	return b.Build()
}
