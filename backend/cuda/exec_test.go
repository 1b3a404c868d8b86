package cuda

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loom-ml/loom/backend/cpu"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/internal/parity"
	"github.com/loom-ml/loom/model"
	_ "github.com/loom-ml/loom/model/all"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tensor"
)

// An op with neither a CUDA kernel nor a decomposition, and a fused op whose decomposition
// needs such an op, are compile errors naming them (there is no CPU fallback).
func TestCompileNamesMissingKernels(t *testing.T) {
	registerTestOps()
	b := graph.NewBuilder("g")
	x := b.Input("x", tensor.F32, graph.Shape{graph.Sym("B"), graph.D(4)})
	y := b.Op("cuda_test_nokernel", nil, b.Unary("rsqrt", b.Pow(x, b.Scalar(tensor.F32, 2))))
	b.Output(b.Op("cuda_test_needs_nokernel", nil, y))
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	_, err = Compile(context.Background(), nil, g, nil, nil)
	if err == nil {
		t.Fatal("compile succeeded")
	}
	for _, want := range []string{
		`no CUDA kernel for op "cuda_test_nokernel" (node %3 = cuda_test_nokernel(%2)) and no decomposition in the graph catalog`,
		`no CUDA kernel for op "cuda_test_nokernel"`,
		`needed by the decomposition of cuda_test_needs_nokernel`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	for _, op := range []string{`"pow"`, `"rsqrt"`, `"neg"`} { // primitives with kernels
		if strings.Contains(err.Error(), op) {
			t.Errorf("error %q names %s, which has a kernel", err, op)
		}
	}
}

// inputIDs returns input_ids and positions for B sequences of S tokens; sequence b starts
// at position 2*b.
func inputIDs(rng *rand.Rand, B, S, vocab int) map[string]*tensor.Tensor {
	ids, pos := tensor.New(tensor.I32, B, S), tensor.New(tensor.I32, B, S)
	for b := range B {
		for s := range S {
			ids.I32[b*S+s] = int32(rng.IntN(vocab))
			pos.I32[b*S+s] = int32(2*b + s)
		}
	}
	return map[string]*tensor.Tensor{"input_ids": ids, "positions": pos}
}

// rotaryInvFreq finds the inverse frequencies the frontend put in the plain graph.
func rotaryInvFreq(g *graph.Graph, half int) ([]float64, error) {
	for _, n := range g.Nodes {
		if n.Op == graph.OpConst && n.Scope == "model.rotary_emb" && len(n.Out().Type.Shape) == 1 && n.Out().Type.Shape[0].Size == half {
			return n.Attrs.Floats("values"), nil
		}
	}
	return nil, fmt.Errorf("no rotary inverse frequencies in graph %s", g.Name)
}

// fusedGraph writes a Llama-family model with the fused ops (what the transform pipeline
// is to produce): embedding, rmsnorm, linear, rope, sdpa, add_rmsnorm, swiglu, and the
// shape ops between them.
func fusedGraph(m *model.Model, act tensor.DType, inv []float64) (*graph.Graph, error) {
	cfg := m.Config
	B, S := graph.Sym("B"), graph.Sym("S")
	b := graph.NewBuilder(cfg.Architectures[0] + "_fused")
	ids := b.Input("input_ids", tensor.I32, graph.Shape{B, S})
	pos := b.Input("positions", tensor.I32, graph.Shape{B, S})
	param := func(key string, shape ...int) *graph.Value {
		info, ok := m.Checkpoint.Info(key)
		if !ok {
			b.Fail(fmt.Errorf("no tensor %s", key))
			return b.Scalar(tensor.F32, 0)
		}
		return b.Param(key, info.DType, graph.Dims(shape...))
	}
	has := func(key string) bool { _, ok := m.Checkpoint.Info(key); return ok }
	lin := func(x *graph.Value, p string, in, out int) *graph.Value {
		y := b.Linear(x, param(p+".weight", out, in))
		if has(p + ".bias") {
			y = b.Add(y, param(p+".bias", out))
		}
		return y
	}
	norm := func(x, w *graph.Value) *graph.Value {
		return b.Op("rmsnorm", graph.Attrs{"eps": cfg.RMSNormEps}, x, w)
	}
	Hd, H, KV, D, I := cfg.HiddenSize, cfg.NumAttentionHeads, cfg.NumKeyValueHeads, cfg.HeadDim, cfg.IntermediateSize
	embed := param("model.embed_tokens.weight", cfg.VocabSize, Hd)
	resid := b.Cast(b.Embedding(embed, ids), act)
	x := norm(resid, param("model.layers.0.input_layernorm.weight", Hd))
	for l := range cfg.NumHiddenLayers {
		p := fmt.Sprintf("model.layers.%d", l)
		q := b.Reshape(lin(x, p+".self_attn.q_proj", Hd, H*D), B, S, graph.D(H), graph.D(D))
		k := b.Reshape(lin(x, p+".self_attn.k_proj", Hd, KV*D), B, S, graph.D(KV), graph.D(D))
		v := b.Reshape(lin(x, p+".self_attn.v_proj", Hd, KV*D), B, S, graph.D(KV), graph.D(D))
		if has(p + ".self_attn.q_norm.weight") {
			q = norm(q, param(p+".self_attn.q_norm.weight", D))
			k = norm(k, param(p+".self_attn.k_norm.weight", D))
		}
		q, k, v = b.Transpose(q, 0, 2, 1, 3), b.Transpose(k, 0, 2, 1, 3), b.Transpose(v, 0, 2, 1, 3)
		qk := b.Apply("rope", graph.Attrs{"inv_freq": inv, "scaling": 1.0}, q, k, pos)
		o := b.Op("sdpa", graph.Attrs{"scale": 1 / math.Sqrt(float64(D)), "window": cfg.SlidingWindow}, qk[0], qk[1], v, pos)
		o = b.Reshape(b.Transpose(o, 0, 2, 1, 3), B, S, graph.D(H*D))
		a := lin(o, p+".self_attn.o_proj", H*D, Hd)
		r := b.Apply("add_rmsnorm", graph.Attrs{"eps": cfg.RMSNormEps}, a, resid, param(p+".post_attention_layernorm.weight", Hd))
		x, resid = r[0], r[1]
		g := lin(x, p+".mlp.gate_proj", Hd, I)
		u := lin(x, p+".mlp.up_proj", Hd, I)
		mlp := lin(b.Op("swiglu", nil, g, u), p+".mlp.down_proj", I, Hd)
		next := "model.norm.weight"
		if l+1 < cfg.NumHiddenLayers {
			next = fmt.Sprintf("model.layers.%d.input_layernorm.weight", l+1)
		}
		r = b.Apply("add_rmsnorm", graph.Attrs{"eps": cfg.RMSNormEps}, mlp, resid, param(next, Hd))
		x, resid = r[0], r[1]
	}
	head := embed
	if !cfg.TieWordEmbeddings {
		head = param("lm_head.weight", cfg.VocabSize, Hd)
	}
	b.Output(b.Cast(b.Linear(x, head), tensor.F32))
	return b.Build()
}

// fixtureGraphs opens a fixture and returns its plain graph and the fused graph.
func fixtureGraphs(t *testing.T, name string, act tensor.DType) (*model.Model, *graph.Graph, *graph.Graph) {
	t.Helper()
	m, err := model.Open("../../testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	plain, err := model.BuildGraph(m.Config, model.BuildOptions{ActivationDType: act, Tensors: m.Checkpoint})
	if err != nil {
		t.Fatal(err)
	}
	inv, err := rotaryInvFreq(plain, m.Config.HeadDim/2)
	if err != nil {
		t.Fatal(err)
	}
	fused, err := fusedGraph(m, act, inv)
	if err != nil {
		t.Fatal(err)
	}
	return m, plain, fused
}

func runCPU(t *testing.T, m *model.Model, g *graph.Graph, in map[string]*tensor.Tensor) *tensor.Tensor {
	t.Helper()
	p, err := cpu.Compile(context.Background(), g, m.Checkpoint)
	if err != nil {
		t.Fatal(err)
	}
	out, err := p.Run(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	return out[0]
}

var fixtures = []string{"tiny-llama", "tiny-gqa6", "tiny-mistral", "tiny-qwen2", "tiny-qwen3", "tiny-llama31", "tiny-llama2"}

// The fused test graph computes what the frontend's plain graph computes (on the CPU).
func TestFusedGraphMatchesPlainOnCPU(t *testing.T) {
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			m, plain, fused := fixtureGraphs(t, name, tensor.F32)
			in := inputIDs(rand.New(rand.NewPCG(11, 11)), 2, 9, m.Config.VocabSize)
			want, got := runCPU(t, m, plain, in), runCPU(t, m, fused, in)
			// A NaN in either counts as an infinite difference.
			if d, at := parity.MaxAbsDiff(got.Float32s(), want.Float32s()); !(d <= 1e-4) {
				t.Errorf("fused graph differs from the plain graph by %.3g at %d", d, at)
			}
		})
	}
}

