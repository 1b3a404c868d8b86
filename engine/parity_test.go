package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loom-ml/loom/internal/parity"
	"github.com/loom-ml/loom/kvcache"
	"github.com/loom-ml/loom/model/safetensors"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tensor"
)

// loadReference reads a fixture's reference.json (Hugging Face transformers, f32), failing
// the test when it is missing or proves nothing (see parity.Load).
func loadReference(t *testing.T, dir string) *parity.Reference {
	t.Helper()
	ref, err := parity.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// supportedFixtures are the testdata checkpoints of every architecture Loom supports.
var supportedFixtures = []string{
	"tiny-llama",   // Llama 3 style, GQA
	"tiny-llama31", // Llama 3.1 rope scaling (llama3), tied embeddings
	"tiny-llama2",  // Llama 2 style, MHA, linear rope scaling
	"tiny-mistral", // Mistral, sliding window 8
	"tiny-qwen2",   // q/k/v bias, tied embeddings
	"tiny-qwen3",   // per-head q/k norm, head_dim 24 != hidden/heads
	"tiny-gqa6",    // 6 heads, 1 KV head
}

// moeFixtures are the mixture-of-experts checkpoints, whose frontends write every expert
// in plain primitives (graph.DecomposeMoE). They are held to Hugging Face on the CPU, plain
// (TestHuggingFaceParity) and cached, with fused moe ops (match_moe_pattern), at tp 1, 2
// and 4 and with expert parallelism at ep=2, ep=4 and tp=2,ep=2
// (TestCachedEngineHuggingFaceParity). On CUDA the moe op runs as its decomposition.
var moeFixtures = []string{
	"tiny-mixtral",  // 4 experts, top-2, renormalised
	"tiny-qwen2moe", // shared expert with its sigmoid gate, top-2 not renormalised
	"tiny-qwen3moe", // q/k norm, norm_topk_prob, one dense layer (mlp_only_layers)
}

const logitTol = parity.LogitTol

// maxAbsDiff is parity.MaxAbsDiff: a NaN or infinity counts as an infinite difference.
var maxAbsDiff = parity.MaxAbsDiff

// runAll returns logits [S,vocab] of one sequence.
func runAll(t *testing.T, exe Executable, ids []int) (logits []float32, vocab int) {
	t.Helper()
	in := make([]int32, len(ids))
	pos := make([]int32, len(ids))
	for i, id := range ids {
		in[i], pos[i] = int32(id), int32(i)
	}
	outs, err := exe.Run(context.Background(), map[string]*tensor.Tensor{
		"input_ids": tensor.FromI32(in, 1, len(ids)),
		"positions": tensor.FromI32(pos, 1, len(ids)),
	})
	if err != nil {
		t.Fatal(err)
	}
	return outs[0].Float32s(), outs[0].Shape[2]
}

// checkLogits holds logits of every position of p (runAll's) to the reference within
// logitTol.
func checkLogits(t *testing.T, logits []float32, p parity.Prompt) {
	t.Helper()
	if err := parity.CheckLogits(logits, p, logitTol); err != nil {
		t.Error(err)
	}
}

// checkGreedy holds gen's greedy continuation of p to the reference's, teacher-forced past
// near ties (parity.CheckGreedy), and logs the ties it forced.
func checkGreedy(t *testing.T, gen parity.Generator, p parity.Prompt) {
	t.Helper()
	res, err := parity.CheckGreedy(gen, p, parity.NearTie)
	if err != nil {
		t.Error(err)
		return
	}
	if len(res.Ties) > 0 {
		t.Logf("%q: near ties at steps %v taken the other way; the reference's tokens forced there, %d of %d steps compared",
			p.Text, res.Ties, res.Compared, res.Steps)
	}
}

// recomputeGen generates through GreedyRecompute on exe (the whole sequence run per token).
func recomputeGen(exe Executable) parity.Generator {
	return func(prompt []int, n int) ([]int, error) {
		res, err := GreedyRecompute(context.Background(), exe, prompt, n)
		if err != nil {
			return nil, err
		}
		return res.NewIDs, nil
	}
}

// forcedGen generates through one run of the whole-sequence executable exe: the logits of
// prompt followed by the reference's next n-1 tokens, argmax at each of the last n
// positions. Attention is causal, so each of those positions sees exactly what a greedy run
// that has agreed so far feeds it: this is greedy generation teacher-forced at every step,
// n times cheaper than GreedyRecompute on a long prompt.
func forcedGen(t *testing.T, exe Executable, p parity.Prompt) parity.Generator {
	return func(prompt []int, n int) ([]int, error) {
		done := len(prompt) - len(p.IDs)
		seq := slices.Concat(prompt, p.GreedyNewIDs[done:done+n-1])
		logits, V := runAll(t, exe, seq)
		out := make([]int, n)
		for i := range out {
			row := len(prompt) - 1 + i
			out[i] = sample.Argmax(logits[row*V : (row+1)*V])
		}
		return out, nil
	}
}

// engineGen generates one request at a time on e.
func engineGen(t *testing.T, e *Engine) parity.Generator {
	return func(prompt []int, n int) ([]int, error) {
		ctx := testCtx(t)
		st, err := e.Submit(ctx, Request{Prompt: prompt, MaxTokens: n, IgnoreEOS: true})
		if err != nil {
			return nil, err
		}
		toks, last, err := st.Collect(ctx)
		if err == nil && last.Finish == FinishError {
			err = last.Err
		}
		return toks, err
	}
}

// greedyRequests are the engine requests of the reference's prompts, each for as many
// tokens as Hugging Face's greedy continuation of it holds.
func greedyRequests(ref *parity.Reference) []Request {
	var reqs []Request
	for _, p := range ref.Prompts {
		reqs = append(reqs, Request{Prompt: p.IDs, MaxTokens: len(p.GreedyNewIDs), IgnoreEOS: true})
	}
	return reqs
}

// checkGreedyAll checks the tokens generated for each prompt (got, in the order of
// greedyRequests, all submitted at once) against Hugging Face's greedy continuations; after
// a near tie the rest is generated again through gen from the teacher-forced prefix.
func checkGreedyAll(t *testing.T, ref *parity.Reference, got [][]int, gen parity.Generator) {
	t.Helper()
	for i, p := range ref.Prompts {
		first := true
		checkGreedy(t, func(prompt []int, n int) ([]int, error) {
			if first {
				first = false
				return got[i], nil
			}
			return gen(prompt, n)
		}, p)
	}
}

func TestHuggingFaceParity(t *testing.T) {
	for _, name := range slices.Concat(supportedFixtures, moeFixtures) {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Join("..", "testdata", name)
			ref := loadReference(t, dir)
			m, err := Load(context.Background(), dir, LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			for _, p := range ref.Prompts {
				logits, _ := runAll(t, m.Program, p.IDs)
				checkLogits(t, logits, p)
				gen := recomputeGen(m.Program) // GreedyRecompute itself, on the short prompts
				if len(p.IDs) > 64 {
					gen = forcedGen(t, m.Program, p)
				}
				checkGreedy(t, gen, p)
			}
		})
	}
}

