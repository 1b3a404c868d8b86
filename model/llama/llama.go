// Package llama is the frontend of the Llama family of decoders: LlamaForCausalLM (Llama 2,
// 3, 3.1, 3.2), MistralForCausalLM, Qwen2ForCausalLM (q/k/v bias) and Qwen3ForCausalLM
// (per-head q/k RMSNorm), and their mixture-of-experts relatives MixtralForCausalLM,
// Qwen2MoeForCausalLM and Qwen3MoeForCausalLM (moe.go). It writes the model as plain
// primitive ops, mirroring Hugging Face's modeling code line by line: RMSNorm, rotary
// embeddings with cos/sin computed from positions, GQA head repetition, the causal mask and
// SwiGLU all stay visible so the transform pipeline can recognise them.
package llama

import (
	"fmt"
	"math"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model"
	"github.com/loom-ml/loom/tensor"
)

// variant holds what distinguishes the family members.
type variant struct {
	qkvBias bool // Qwen2: q/k/v projections have biases
	qkNorm  bool // Qwen3: RMSNorm over each head of q and k before rotary
	moe     *moe // mixture-of-experts models: their sparse blocks (moe.go)
}

func init() {
	for name, v := range map[string]variant{
		"LlamaForCausalLM":   {},
		"MistralForCausalLM": {},
		"Qwen2ForCausalLM":   {qkvBias: true},
		"Qwen3ForCausalLM":   {qkNorm: true},
	} {
		model.RegisterArchitecture(&model.Architecture{Name: name, Build: func(cfg *model.Config, opts model.BuildOptions) (*graph.Graph, error) {
			return build(cfg, opts, v)
		}, TPPlan: tpPlan})
	}
}

// tpPlan is the family's tensor-parallel plan: q/k/v and gate/up split by output features
// (whole heads: detect_sharding keeps attention splits on head boundaries), o and down by
// input features with an all_reduce after, the LM head by vocabulary with an all_gather.
// Embedding lookups stay replicated; with tied embeddings the table's entry is the LM head's.
var tpPlan = model.TPPlan{
	"model.layers.*.self_attn.q_proj": model.TPColwise,
	"model.layers.*.self_attn.k_proj": model.TPColwise,
	"model.layers.*.self_attn.v_proj": model.TPColwise,
	"model.layers.*.self_attn.o_proj": model.TPRowwise,
	"model.layers.*.mlp.gate_proj":    model.TPColwise,
	"model.layers.*.mlp.up_proj":      model.TPColwise,
	"model.layers.*.mlp.down_proj":    model.TPRowwise,
	"model.embed_tokens":              model.TPGather,
	"lm_head":                         model.TPGather,
}

// B and S are the symbolic batch and sequence dimensions of the graph inputs.
var (
	B = graph.Sym("B")
	S = graph.Sym("S")
)

type builder struct {
	*graph.Builder
	cfg  *model.Config
	opts model.BuildOptions
	act  tensor.DType
	// scales holds the stored shape and dtype of each quantized module's scale (quant.go).
	scales map[string]scaleType
	// dequantized holds the dtype that each quantized module of a sparse block is read in,
	// the checkpoint dequantizing it (quant.go, sparseParam).
	dequantized map[string]tensor.DType
}

// param declares a weight with the given shape; the dtype is the stored one.
func (b *builder) param(key string, shape ...int) *graph.Value {
	dt := tensor.Invalid
	if b.opts.Tensors != nil {
		if info, ok := b.opts.Tensors.Info(key); ok {
			dt = info.DType
		}
	}
	if dt == tensor.Invalid {
		dt = b.cfg.WeightDType()
	}
	return b.Param(key, dt, graph.Dims(shape...))
}

