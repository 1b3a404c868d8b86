package graph

import (
	"fmt"
	"strings"
	"testing"

	"github.com/loom-ml/loom/tensor"
)

// moeInferCases are the inference cases of the mixture-of-experts ops (catalog_moe.go).
func moeInferCases() []inferCase {
	return []inferCase{
		{op: "topk", in: []Type{ty(f32t, "B", "S", 8)}, attrs: Attrs{"k": 2}, want: []Type{ty(f32t, "B", "S", 2), ty(i32, "B", "S", 2)}},
		{op: "topk", in: []Type{ty(bf16, 5)}, attrs: Attrs{"k": 5}, want: []Type{ty(bf16, 5), ty(i32, 5)}},
		{op: "topk", in: []Type{ty(f32t, "B", 4)}, attrs: Attrs{"k": 5}, err: "k = 5 is not in [1, 4]"},
		{op: "topk", in: []Type{ty(f32t, "B", 4)}, attrs: Attrs{"k": 0}, err: "k = 0 is not in [1, 4]"},
		{op: "topk", in: []Type{ty(f32t, "B", "E")}, attrs: Attrs{"k": 1}, err: "topk along a symbolic axis (E)"},
		{op: "topk", in: []Type{ty(i32, 4)}, attrs: Attrs{"k": 1}, err: "topk needs a float input"},
		{op: "topk", in: []Type{ty(f32t)}, attrs: Attrs{"k": 1}, err: "topk needs a float input of rank >= 1"},
		{op: "topk", in: []Type{ty(f32t, 4)}, err: "missing required attribute k"},

		{op: "moe", in: []Type{ty(f32t, "B", "S", 8), ty(bf16, 4, 8), ty(bf16, 4, 6, 8), ty(bf16, 4, 6, 8), ty(bf16, 4, 8, 6)}, attrs: Attrs{"top_k": 2}, want: []Type{ty(f32t, "B", "S", 8)}},
		{op: "moe", in: []Type{ty(bf16, "S", 8), ty(bf16, 4, 8), ty(bf16, 2, 3, 8), ty(bf16, 2, 3, 8), ty(bf16, 2, 8, 3)}, attrs: Attrs{"top_k": 4, "normalize": true, "weight_dtype": bf16, "expert_offset": 2}, want: []Type{ty(bf16, "S", 8)}},
		{op: "moe", in: []Type{ty(f32t, "S", 8), ty(f32t, 4, 8), ty(f32t, 2, 3, 8), ty(f32t, 2, 3, 8), ty(f32t, 2, 8, 3)}, attrs: Attrs{"top_k": 2, "expert_offset": 3}, err: "2 local experts at expert_offset 3 do not fit the router's 4 experts"},
		{op: "moe", in: []Type{ty(f32t, "S", 8), ty(f32t, 4, 8), ty(f32t, 4, 3, 8), ty(f32t, 4, 3, 8), ty(f32t, 4, 8, 3)}, attrs: Attrs{"top_k": 5}, err: "top_k = 5 is not in [1, 4]"},
		{op: "moe", in: []Type{ty(f32t, "S", 8), ty(f32t, 4, 8), ty(f32t, 4, 3, 8), ty(f32t, 4, 3, 8), ty(f32t, 4, 3, 8)}, attrs: Attrs{"top_k": 1}, err: "down [4,3,8] must be [L,H,I] = [4,8,3]"},
		{op: "moe", in: []Type{ty(f32t, "S", 8), ty(f32t, 4, 8), ty(f32t, 4, 3, 8), ty(f32t, 4, 2, 8), ty(f32t, 4, 8, 3)}, attrs: Attrs{"top_k": 1}, err: "gate [4,3,8] and up [4,2,8] must be [L,I,H]"},
		{op: "moe", in: []Type{ty(f32t, "S", 6), ty(f32t, 4, 8), ty(f32t, 4, 3, 8), ty(f32t, 4, 3, 8), ty(f32t, 4, 8, 3)}, attrs: Attrs{"top_k": 1}, err: "x [S,6] does not fit router [E,H] = [4,8]"},
		{op: "moe", in: []Type{ty(f32t, "S", 8), ty(f32t, "E", 8), ty(f32t, 4, 3, 8), ty(f32t, 4, 3, 8), ty(f32t, 4, 8, 3)}, attrs: Attrs{"top_k": 1}, err: "router [E,8] must be a constant [E,H]"},
		{op: "moe", in: []Type{ty(i32, "S", 8), ty(f32t, 4, 8), ty(f32t, 4, 3, 8), ty(f32t, 4, 3, 8), ty(f32t, 4, 8, 3)}, attrs: Attrs{"top_k": 1}, err: "moe needs float operands"},
		{op: "moe", in: []Type{ty(f32t, "S", 8), ty(f32t, 4, 8), ty(f32t, 4, 3, 8), ty(f32t, 4, 3, 8), ty(f32t, 4, 8, 3)}, attrs: Attrs{"top_k": 1, "weight_dtype": i32}, err: "weight_dtype i32 is not a float dtype"},
		{op: "moe", in: []Type{ty(f32t, "S", 8), ty(f32t, 4, 8), ty(f32t, 4, 3, 8), ty(f32t, 4, 3, 8), ty(f32t, 4, 8, 3)}, err: "missing required attribute top_k"},

		{op: "moe_route", in: []Type{ty(bf16, "B", "S", 8), ty(bf16, 4, 8)}, attrs: Attrs{"top_k": 2, "weight_dtype": bf16}, want: []Type{ty(bf16, "B", "S", 2), ty(i32, "B", "S", 2)}},
		{op: "moe_route", in: []Type{ty(f32t, "S", 8), ty(bf16, 4, 8)}, attrs: Attrs{"top_k": 5}, err: "moe_route: top_k = 5 is not in [1, 4]"},
		{op: "moe_route", in: []Type{ty(f32t, "S", 6), ty(bf16, 4, 8)}, attrs: Attrs{"top_k": 1}, err: "x [S,6] does not fit a constant router [E,H] = [4,8]"},
		{op: "moe_dispatch", in: []Type{ty(bf16, "B", "S", 8), ty(i32, "B", "S", 2)}, attrs: Attrs{"num_experts": 4, "group_size": 2, "rank": 1}, want: []Type{ty(bf16, 2, "B", "S", 2, 8), ty(i32, 2, "B", "S", 2)}},
		{op: "moe_dispatch", in: []Type{ty(bf16, "S", 8), ty(i32, "S", 2)}, attrs: Attrs{"num_experts": 4, "group_size": 3, "rank": 0}, err: "moe_dispatch: 3 ep ranks do not divide 4 experts"},
		{op: "moe_dispatch", in: []Type{ty(bf16, "S", 8), ty(i32, "S", 2)}, attrs: Attrs{"num_experts": 4, "group_size": 2, "rank": 2}, err: "moe_dispatch: rank 2 is not in [0, 2)"},
		{op: "moe_dispatch", in: []Type{ty(bf16, "S", 8), ty(i32, "B", 2)}, attrs: Attrs{"num_experts": 4, "group_size": 2, "rank": 0}, err: "needs float x [...,H] and i32 experts [...,k]"},
		{op: "moe_dispatch", in: []Type{ty(bf16, "S", 8), ty(i32, "S", 5)}, attrs: Attrs{"num_experts": 4, "group_size": 2, "rank": 0}, err: "5 slots per token for 4 experts"},
		{op: "moe_experts", in: []Type{ty(bf16, 2, "S", 2, 8), ty(i32, 2, "S", 2), ty(bf16, 2, 6, 8), ty(bf16, 2, 6, 8), ty(bf16, 2, 8, 6)}, attrs: Attrs{"expert_offset": 2}, want: []Type{ty(bf16, 2, "S", 2, 8)}},
		{op: "moe_experts", in: []Type{ty(bf16, "S", 8), ty(i32, "S", 2), ty(bf16, 2, 6, 8), ty(bf16, 2, 6, 8), ty(bf16, 2, 8, 6)}, err: "moe_experts needs float rows [...,H] and i32 ids [...]"},
		{op: "moe_experts", in: []Type{ty(bf16, "S", 8), ty(i32, "S"), ty(bf16, 2, 6, 8), ty(bf16, 2, 6, 8), ty(bf16, 2, 6, 8)}, err: "moe_experts: down [2,6,8] must be [L,H,I] = [2,8,6]"},
		{op: "moe_combine", in: []Type{ty(bf16, 2, "B", "S", 2, 8), ty(i32, "B", "S", 2), ty(f32t, "B", "S", 2)}, attrs: Attrs{"num_experts": 4}, want: []Type{ty(bf16, "B", "S", 8)}},
		{op: "moe_combine", in: []Type{ty(bf16, 2, "S", 3, 8), ty(i32, "S", 2), ty(f32t, "S", 2)}, attrs: Attrs{"num_experts": 4}, err: "moe_combine: rows [2,S,3,8] do not fit experts [S,2]"},
		{op: "moe_combine", in: []Type{ty(bf16, 3, "S", 2, 8), ty(i32, "S", 2), ty(f32t, "S", 2)}, attrs: Attrs{"num_experts": 4}, err: "moe_combine: 3 ep ranks do not divide 4 experts"},
		{op: "moe_combine", in: []Type{ty(bf16, 2, "S", 2, 8), ty(i32, "S", 2), ty(f32t, "S", 1)}, attrs: Attrs{"num_experts": 4}, err: "moe_combine: weights [S,1] and experts [S,2] differ"},

		{op: "param", attrs: Attrs{"key": "e.*.w", "dtype": bf16, "shape": Dims(4, 6, 8), "stack": 4}, want: []Type{ty(bf16, 4, 6, 8)}},
		{op: "param", attrs: Attrs{"key": "e.*.w", "dtype": bf16, "shape": Dims(4, 6, 8), "stack": 4, "slice_dim": 0, "slice_index": 1, "slice_count": 2}, want: []Type{ty(bf16, 2, 6, 8)}},
		{op: "param", attrs: Attrs{"key": "e.*.w", "dtype": bf16, "shape": Dims(4, 6, 8), "stack": 4, "slice_dim": 1, "slice_index": 1, "slice_count": 2, "member_part": 1, "member_parts": 2}, want: []Type{ty(bf16, 2, 3, 8)}},
		{op: "param", attrs: Attrs{"key": "e.*.w", "dtype": bf16, "shape": Dims(4, 6, 8), "stack": 4, "member_part": 0, "member_parts": 3}, err: `param "e.*.w": member run 0 of 3 does not fit its 4 members`},
		{op: "param", attrs: Attrs{"key": "e.*.w", "dtype": bf16, "shape": Dims(4, 6, 8), "stack": 4, "slice_dim": 0, "slice_count": 2, "member_parts": 2}, err: "member runs and a slice along dimension 0 both select members"},
		{op: "param", attrs: Attrs{"key": "w", "dtype": bf16, "shape": Dims(4, 6, 8), "member_parts": 2}, err: `param "w": member_parts 2 on a param that is not stacked`},
		{op: "param", attrs: Attrs{"key": "e.0.w", "dtype": bf16, "shape": Dims(4, 6, 8), "stack": 4}, err: "the key needs exactly one *"},
		{op: "param", attrs: Attrs{"key": "e.*.w", "dtype": bf16, "shape": Dims(3, 6, 8), "stack": 4}, err: "does not start with the 4 stacked members"},
		{op: "param", attrs: Attrs{"key": "e.*.w", "dtype": bf16, "shape": Dims(4, 6, 8), "stack": -1}, err: "stack -1 is negative"},
	}
}

