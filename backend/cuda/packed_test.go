package cuda

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// qkv_rope and swiglu_packed against the CPU backend's kernels of the same ops (which give
// the bits of their decompositions), on random inputs; and a captured CUDA graph of a model
// that uses both.

func TestQKVRoPE(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(21, 22))
	for _, tc := range []struct {
		B, S, H, KV, D int
		scaling        float64
		pos            tensor.DType
	}{
		{1, 1, 1, 1, 2, 1, tensor.I32},       // one head each, D=2
		{1, 1, 32, 8, 128, 1, tensor.I32},    // a Llama-3-8B decode token: several blocks per row
		{1, 37, 4, 2, 16, 1, tensor.I64},     // GQA, odd S
		{2, 37, 6, 1, 64, 0.7, tensor.I32},   // H not a power of two, scaled
		{3, 5, 3, 3, 10, 1, tensor.I64},      // MHA, D/2 odd
		{2, 9, 40, 8, 128, 1.25, tensor.I32}, // rows wider than a block's span
	} {
		for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
			W := (tc.H + 2*tc.KV) * tc.D
			x := randTensor(rng, dt, []int{tc.B, tc.S, W}, -2, 2)
			pos := randInts(rng, tc.pos, []int{tc.B, tc.S}, 5000)
			inv := invFreqs(tc.D, 10000)
			want := cpuOp(t, "qkv_rope", graph.Attrs{"heads": tc.H, "kv_heads": tc.KV, "inv_freq": inv, "scaling": tc.scaling}, x, pos)
			f := make([]float32, len(inv))
			for i, v := range inv {
				f[i] = float32(v)
			}
			in := up(t, d, x, pos, tensor.FromF32(f, len(f)))
			out := like(t, d, want...)
			if err := QKVRoPE(d, out[0], out[1], out[2], in[0], in[1], in[2], tc.H, tc.KV, float32(tc.scaling)); err != nil {
				t.Fatal(err)
			}
			name := fmt.Sprintf("%s B%d S%d H%d KV%d D%d scaling %g pos %s", dt, tc.B, tc.S, tc.H, tc.KV, tc.D, tc.scaling, tc.pos)
			tl := tolFor(dt)
			if dt == tensor.BF16 {
				tl.atol = 1.0 / 128 // as for rope: one ulp of the terms, not of their sum
			}
			compare(t, "qkv_rope", name+" q", down(t, d, out[0]), want[0], tl)
			compare(t, "qkv_rope", name+" k", down(t, d, out[1]), want[1], tl)
			compare(t, "qkv_rope", name+" v", down(t, d, out[2]), want[2], exact)
		}
	}
}

// qkv_norm_rope against the CPU's decomposition (split, rmsnorm per head, layout, rope):
// Qwen3's decode and prefill shapes, f32 and bf16 x, bf16 and f32 norm weights (bf16 x
// takes bf16 weights only), scaled, with heads spread over several blocks.
func TestQKVNormRoPE(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(25, 26))
	for _, tc := range []struct {
		B, S, H, KV, D int
		scaling        float64
		pos            tensor.DType
	}{
		{1, 1, 1, 1, 2, 1, tensor.I32},       // one head each, D=2
		{1, 1, 32, 4, 128, 1, tensor.I32},    // a Qwen3-30B-A3B decode token
		{4, 1, 16, 8, 128, 1, tensor.I64},    // a decode batch, Qwen3-8B's heads at tp=2
		{1, 37, 6, 2, 80, 0.7, tensor.I32},   // odd S, D/2 not a multiple of 32, scaled
		{2, 9, 40, 8, 256, 1.25, tensor.I64}, // D/2 above a warp
	} {
		for _, dts := range [][2]tensor.DType{{tensor.F32, tensor.F32}, {tensor.F32, tensor.BF16}, {tensor.BF16, tensor.BF16}} {
			dt, wt := dts[0], dts[1]
			W := (tc.H + 2*tc.KV) * tc.D
			x := randTensor(rng, dt, []int{tc.B, tc.S, W}, -3, 3)
			qn, kn := randTensor(rng, wt, []int{tc.D}, 0.2, 2), randTensor(rng, wt, []int{tc.D}, 0.2, 2)
			pos := randInts(rng, tc.pos, []int{tc.B, tc.S}, 5000)
			inv := invFreqs(tc.D, 1000000)
			attrs := graph.Attrs{"heads": tc.H, "kv_heads": tc.KV, "inv_freq": inv, "scaling": tc.scaling, "eps": 1e-6}
			want := cpuOp(t, "qkv_norm_rope", attrs, x, qn, kn, pos)
			f := make([]float32, len(inv))
			for i, v := range inv {
				f[i] = float32(v)
			}
			in := up(t, d, x, qn, kn, pos, tensor.FromF32(f, len(f)))
			out := like(t, d, want...)
			if err := QKVNormRoPE(d, out[0], out[1], out[2], in[0], in[1], in[2], in[3], in[4], tc.H, tc.KV, float32(tc.scaling), 1e-6); err != nil {
				t.Fatal(err)
			}
			name := fmt.Sprintf("%s/%s B%d S%d H%d KV%d D%d scaling %g pos %s", dt, wt, tc.B, tc.S, tc.H, tc.KV, tc.D, tc.scaling, tc.pos)
			tl := tolFor(dt)
			if dt == tensor.BF16 {
				tl.atol = 1.0 / 64 // one ulp of the normed terms (up to 2), not of their sum
			}
			compare(t, "qkv_norm_rope", name+" q", down(t, d, out[0]), want[0], tl)
			compare(t, "qkv_norm_rope", name+" k", down(t, d, out[1]), want[1], tl)
			compare(t, "qkv_norm_rope", name+" v", down(t, d, out[2]), want[2], exact)
		}
	}
	// bf16 x with f32 weights would give f32 q and k: refused, the node runs decomposed.
	n := &graph.Node{Op: "qkv_norm_rope", Inputs: []*graph.Value{
		{Type: graph.Type{DType: tensor.BF16}}, {Type: graph.Type{DType: tensor.F32}}, {Type: graph.Type{DType: tensor.F32}}, {Type: graph.Type{DType: tensor.I32}}}}
	if err := qkvNormRopeSupports(n); err == nil {
		t.Error("bf16 x with f32 norm weights: supported, want refused")
	}
}

