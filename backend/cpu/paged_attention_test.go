package cpu

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// paProgram compiles a graph of one op whose inputs x0, x1, ... have the given types.
func paProgram(t *testing.T, op string, attrs graph.Attrs, types ...graph.Type) *Program {
	t.Helper()
	b := graph.NewBuilder("t")
	vals := make([]*graph.Value, len(types))
	for i, ty := range types {
		vals[i] = b.Input(fmt.Sprintf("x%d", i), ty.DType, ty.Shape)
	}
	b.Output(b.Op(op, attrs, vals...))
	g, err := b.Build()
	if err != nil {
		t.Fatalf("build %s: %v", op, err)
	}
	p, err := Compile(context.Background(), g, nil)
	if err != nil {
		t.Fatalf("compile %s: %v", op, err)
	}
	return p
}

// paTypes are the input types of a paged_attention node over the S flattened tokens of
// several sequences: x0 q [1,H,S,D], x1 k and x2 v [1,KV,S,D], x3 positions [1,S], x4 and x5
// the caches of NB blocks of bs slots, x6 slot_mapping [S], x7 token_seq [S], x8
// block_tables [N,M].
func paTypes(dt tensor.DType, H, KV, D, bs int) []graph.Type {
	S, sym := graph.Sym("S"), graph.Sym
	cache := graph.Type{DType: dt, Shape: graph.Shape{sym("NB"), graph.D(bs), graph.D(KV), graph.D(D)}}
	kv := graph.Type{DType: dt, Shape: graph.Shape{graph.D(1), graph.D(KV), S, graph.D(D)}}
	perToken := graph.Type{DType: tensor.I32, Shape: graph.Shape{S}}
	return []graph.Type{
		{DType: dt, Shape: graph.Shape{graph.D(1), graph.D(H), S, graph.D(D)}}, kv, kv,
		{DType: tensor.I32, Shape: graph.Shape{graph.D(1), S}}, cache, cache, perToken, perToken,
		{DType: tensor.I32, Shape: graph.Shape{sym("N"), sym("M")}},
	}
}

// paFeeds names tensors x0, x1, ... as paProgram's inputs.
func paFeeds(ts ...*tensor.Tensor) map[string]*tensor.Tensor {
	m := map[string]*tensor.Tensor{}
	for i, x := range ts {
		m[fmt.Sprintf("x%d", i)] = x
	}
	return m
}

func paRand(rng *rand.Rand, dt tensor.DType, shape ...int) *tensor.Tensor {
	x := make([]float32, tensor.Numel(shape))
	for i := range x {
		x[i] = float32(rng.Float64()*2 - 1)
	}
	return tensor.FromF32(x, shape...).Cast(dt)
}

func paI32(shape []int, vals ...int) *tensor.Tensor {
	x := make([]int32, len(vals))
	for i, v := range vals {
		x[i] = int32(v)
	}
	return tensor.FromI32(x, shape...)
}

// headRows copies tokens [from, to) of x[1,N,T,D] into a new [1,N,to-from,D] tensor.
func headRows(x *tensor.Tensor, from, to int) *tensor.Tensor {
	n, T, D := x.Shape[1], x.Shape[2], x.Shape[3]
	f := x.Float32s()
	out := make([]float32, 0, n*(to-from)*D)
	for h := range n {
		out = append(out, f[(h*T+from)*D:(h*T+to)*D]...)
	}
	return tensor.FromF32(out, 1, n, to-from, D).Cast(x.DType)
}

// concatTokens joins [1,N,Ti,D] tensors along the token axis.
func concatTokens(xs ...*tensor.Tensor) *tensor.Tensor {
	n, D := xs[0].Shape[1], xs[0].Shape[3]
	total := 0
	for _, x := range xs {
		total += x.Shape[2]
	}
	out := make([]float32, n*total*D)
	off := 0
	for _, x := range xs {
		T, f := x.Shape[2], x.Float32s()
		for h := range n {
			copy(out[(h*total+off)*D:], f[h*T*D:(h+1)*T*D])
		}
		off += T
	}
	return tensor.FromF32(out, 1, n, total, D).Cast(xs[0].DType)
}

