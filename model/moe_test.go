package model

import (
	"path/filepath"
	"reflect"
	"testing"
)

func TestMoEConfigFixtures(t *testing.T) {
	for _, tc := range []struct {
		name          string
		experts, topk int
		moe           MoEConfig
		sparse        []bool
	}{
		// Mixtral names none of the fields: the defaults.
		{"tiny-mixtral", 4, 2, MoEConfig{DecoderSparseStep: 1, QKVBias: true}, []bool{true, true}},
		{"tiny-qwen2moe", 4, 2, MoEConfig{IntermediateSize: 48, SharedExpertIntermediateSize: 96, DecoderSparseStep: 1, MLPOnlyLayers: []int{}, QKVBias: true}, []bool{true, true}},
		{"tiny-qwen3moe", 4, 2, MoEConfig{IntermediateSize: 48, NormTopKProb: true, DecoderSparseStep: 2, MLPOnlyLayers: []int{}, QKVBias: true}, []bool{false, true}},
		{"tiny-llama", 0, 0, MoEConfig{DecoderSparseStep: 1, QKVBias: true}, []bool{false, false}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := LoadConfig(filepath.Join(fixtures, tc.name, "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			if c.NumLocalExperts != tc.experts || c.NumExpertsPerTok != tc.topk {
				t.Errorf("%d experts, %d per token; want %d, %d", c.NumLocalExperts, c.NumExpertsPerTok, tc.experts, tc.topk)
			}
			if !reflect.DeepEqual(c.MoE, tc.moe) {
				t.Errorf("MoE %+v, want %+v", c.MoE, tc.moe)
			}
			for l, want := range tc.sparse {
				if got := c.IsSparseLayer(l); got != want {
					t.Errorf("IsSparseLayer(%d) = %v, want %v", l, got, want)
				}
			}
		})
	}
}

func TestIsSparseLayer(t *testing.T) {
	c, err := ParseConfig(configJSON(t, map[string]any{"num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 6,
		"decoder_sparse_step": 2, "mlp_only_layers": []int{3, 9}, "norm_topk_prob": true, "qkv_bias": false}), "config.json")
	if err != nil {
		t.Fatal(err)
	}
	var sparse []int
	for l := range c.NumHiddenLayers {
		if c.IsSparseLayer(l) {
			sparse = append(sparse, l)
		}
	}
	if want := []int{1, 5}; !reflect.DeepEqual(sparse, want) { // 3 is MLP-only; 9 is no layer
		t.Errorf("sparse layers %v, want %v", sparse, want)
	}
	if !c.MoE.NormTopKProb || c.MoE.QKVBias {
		t.Errorf("MoE %+v", c.MoE)
	}
	c, err = ParseConfig(configJSON(t, map[string]any{"num_experts": 0, "decoder_sparse_step": 1}), "config.json")
	if err != nil {
		t.Fatal(err)
	}
	if c.IsSparseLayer(0) {
		t.Error("a model without experts has a sparse layer")
	}
}

func TestMoEConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edits map[string]any
		want  string
	}{
		{"sparse step zero", map[string]any{"decoder_sparse_step": 0}, "decoder_sparse_step must be positive, got 0"},
		{"moe width negative", map[string]any{"moe_intermediate_size": -8}, "moe_intermediate_size must not be negative, got -8"},
		{"shared width negative", map[string]any{"shared_expert_intermediate_size": -1}, "shared_expert_intermediate_size must not be negative"},
		{"mlp_only_layers not a list", map[string]any{"mlp_only_layers": 3}, "mlp_only_layers: want a list of integers, got 3"},
		{"mlp_only_layers of strings", map[string]any{"mlp_only_layers": []any{1, "2"}}, `mlp_only_layers: want integers, got "2"`},
		{"norm_topk_prob a string", map[string]any{"norm_topk_prob": "yes"}, "norm_topk_prob: want true or false"},
		// The bound names the field the file gave the count in.
		{"too many per token (num_experts)", map[string]any{"num_experts": 4, "num_experts_per_tok": 5}, "num_experts_per_tok must be in [1, 4] (num_experts), got 5"},
		{"too many per token (num_local_experts)", map[string]any{"num_local_experts": 4, "num_experts_per_tok": 5}, "num_experts_per_tok must be in [1, 4] (num_local_experts), got 5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig(configJSON(t, tc.edits), "x/config.json")
			if c != nil {
				t.Errorf("got a config with the error")
			}
			wantErr(t, err, "x/config.json: ", tc.want)
		})
	}
}
