package llama

import (
	"fmt"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model"
	"github.com/loom-ml/loom/tensor"
)

// The sparse mixture-of-experts members of the family: MixtralForCausalLM,
// Qwen2MoeForCausalLM and Qwen3MoeForCausalLM. Attention, norms and rotary embeddings are
// the dense models' (Mistral's, Qwen2's with qkv_bias, Qwen3's with q/k norms); the MLP of a
// sparse layer is a router and experts, written in primitives by graph.DecomposeMoE: every
// expert runs on every token and is weighed by its routing weight, exactly 0 for the experts
// a token did not choose.

// moe says where a family keeps its sparse blocks and how their routers weigh the experts.
type moe struct {
	block            string // the sparse block's module under each layer
	gate, up, down   string // the expert projections' names
	experts          string // the field that counts the experts, named when neither num_local_experts nor num_experts is given
	expertWidth      func(*model.Config) int
	renormalize      func(*model.Config) bool // divide the top-k probabilities by their sum
	f32Weights       bool                     // routing weights multiply in f32 (Mixtral), not the activations' dtype (Qwen)
	sharedExpert     bool                     // Qwen2-MoE: a dense expert for every token, scaled by sigmoid(shared_expert_gate)
	perLayerWindows  bool                     // use_sliding_window gives some layers a window, others none (Qwen2-MoE): unsupported
	windowNeedsFlag  bool                     // sliding_window applies only with use_sliding_window true (Qwen)
	widthField       string                   // the config field of expertWidth, for messages
	qkvBiasFromField bool                     // q/k/v biases follow qkv_bias (Qwen2-MoE)
	layerChoice      bool                     // decoder_sparse_step and mlp_only_layers choose the sparse layers, and 0 experts means none (Qwen); else every layer is sparse
}

var (
	// Mixtral: model.layers.N.block_sparse_moe.{gate, experts.E.w1/w2/w3}; softmax over all
	// experts in f32, top-k, renormalised, weights kept in f32 (MixtralTopKRouter).
	mixtralMoE = moe{
		block: "block_sparse_moe", gate: "w1", up: "w3", down: "w2", experts: "num_local_experts",
		expertWidth: func(c *model.Config) int { return c.IntermediateSize }, widthField: "intermediate_size",
		renormalize: func(*model.Config) bool { return true }, f32Weights: true,
	}
	// Qwen2-MoE: mlp.{gate, experts.E.{gate,up,down}_proj, shared_expert.*, shared_expert_gate};
	// top-k renormalised only with norm_topk_prob, the weights cast to the logits' dtype.
	qwen2MoE = moe{
		block: "mlp", gate: "gate_proj", up: "up_proj", down: "down_proj", experts: "num_experts",
		expertWidth: func(c *model.Config) int { return c.MoE.IntermediateSize }, widthField: "moe_intermediate_size",
		renormalize:  func(c *model.Config) bool { return c.MoE.NormTopKProb },
		sharedExpert: true, perLayerWindows: true, windowNeedsFlag: true, qkvBiasFromField: true, layerChoice: true,
	}
	// Qwen3-MoE: as Qwen2-MoE without the shared expert, with Qwen3's attention.
	qwen3MoE = moe{
		block: "mlp", gate: "gate_proj", up: "up_proj", down: "down_proj", experts: "num_experts",
		expertWidth: func(c *model.Config) int { return c.MoE.IntermediateSize }, widthField: "moe_intermediate_size",
		renormalize:     func(c *model.Config) bool { return c.MoE.NormTopKProb },
		windowNeedsFlag: true, layerChoice: true,
	}
)

func init() {
	for name, v := range map[string]variant{
		"MixtralForCausalLM":  {moe: &mixtralMoE},
		"Qwen2MoeForCausalLM": {moe: &qwen2MoE},
		"Qwen3MoeForCausalLM": {qkNorm: true, moe: &qwen3MoE},
	} {
		model.RegisterArchitecture(&model.Architecture{Name: name, Build: func(cfg *model.Config, opts model.BuildOptions) (*graph.Graph, error) {
			return buildMoE(cfg, opts, v)
		}, TPPlan: moeTPPlan})
	}
}

