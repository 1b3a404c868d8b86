package cpu

import (
	"context"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Benchmarks of the fast kernels against the reference ones, run side by side so that each
// fast/reference ratio (logged by the parent benchmark) comes from one run on one machine.
// Shapes are those of Llama-3.2-1B: hidden 2048, 32 heads, 8 KV heads, head_dim 64, FFN 8192.

// randBF16 fills a bf16 tensor with uniform values in [-1, 1).
func randBF16(rng *rand.Rand, shape ...int) *tensor.Tensor {
	t := tensor.New(tensor.BF16, shape...)
	for i := range t.Half {
		t.Half[i] = tensor.F32ToBF16(2*rng.Float32() - 1)
	}
	return t
}

// randF32 fills an f32 tensor with uniform values in [-1, 1).
func randF32(rng *rand.Rand, shape ...int) *tensor.Tensor {
	t := tensor.New(tensor.F32, shape...)
	for i := range t.F32 {
		t.F32[i] = 2*rng.Float32() - 1
	}
	return t
}

// benchVariants runs one sub-benchmark per variant, in order; every variant after the first
// also reports its speed relative to the first, as measured in this run ("speedup": the
// first one's time per op over its own).
func benchVariants(b *testing.B, bytes int64, names []string, fns []func() error) {
	b.Helper()
	var first time.Duration
	for i, f := range fns {
		b.Run(names[i], func(b *testing.B) {
			b.SetBytes(bytes)
			b.ReportAllocs()
			for b.Loop() {
				if err := f(); err != nil {
					b.Fatal(err)
				}
			}
			per := b.Elapsed() / time.Duration(b.N)
			if i == 0 {
				first = per
			} else if first > 0 && per > 0 {
				b.ReportMetric(float64(first)/float64(per), "speedup")
			}
		})
	}
}

// kernelFn calls kernel k on node n's concrete inputs.
func kernelFn(b *testing.B, k Kernel, op string, attrs graph.Attrs, in ...*tensor.Tensor) func() error {
	n, outs := nodeFor(b, op, attrs, in)
	return func() error {
		_, err := k(n, in, outs)
		return err
	}
}

// BenchmarkLinear: x[M,8192] @ bf16 w[2048,8192]^T (down_proj), M=1 (decode) and M=8; the
// bytes are the weight bytes read per call, so MB/s is the weight bandwidth.
func BenchmarkLinear(b *testing.B) {
	const N, K = 2048, 8192
	rng := rand.New(rand.NewPCG(61, 62))
	w := randBF16(rng, N, K)
	ref, _ := Reference("linear")
	for _, M := range []int{1, 8} {
		b.Run(fmt.Sprintf("M=%d", M), func(b *testing.B) {
			x := randF32(rng, M, K)
			benchVariants(b, int64(N*K*2), []string{"reference", "fast"}, []func() error{
				kernelFn(b, ref, "linear", nil, x, w),
				kernelFn(b, fastLinear, "linear", nil, x, w),
			})
		})
	}
}

// BenchmarkLinearBatch: the fast linear on Qwen2.5-0.5B's gate/up shape (bf16 w[9728,896])
// for 1 to 16 rows of x, the decode steps of 1 to 16 sequences; with K this short every
// micro-kernel call is short, so what the weights' stream costs shows. It reports GFLOP/s.
func BenchmarkLinearBatch(b *testing.B) {
	const N, K = 9728, 896
	rng := rand.New(rand.NewPCG(65, 66))
	w := randBF16(rng, N, K)
	for _, M := range []int{1, 4, 8, 16, 128} {
		b.Run(fmt.Sprintf("M=%d", M), func(b *testing.B) {
			f := kernelFn(b, fastLinear, "linear", nil, randF32(rng, M, K), w)
			for b.Loop() {
				if err := f(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(2*float64(M*N*K)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// BenchmarkSDPA: q f32[1,32,S,64], k, v f32[1,8,S,64], causal; the reference is the
// decomposition (repeat_kv, mask, matmul, softmax, matmul) run with reference kernels.
func BenchmarkSDPA(b *testing.B) {
	rng := rand.New(rand.NewPCG(63, 64))
	ref, _ := Reference("sdpa")
	for _, S := range []int{8, 128} {
		b.Run(fmt.Sprintf("S=%d", S), func(b *testing.B) {
			q, k, v := randF32(rng, 1, 32, S, 64), randF32(rng, 1, 8, S, 64), randF32(rng, 1, 8, S, 64)
			pos := positionsFrom(tensor.I32, S, 1, 0)
			attrs := graph.Attrs{"scale": 0.125}
			benchVariants(b, 0, []string{"reference", "fast"}, []func() error{
				kernelFn(b, ref, "sdpa", attrs, q, k, v, pos),
				kernelFn(b, fastSDPA, "sdpa", attrs, q, k, v, pos),
			})
		})
	}
}

// BenchmarkRMSNorm: x f32[8,2048] with a bf16 weight; the reference is the decomposition.
func BenchmarkRMSNorm(b *testing.B) {
	rng := rand.New(rand.NewPCG(65, 66))
	x, w := randF32(rng, 8, 2048), randBF16(rng, 2048)
	ref, _ := Reference("rmsnorm")
	attrs := graph.Attrs{"eps": 1e-5}
	benchVariants(b, 0, []string{"reference", "fast"}, []func() error{
		kernelFn(b, ref, "rmsnorm", attrs, x, w),
		kernelFn(b, fastRMSNorm, "rmsnorm", attrs, x, w),
	})
}

// layerDims are the sizes of a Llama decoder layer.
type layerDims struct{ hidden, heads, kv, headDim, ffn int }

// llama1B is Llama-3.2-1B's decoder layer.
var llama1B = layerDims{hidden: 2048, heads: 32, kv: 8, headDim: 64, ffn: 8192}

const lEps = 1e-5

// layerWeights returns random bf16 weights for one decoder layer.
func layerWeights(rng *rand.Rand, d layerDims) MapWeights {
	shapes := map[string][]int{
		"in_norm": {d.hidden}, "post_norm": {d.hidden},
		"q": {d.heads * d.headDim, d.hidden}, "k": {d.kv * d.headDim, d.hidden}, "v": {d.kv * d.headDim, d.hidden},
		"o": {d.hidden, d.heads * d.headDim}, "gate": {d.ffn, d.hidden}, "up": {d.ffn, d.hidden}, "down": {d.hidden, d.ffn},
	}
	w := MapWeights{}
	for _, key := range slices.Sorted(maps.Keys(shapes)) { // sorted: the same weights every time
		w[key] = randBF16(rng, shapes[key]...)
	}
	return w
}

func (d layerDims) invFreq() []float64 {
	inv := make([]float64, d.headDim/2)
	for i := range inv {
		inv[i] = math.Pow(500000, -2*float64(i)/float64(d.headDim))
	}
	return inv
}

// plainLayer is one decoder layer as the frontend writes it (model/llama): primitives,
// eager attention with repeated KV heads and an additive mask. h f32[B,S,2048].
func plainLayer(t testing.TB, d layerDims, act tensor.DType) *graph.Graph {
	b := graph.NewBuilder("plain")
	B, S := graph.Sym("B"), graph.Sym("S")
	h := b.Input("h", act, graph.Shape{B, S, graph.D(d.hidden)})
	pos := b.Input("positions", tensor.I32, graph.Shape{B, S})
	p := func(key string, shape ...int) *graph.Value { return b.Param(key, tensor.BF16, graph.Dims(shape...)) }
	cos, sin := graph.DecomposeRotaryTables(b, pos, d.invFreq(), 1, act)
	mask := graph.DecomposeCausalMask(b, pos, 0)
	hd := graph.D(d.headDim)

	x := graph.DecomposeRMSNorm(b, h, p("in_norm", d.hidden), lEps)
	q := b.Transpose(b.Reshape(b.Linear(x, p("q", d.heads*d.headDim, d.hidden)), B, S, graph.D(d.heads), hd), 0, 2, 1, 3)
	k := b.Transpose(b.Reshape(b.Linear(x, p("k", d.kv*d.headDim, d.hidden)), B, S, graph.D(d.kv), hd), 0, 2, 1, 3)
	v := b.Transpose(b.Reshape(b.Linear(x, p("v", d.kv*d.headDim, d.hidden)), B, S, graph.D(d.kv), hd), 0, 2, 1, 3)
	q, k = graph.ApplyRotary(b, q, cos, sin), graph.ApplyRotary(b, k, cos, sin)
	k, v = graph.DecomposeRepeatKV(b, k, d.heads/d.kv), graph.DecomposeRepeatKV(b, v, d.heads/d.kv)
	scores := b.Mul(b.Matmul(q, b.Transpose(k, 0, 1, 3, 2)), b.Scalar(tensor.F32, 1/math.Sqrt(float64(d.headDim))))
	probs := b.Cast(b.Softmax(b.Cast(b.Add(scores, mask), tensor.F32), -1), act)
	o := b.Reshape(b.Transpose(b.Matmul(probs, v), 0, 2, 1, 3), B, S, graph.D(d.heads*d.headDim))
	h = b.Add(h, b.Linear(o, p("o", d.hidden, d.heads*d.headDim)))

	x = graph.DecomposeRMSNorm(b, h, p("post_norm", d.hidden), lEps)
	gate, up := b.Linear(x, p("gate", d.ffn, d.hidden)), b.Linear(x, p("up", d.ffn, d.hidden))
	b.Output(b.Add(h, b.Linear(b.Mul(b.Unary("silu", gate), up), p("down", d.hidden, d.ffn))))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// fusedLayer is plainLayer as the transform pipeline should leave it: fused norms, rope,
// sdpa and swiglu, and fused GEMMs whose concatenated weights fold at compile time.
func fusedLayer(t testing.TB, d layerDims, act tensor.DType) *graph.Graph {
	b := graph.NewBuilder("fused")
	B, S := graph.Sym("B"), graph.Sym("S")
	h := b.Input("h", act, graph.Shape{B, S, graph.D(d.hidden)})
	pos := b.Input("positions", tensor.I32, graph.Shape{B, S})
	p := func(key string, shape ...int) *graph.Value { return b.Param(key, tensor.BF16, graph.Dims(shape...)) }
	hd := graph.D(d.headDim)
	heads := func(x *graph.Value, n int) *graph.Value {
		return b.Transpose(b.Reshape(x, B, S, graph.D(n), hd), 0, 2, 1, 3)
	}

	x := b.Op("rmsnorm", graph.Attrs{"eps": lEps}, h, p("in_norm", d.hidden))
	wqkv := b.Concat(0, p("q", d.heads*d.headDim, d.hidden), p("k", d.kv*d.headDim, d.hidden), p("v", d.kv*d.headDim, d.hidden))
	qkv := b.Split(b.Linear(x, wqkv), -1, d.heads*d.headDim, d.kv*d.headDim, d.kv*d.headDim)
	qk := b.Apply("rope", graph.Attrs{"inv_freq": d.invFreq()}, heads(qkv[0], d.heads), heads(qkv[1], d.kv), pos)
	o := b.Op("sdpa", graph.Attrs{"scale": 1 / math.Sqrt(float64(d.headDim))}, qk[0], qk[1], heads(qkv[2], d.kv), pos)
	o = b.Reshape(b.Transpose(o, 0, 2, 1, 3), B, S, graph.D(d.heads*d.headDim))
	normed := b.Apply("add_rmsnorm", graph.Attrs{"eps": lEps}, b.Linear(o, p("o", d.hidden, d.heads*d.headDim)), h, p("post_norm", d.hidden))

	gu := b.Split(b.Linear(normed[0], b.Concat(0, p("gate", d.ffn, d.hidden), p("up", d.ffn, d.hidden))), -1, d.ffn, d.ffn)
	b.Output(b.Add(normed[1], b.Linear(b.Op("swiglu", nil, gu[0], gu[1]), p("down", d.hidden, d.ffn))))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// BenchmarkLayer runs one Llama-3.2-1B decoder layer (bf16 weights, f32 activations) on a
// batch of one sequence of 8 tokens at positions 5..12: the plain graph with reference
// kernels only, the plain graph with the registered (fast) kernels, and the fused graph.
// The bytes are the layer's weight bytes.
func BenchmarkLayer(b *testing.B) {
	rng := rand.New(rand.NewPCG(67, 68))
	w := layerWeights(rng, llama1B)
	const S = 8
	in := map[string]*tensor.Tensor{"h": randF32(rng, 1, S, llama1B.hidden), "positions": positionsFrom(tensor.I32, S, 1, 5)}
	ctx := context.Background()
	plainRef, err := compile(ctx, plainLayer(b, llama1B, tensor.F32), w, Reference)
	if err != nil {
		b.Fatal(err)
	}
	plainFast, err := Compile(ctx, plainLayer(b, llama1B, tensor.F32), w)
	if err != nil {
		b.Fatal(err)
	}
	fused, err := Compile(ctx, fusedLayer(b, llama1B, tensor.F32), w)
	if err != nil {
		b.Fatal(err)
	}
	var bytes int64
	for _, t := range w {
		bytes += int64(t.Numel() * 2)
	}
	run := func(p *Program) func() error {
		return func() error { _, err := p.Run(ctx, in); return err }
	}
	benchVariants(b, bytes, []string{"plain-reference", "plain-fast", "fused-fast"},
		[]func() error{run(plainRef), run(plainFast), run(fused)})
}
