// Package model opens Hugging Face checkpoints: the typed configuration of a decoder LLM
// (config.json), its optional generation defaults (generation_config.json) and its weights
// (one or many safetensors files, memory-mapped and validated up front). A Checkpoint is the
// graph.Weights that executables load parameters from, each rank reading only its own
// slices. Architecture frontends register themselves here (registry.go) and build the plain
// primitive graph of a config.
package model

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/loom-ml/loom/tensor"
)

// Config is a typed view of a Hugging Face config.json for decoder-only language models.
// Fields absent from the file take Hugging Face's defaults, noted per field.
type Config struct {
	// Source names the file the config came from, for messages.
	Source string

	Architectures []string // e.g. ["LlamaForCausalLM"]
	ModelType     string   // e.g. "llama"

	VocabSize             int
	HiddenSize            int
	IntermediateSize      int
	NumHiddenLayers       int
	NumAttentionHeads     int
	NumKeyValueHeads      int // num_key_value_heads; NumAttentionHeads when absent
	HeadDim               int // head_dim; HiddenSize/NumAttentionHeads when absent or null
	MaxPositionEmbeddings int

	RMSNormEps        float64 // rms_norm_eps; 1e-6 when absent
	TieWordEmbeddings bool
	AttentionBias     bool
	MLPBias           bool
	HiddenAct         string // hidden_act (or hidden_activation); "silu" when absent

	// SlidingWindow is the attention window in tokens; 0 means full attention (also when
	// use_sliding_window is explicitly false, as Qwen2 configs say).
	SlidingWindow int

	// DType is the checkpoint dtype that dtype (or the older torch_dtype) names; Invalid when
	// absent or not one of bfloat16, float16, float32.
	DType tensor.DType

	BOSTokenID  int   // -1 when absent or null
	EOSTokenIDs []int // eos_token_id as a list (it may be an int or a list); empty when none
	PadTokenID  int   // -1 when absent or null

	NumLocalExperts  int       // Mixtral num_local_experts (or num_experts); 0 for dense models
	NumExpertsPerTok int       // experts each token is routed to
	MoE              MoEConfig // the other mixture-of-experts settings (moe.go)

	Rope RopeConfig

	// Quant is quantization_config (quant.go); nil for an unquantized checkpoint.
	Quant *QuantConfig

	// Raw is the whole decoded JSON object, for fields this view does not type.
	Raw map[string]any
}

// RopeConfig describes rotary position embeddings. It is read from either config style:
// the older rope_theta + rope_scaling (whose kind is in "type" or "rope_type") or the newer
// rope_parameters, which holds rope_theta and rope_type itself.
type RopeConfig struct {
	Theta float64 // rope_theta; 10000 when absent
	// Type is the rope_type: "default", "linear", "dynamic", "yarn", "llama3", "longrope", ...
	Type string
	// Factor is the scaling factor (1 when absent).
	Factor float64
	// LowFreqFactor and HighFreqFactor bound the smoothly scaled band of llama3 rope.
	LowFreqFactor, HighFreqFactor float64
	// OriginalMaxPositionEmbeddings is the context length the model was trained with before
	// scaling (llama3, yarn); 0 when absent.
	OriginalMaxPositionEmbeddings int
	// AttentionFactor, BetaFast and BetaSlow are yarn's parameters; 0 when absent.
	AttentionFactor, BetaFast, BetaSlow float64
}

// LoadConfig reads and validates a config.json.
func LoadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	return ParseConfig(data, path)
}