// buildMoE is a sparse mixture-of-experts block as the frontends write it
// (DecomposeMoE): router, softmax, topk, one-hot scatter of the weights, experts.
func buildMoE() (*Graph, error) {
	const hidden, width, experts = 8, 6, 3
	b := NewBuilder("moe")
	x := b.Input("x", tensor.F32, Shape{symB, symS, D(hidden)})
	b.SetScope("model.layers.0.mlp")
	router := b.Param("router", tensor.BF16, Dims(experts, hidden))
	var ex []MoEExpert
	for e := range experts {
		p := fmt.Sprintf("experts.%d.", e)
		ex = append(ex, MoEExpert{
			Gate: b.Param(p+"gate", tensor.BF16, Dims(width, hidden)),
			Up:   b.Param(p+"up", tensor.BF16, Dims(width, hidden)),
			Down: b.Param(p+"down", tensor.BF16, Dims(hidden, width)),
		})
	}
	b.Output(DecomposeMoE(b, x, router, ex, MoERouting{TopK: 2, Renormalize: true, WeightDType: tensor.F32}))
	return b.Build()
}

// buildMoEFused is the fused moe op on stacked expert weights, as an expert-parallel rank
// reads them (experts 2 and 3 of 4) and with every attribute set.
func buildMoEFused() (*Graph, error) {
	b := NewBuilder("moe_fused")
	x := b.Input("x", tensor.BF16, Shape{symB, symS, D(8)})
	b.SetScope("model.layers.0.mlp")
	router := b.Param("model.layers.0.mlp.gate.weight", tensor.BF16, Dims(4, 8))
	stack := func(proj string, shape ...int) *Value {
		key := "model.layers.0.mlp.experts.*." + proj + ".weight"
		return b.Named(key, OpParam, Attrs{"key": key, "dtype": tensor.BF16, "shape": Dims(shape...), "stack": 4, "slice_dim": 0, "slice_index": 1, "slice_count": 2})
	}
	gate, up, down := stack("gate_proj", 4, 6, 8), stack("up_proj", 4, 6, 8), stack("down_proj", 4, 8, 6)
	b.Output(b.MoE(x, router, gate, up, down, MoERouting{TopK: 2, Renormalize: true, WeightDType: tensor.BF16}, 2))
	return b.Build()
}