func build(cfg *model.Config, opts model.BuildOptions, v variant) (*graph.Graph, error) {
	if cfg.NumAttentionHeads%cfg.NumKeyValueHeads != 0 {
		return nil, fmt.Errorf("num_attention_heads %d is not a multiple of num_key_value_heads %d", cfg.NumAttentionHeads, cfg.NumKeyValueHeads)
	}
	if cfg.Quant != nil && cfg.Quant.Method == model.QuantLoad && v.moe != nil {
		// The experts hold nearly all of the weights, and the moe op has no fp8 kernels:
		// quantizing the attention alone would save next to nothing.
		return nil, fmt.Errorf("%s: quantizing a mixture-of-experts model while loading is not supported: its experts, nearly all of its weights, would stay as stored (the moe op has no fp8 kernels yet); load an FP8 checkpoint of it instead", cfg.Quant)
	}
	if cfg.HiddenAct != "" && cfg.HiddenAct != "silu" {
		return nil, fmt.Errorf("hidden_act %q is not supported (want silu)", cfg.HiddenAct)
	}
	scales, err := quantScales(cfg, opts)
	if err != nil {
		return nil, err
	}
	var dequantized map[string]tensor.DType
	if v.moe != nil {
		if dequantized, err = dequantizedModules(cfg, opts, v.moe); err != nil {
			return nil, err
		}
	}
	b := &builder{Builder: graph.NewBuilder(cfg.Architectures[0]), cfg: cfg, opts: opts, act: opts.ActivationDType, scales: scales, dequantized: dequantized}
	ids := b.Input("input_ids", tensor.I32, graph.Shape{B, S})
	pos := b.Input("positions", tensor.I32, graph.Shape{B, S})

	b.SetScope("model.embed_tokens")
	embed := b.param("model.embed_tokens.weight", cfg.VocabSize, cfg.HiddenSize)
	h := b.Cast(b.Embedding(embed, ids), b.act)

	b.SetScope("model.rotary_emb")
	cos, sin, err := b.rotary(pos)
	if err != nil {
		return nil, err
	}
	mask := b.causalMask(pos)

	for l := range cfg.NumHiddenLayers {
		h = b.layer(l, h, cos, sin, mask, v)
	}

	b.SetScope("model.norm")
	h = b.rmsnorm(h, b.param("model.norm.weight", cfg.HiddenSize), cfg.RMSNormEps)
	b.SetScope("lm_head")
	head := embed
	var logits *graph.Value
	if cfg.TieWordEmbeddings {
		logits = b.Cast(b.Linear(h, head), tensor.F32)
	} else {
		logits = b.Cast(b.project(h, "lm_head", cfg.HiddenSize, cfg.VocabSize), tensor.F32)
	}
	b.Output(logits)
	return b.Build()
}

// rmsnorm is Hugging Face's LlamaRMSNorm over the last axis, computed in f32.
func (b *builder) rmsnorm(x, w *graph.Value, eps float64) *graph.Value {
	return graph.DecomposeRMSNorm(b.Builder, x, w, eps)
}

// rotary computes cos and sin [B,S,head_dim] from positions [B,S], as Hugging Face's rotary
// embedding module does: freqs = positions ⊗ inv_freq, emb = concat(freqs, freqs).
func (b *builder) rotary(pos *graph.Value) (cos, sin *graph.Value, err error) {
	d := b.cfg.HeadDim
	inv, scaling, err := invFreq(b.cfg.Rope, d)
	if err != nil {
		return nil, nil, err
	}
	cos, sin = graph.DecomposeRotaryTables(b.Builder, pos, inv, scaling, b.act)
	return cos, sin, nil
}

// causalMask is the additive attention mask [B,1,S,S]: 0 where key position <= query
// position (and, with a sliding window W, key position > query position - W), -inf elsewhere.
func (b *builder) causalMask(pos *graph.Value) *graph.Value {
	b.SetScope("model.mask")
	return graph.DecomposeCausalMask(b.Builder, pos, b.cfg.SlidingWindow)
}

// linear is x @ w^T (+ bias), quantized when the checkpoint's quantization_config says so.
func (b *builder) linear(x *graph.Value, prefix string, in, out int, bias bool) *graph.Value {
	y := b.project(x, prefix, in, out)
	if bias {
		y = b.Add(y, b.param(prefix+".bias", out))
	}
	return y
}