// ParseConfig decodes and validates the contents of a config.json. source names the file in
// error messages, which also name the field at fault, e.g.
// "config.json: num_attention_heads must be positive, got 0".
func ParseConfig(data []byte, source string) (*Config, error) {
	f, err := parseObject(data, source)
	if err != nil {
		return nil, err
	}
	c := &Config{Source: source}
	if err := json.Unmarshal(data, &c.Raw); err != nil {
		return nil, fmt.Errorf("%s: invalid JSON: %w", source, err)
	}
	c.Architectures = f.strs("architectures")
	c.ModelType = f.str("model_type", "")
	c.VocabSize = f.int("vocab_size", 0)
	c.HiddenSize = f.int("hidden_size", 0)
	c.IntermediateSize = f.int("intermediate_size", 0)
	c.NumHiddenLayers = f.int("num_hidden_layers", 0)
	c.NumAttentionHeads = f.int("num_attention_heads", 0)
	c.NumKeyValueHeads = f.int("num_key_value_heads", c.NumAttentionHeads)
	c.MaxPositionEmbeddings = f.int("max_position_embeddings", 0)
	c.RMSNormEps = f.float("rms_norm_eps", 1e-6)
	c.TieWordEmbeddings = f.bool("tie_word_embeddings", false)
	c.AttentionBias = f.bool("attention_bias", false)
	c.MLPBias = f.bool("mlp_bias", false)
	c.HiddenAct = f.str("hidden_act", f.str("hidden_activation", "silu"))
	c.SlidingWindow = f.int("sliding_window", 0)
	if f.has("use_sliding_window") && !f.bool("use_sliding_window", true) {
		c.SlidingWindow = 0
	}
	c.DType = parseTorchDType(f.str("dtype", f.str("torch_dtype", "")))
	c.BOSTokenID = firstID(f.ids("bos_token_id"))
	c.EOSTokenIDs = f.ids("eos_token_id")
	c.PadTokenID = firstID(f.ids("pad_token_id"))
	c.NumLocalExperts = f.int("num_local_experts", f.int("num_experts", 0))
	c.NumExpertsPerTok = f.int("num_experts_per_tok", 0)
	c.MoE = parseMoE(f)
	c.Rope = parseRope(f)
	c.Quant = parseQuant(f)

	// Validation, in the order a reader would check the file.
	f.positive("vocab_size", c.VocabSize, true)
	f.positive("hidden_size", c.HiddenSize, true)
	f.positive("intermediate_size", c.IntermediateSize, true)
	f.positive("num_hidden_layers", c.NumHiddenLayers, true)
	f.positive("num_attention_heads", c.NumAttentionHeads, true)
	f.positive("num_key_value_heads", c.NumKeyValueHeads, false)
	if *f.err == nil && c.NumAttentionHeads%c.NumKeyValueHeads != 0 {
		f.fail("num_attention_heads %d is not divisible by num_key_value_heads %d", c.NumAttentionHeads, c.NumKeyValueHeads)
	}
	if f.has("head_dim") {
		c.HeadDim = f.int("head_dim", 0)
		f.positive("head_dim", c.HeadDim, true)
	} else if *f.err == nil {
		if c.HiddenSize%c.NumAttentionHeads != 0 {
			f.fail("hidden_size %d is not divisible by num_attention_heads %d (and head_dim is not given)", c.HiddenSize, c.NumAttentionHeads)
		}
		c.HeadDim = c.HiddenSize / c.NumAttentionHeads
	}
	f.nonNegative("max_position_embeddings", c.MaxPositionEmbeddings)
	if f.has("rms_norm_eps") && !(c.RMSNormEps > 0) {
		f.fail("rms_norm_eps must be positive, got %g", c.RMSNormEps)
	}
	f.nonNegative("sliding_window", c.SlidingWindow)
	f.nonNegative("num_local_experts", c.NumLocalExperts)
	f.nonNegative("num_experts", c.NumLocalExperts) // the other name, read when num_local_experts is absent
	f.nonNegative("num_experts_per_tok", c.NumExpertsPerTok)
	if c.NumLocalExperts > 0 && (c.NumExpertsPerTok < 1 || c.NumExpertsPerTok > c.NumLocalExperts) {
		experts := "num_local_experts"
		if !f.has(experts) {
			experts = "num_experts"
		}
		f.fail("num_experts_per_tok must be in [1, %d] (%s), got %d", c.NumLocalExperts, experts, c.NumExpertsPerTok)
	}
	for _, id := range c.EOSTokenIDs {
		if id < 0 {
			f.fail("eos_token_id must not be negative, got %d", id)
		}
	}
	if *f.err != nil {
		return nil, *f.err
	}
	return c, nil
}