// buildMoEAllToAll is rank 1 of 2 of a moe op run by all_to_all dispatch and combine over
// ep, its experts (2 and 3 of 4) also cut by tp (member runs and a slice per member).
func buildMoEAllToAll() (*Graph, error) {
	b := NewBuilder("moe_all_to_all")
	x := b.Input("x", tensor.BF16, Shape{symB, symS, D(8)})
	b.SetScope("model.layers.0.mlp")
	router := b.Param("model.layers.0.mlp.gate.weight", tensor.BF16, Dims(4, 8))
	stack := func(proj string, dim int, shape ...int) *Value {
		key := "model.layers.0.mlp.experts.*." + proj + ".weight"
		return b.Named(key, OpParam, Attrs{"key": key, "dtype": tensor.BF16, "shape": Dims(shape...), "stack": 4, "member_part": 1, "member_parts": 2, "slice_dim": dim, "slice_index": 0, "slice_count": 2})
	}
	gate, up, down := stack("gate_proj", 1, 4, 6, 8), stack("up_proj", 1, 4, 6, 8), stack("down_proj", 2, 4, 8, 6)
	w, ex := b.MoERoute(x, router, MoERouting{TopK: 2, Renormalize: true, WeightDType: tensor.BF16})
	sent := b.Apply("moe_dispatch", Attrs{"num_experts": 4, "group_size": 2, "rank": 1}, x, ex)
	a2a := func(v *Value) *Value {
		return b.Op("all_to_all", Attrs{"group": "ep", "group_size": 2, "split_axis": 0, "concat_axis": 0}, v)
	}
	y := b.Op("moe_experts", Attrs{"expert_offset": 2}, a2a(sent[0]), a2a(sent[1]), gate, up, down)
	y = b.Op("all_reduce", Attrs{"group": "tp", "group_size": 2}, y)
	out := b.Op("moe_combine", Attrs{"num_experts": 4}, a2a(y), ex, w)
	b.Output(b.Op("all_reduce", Attrs{"group": "ep", "group_size": 2}, out))
	return b.Build()
}

