package engine

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/transform"
)

// qwen3MoESmall is Qwen3-30B-A3B's layer shape (hidden 2048, 32 query heads of 128, 4 KV
// heads, 128 experts of intermediate size 768, top 8, renormalised) cut to 2 layers and 16
// experts (loom synth qwen3-30b-a3b --layers 2 --experts 16), with a 256-token vocabulary so
// that the embedding and the LM head weigh next to nothing beside the layers.
const qwen3MoESmall = `{
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 256,
  "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 2,
  "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
  "num_experts": 16, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
  "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [],
  "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "hidden_act": "silu",
  "attention_bias": false, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "use_sliding_window": false, "rope_theta": 1000000.0
}`

// BenchmarkMoEDecode runs one decode token (batch 1, position 0, so that attention costs
// next to nothing) of a small Qwen3-MoE (qwen3MoESmall) on the CPU and holds it to its
// active-weight bandwidth floor: the bytes of the weights one token reads (every weight but
// the experts, one embedding row, and the 8 chosen of each layer's 16 experts) over the
// memory read bandwidth measured in the same run (readBandwidth). It reports ms/token,
// floor-ms and x-floor (time over floor: 1 is the floor):
//
//	optimized: the transform pipeline's graph, one fused moe op per layer (only the chosen
//	           experts run)
//	plain:     the frontend's masked-dense graph, every expert on the token
func BenchmarkMoEDecode(b *testing.B) {
	ctx := context.Background()
	cfg, err := model.ParseConfig([]byte(qwen3MoESmall), "qwen3-moe small")
	if err != nil {
		b.Fatal(err)
	}
	plain, err := model.BuildGraph(cfg, model.BuildOptions{})
	if err != nil {
		b.Fatal(err)
	}
	w := randomWeights(plain)
	graphs, _, err := (&transform.Optimizer{}).Run(ctx, &transform.Context{Arch: cfg.ModelType, Weights: w}, plain.Clone())
	if err != nil {
		b.Fatal(err)
	}
	optimized := graphs[0]
	active := activeWeightBytes(plain, cfg.NumExpertsPerTok, cfg.NumLocalExperts)
	bw := readBandwidth()
	floor := float64(active) / bw
	b.Logf("active weights %.1f MB per token, read bandwidth %.2f GB/s, floor %.2f ms (GOMAXPROCS %d)", float64(active)/1e6, bw/1e9, floor*1e3, runtime.GOMAXPROCS(0))
	in := map[string]*tensor.Tensor{"input_ids": tensor.FromI32([]int32{17}, 1, 1), "positions": tensor.FromI32([]int32{0}, 1, 1)}
	for _, v := range []struct {
		name string
		g    *graph.Graph
	}{{"optimized", optimized}, {"plain", plain}} {
		prog, err := compileFast(ctx, v.g, w)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(v.name, func(b *testing.B) {
			start := time.Now()
			for b.Loop() {
				if _, err := prog.Run(ctx, in); err != nil {
					b.Fatal(err)
				}
			}
			per := time.Since(start).Seconds() / float64(b.N)
			b.ReportMetric(per*1e3, "ms/token")
			b.ReportMetric(floor*1e3, "floor-ms")
			b.ReportMetric(per/floor, "x-floor")
		})
	}
}

// activeWeightBytes is what one decode token reads of g's weights: every param whole but
// the experts' (of which it reads topK of numExperts) and the embedding table (one row).
func activeWeightBytes(g *graph.Graph, topK, numExperts int) int64 {
	var total int64
	for _, n := range g.Params() {
		ref, _ := graph.ParamOf(n)
		bytes := int64(tensor.Numel(ref.Shape) * ref.DType.Size())
		switch {
		case strings.Contains(ref.Key, ".experts."):
			// one expert's tensor; a token reads topK of the layer's numExperts
			bytes = bytes * int64(topK) / int64(numExperts)
		case strings.Contains(ref.Key, "embed_tokens"):
			bytes /= int64(ref.Shape[0])
		}
		total += bytes
	}
	return total
}

// readBandwidth measures memory read bandwidth in bytes per second as BenchmarkMemoryRead
// (backend/cpu) does, every core summing its share of a 512 MiB buffer (well past the
// caches), and returns the best of 5 passes.
func readBandwidth() float64 {
	buf := make([]uint64, 1<<26)
	for i := range buf {
		buf[i] = uint64(i)
	}
	workers := runtime.GOMAXPROCS(0)
	chunk := len(buf) / workers
	sums := make([]uint64, workers)
	best := 0.0
	for range 5 {
		start := time.Now()
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				var s0, s1, s2, s3 uint64
				part := buf[w*chunk : (w+1)*chunk]
				for i := 0; i+3 < len(part); i += 4 {
					s0 += part[i]
					s1 += part[i+1]
					s2 += part[i+2]
					s3 += part[i+3]
				}
				sums[w] = s0 + s1 + s2 + s3
			})
		}
		wg.Wait()
		best = max(best, float64(len(buf)*8)/time.Since(start).Seconds())
	}
	return best
}
