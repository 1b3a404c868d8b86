package model

import ()

// MoEConfig holds the mixture-of-experts settings beyond the expert counts
// (Config.NumLocalExperts, Config.NumExpertsPerTok), as Qwen2-MoE and Qwen3-MoE configs name
// them. Mixtral has none of them: its experts are intermediate_size wide, every layer is
// sparse and its router always renormalises.
type MoEConfig struct {
	// IntermediateSize is each expert's width (moe_intermediate_size); 0 when absent.
	IntermediateSize int
	// SharedExpertIntermediateSize is the width of Qwen2-MoE's shared expert
	// (shared_expert_intermediate_size); 0 when absent.
	SharedExpertIntermediateSize int
	// NormTopKProb divides the top-k routing probabilities by their sum (norm_topk_prob;
	// false when absent, as in transformers).
	NormTopKProb bool
	// DecoderSparseStep makes layer l sparse when (l+1) % DecoderSparseStep == 0
	// (decoder_sparse_step; 1 when absent: every layer).
	DecoderSparseStep int
	// MLPOnlyLayers are layers that keep a dense MLP whatever DecoderSparseStep says
	// (mlp_only_layers; none when absent).
	MLPOnlyLayers []int
	// QKVBias is whether Qwen2-MoE's q/k/v projections have biases (qkv_bias; true when
	// absent, as in transformers).
	QKVBias bool
}

// parseMoE reads and checks the MoEConfig fields of a config.json.
func parseMoE(f *fields) MoEConfig {
	m := MoEConfig{
		IntermediateSize:             f.int("moe_intermediate_size", 0),
		SharedExpertIntermediateSize: f.int("shared_expert_intermediate_size", 0),
		NormTopKProb:                 f.bool("norm_topk_prob", false),
		DecoderSparseStep:            f.int("decoder_sparse_step", 1),
		MLPOnlyLayers:                f.intList("mlp_only_layers"),
		QKVBias:                      f.bool("qkv_bias", true),
	}
	f.nonNegative("moe_intermediate_size", m.IntermediateSize)
	f.nonNegative("shared_expert_intermediate_size", m.SharedExpertIntermediateSize)
	f.positive("decoder_sparse_step", m.DecoderSparseStep, false)
	return m
}

// IsSparseLayer reports whether decoder layer l routes its tokens to experts: the model has
// experts, l is not one of MLPOnlyLayers and (l+1) is a multiple of DecoderSparseStep (as
// Qwen2-MoE's and Qwen3-MoE's decoder layers choose; Mixtral leaves both at their defaults,
// so every layer is sparse).
func (c *Config) IsSparseLayer(l int) bool {
	if !c.IsMoE() {
		return false
	}
	for _, d := range c.MoE.MLPOnlyLayers {
		if d == l {
			return false
		}
	}
	step := max(c.MoE.DecoderSparseStep, 1)
	return (l+1)%step == 0
}