// WeightDType is the dtype weights are assumed to be stored in when the checkpoint does not
// say: the config's dtype, or f32 (Hugging Face's default) when the config names none.
func (c *Config) WeightDType() tensor.DType {
	if c.DType == tensor.Invalid {
		return tensor.F32
	}
	return c.DType
}

// IsMoE reports whether the model routes tokens to experts.
func (c *Config) IsMoE() bool { return c.NumLocalExperts > 0 }

// parseTorchDType maps a torch dtype name to a Loom dtype (Invalid if unknown).
func parseTorchDType(s string) tensor.DType {
	switch strings.TrimPrefix(s, "torch.") {
	case "bfloat16":
		return tensor.BF16
	case "float16", "half":
		return tensor.F16
	case "float32", "float":
		return tensor.F32
	}
	return tensor.Invalid
}

func firstID(ids []int) int {
	if len(ids) == 0 {
		return -1
	}
	return ids[0]
}

// parseRope reads the rotary settings from rope_parameters (newer configs) or rope_theta +
// rope_scaling (older ones), then checks the parameters each known type needs.
func parseRope(f *fields) RopeConfig {
	r := RopeConfig{Theta: f.float("rope_theta", 10000), Type: "default", Factor: 1}
	p := f.object("rope_parameters")
	if p != nil && !p.present("rope_type") && !p.present("type") && !p.present("rope_theta") {
		// Per-layer-type parameters ({"full_attention": {...}, "sliding_attention": {...}}):
		// the full-attention layers' set describes the model's positions.
		if full := p.object("full_attention"); full != nil {
			p = full
		}
	}
	if p == nil {
		p = f.object("rope_scaling")
	}
	if p == nil {
		checkRope(f, "rope_theta", &r)
		return r
	}
	r.Theta = p.float("rope_theta", r.Theta)
	r.Type = p.str("rope_type", p.str("type", "default"))
	if r.Type == "" {
		r.Type = "default"
	}
	r.Factor = p.float("factor", 1)
	r.LowFreqFactor = p.float("low_freq_factor", 0)
	r.HighFreqFactor = p.float("high_freq_factor", 0)
	r.OriginalMaxPositionEmbeddings = p.int("original_max_position_embeddings", f.int("original_max_position_embeddings", 0))
	r.AttentionFactor = p.float("attention_factor", 0)
	r.BetaFast = p.float("beta_fast", 0)
	r.BetaSlow = p.float("beta_slow", 0)
	thetaKey := "rope_theta"
	if p.has("rope_theta") {
		thetaKey = p.key("rope_theta")
	}
	checkRope(p, thetaKey, &r)
	return r
}

func checkRope(p *fields, thetaKey string, r *RopeConfig) {
	if !(r.Theta > 0) {
		p.fail("%s must be positive, got %g", thetaKey, r.Theta)
	}
	switch r.Type {
	case "linear", "dynamic", "yarn", "llama3":
		if !(r.Factor > 0) {
			p.fail("%s must be positive for rope type %s, got %g", p.key("factor"), r.Type, r.Factor)
		}
	}
	if r.Type == "llama3" {
		switch {
		case !(r.LowFreqFactor > 0):
			p.fail("%s must be positive for rope type llama3, got %g", p.key("low_freq_factor"), r.LowFreqFactor)
		case !(r.HighFreqFactor > r.LowFreqFactor):
			p.fail("%s (%g) must exceed low_freq_factor (%g) for rope type llama3", p.key("high_freq_factor"), r.HighFreqFactor, r.LowFreqFactor)
		case r.OriginalMaxPositionEmbeddings <= 0:
			p.fail("%s must be positive for rope type llama3, got %d", p.key("original_max_position_embeddings"), r.OriginalMaxPositionEmbeddings)
		}
	}
}