// TestPagedAttentionEqualsSDPA runs sequences through paged_attention step by step, in
// chunks and one token at a time, several sequences per step, and compares every output row
// with sdpa over the whole sequence: random q, k, v; block sizes 1, 3 and 16; 1, 2 and 4
// query heads per KV head; with and without a sliding window; f32 and bf16.
func TestPagedAttentionEqualsSDPA(t *testing.T) {
	const H, D = 4, 8
	lens := []int{11, 5, 20} // three sequences
	// steps[i][s] is how many tokens sequence s contributes to step i.
	steps := [][]int{{4, 5, 0}, {1, 0, 7}, {6, 0, 1}, {0, 0, 12}}
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		for _, bs := range []int{1, 3, 16} {
			for _, kv := range []int{4, 2, 1} {
				for _, window := range []int{0, 3} {
					name := fmt.Sprintf("%s/bs=%d/gqa=%d/window=%d", dt, bs, H/kv, window)
					t.Run(name, func(t *testing.T) {
						checkPagedSteps(t, dt, bs, H, kv, D, window, lens, steps)
					})
				}
			}
		}
	}
}

func checkPagedSteps(t *testing.T, dt tensor.DType, bs, H, KV, D, window int, lens []int, steps [][]int) {
	rng := rand.New(rand.NewPCG(uint64(bs*100+KV*10+window), 1))
	scale := 1 / math.Sqrt(float64(D))
	attrs := graph.Attrs{"scale": scale, "window": window}

	// Reference: sdpa over each whole sequence.
	q, k, v, want := make([]*tensor.Tensor, len(lens)), make([]*tensor.Tensor, len(lens)), make([]*tensor.Tensor, len(lens)), make([]*tensor.Tensor, len(lens))
	for s, L := range lens {
		q[s], k[s], v[s] = paRand(rng, dt, 1, H, L, D), paRand(rng, dt, 1, KV, L, D), paRand(rng, dt, 1, KV, L, D)
		pos := make([]int, L)
		for i := range pos {
			pos[i] = i
		}
		sd := paProgram(t, "sdpa", attrs,
			graph.Type{DType: dt, Shape: graph.Dims(1, H, L, D)}, graph.Type{DType: dt, Shape: graph.Dims(1, KV, L, D)},
			graph.Type{DType: dt, Shape: graph.Dims(1, KV, L, D)}, graph.Type{DType: tensor.I32, Shape: graph.Dims(1, L)})
		outs, err := sd.Run(context.Background(), paFeeds(q[s], k[s], v[s], paI32([]int{1, L}, pos...)))
		if err != nil {
			t.Fatal(err)
		}
		want[s] = outs[0]
	}

	// Blocks handed out in a shuffled order, so that no sequence's blocks are contiguous.
	maxBlocks := 0
	for _, L := range lens {
		maxBlocks = max(maxBlocks, (L+bs-1)/bs)
	}
	NB := len(lens)*maxBlocks + 2
	perm := rng.Perm(NB)
	tables := make([][]int, len(lens))
	for s := range lens {
		tables[s] = perm[s*maxBlocks : (s+1)*maxBlocks]
	}
	kc, vc := tensor.New(dt, NB, bs, KV, D), tensor.New(dt, NB, bs, KV, D)

	pa := paProgram(t, "paged_attention", attrs, paTypes(dt, H, KV, D, bs)...)

	done := make([]int, len(lens))
	tol := 1e-5
	if dt != tensor.F32 {
		tol = 2e-2
	}
	for i, step := range steps {
		var qs, ks, vs []*tensor.Tensor
		var pos, slots, seqs, rows, table []int
		type span struct{ seq, from, to, at int }
		var spans []span
		at := 0
		for s, n := range step {
			if n == 0 {
				continue
			}
			row := len(rows)
			rows = append(rows, s)
			table = append(table, tables[s]...)
			from, to := done[s], done[s]+n
			qs, ks, vs = append(qs, headRows(q[s], from, to)), append(ks, headRows(k[s], from, to)), append(vs, headRows(v[s], from, to))
			for p := from; p < to; p++ {
				pos = append(pos, p)
				slots = append(slots, tables[s][p/bs]*bs+p%bs)
				seqs = append(seqs, row)
			}
			spans = append(spans, span{s, from, to, at})
			at += n
			done[s] = to
		}
		outs, err := pa.Run(context.Background(), paFeeds(concatTokens(qs...), concatTokens(ks...), concatTokens(vs...),
			paI32([]int{1, at}, pos...), kc, vc, paI32([]int{at}, slots...), paI32([]int{at}, seqs...),
			paI32([]int{len(rows), maxBlocks}, table...)))
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		for _, sp := range spans {
			got := headRows(outs[0], sp.at, sp.at+sp.to-sp.from).Float32s()
			ref := headRows(want[sp.seq], sp.from, sp.to).Float32s()
			for j := range ref {
				if d := math.Abs(float64(got[j] - ref[j])); !(d <= tol) {
					t.Fatalf("step %d, sequence %d, positions %d..%d: element %d is %g, sdpa gives %g", i, sp.seq, sp.from, sp.to-1, j, got[j], ref[j])
				}
			}
		}
	}
}

