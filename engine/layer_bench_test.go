package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/loom-ml/loom/backend/cpu"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform"
)

// llama32Layer is one decoder layer shaped like Llama-3.2-1B's (hidden 2048, 32 heads, 8 KV
// heads, FFN 8192) with a 256-token vocabulary, so embedding and LM head cost next to nothing
// beside the layer.
const llama32Layer = `{
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256,
  "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 1,
  "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
  "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "dtype": "bfloat16",
  "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0,
    "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
}`

// randomWeights gives every param of g random bf16 values.
func randomWeights(g *graph.Graph) cpu.MapWeights {
	w := cpu.MapWeights{}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range g.Params() {
		ref, _ := graph.ParamOf(n)
		t := tensor.New(tensor.F32, ref.Shape...)
		for i := range t.F32 {
			t.F32[i] = float32(rng.NormFloat64() * 0.02)
		}
		if len(ref.Shape) == 1 {
			for i := range t.F32 {
				t.F32[i] = 1
			}
		}
		w[ref.Key] = t.Cast(ref.DType)
	}
	return w
}

// BenchmarkDecoderLayer compares one Llama-3.2-1B-shaped layer, batch 1, 1 and 8 tokens:
//
//	plain/reference:  the frontend's primitive graph on the reference kernels
//	plain/fast:       the same graph on the fast kernels (linear, matmul)
//	optimized/fast:   the transform pipeline's graph (fused ops) on the fast kernels
func BenchmarkDecoderLayer(b *testing.B) {
	ctx := context.Background()
	cfg, err := model.ParseConfig([]byte(llama32Layer), "llama-3.2-1b layer")
	if err != nil {
		b.Fatal(err)
	}
	plain, err := model.BuildGraph(cfg, model.BuildOptions{})
	if err != nil {
		b.Fatal(err)
	}
	w := randomWeights(plain)
	graphs, _, err := (&transform.Optimizer{}).Run(ctx, &transform.Context{Arch: "llama", Weights: w}, plain.Clone())
	if err != nil {
		b.Fatal(err)
	}
	optimized := graphs[0]
	for _, variant := range []struct {
		name    string
		g       *graph.Graph
		compile func(context.Context, *graph.Graph, backendWeights) (*cpu.Program, error)
	}{
		{"plain/reference", plain, compileRef},
		{"plain/fast", plain, compileFast},
		{"optimized/fast", optimized, compileFast},
	} {
		prog, err := variant.compile(ctx, variant.g, w)
		if err != nil {
			b.Fatal(err)
		}
		for _, tokens := range []int{1, 8} {
			ids := make([]int32, tokens)
			pos := make([]int32, tokens)
			for i := range ids {
				ids[i], pos[i] = int32(i*7%256), int32(i)
			}
			in := map[string]*tensor.Tensor{"input_ids": tensor.FromI32(ids, 1, tokens), "positions": tensor.FromI32(pos, 1, tokens)}
			b.Run(fmt.Sprintf("%s/tokens=%d", variant.name, tokens), func(b *testing.B) {
				for b.Loop() {
					if _, err := prog.Run(ctx, in); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

type backendWeights = cpu.MapWeights

func compileRef(ctx context.Context, g *graph.Graph, w backendWeights) (*cpu.Program, error) {
	return cpu.CompileReference(ctx, g, w)
}

func compileFast(ctx context.Context, g *graph.Graph, w backendWeights) (*cpu.Program, error) {
	return cpu.Compile(ctx, g, w)
}