// The CUDA executor runs the fused graphs of the fixtures and gives the CPU's logits.
func TestProgramFixtures(t *testing.T) {
	d := gpu(t)
	for _, name := range fixtures {
		for _, act := range []tensor.DType{tensor.F32, tensor.BF16} {
			t.Run(name+"/"+act.String(), func(t *testing.T) {
				m, _, fused := fixtureGraphs(t, name, act)
				checkAgainstCPU(t, d, name, act, m, fused)
			})
		}
	}
}

// checkAgainstCPU runs g on the GPU and on the CPU backend for several batch shapes and
// compares the logits (within a few bf16 ulps of the largest) and the greedy tokens.
func checkAgainstCPU(t *testing.T, d *Device, name string, act tensor.DType, m *model.Model, g *graph.Graph) {
	t.Helper()
	p, err := Compile(context.Background(), d, g, m.Checkpoint, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	rng := rand.New(rand.NewPCG(12, 12))
	for _, bs := range [][2]int{{2, 9}, {1, 37}, {3, 5}, {2, 9}} {
		in := inputIDs(rng, bs[0], bs[1], m.Config.VocabSize)
		want := runCPU(t, m, g, in)
		out, err := p.Run(context.Background(), in)
		if err != nil {
			t.Fatal(err)
		}
		maxWant := 0.0
		for i := range want.Numel() {
			maxWant = max(maxWant, math.Abs(want.At(i)))
		}
		// Logits through two layers of bf16 GEMMs: a few bf16 ulps of the largest logit.
		tl := tol{atol: maxWant / 32}
		compare(t, "program", fmt.Sprintf("%s act %s B%d S%d", name, act, bs[0], bs[1]), out[0], want, tl)
		// Greedy tokens agree at the last position unless the CPU's top two are close.
		V := m.Config.VocabSize
		for b := range bs[0] {
			off := (b*bs[1] + bs[1] - 1) * V
			w, gv := want.Float32s()[off:off+V], out[0].Float32s()[off:off+V]
			wi, gi := sample.Argmax(w), sample.Argmax(gv)
			if wi != gi && math.Abs(float64(w[wi]-w[gi])) > float64(maxWant)/64 {
				t.Errorf("%s B%d S%d row %d: GPU picks token %d, CPU %d (logits %v vs %v)", name, bs[0], bs[1], b, gi, wi, w[gi], w[wi])
			}
		}
	}
	t.Logf("%s act %s: %d steps, %d folded, %d bytes of weights", name, act, len(p.steps), p.Folded, p.WeightBytes())
}

// The fused graphs, run by the CUDA executor with f32 activations and exact f32 GEMMs, give
// Hugging Face's logits within parity.LogitTol (as the CPU backend must) and its greedy
// tokens, teacher-forced past near ties.
func TestProgramHuggingFaceParity(t *testing.T) {
	d := gpu(t)
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			m, _, fused := fixtureGraphs(t, name, tensor.F32)
			checkHFParity(t, d, name, m, fused)
		})
	}
}

