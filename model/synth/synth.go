// Package synth writes random-weight checkpoints in Hugging Face format for named model
// shapes, so benchmarks run without downloads. The tensors written are exactly the params of
// the graph that Loom's frontend builds for the config, so a synthesized checkpoint always
// loads.
package synth

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model"
	_ "github.com/loom-ml/loom/model/all" // frontends
	"github.com/loom-ml/loom/model/safetensors"
	"github.com/loom-ml/loom/tensor"
)

// Shape is a named model configuration: the config.json fields Loom reads.
type Shape struct {
	Name   string
	Config map[string]any
	Chat   string // chat template style: "llama3", "chatml" or "mistral"
}

func llama3(name string, vocab, hidden, inter, layers, heads, kv int, factor float64, tie bool) Shape {
	return Shape{Name: name, Chat: "llama3", Config: map[string]any{
		"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama",
		"vocab_size": vocab, "hidden_size": hidden, "intermediate_size": inter,
		"num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
		"head_dim": hidden / heads, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
		"hidden_act": "silu", "tie_word_embeddings": tie, "dtype": "bfloat16",
		"bos_token_id": 128000, "eos_token_id": 128009,
		"rope_parameters": map[string]any{"rope_type": "llama3", "rope_theta": 500000.0, "factor": factor,
			"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
	}}
}

// Shapes lists the shapes synth knows, by name.
var Shapes = map[string]Shape{
	"llama-3.2-1b": llama3("llama-3.2-1b", 128256, 2048, 8192, 16, 32, 8, 32, true),
	"llama-3.2-3b": llama3("llama-3.2-3b", 128256, 3072, 8192, 28, 24, 8, 32, true),
	"llama-3.1-8b": llama3("llama-3.1-8b", 128256, 4096, 14336, 32, 32, 8, 8, false),
	"qwen2.5-0.5b": {Name: "qwen2.5-0.5b", Chat: "chatml", Config: map[string]any{
		"architectures": []string{"Qwen2ForCausalLM"}, "model_type": "qwen2",
		"vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
		"num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
		"max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "hidden_act": "silu",
		"tie_word_embeddings": true, "dtype": "bfloat16", "use_sliding_window": false,
		"bos_token_id": 151643, "eos_token_id": 151645,
		"rope_parameters": map[string]any{"rope_type": "default", "rope_theta": 1000000.0},
	}},
	// The mixture-of-experts shapes, with the released config.json fields: one tensor per
	// expert projection, as those checkpoints store them. Full size, Qwen3-30B-A3B is 30.5 B
	// params (61.1 GB in bf16) and Mixtral-8x7B 46.7 B (93.4 GB); --layers and --experts make
	// smaller copies.
	"qwen3-30b-a3b": {Name: "qwen3-30b-a3b", Chat: "chatml", Config: map[string]any{
		"architectures": []string{"Qwen3MoeForCausalLM"}, "model_type": "qwen3_moe",
		"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
		"num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
		"num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
		"norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": []int{},
		"max_position_embeddings": 40960, "max_window_layers": 48, "rms_norm_eps": 1e-6,
		"hidden_act": "silu", "attention_bias": false, "tie_word_embeddings": false,
		"torch_dtype": "bfloat16", "use_sliding_window": false, "sliding_window": nil,
		"rope_theta": 1000000.0, "rope_scaling": nil,
		"router_aux_loss_coef": 0.001, "output_router_logits": false,
		"bos_token_id": 151643, "eos_token_id": 151645,
	}},
	"mixtral-8x7b": {Name: "mixtral-8x7b", Chat: "mistral", Config: map[string]any{
		"architectures": []string{"MixtralForCausalLM"}, "model_type": "mixtral",
		"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
		"num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
		"num_local_experts": 8, "num_experts_per_tok": 2,
		"max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "hidden_act": "silu",
		"tie_word_embeddings": false, "torch_dtype": "bfloat16", "sliding_window": nil,
		"rope_theta": 1000000.0, "router_aux_loss_coef": 0.02, "output_router_logits": false,
		"bos_token_id": 1, "eos_token_id": 2,
	}},
}

// Names lists the known shape names, sorted.
func Names() []string {
	var out []string
	for n := range Shapes {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Options adjust a synthesized checkpoint.
type Options struct {
	// Layers overrides num_hidden_layers when > 0 (smaller models for quick runs).
	Layers int
	// Experts overrides a mixture-of-experts shape's expert count (num_experts or
	// num_local_experts) when > 0; it must be at least num_experts_per_tok.
	Experts int
	// Seed selects the random weights.
	Seed uint64
	// ShardBytes caps the size of one safetensors file (default 4 GB); larger checkpoints are
	// written as shards with a model.safetensors.index.json.
	ShardBytes int64
	// FP8 writes the decoder layers' linear weights in an FP8 format (fp8.go): "" keeps every
	// weight bf16, FP8Block writes Hugging Face fp8 with 128x128 block scales. The values
	// quantized are the bf16 ones the same seed writes without it.
	FP8 string
}

// Write creates dir and writes config.json, generation_config.json, the weights and a
// byte-level BPE tokenizer that covers the whole vocabulary (see writeTokenizer).
func Write(ctx context.Context, name, dir string, opts Options) error {
	p, err := plan(name, opts)
	if err != nil {
		return err
	}
	shape, cfgMap, cfgJSON, cfg, g := p.shape, p.cfgMap, p.cfgJSON, p.cfg, p.g
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), cfgJSON, 0o644); err != nil {
		return err
	}
	gen, _ := json.MarshalIndent(map[string]any{"bos_token_id": cfgMap["bos_token_id"], "eos_token_id": cfgMap["eos_token_id"]}, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, "generation_config.json"), gen, 0o644); err != nil {
		return err
	}
	if err := writeTokenizer(dir, shape, cfg); err != nil {
		return err
	}
	return writeWeights(ctx, dir, g, cfg, opts)
}