// moeTPPlan extends the family's plan to the sparse blocks: each expert splits as a dense
// MLP does (gate and up by output features, down by input features with an all_reduce
// after), the routers and Qwen2-MoE's shared-expert gate stay whole.
var moeTPPlan = func() model.TPPlan {
	p := model.TPPlan{
		"model.layers.*.block_sparse_moe.gate":         model.TPReplicate,
		"model.layers.*.block_sparse_moe.experts.*.w1": model.TPColwise,
		"model.layers.*.block_sparse_moe.experts.*.w3": model.TPColwise,
		"model.layers.*.block_sparse_moe.experts.*.w2": model.TPRowwise,
		"model.layers.*.mlp.gate":                      model.TPReplicate,
		"model.layers.*.mlp.experts.*.gate_proj":       model.TPColwise,
		"model.layers.*.mlp.experts.*.up_proj":         model.TPColwise,
		"model.layers.*.mlp.experts.*.down_proj":       model.TPRowwise,
		"model.layers.*.mlp.shared_expert.gate_proj":   model.TPColwise,
		"model.layers.*.mlp.shared_expert.up_proj":     model.TPColwise,
		"model.layers.*.mlp.shared_expert.down_proj":   model.TPRowwise,
		"model.layers.*.mlp.shared_expert_gate":        model.TPReplicate,
	}
	for k, v := range tpPlan {
		p[k] = v
	}
	return p
}()

// buildMoE checks a mixture-of-experts config (and, when the build options give them, the
// checkpoint's expert tensors) before building the graph, so that bad input fails naming
// the field or the tensor before any weight is read.
func buildMoE(cfg *model.Config, opts model.BuildOptions, v variant) (*graph.Graph, error) {
	m := v.moe
	c := *cfg // adjusted below to what the family reads
	name := cfg.Architectures[0]
	field := m.experts // the field that gave the count, for messages
	if cfg.Raw != nil {
		switch {
		case cfg.Raw["num_local_experts"] != nil:
			field = "num_local_experts"
		case cfg.Raw["num_experts"] != nil:
			field = "num_experts"
		default:
			return nil, fmt.Errorf("%s is missing: %s needs the number of experts", m.experts, name)
		}
	}
	switch {
	case cfg.NumLocalExperts < 0 || (cfg.NumLocalExperts == 0 && !m.layerChoice):
		return nil, fmt.Errorf("%s must be positive for %s, got %d", field, name, cfg.NumLocalExperts)
	case !m.layerChoice: // Mixtral: every layer is sparse, whatever fields of other families say
		c.MoE.DecoderSparseStep, c.MoE.MLPOnlyLayers = 1, nil
	}
	sparse := 0
	for l := range c.NumHiddenLayers {
		if c.IsSparseLayer(l) {
			sparse++
		}
	}
	if sparse > 0 {
		if k := c.NumExpertsPerTok; k < 1 || k > c.NumLocalExperts {
			return nil, fmt.Errorf("num_experts_per_tok must be in [1, %d] (%s), got %d", c.NumLocalExperts, field, k)
		}
		if w := m.expertWidth(&c); w <= 0 {
			return nil, fmt.Errorf("%s must be positive for the experts of %s, got %d", m.widthField, name, w)
		}
		if m.sharedExpert && c.MoE.SharedExpertIntermediateSize <= 0 {
			return nil, fmt.Errorf("shared_expert_intermediate_size must be positive for %s, got %d", name, c.MoE.SharedExpertIntermediateSize)
		}
	}
	if m.windowNeedsFlag {
		on, _ := cfg.Raw["use_sliding_window"].(bool) // false when absent, as in transformers
		switch {
		case on && m.perLayerWindows && cfg.SlidingWindow > 0:
			return nil, fmt.Errorf("use_sliding_window is not supported for %s (a window on some layers only)", name)
		case !on:
			c.SlidingWindow = 0
		}
	}
	if m.qkvBiasFromField {
		v.qkvBias = cfg.MoE.QKVBias
		c.AttentionBias = false // o_proj never has a bias here
	}
	if opts.Tensors != nil {
		if err := checkExperts(&c, opts.Tensors, m, field); err != nil {
			return nil, err
		}
	}
	return build(&c, opts, v)
}

