package engine

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loom-ml/loom/internal/parity"
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
	for _, name := range supportedFixtures {
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
				checkGreedy(t, recomputeGen(m.Program), p)
			}
		})
	}
}

func TestUnsupportedArchitectureListsSupported(t *testing.T) {
	_, err := Load(context.Background(), filepath.Join("..", "testdata", "tiny-mixtral"), LoadOptions{})
	if err == nil {
		t.Fatal("loading a MixtralForCausalLM checkpoint should fail until MoE is supported")
	}
	for _, want := range []string{"MixtralForCausalLM", "LlamaForCausalLM", "Qwen3ForCausalLM"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}