func TestUnsupportedArchitectureListsSupported(t *testing.T) {
	dir := t.TempDir() // tiny-llama's checkpoint under an architecture Loom has no frontend for
	src := filepath.Join("..", "testdata", "tiny-llama")
	for _, f := range []string{"config.json", "model.safetensors"} {
		data, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if f == "config.json" {
			data = []byte(strings.Replace(string(data), `"LlamaForCausalLM"`, `"GPT2LMHeadModel"`, 1))
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	_, err := Load(context.Background(), dir, LoadOptions{})
	if err == nil {
		t.Fatal("loading a GPT2LMHeadModel checkpoint should fail")
	}
	for _, want := range []string{"GPT2LMHeadModel", "LlamaForCausalLM", "MixtralForCausalLM", "Qwen3ForCausalLM"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

// bitsEqual reports whether a and b hold the same float32 bits.
func bitsEqual(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

// cachedPromptLogits feeds prompt through e's paged KV cache in chunks of chunk tokens (so
// later chunks attend to keys and values written by earlier steps) and returns the logits
// of its last position.
func cachedPromptLogits(t *testing.T, e *Engine, prompt []int, chunk int) []float32 {
	t.Helper()
	const id = kvcache.SeqID(1 << 20) // far from the engine's own ids
	// The engine frees a finished request's blocks in its own loop, after the request's last
	// event has gone out: wait for that before taking blocks beside it.
	for deadline := time.Now().Add(10 * time.Second); e.alloc.Stats().Sequences > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the engine still holds %d sequences", e.alloc.Stats().Sequences)
		}
	}
	if err := e.alloc.Reserve(id, len(prompt)); err != nil {
		t.Fatal(err)
	}
	defer e.alloc.Free(id)
	var last []float32
	for from := 0; from < len(prompt); from += chunk {
		n := min(chunk, len(prompt)-from)
		in, err := stepInputs(e.alloc, []stepSeq{{seq: id, tokens: prompt, from: from, n: n}}, e.layout.LogitRows)
		if err != nil {
			t.Fatal(err)
		}
		out, err := e.ranks.run(context.Background(), in)
		if err != nil {
			t.Fatal(err)
		}
		V := out.Shape[2]
		r := n - 1
		if e.layout.LogitRows { // gather_logits: one row per sequence
			r = 0
		}
		last = slices.Clone(out.F32[r*V : (r+1)*V])
	}
	return last
}

// parityEngine starts an engine on m with a KV cache just long enough for ref's longest
// prompt (so that a leak or a wrong block count fails) and closes it when the test ends.
func parityEngine(t *testing.T, m *Model, ref *parity.Reference) *Engine {
	t.Helper()
	longest := 0
	for _, p := range ref.Prompts {
		longest = max(longest, len(p.IDs))
	}
	e, err := New(context.Background(), m, Options{Logger: quiet, MaxTokensPerStep: 16, KVBlocks: longest/16 + 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// checkCachedParity holds the cached engine on m to ref: every prompt's last-position logits
// (fed in chunks of 7) and the engine's greedy continuations (checkGreedyAll).
func checkCachedParity(t *testing.T, m *Model, ref *parity.Reference) {
	t.Helper()
	e := parityEngine(t, m, ref)
	var got [][]int
	for _, p := range ref.Prompts {
		if err := parity.CheckLogits(cachedPromptLogits(t, e, p.IDs, 7), p, logitTol); err != nil {
			t.Error(err)
		}
		toks, err := engineGen(t, e)(p.IDs, len(p.GreedyNewIDs))
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, toks)
	}
	checkGreedyAll(t, ref, got, engineGen(t, e))
}

// TestCachedEngineHuggingFaceParity holds the deployed path, the optimized graph with the
// paged KV cache, to Hugging Face's last-position logits on every fixture and prompt, at
// tensor-parallel sizes 1, 2 and 4, with the prompt fed in chunks of 7 tokens. The MoE
// fixtures, whose sparse blocks run as fused moe ops, also run with their experts split by
// expert parallelism (ep=2, ep=4, tp=2,ep=2); with ep alone (attention replicated) their
// logits equal the unsharded engine's bit for bit.
func TestCachedEngineHuggingFaceParity(t *testing.T) {
	for _, name := range slices.Concat(supportedFixtures, moeFixtures) {
		meshes := []string{"tp=1", "tp=2", "tp=4"}
		moe := slices.Contains(moeFixtures, name)
		if moe {
			meshes = append(meshes, "ep=2", "ep=4", "tp=2,ep=2")
		}
		var unsharded [][]float32 // per prompt, the tp=1 run's logits
		for _, meshText := range meshes {
			t.Run(fmt.Sprintf("%s/%s", name, meshText), func(t *testing.T) {
				if meshText != "tp=1" && testing.Short() {
					t.Skip("sharded runs skipped in -short mode")
				}
				dir := filepath.Join("..", "testdata", name)
				ref := loadReference(t, dir)
				mesh := mustMeshFor(t, 0, meshText)
				if meshText == "tp=1" {
					mesh = mustMeshFor(t, 1, "")
				}
				m, err := Load(context.Background(), dir, LoadOptions{Optimize: true, Mesh: mesh})
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				if moe {
					checkMoEGraph(t, m, meshText)
				}
				longest := 0
				for _, p := range ref.Prompts {
					longest = max(longest, len(p.IDs))
				}
				e, err := New(context.Background(), m, Options{Logger: quiet, MaxTokensPerStep: 16, KVBlocks: longest/16 + 2})
				if err != nil {
					t.Fatal(err)
				}
				defer e.Close()
				for i, p := range ref.Prompts {
					logits := cachedPromptLogits(t, e, p.IDs, 7)
					if err := parity.CheckLogits(logits, p, logitTol); err != nil {
						t.Error(err)
					}
					if moe {
						d, _ := maxAbsDiff(logits[len(logits)-len(p.LastLogits):], p.LastLogits)
						t.Logf("prompt %d (%d tokens): last-position logits within %.3g of Hugging Face's", i, len(p.IDs), d)
					}
					switch {
					case meshText == "tp=1":
						unsharded = append(unsharded, logits)
					case !moe || strings.Contains(meshText, "tp"):
					case i >= len(unsharded):
						t.Logf("prompt %d: no unsharded run to compare with", i)
					default:
						if d, at := maxAbsDiff(logits, unsharded[i]); d != 0 {
							t.Errorf("prompt %d: %s logits differ from the unsharded engine's by %.3g at %d", i, meshText, d, at)
						}
					}
				}
			})
		}
	}
}

// checkMoEGraph makes sure that a MoE fixture runs fused moe ops and, on a mesh with an ep
// axis, that rank 0 reads only its experts and reduces over ep.
func checkMoEGraph(t *testing.T, m *Model, meshText string) {
	t.Helper()
	moes, overEP := 0, 0
	for _, n := range m.Graph.Nodes {
		switch {
		case n.Op == "moe":
			moes++
			if strings.Contains(meshText, "ep") && n.Inputs[2].Type.Shape[0] == n.Inputs[1].Type.Shape[0] {
				t.Errorf("%s: the moe op reads all %s experts on rank 0", meshText, n.Inputs[1].Type.Shape[0])
			}
		case n.Spec() != nil && n.Spec().Collective && n.Attrs.String("group") == "ep":
			overEP++
		}
	}
	if moes == 0 {
		t.Errorf("%s: no moe op in the optimized graph", meshText)
	}
	if strings.Contains(meshText, "ep") && overEP != moes {
		t.Errorf("%s: %d collectives over ep for %d moe ops", meshText, overEP, moes)
	}
}

// convertCheckpoint copies the checkpoint in dir to a new directory with every weight cast
// to dt and config.json's dtype saying so.
func convertCheckpoint(t *testing.T, dir string, dt tensor.DType, torchName string) string {
	t.Helper()
	return rewriteCheckpoint(t, dir, torchName, func(_ string, w *tensor.Tensor) *tensor.Tensor { return w.Cast(dt) })
}

// rewriteCheckpoint copies the checkpoint in dir (but its reference.json) to a new directory,
// each weight of model.safetensors replaced by weight(name, w) and config.json's dtype set to
// torchName.
func rewriteCheckpoint(t *testing.T, dir, torchName string, weight func(name string, w *tensor.Tensor) *tensor.Tensor) string {
	t.Helper()
	out := t.TempDir()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == "model.safetensors" || e.Name() == "reference.json" || e.IsDir() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if e.Name() == "config.json" {
			var cfg map[string]any
			if err := json.Unmarshal(data, &cfg); err != nil {
				t.Fatal(err)
			}
			delete(cfg, "torch_dtype")
			cfg["dtype"] = torchName
			if data, err = json.Marshal(cfg); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(out, e.Name()), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f, err := safetensors.Open(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tensors := map[string]*tensor.Tensor{}
	for _, name := range f.Names() {
		w, err := f.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		tensors[name] = weight(name, w)
	}
	if err := safetensors.Write(filepath.Join(out, "model.safetensors"), tensors); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCheckpointDTypes: the bf16 fixture stored as f32 (the same values) and as f16 (the same
// values too: bf16's 8 significant bits fit f16's 11, and these weights lie in f16's normal
// range but for a few that lose under 1e-7) loads and gives Hugging Face's logits and greedy
// tokens, through the plain and the optimized graph.
func TestCheckpointDTypes(t *testing.T) {
	const name = "tiny-llama"
	ref := loadReference(t, filepath.Join("..", "testdata", name))
	for _, tc := range []struct {
		dt    tensor.DType
		torch string
	}{{tensor.F32, "float32"}, {tensor.F16, "float16"}} {
		dir := convertCheckpoint(t, filepath.Join("..", "testdata", name), tc.dt, tc.torch)
		for _, optimize := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/optimize=%v", tc.dt, optimize), func(t *testing.T) {
				m, err := Load(context.Background(), dir, LoadOptions{Optimize: optimize, Transforms: wholeSequences})
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				if got := m.Model.Config.DType; got != tc.dt {
					t.Fatalf("config dtype %s, want %s", got, tc.dt)
				}
				for _, p := range ref.Prompts {
					logits, _ := runAll(t, m.Executable(), p.IDs)
					checkLogits(t, logits, p)
					checkGreedy(t, forcedGen(t, m.Executable(), p), p)
				}
			})
		}
	}
}
