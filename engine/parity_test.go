package engine

import (
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loom-ml/loom/tensor"
)

// reference is the part of a fixture's reference.json (computed by Hugging Face transformers)
// that the parity tests read.
type reference struct {
	Prompts []struct {
		Text          string      `json:"text"`
		IDs           []int       `json:"ids"`
		LastLogits    []float32   `json:"last_logits"`
		AllLogits     [][]float32 `json:"all_logits"`
		GreedyNewIDs  []int       `json:"greedy_new_ids"`
		GreedyMargins []float64   `json:"greedy_margins"`
	} `json:"prompts"`
}

func loadReference(t *testing.T, dir string) *reference {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "reference.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref reference
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatalf("%s/reference.json: %v", dir, err)
	}
	return &ref
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

const logitTol = 1e-3 // absolute, against Hugging Face's float32 logits
const lowMargin = 0.01

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

func maxAbsDiff(a, b []float32) (float64, int) {
	worst, at := 0.0, -1
	if len(a) != len(b) {
		return math.Inf(1), -1
	}
	for i := range a {
		if d := math.Abs(float64(a[i] - b[i])); d > worst || math.IsNaN(d) {
			worst, at = d, i
		}
	}
	return worst, at
}

// checkGreedy compares greedy ids with the reference up to the first low-margin step that
// disagrees: where Hugging Face's top two logits were closer than lowMargin, float rounding
// may legitimately pick the other token.
func checkGreedy(t *testing.T, got, want []int, margins []float64) {
	t.Helper()
	for i := range want {
		if i >= len(got) {
			t.Fatalf("generated %d tokens, reference has %d", len(got), len(want))
		}
		if got[i] == want[i] {
			continue
		}
		if margins[i] < lowMargin {
			t.Logf("step %d: got %d, reference %d at margin %.4f (a near tie); comparison stops here", i, got[i], want[i], margins[i])
			return
		}
		t.Fatalf("step %d: got token %d, reference %d (margin %.4f)\n got  %v\n want %v", i, got[i], want[i], margins[i], got, want)
	}
}

// greedyRequests are the engine requests of the reference's prompts, each for as many
// tokens as Hugging Face's greedy continuation of it holds.
func (r *reference) greedyRequests() []Request {
	var reqs []Request
	for _, p := range r.Prompts {
		reqs = append(reqs, Request{Prompt: generatePrompt(p.IDs), MaxTokens: len(p.GreedyNewIDs), IgnoreEOS: true})
	}
	return reqs
}

// checkGreedyAll checks the tokens generated for each prompt (got, in the order of
// greedyRequests) against Hugging Face's greedy continuations (see checkGreedy).
func (r *reference) checkGreedyAll(t *testing.T, got [][]int) {
	t.Helper()
	for i, p := range r.Prompts {
		checkGreedy(t, got[i], p.GreedyNewIDs, p.GreedyMargins)
	}
}

// generatePrompt is the prompt as Hugging Face's generate saw it when the references were
// made: the fixture script passed pad_token_id=0 and no attention mask, so transformers took
// leading id-0 tokens (the BOS of the Llama 3 style tokenizers) for left padding, masked them
// out and numbered the remaining positions from 0. Such a token is invisible to every other
// position, which is the same as leaving it out. The logits above are compared with BOS in place.
func generatePrompt(ids []int) []int {
	for len(ids) > 1 && ids[0] == 0 {
		ids = ids[1:]
	}
	return ids
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
				logits, vocab := runAll(t, m.Program, p.IDs)
				last := logits[(len(p.IDs)-1)*vocab:]
				if d, at := maxAbsDiff(last, p.LastLogits); d > logitTol {
					t.Errorf("%q: last-position logits differ by %.2e at token %d (tolerance %.0e)", p.Text, d, at, logitTol)
				}
				for pos, row := range p.AllLogits {
					if d, at := maxAbsDiff(logits[pos*vocab:(pos+1)*vocab], row); d > logitTol {
						t.Errorf("%q: position %d logits differ by %.2e at token %d", p.Text, pos, d, at)
					}
				}
				res, err := GreedyRecompute(context.Background(), m.Program, generatePrompt(p.IDs), len(p.GreedyNewIDs))
				if err != nil {
					t.Fatal(err)
				}
				checkGreedy(t, res.NewIDs, p.GreedyNewIDs, p.GreedyMargins)
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