// planned is what Write writes for a shape and options, before any file is written.
type planned struct {
	shape   Shape
	cfgMap  map[string]any
	cfgJSON []byte
	cfg     *model.Config // parsed from cfgJSON (with its quantization_config)
	g       *graph.Graph  // of the unquantized config: its params are the tensors written (quantized by cfg.Quant)
}

// plan applies opts to the named shape's config and builds the graph whose params synth
// writes. The graph is built from the unquantized config, so that every param keeps its
// place (and its random stream) with or without FP8.
func plan(name string, opts Options) (*planned, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	shape, ok := Shapes[name]
	if !ok {
		return nil, fmt.Errorf("unknown model shape %q; known: %s", name, strings.Join(Names(), ", "))
	}
	cfgMap := map[string]any{}
	for k, v := range shape.Config {
		cfgMap[k] = v
	}
	if opts.Layers > 0 {
		cfgMap["num_hidden_layers"] = opts.Layers
	}
	if opts.Experts > 0 {
		field := ""
		for _, f := range []string{"num_local_experts", "num_experts"} {
			if _, ok := cfgMap[f]; ok {
				field = f
			}
		}
		if field == "" {
			return nil, fmt.Errorf("%s has no experts to set the number of", name)
		}
		if k, _ := cfgMap["num_experts_per_tok"].(int); opts.Experts < k {
			return nil, fmt.Errorf("%s routes each token to %d experts (num_experts_per_tok); %d experts are too few", name, k, opts.Experts)
		}
		cfgMap[field] = opts.Experts
	}
	cfgJSON, err := json.MarshalIndent(cfgMap, "", "  ")
	if err != nil {
		return nil, err
	}
	cfg, err := model.ParseConfig(cfgJSON, name+" config")
	if err != nil {
		return nil, err
	}
	g, err := model.BuildGraph(cfg, model.BuildOptions{})
	if err != nil {
		return nil, err
	}
	if opts.FP8 != "" {
		r, err := routers(g)
		if err != nil {
			return nil, err
		}
		cfgMap["quantization_config"] = fp8QuantConfig(r)
		if cfgJSON, err = json.MarshalIndent(cfgMap, "", "  "); err != nil {
			return nil, err
		}
		if cfg, err = model.ParseConfig(cfgJSON, name+" config"); err != nil {
			return nil, fmt.Errorf("--fp8 %s: %w", opts.FP8, err)
		}
	}
	return &planned{shape, cfgMap, cfgJSON, cfg, g}, nil
}