// The primitive MoE block: its ops, and the dtypes its routing weights take.
func TestDecomposeMoE(t *testing.T) {
	g, err := buildMoE()
	if err != nil {
		t.Fatal(err)
	}
	ops := map[string]int{}
	for _, n := range g.Nodes {
		ops[n.Op]++
	}
	for op, want := range map[string]int{
		"softmax": 1, "topk": 1, "iota": 1, "eq": 1, "where": 1, "sum": 2, "div": 1, // routing, renormalised
		"linear": 1 + 3*3, "silu": 3, "slice": 3, "add": 2, "cast": 0, // experts; f32 all along
	} {
		if ops[op] != want {
			t.Errorf("%d %s nodes, want %d (all: %v)", ops[op], op, want, ops)
		}
	}
	if out := g.Outputs[0].Type; !out.Equal(ty(f32t, "B", "S", 8)) {
		t.Errorf("output %s", out)
	}

	// Qwen's routing: no renormalisation, the weights cast back to the logits' dtype.
	b := NewBuilder("route")
	logits := b.Input("logits", tensor.BF16, Shape{symB, symS, D(4)})
	w := DecomposeMoERouting(b, logits, MoERouting{TopK: 3, WeightDType: tensor.BF16})
	b.Output(w)
	g, err = b.Build()
	if err != nil {
		t.Fatal(err)
	}
	if !w.Type.Equal(ty(bf16, "B", "S", 4)) {
		t.Errorf("weights %s, want bf16[B,S,4]", w.Type)
	}
	var casts []string
	for _, n := range g.Nodes {
		if n.Op == "cast" {
			casts = append(casts, n.Inputs[0].Type.DType.String()+"->"+n.Out().Type.DType.String())
		}
		if n.Op == "div" {
			t.Error("routing without Renormalize divides")
		}
	}
	if got := strings.Join(casts, " "); got != "bf16->f32 f32->bf16" {
		t.Errorf("casts %q, want the logits to f32 for softmax and the weights back to bf16", got)
	}
}

