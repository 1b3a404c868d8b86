package model

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// quantConfig is tiny-llama's config.json with the given quantization_config.
func quantConfig(t testing.TB, qc string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(fixtures, "tiny-llama", "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	s := strings.TrimSpace(string(b))
	return []byte(s[:len(s)-1] + `, "quantization_config": ` + qc + "}")
}

const (
	hfFP8 = `{"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128], "modules_to_not_convert": ["mlp.gate"]}`
	ctFP8 = `{"quant_method": "compressed-tensors", "format": "float-quantized", "ignore": ["lm_head", "re:.*mlp\\.gate$"],
		"config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": false},
		"input_activations": {"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true}}}}`
)

func TestQuantConfig(t *testing.T) {
	c, err := ParseConfig(quantConfig(t, hfFP8), "config.json")
	if err != nil {
		t.Fatal(err)
	}
	q := c.Quant
	if q.Method != QuantFP8 || q.Scheme != graph.QuantBlock || !slices.Equal(q.Block, []int{128, 128}) || q.ScaleSuffix != "weight_scale_inv" || q.Activations != "dynamic" || q.WeightDType != tensor.F8E4M3 {
		t.Errorf("hf fp8: %+v", q)
	}
	if s := q.ScaleShape(300, 129); !slices.Equal(s, []int{3, 2}) {
		t.Errorf("block scale shape of [300,129]: %v", s)
	}
	for module, want := range map[string]bool{"model.layers.0.mlp.up_proj": true, "lm_head": false, "model.layers.3.mlp.gate": false} {
		if q.Quantized(module) != want {
			t.Errorf("hf fp8: Quantized(%s) = %v", module, !want)
		}
	}
	c, err = ParseConfig(quantConfig(t, ctFP8), "config.json")
	if err != nil {
		t.Fatal(err)
	}
	q = c.Quant
	if q.Method != QuantCompressedTensors || q.Scheme != graph.QuantChannel || q.ScaleSuffix != "weight_scale" || q.Activations != "dynamic" {
		t.Errorf("compressed-tensors: %+v", q)
	}
	for module, want := range map[string]bool{"model.layers.0.self_attn.q_proj": true, "lm_head": false, "model.layers.1.mlp.gate": false, "model.layers.1.mlp.gate_proj": true} {
		if q.Quantized(module) != want {
			t.Errorf("compressed-tensors: Quantized(%s) = %v", module, !want)
		}
	}
	if c, err := ParseConfig(quantConfig(t, `null`), "config.json"); err != nil || c.Quant != nil {
		t.Errorf("null quantization_config: %v, %v", c.Quant, err)
	}
}

func TestQuantConfigErrors(t *testing.T) {
	ct := func(weights string) string {
		return `{"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"], "weights": ` + weights + `}}}`
	}
	for _, tc := range []struct{ qc, want string }{
		{`{"quant_method": "awq"}`, `config.json: quantization_config.quant_method "awq" is not supported`},
		{`{"bits": 4}`, "quantization_config.quant_method is missing"},
		{`[1]`, "quantization_config: want an object"},
		{`{"quant_method": "fp8", "weight_block_size": [128]}`, "quantization_config.weight_block_size must be two positive integers"},
		{`{"quant_method": "fp8", "weight_block_size": [0, 128]}`, "weight_block_size must be two positive integers"},
		{`{"quant_method": "fp8", "fmt": "e3m4"}`, `quantization_config.fmt "e3m4" is not supported`},
		{`{"quant_method": "fp8", "activation_scheme": "weird"}`, `quantization_config.activation_scheme "weird"`},
		{`{"quant_method": "compressed-tensors"}`, "quantization_config.config_groups is missing"},
		{`{"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {}}`, `quantization_config.format "pack-quantized" is not supported`},
		{ct(`{"num_bits": 4, "type": "int", "strategy": "group"}`), "quantization_config.config_groups.g.weights.num_bits 4 is not supported"},
		{ct(`{"num_bits": 8, "type": "int", "strategy": "channel"}`), `weights.type "int" is not supported`},
		{ct(`{"num_bits": 8, "type": "float", "strategy": "group"}`), `weights.strategy "group" is not supported`},
		{ct(`{"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [128]}`), "weights.block_structure must be two positive integers"},
		{`{"quant_method": "compressed-tensors", "config_groups": {"a": {}, "b": {}}}`, "Loom reads one quantization group, got 2 (a, b)"},
		{`{"quant_method": "compressed-tensors", "ignore": ["re:("], "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float", "strategy": "tensor"}}}}`, `bad pattern "re:("`},
	} {
		_, err := ParseConfig(quantConfig(t, tc.qc), "config.json")
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s:\n error %v\n want %q", tc.qc, err, tc.want)
		}
	}
}

// FuzzQuantConfig: any quantization_config parses or fails cleanly; a parsed one has a
// scheme whose scale shapes exist.
func FuzzQuantConfig(f *testing.F) {
	for _, s := range []string{hfFP8, ctFP8, `{"quant_method": "fp8"}`, `{"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float", "strategy": "block", "block_structure": [2, 3]}}}}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, qc string) {
		c, err := ParseConfig(quantConfig(t, qc), "config.json")
		if err != nil || c.Quant == nil {
			return
		}
		if _, err := graph.FP8ScaleShape(c.Quant.Scheme, 64, 160, c.Quant.Block); err != nil {
			t.Fatalf("parsed %s into %+v, whose scheme has no scale shape: %v", qc, c.Quant, err)
		}
		c.Quant.Quantized("model.layers.0.mlp.up_proj")
	})
}