// TestPagedAttentionErrors checks that bad indices are errors, not panics, and that a failed
// call leaves the caches as they were.
func TestPagedAttentionErrors(t *testing.T) {
	const H, KV, D, BS, NB = 2, 1, 4, 2, 3 // slots 0-5
	rng := rand.New(rand.NewPCG(3, 4))
	S := graph.Sym("S")
	f32 := func(shape ...graph.Dim) graph.Type { return graph.Type{DType: tensor.F32, Shape: shape} }
	i32 := func(shape ...graph.Dim) graph.Type { return graph.Type{DType: tensor.I32, Shape: shape} }
	d := graph.D
	pa := paProgram(t, "paged_attention", graph.Attrs{"scale": 0.5},
		f32(graph.Sym("B"), d(H), S, d(D)), f32(graph.Sym("B"), d(KV), S, d(D)), f32(graph.Sym("B"), d(KV), S, d(D)),
		i32(graph.Sym("B"), S), f32(d(NB), d(BS), d(KV), d(D)), f32(d(NB), d(BS), d(KV), d(D)),
		i32(S), i32(S), i32(graph.Sym("N"), graph.Sym("M")))
	kc, vc := paRand(rng, tensor.F32, NB, BS, KV, D), paRand(rng, tensor.F32, NB, BS, KV, D)
	before := slices.Clone(kc.F32)
	q, k, v := paRand(rng, tensor.F32, 1, H, 2, D), paRand(rng, tensor.F32, 1, KV, 2, D), paRand(rng, tensor.F32, 1, KV, 2, D)
	good := func() map[string]*tensor.Tensor {
		return paFeeds(q, k, v, paI32([]int{1, 2}, 2, 3), kc, vc, paI32([]int{2}, 4, 5), paI32([]int{2}, 0, 0), paI32([]int{1, 2}, 1, 2))
	}
	for _, tc := range []struct {
		name  string
		input int
		value *tensor.Tensor
		want  string
	}{
		{"slot too large", 6, paI32([]int{2}, 4, 6), "slot 6 is outside"},
		{"negative slot", 6, paI32([]int{2}, -1, 5), "slot -1 is outside"},
		{"sequence out of range", 7, paI32([]int{2}, 0, 1), "sequence 1 is outside"},
		{"block out of range", 8, paI32([]int{1, 2}, 1, 3), "block 1 is 3"},
		{"negative block", 8, paI32([]int{1, 2}, -1, 2), "block 0 is -1"},
		{"position beyond the table", 3, paI32([]int{1, 2}, 2, 4), "needs block 2"},
		{"negative position", 3, paI32([]int{1, 2}, -1, 0), "negative position"},
		{"batch of 2", 0, paRand(rng, tensor.F32, 2, H, 2, D), "batch must be 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			feeds := good()
			feeds[fmt.Sprintf("x%d", tc.input)] = tc.value
			if tc.input == 0 { // keep B consistent across inputs
				feeds["x1"], feeds["x2"] = paRand(rng, tensor.F32, 2, KV, 2, D), paRand(rng, tensor.F32, 2, KV, 2, D)
				feeds["x3"] = paI32([]int{2, 2}, 0, 1, 0, 1)
			}
			_, err := pa.Run(context.Background(), feeds)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
			if !slices.Equal(kc.F32, before) {
				t.Fatal("a failed call changed the cache")
			}
		})
	}
	// The good call writes slots 4 and 5 (block 2) and nothing else.
	if _, err := pa.Run(context.Background(), good()); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(kc.F32[:4*KV*D], before[:4*KV*D]) {
		t.Error("the call changed slots 0-3, which it does not write")
	}
	if !slices.Equal(kc.F32[4*KV*D:6*KV*D], k.F32) {
		t.Errorf("slots 4, 5 hold %v, want k %v", kc.F32[4*KV*D:6*KV*D], k.F32)
	}
}