// writeWeights writes every param of g with random values: matrices ~U(-a, a) with a giving
// a standard deviation of 0.02, norm weights 1, biases small. A decoder layer's linear
// weight that cfg.Quant quantizes is generated as before into a buffer reused from weight to
// weight, then quantized into f8e4m3 bytes and its block scales (quantizeBlocks): the
// checkpoint is held once, at one byte a quantized weight.
func writeWeights(ctx context.Context, dir string, g *graph.Graph, cfg *model.Config, opts Options) error {
	limit := opts.ShardBytes
	if limit <= 0 {
		limit = 4 << 30
	}
	var shards [][]safetensors.Entry
	var cur []safetensors.Entry
	var size int64
	var gen []byte // a quantized weight's values before quantization
	for i, n := range g.Params() {
		if err := ctx.Err(); err != nil {
			return err
		}
		ref, err := graph.ParamOf(n)
		if err != nil {
			return err
		}
		numel := tensor.Numel(ref.Shape)
		module, linear := layerLinear(ref)
		quantize := linear && cfg.Quant.Quantized(module)
		var data []byte
		if quantize {
			if cap(gen) < numel*ref.DType.Size() {
				gen = nil // drop the smaller buffer before allocating
				gen = make([]byte, numel*ref.DType.Size())
			}
			data = gen[:numel*ref.DType.Size()]
		} else {
			data = make([]byte, numel*ref.DType.Size())
		}
		switch {
		case strings.HasSuffix(ref.Key, "norm.weight"):
			fillParallel(data, ref.DType, 0, 0, 0)
		case len(ref.Shape) == 1:
			fillParallel(data, ref.DType, opts.Seed, i, 0.02)
		default:
			fillParallel(data, ref.DType, opts.Seed, i, float32(0.02*math.Sqrt(3)))
		}
		st, ok := safetensors.FromTensor(ref.DType)
		if !ok {
			return fmt.Errorf("param %s: dtype %s cannot be written", ref.Key, ref.DType)
		}
		entries := []safetensors.Entry{{Name: ref.Key, DType: st, Shape: ref.Shape, Data: data}}
		if quantize {
			n, k := ref.Shape[0], ref.Shape[1]
			sshape := cfg.Quant.ScaleShape(n, k)
			q, scale := make([]byte, numel), make([]byte, tensor.Numel(sshape)*4)
			quantizeBlocks(data, ref.DType, n, k, q, scale)
			entries = []safetensors.Entry{
				{Name: ref.Key, DType: safetensors.F8E4M3, Shape: ref.Shape, Data: q},
				{Name: module + "." + fp8ScaleSuffix, DType: safetensors.F32, Shape: sshape, Data: scale},
			}
		}
		bytes := int64(0)
		for _, e := range entries {
			bytes += int64(len(e.Data))
		}
		// A weight and its scale share a shard.
		if size > 0 && size+bytes > limit {
			shards, cur, size = append(shards, cur), nil, 0
		}
		cur = append(cur, entries...)
		size += bytes
	}
	shards = append(shards, cur)
	meta := map[string]string{"format": "pt"}
	if len(shards) == 1 {
		return safetensors.WriteEntries(filepath.Join(dir, model.SingleFile), shards[0], meta)
	}
	weightMap := map[string]string{}
	var total int64
	for i, entries := range shards {
		file := fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(shards))
		if err := safetensors.WriteEntries(filepath.Join(dir, file), entries, meta); err != nil {
			return err
		}
		for _, e := range entries {
			weightMap[e.Name] = file
			total += int64(len(e.Data))
		}
	}
	index, _ := json.MarshalIndent(map[string]any{"metadata": map[string]any{"total_size": total}, "weight_map": weightMap}, "", "  ")
	return os.WriteFile(filepath.Join(dir, model.IndexFile), index, 0o644)
}

// fillChunk is the number of elements one goroutine of fillParallel fills from its own
// random stream.
const fillChunk = 1 << 18

// fillParallel fills data (elements of dt) with values ~U(-a, a), or with ones when a is 0,
// on every core. Chunk c of param i draws from a stream seeded by (seed, i, c), so the bytes
// depend only on the seed and the param's place, not on the number of cores.
func fillParallel(data []byte, dt tensor.DType, seed uint64, param int, a float32) {
	size := dt.Size()
	numel := len(data) / size
	chunks := (numel + fillChunk - 1) / fillChunk
	var wg sync.WaitGroup
	work := make(chan int, chunks)
	for c := 0; c < chunks; c++ {
		work <- c
	}
	close(work)
	for w := 0; w < min(runtime.GOMAXPROCS(0), chunks); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c := range work {
				lo, hi := c*fillChunk, min((c+1)*fillChunk, numel)
				rng := (seed*0x9E3779B97F4A7C15 + 1) ^ (uint64(param)<<32|uint64(c))*0xBF58476D1CE4E5B9 | 1
				next := func() float32 { return 1 }
				if a != 0 {
					next = func() float32 { rng = xorshift(rng); return uniform(rng) * a }
				}
				fill(data[lo*size:hi*size], dt, next)
			}
		}()
	}
	wg.Wait()
}

func fill(data []byte, dt tensor.DType, next func() float32) {
	switch dt {
	case tensor.BF16:
		for i := 0; i < len(data); i += 2 {
			binary.LittleEndian.PutUint16(data[i:], tensor.F32ToBF16(next()))
		}
	case tensor.F16:
		for i := 0; i < len(data); i += 2 {
			binary.LittleEndian.PutUint16(data[i:], tensor.F32ToF16(next()))
		}
	case tensor.F32:
		for i := 0; i < len(data); i += 4 {
			binary.LittleEndian.PutUint32(data[i:], math.Float32bits(next()))
		}
	}
}

func xorshift(x uint64) uint64 {
	x ^= x << 13
	x ^= x >> 7
	x ^= x << 17
	return x
}

// uniform maps random bits to [-1, 1).
func uniform(x uint64) float32 { return float32(x>>40)/float32(1<<23) - 1 }