func TestDecomposeMoEErrors(t *testing.T) {
	b := NewBuilder("bad")
	x := b.Input("x", tensor.F32, Shape{symB, D(8)})
	router := b.Param("router", tensor.F32, Dims(3, 8))
	DecomposeMoE(b, x, router, []MoEExpert{}, MoERouting{TopK: 1, WeightDType: tensor.F32})
	if err := b.Err(); err == nil || !strings.Contains(err.Error(), "router weight [3,8] does not fit 0 experts") {
		t.Errorf("error %v", err)
	}
	b = NewBuilder("bad k")
	logits := b.Input("logits", tensor.F32, Shape{symB, D(3)})
	DecomposeMoERouting(b, logits, MoERouting{TopK: 4, WeightDType: tensor.F32})
	if err := b.Err(); err == nil || !strings.Contains(err.Error(), "k = 4 is not in [1, 3]") {
		t.Errorf("error %v", err)
	}
}

// The moe op's decomposition is the frontend's block over slices of the stacked weights: the
// same ops as DecomposeMoE's (plus a slice and a reshape per expert weight), and with an
// expert offset the local experts read their own columns of the routing weights.
func TestMoEDecomposition(t *testing.T) {
	for _, tc := range []struct {
		local, offset int
		columns       []int // the routing columns the experts read
	}{{3, 0, []int{0, 1, 2}}, {1, 2, []int{2}}, {2, 1, []int{1, 2}}} {
		b := NewBuilder("moe")
		x := b.Input("x", tensor.BF16, Shape{symB, symS, D(8)})
		router := b.Param("router", tensor.BF16, Dims(3, 8))
		stack := func(name string, shape ...int) *Value {
			return b.Named(name, OpParam, Attrs{"key": "experts.*." + name, "dtype": tensor.BF16, "shape": Dims(shape...), "stack": shape[0]})
		}
		gate, up, down := stack("gate", 3, 6, 8), stack("up", 3, 6, 8), stack("down", 3, 8, 6)
		if tc.local < 3 {
			sl := func(v *Value) *Value { return b.Slice(v, 0, tc.offset, tc.offset+tc.local) }
			gate, up, down = sl(gate), sl(up), sl(down)
		}
		y := b.MoE(x, router, gate, up, down, MoERouting{TopK: 2, WeightDType: tensor.BF16}, tc.offset)
		if err := b.Err(); err != nil {
			t.Fatal(err)
		}
		start := len(b.Graph().Nodes)
		spec, _ := Lookup("moe")
		got, err := spec.Decompose(b, y.Producer)
		if err != nil {
			t.Fatal(err)
		}
		if !got[0].Type.Equal(y.Type) {
			t.Errorf("decomposition gives %s, the op %s", got[0].Type, y.Type)
		}
		b.Output(got[0])
		if _, err := b.Build(); err != nil {
			t.Fatal(err)
		}
		ops := map[string]int{}
		var columns []int
		for _, n := range b.Graph().Nodes[start:] {
			ops[n.Op]++
			if n.Op == "slice" && n.Attrs.Int("axis") == -1 {
				columns = append(columns, n.Attrs.Int("start"))
			}
		}
		L := tc.local
		for op, want := range map[string]int{"topk": 1, "softmax": 1, "linear": 1 + 3*L, "silu": L, "slice": 3*L + L, "reshape": 3*L + 2, "add": L - 1} {
			if ops[op] != want {
				t.Errorf("local %d offset %d: %d %s nodes, want %d (all: %v)", L, tc.offset, ops[op], op, want, ops)
			}
		}
		if fmt.Sprint(columns) != fmt.Sprint(tc.columns) {
			t.Errorf("local %d offset %d: columns %v, want %v", L, tc.offset, columns, tc.columns)
		}
	}
}