func TestSwiGLUPacked(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(23, 24))
	for _, shape := range [][]int{{2}, {1, 1, 2 * 14336}, {1, 37, 2 * 160}, {3, 2 * 1001}, {2, 5, 2 * 7}} {
		for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
			x := randTensor(rng, dt, shape, -6, 6)
			want := cpuOp(t, "swiglu_packed", nil, x)[0]
			in := up(t, d, x)
			out := like(t, d, want)
			if err := SwiGLUPacked(d, out[0], in[0]); err != nil {
				t.Fatal(err)
			}
			compare(t, "swiglu_packed", fmt.Sprintf("%s%v", dt, shape), down(t, d, out[0]), want, tolFor(dt))
		}
	}
}

// Bad operands are errors, not launches.
func TestPackedChecks(t *testing.T) {
	d := gpu(t)
	x := up(t, d, tensor.New(tensor.BF16, 1, 3, 16), tensor.New(tensor.I32, 1, 3), tensor.FromF32([]float32{1, 0.5}, 2))
	outs := like(t, d, tensor.New(tensor.BF16, 1, 2, 3, 4), tensor.New(tensor.BF16, 1, 1, 3, 4), tensor.New(tensor.F32, 1, 1, 3, 4))
	if err := QKVRoPE(d, outs[0], outs[1], outs[1], x[0], x[1], x[2], 2, 1, 1); err != nil {
		t.Errorf("fitting operands: %v", err)
	}
	for _, c := range []struct {
		name string
		err  error
	}{
		{"heads that do not fit x", QKVRoPE(d, outs[0], outs[1], outs[1], x[0], x[1], x[2], 3, 1, 1)},
		{"v output of another dtype", QKVRoPE(d, outs[0], outs[1], outs[2], x[0], x[1], x[2], 2, 1, 1)},
		{"float positions", QKVRoPE(d, outs[0], outs[1], outs[1], x[0], x[2], x[2], 2, 1, 1)},
		{"swiglu_packed output of another shape", SwiGLUPacked(d, outs[0], x[0])},
	} {
		if c.err == nil {
			t.Errorf("%s: no error", c.name)
		}
	}
}

// A model graph with the packed ops, fused with their linears (linear_qkv_rope and
// linear_swiglu: tiny-llama through the default pipeline), captured as a CUDA graph and
// replayed gives the bits of eager launches, with new inputs on every run: one token (the
// fused GEMV) and 2 × 37 (linear into the workspace, then the packed kernels).
func TestPackedProgramGraphReplay(t *testing.T) {
	d := gpu(t)
	m, _, _ := fixtureGraphs(t, "tiny-llama", tensor.BF16)
	g := optimizedGraph(t, m, tensor.BF16)
	ops := map[string]int{}
	for _, n := range g.Nodes {
		ops[n.Op]++
	}
	if ops["linear_qkv_rope"] == 0 || ops["linear_swiglu"] == 0 {
		t.Fatalf("the optimized graph has no linear_qkv_rope or linear_swiglu: %v", ops)
	}
	replayMatchesEager(t, d, g, m, rand.New(rand.NewPCG(25, 26)), [][2]int{{1, 1}, {1, 1}, {1, 1}, {1, 1}, {2, 37}, {2, 37}, {2, 37}})
}