// layer is one decoder layer on h [B,S,hidden].
func (b *builder) layer(l int, h, cos, sin, mask *graph.Value, v variant) *graph.Value {
	cfg := b.cfg
	p := fmt.Sprintf("model.layers.%d", l)

	b.SetScope(p + ".input_layernorm")
	x := b.rmsnorm(h, b.param(p+".input_layernorm.weight", cfg.HiddenSize), cfg.RMSNormEps)
	b.SetScope(p + ".self_attn")
	h = b.Add(h, b.attention(p+".self_attn", x, cos, sin, mask, v))

	b.SetScope(p + ".post_attention_layernorm")
	x = b.rmsnorm(h, b.param(p+".post_attention_layernorm.weight", cfg.HiddenSize), cfg.RMSNormEps)
	if v.moe != nil && cfg.IsSparseLayer(l) {
		return b.Add(h, b.sparseMoE(p, x, v.moe))
	}
	b.SetScope(p + ".mlp")
	return b.Add(h, b.mlp(p+".mlp", x))
}

// attention is eager multi-head attention with grouped KV heads on x [B,S,hidden].
func (b *builder) attention(p string, x, cos, sin, mask *graph.Value, v variant) *graph.Value {
	cfg := b.cfg
	H, KV, D := cfg.NumAttentionHeads, cfg.NumKeyValueHeads, cfg.HeadDim
	hd, bias := graph.D(D), v.qkvBias || cfg.AttentionBias

	q := b.Reshape(b.linear(x, p+".q_proj", cfg.HiddenSize, H*D, bias), B, S, graph.D(H), hd)
	k := b.Reshape(b.linear(x, p+".k_proj", cfg.HiddenSize, KV*D, bias), B, S, graph.D(KV), hd)
	val := b.Reshape(b.linear(x, p+".v_proj", cfg.HiddenSize, KV*D, bias), B, S, graph.D(KV), hd)
	if v.qkNorm {
		q = b.rmsnorm(q, b.param(p+".q_norm.weight", D), cfg.RMSNormEps)
		k = b.rmsnorm(k, b.param(p+".k_norm.weight", D), cfg.RMSNormEps)
	}
	q = b.Transpose(q, 0, 2, 1, 3) // [B,H,S,D]
	k = b.Transpose(k, 0, 2, 1, 3) // [B,KV,S,D]
	val = b.Transpose(val, 0, 2, 1, 3)

	q = graph.ApplyRotary(b.Builder, q, cos, sin)
	k = graph.ApplyRotary(b.Builder, k, cos, sin)

	k = graph.DecomposeRepeatKV(b.Builder, k, H/KV)
	val = graph.DecomposeRepeatKV(b.Builder, val, H/KV)

	scores := b.Mul(b.Matmul(q, b.Transpose(k, 0, 1, 3, 2)), b.Scalar(tensor.F32, 1/math.Sqrt(float64(D))))
	scores = b.Add(scores, mask)
	probs := b.Cast(b.Softmax(b.Cast(scores, tensor.F32), -1), b.act)
	o := b.Matmul(probs, val)                                     // [B,H,S,D]
	o = b.Reshape(b.Transpose(o, 0, 2, 1, 3), B, S, graph.D(H*D)) // [B,S,H*D]
	return b.linear(o, p+".o_proj", H*D, cfg.HiddenSize, cfg.AttentionBias)
}

// mlp is SwiGLU: down(silu(gate(x)) * up(x)).
func (b *builder) mlp(p string, x *graph.Value) *graph.Value {
	cfg := b.cfg
	gate := b.linear(x, p+".gate_proj", cfg.HiddenSize, cfg.IntermediateSize, cfg.MLPBias)
	up := b.linear(x, p+".up_proj", cfg.HiddenSize, cfg.IntermediateSize, cfg.MLPBias)
	return b.linear(b.Mul(b.Unary("silu", gate), up), p+".down_proj", cfg.IntermediateSize, cfg.HiddenSize, cfg.MLPBias)
}