// checkHFParity compiles g (f32 activations) with exact f32 GEMMs and requires Hugging
// Face's logits within parity.LogitTol and its greedy tokens, teacher-forced past near ties.
func checkHFParity(t *testing.T, d *Device, name string, m *model.Model, g *graph.Graph) {
	t.Helper()
	p, err := Compile(context.Background(), d, g, m.Checkpoint, &Options{ExactF32Linear: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, pr := range readReference(t, name).Prompts {
		if err := parity.CheckLogits(programLogits(t, p, pr.IDs), pr, parity.LogitTol); err != nil {
			t.Error(err)
		}
		checkGreedy(t, p, m.Config.VocabSize, pr, parity.NearTie)
	}
}

// The default GPU path, bf16 activations (cuBLAS bf16 GEMMs), against Hugging Face's f32
// logits on every dense fixture and every reference prompt, the 300+-token ones included:
// each row within parity.BF16Bound (16 bf16 ulps of its largest logit), and greedy tokens
// equal to Hugging Face's, with the near-tie margin widened to twice that bound. The MoE
// fixtures get the same check in TestMoEFusedOnGPU.
func TestProgramBF16HuggingFace(t *testing.T) {
	d := gpu(t)
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			m, _, fused := fixtureGraphs(t, name, tensor.BF16)
			checkBF16HuggingFace(t, d, name, m, fused)
		})
	}
}