// checkExperts makes sure the checkpoint holds every expert's three projections of every
// sparse layer, naming the first missing one.
func checkExperts(cfg *model.Config, ts model.TensorInfoSource, m *moe, field string) error {
	var missing []string
	for l := range cfg.NumHiddenLayers {
		if !cfg.IsSparseLayer(l) {
			continue
		}
		blk := fmt.Sprintf("model.layers.%d.%s", l, m.block)
		if _, fused := ts.Info(blk + ".experts.gate_up_proj"); fused {
			return fmt.Errorf("checkpoint stores the experts of layer %d fused (%s.experts.gate_up_proj); Loom reads one tensor per expert projection (%s.experts.0.%s.weight, ...)", l, blk, blk, m.gate)
		}
		for e := range cfg.NumLocalExperts {
			for _, proj := range []string{m.gate, m.up, m.down} {
				key := fmt.Sprintf("%s.experts.%d.%s.weight", blk, e, proj)
				if _, ok := ts.Info(key); !ok {
					missing = append(missing, key)
				}
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	more := ""
	if len(missing) > 1 {
		more = fmt.Sprintf(" (and %d more expert tensors)", len(missing)-1)
	}
	return fmt.Errorf("checkpoint has no tensor %s%s, though %s is %d", missing[0], more, field, cfg.NumLocalExperts)
}

// sparseMoE is the sparse block of layer prefix p on x [B,S,hidden]: graph.DecomposeMoE
// over the block's router and experts, plus Qwen2-MoE's shared expert.
func (b *builder) sparseMoE(p string, x *graph.Value, m *moe) *graph.Value {
	cfg := b.cfg
	blk := p + "." + m.block
	b.SetScope(blk)
	E, H, I := cfg.NumLocalExperts, cfg.HiddenSize, m.expertWidth(cfg)
	router := b.sparseParam(blk+".gate", E, H)
	experts := make([]graph.MoEExpert, E)
	for e := range experts {
		ep := fmt.Sprintf("%s.experts.%d.", blk, e)
		experts[e] = graph.MoEExpert{
			Gate: b.sparseParam(ep+m.gate, I, H),
			Up:   b.sparseParam(ep+m.up, I, H),
			Down: b.sparseParam(ep+m.down, H, I),
		}
	}
	r := graph.MoERouting{TopK: cfg.NumExpertsPerTok, Renormalize: m.renormalize(cfg), WeightDType: b.act}
	if m.f32Weights {
		r.WeightDType = tensor.F32
	}
	out := graph.DecomposeMoE(b.Builder, x, router, experts, r)
	if m.sharedExpert {
		b.SetScope(blk + ".shared_expert")
		shared := b.swiglu(blk+".shared_expert", x, cfg.MoE.SharedExpertIntermediateSize)
		b.SetScope(blk + ".shared_expert_gate")
		gate := b.Unary("sigmoid", b.Linear(x, b.sparseParam(blk+".shared_expert_gate", 1, H)))
		out = b.Add(out, b.Mul(gate, shared))
	}
	return out
}

// swiglu is a bias-free SwiGLU MLP of the given width: down(silu(gate(x)) * up(x)).
func (b *builder) swiglu(p string, x *graph.Value, width int) *graph.Value {
	H := b.cfg.HiddenSize
	gate := b.linear(x, p+".gate_proj", H, width, false)
	up := b.linear(x, p+".up_proj", H, width, false)
	return b.linear(b.Mul(b.Unary("silu", gate), up), p+".down_proj", width, H, false)
}