// checkBF16HuggingFace compiles g (bf16 activations) on d and holds its logits on every
// reference prompt of fixture name to Hugging Face's: the last position's row within
// parity.BF16Bound, greedy tokens teacher-forced past margins under twice that bound.
func checkBF16HuggingFace(t *testing.T, d *Device, name string, m *model.Model, g *graph.Graph) {
	t.Helper()
	p, err := Compile(context.Background(), d, g, m.Checkpoint, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	worst := 0.0
	for _, pr := range readReference(t, name).Prompts {
		bound := parity.BF16Bound(pr.LastLogits)
		all := programLogits(t, p, pr.IDs)
		last := all[(len(pr.IDs)-1)*m.Config.VocabSize:]
		dd, at := parity.MaxAbsDiff(last, pr.LastLogits)
		if !(dd <= bound) {
			t.Errorf("%q (%d tokens): bf16 last-position logits differ from Hugging Face's by %.3g at token %d, bound %.3g (%d bf16 ulps of the row's largest)",
				pr.Text, len(pr.IDs), dd, at, bound, parity.BF16Ulps)
		}
		worst = max(worst, dd/bound*parity.BF16Ulps)
		checkGreedy(t, p, m.Config.VocabSize, pr, 2*bound)
	}
	t.Logf("%s: bf16 logits within %.1f bf16 ulps of the row's largest", name, worst)
}

// readReference reads a fixture's reference.json.
func readReference(t *testing.T, name string) *parity.Reference {
	t.Helper()
	ref, err := parity.Load("../../testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// programLogits runs p on one sequence and returns the logits of every position [S*V].
func programLogits(t *testing.T, p *Program, seq []int) []float32 {
	t.Helper()
	ids, pos := tensor.New(tensor.I32, 1, len(seq)), tensor.New(tensor.I32, 1, len(seq))
	for i, id := range seq {
		ids.I32[i], pos.I32[i] = int32(id), int32(i)
	}
	out, err := p.Run(context.Background(), map[string]*tensor.Tensor{"input_ids": ids, "positions": pos})
	if err != nil {
		t.Fatal(err)
	}
	return out[0].Float32s()
}

// checkGreedy holds p's greedy continuation of pr (the whole sequence run per token) to
// Hugging Face's, teacher-forced past steps whose reference margin is under nearTie.
func checkGreedy(t *testing.T, p *Program, V int, pr parity.Prompt, nearTie float64) {
	t.Helper()
	gen := func(prompt []int, n int) ([]int, error) {
		seq := slices.Clone(prompt)
		for range n {
			all := programLogits(t, p, seq)
			seq = append(seq, sample.Argmax(all[(len(seq)-1)*V:]))
		}
		return seq[len(prompt):], nil
	}
	res, err := parity.CheckGreedy(gen, pr, nearTie)
	if err != nil {
		t.Error(err)
	} else if len(res.Ties) > 0 {
		t.Logf("%q: near ties at %v forced, %d of %d steps compared", pr.Text, res.Ties, res.Compared, res.Steps)
	}
}

// Replaying a captured CUDA graph gives bit-for-bit what eager launches give, with new
// inputs on every run (the graph reads its inputs from the same planned addresses) and
// across buckets of shapes.
func TestGraphReplayMatchesEager(t *testing.T) {
	d := gpu(t)
	m, _, fused := fixtureGraphs(t, "tiny-llama", tensor.BF16)
	// Each bucket runs eagerly, then is captured, then replayed: four runs per bucket.
	runs := [][2]int{{2, 9}, {2, 9}, {2, 9}, {2, 9}, {1, 37}, {1, 37}, {1, 37}, {2, 9}}
	graphs, wall := replayMatchesEager(t, d, fused, m, rand.New(rand.NewPCG(5, 6)), runs)
	// The device clock counted every run, eager and replayed, within the wall time.
	busy, n := graphs.DeviceTime()
	if n != len(runs) || busy <= 0 || busy > wall {
		t.Errorf("DeviceTime = %v over %d runs; want %d runs, more than 0 and at most the %v they took", busy, n, len(runs), wall)
	}
	graphs.ResetDeviceTime()
	if busy, n := graphs.DeviceTime(); busy != 0 || n != 0 {
		t.Errorf("after ResetDeviceTime: %v over %d runs", busy, n)
	}
}

// replayMatchesEager compiles g with m's weights eagerly and with CUDA graphs, runs both on
// the same random input ids of each [B,S] of runs, and fails the test unless their logits
// agree bit for bit and every bucket ended up captured. It returns the program with graphs
// (closed with the test) and the wall time of the runs.
func replayMatchesEager(t *testing.T, d *Device, g *graph.Graph, m *model.Model, rng *rand.Rand, runs [][2]int) (*Program, time.Duration) {
	t.Helper()
	eager, err := Compile(context.Background(), d, g, m.Checkpoint, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer eager.Close()
	graphs, err := Compile(context.Background(), d, g, m.Checkpoint, &Options{Graphs: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { graphs.Close() })
	start := time.Now()
	for _, bs := range runs {
		in := inputIDs(rng, bs[0], bs[1], m.Config.VocabSize)
		want, err := eager.Run(context.Background(), in)
		if err != nil {
			t.Fatal(err)
		}
		got, err := graphs.Run(context.Background(), in)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got[0].Float32s(), want[0].Float32s()) {
			t.Fatalf("B%d S%d: graph replay differs from eager launches", bs[0], bs[1])
		}
	}
	wall := time.Since(start)
	for key, pl := range graphs.plans {
		if pl.noGraph || pl.graph == 0 {
			t.Errorf("bucket %s was not captured (noGraph=%v)", key, pl.noGraph)
		}
	}
	return graphs, wall
}

// RunSampled's greedy draws give each logits row's argmax, as Run's logits do; a profiled
// program gives the same logits and accounts GPU time to the ops that ran.
func TestRunSampledAndProfile(t *testing.T) {
	d := gpu(t)
	m, _, fused := fixtureGraphs(t, "tiny-llama", tensor.BF16)
	p, err := Compile(context.Background(), d, fused, m.Checkpoint, &Options{Profile: true})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	plain, err := Compile(context.Background(), d, fused, m.Checkpoint, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	in := inputIDs(rand.New(rand.NewPCG(1, 2)), 1, 7, m.Config.VocabSize)
	want, err := plain.Run(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.Run(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got[0].Float32s(), want[0].Float32s()) {
		t.Error("the profiled run's logits differ")
	}
	prof := p.Profile()
	var linear OpTime // each projection by the shape of its weight
	for _, o := range prof {
		if strings.HasPrefix(o.Op, "linear [") {
			linear.Calls += o.Calls
			linear.Time += o.Time
		}
	}
	if linear.Calls == 0 || linear.Time <= 0 {
		t.Errorf("profile %+v has no linear time", prof)
	}
	ids, err := plain.RunSampled(context.Background(), in, make([]sample.DeviceDraw, 7))
	if err != nil {
		t.Fatal(err)
	}
	V := m.Config.VocabSize
	for i, id := range ids {
		row := want[0].Float32s()[i*V : (i+1)*V]
		if w := sample.Argmax(row); int(id) != w {
			t.Errorf("row %d: sampled %d, argmax %d", i, id, w)
		}
	}
	if _, err := plain.RunSampled(context.Background(), in, make([]sample.DeviceDraw, 3)); err == nil {
		t.Error("RunSampled accepted 3 draws for 7 rows")
	}
}
