package model

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// QuantConfig is a checkpoint's quantization_config (config.json), for the FP8 formats Loom
// reads:
//
//   - Hugging Face "fp8" (quant_method fp8, as Qwen3-*-FP8 and DeepSeek-V3 ship): float8_e4m3fn
//     weights and <module>.weight_scale_inv, one f32 per weight_block_size block
//     [ceil(N/bn), ceil(K/bk)] (a multiplier, whatever the name says); without
//     weight_block_size one scale per tensor. modules_to_not_convert lists modules left
//     unquantized (a module whose name contains an entry, as transformers matches them); the
//     LM head always stays unquantized, as transformers keeps it.
//   - "compressed-tensors" float-quantized FP8 (as llm-compressor writes it): config_groups
//     whose weights are num_bits 8, type float, strategy tensor, channel or block
//     (block_structure), with <module>.weight_scale [1], [N,1] or the block grid; targets
//     "Linear" or "re:<regex>"; ignore lists module names or "re:<regex>" patterns.
//
// Activations: both formats say how an FP8 GEMM quantizes a linear's input (dynamic: per
// token at run time; static: the checkpoint's input_scale). The CPU does not quantize
// activations: it multiplies the dequantized weight with activations in the activation
// dtype, as transformers' dequantized reference does (see linear_fp8).
type QuantConfig struct {
	// Method is quant_method: QuantFP8 or QuantCompressedTensors (or QuantLoad, for a
	// checkpoint quantized while loading: WithLoadQuantization).
	Method string
	// WeightDType is the stored dtype of quantized weights (F8E4M3; F8E5M2 where a config
	// says e5m2).
	WeightDType tensor.DType
	// Scheme is graph.QuantTensor, graph.QuantChannel or graph.QuantBlock; Block the block's
	// [rows, cols] for the block scheme.
	Scheme string
	Block  []int
	// ScaleSuffix names a quantized weight's scale: "<module>.<ScaleSuffix>"
	// (weight_scale_inv or weight_scale).
	ScaleSuffix string
	// Activations is none, dynamic or static (linear_fp8's activation_scheme).
	Activations string
	// Ignore lists the modules left unquantized, as the config gives them; targets the
	// compressed-tensors patterns of the modules quantized.
	Ignore  []string
	targets []string
	// substring: Ignore entries match anywhere in the module name (Hugging Face fp8).
	substring bool
}

// The quant_method values Loom reads.
const (
	QuantFP8               = "fp8"
	QuantCompressedTensors = "compressed-tensors"
	// QuantLoad marks weights quantized while loading (--quantize fp8), not by the checkpoint.
	QuantLoad = "load"
)

// parseQuant reads quantization_config; nil when the config has none.
func parseQuant(f *fields) *QuantConfig {
	q := f.object("quantization_config")
	if q == nil {
		return nil
	}
	method := q.str("quant_method", "")
	switch method {
	case QuantFP8:
		return parseHFFP8(q)
	case QuantCompressedTensors:
		return parseCompressedTensors(q)
	case "":
		q.fail("%s is missing", q.key("quant_method"))
	default:
		q.fail("%s %q is not supported (Loom reads fp8 and compressed-tensors FP8 checkpoints)", q.key("quant_method"), method)
	}
	return nil
}

func parseHFFP8(q *fields) *QuantConfig {
	c := &QuantConfig{Method: QuantFP8, WeightDType: tensor.F8E4M3, Scheme: graph.QuantTensor, ScaleSuffix: "weight_scale_inv", substring: true}
	switch fmtName := q.str("fmt", "e4m3"); fmtName {
	case "e4m3", "float8_e4m3fn":
	case "e5m2", "float8_e5m2":
		c.WeightDType = tensor.F8E5M2
	default:
		q.fail("%s %q is not supported (want e4m3 or e5m2)", q.key("fmt"), fmtName)
	}
	if q.has("weight_block_size") {
		c.Scheme, c.Block = graph.QuantBlock, q.intList("weight_block_size")
		if len(c.Block) != 2 || c.Block[0] < 1 || c.Block[1] < 1 {
			q.fail("%s must be two positive integers, got %v", q.key("weight_block_size"), c.Block)
		}
	}
	c.Activations = q.str("activation_scheme", "dynamic")
	if c.Activations != "dynamic" && c.Activations != "static" {
		q.fail("%s %q is not supported (want dynamic or static)", q.key("activation_scheme"), c.Activations)
	}
	c.Ignore = q.strs("modules_to_not_convert")
	return c
}

func parseCompressedTensors(q *fields) *QuantConfig {
	c := &QuantConfig{Method: QuantCompressedTensors, WeightDType: tensor.F8E4M3, ScaleSuffix: "weight_scale", Activations: "none"}
	if format := q.str("format", "float-quantized"); format != "float-quantized" && format != "naive-quantized" {
		q.fail("%s %q is not supported (Loom reads float-quantized FP8)", q.key("format"), format)
	}
	c.Ignore = q.strs("ignore")
	groups := q.object("config_groups")
	if groups == nil {
		q.fail("%s is missing", q.key("config_groups"))
		return nil
	}
	names := make([]string, 0, len(groups.m))
	for k := range groups.m {
		names = append(names, k)
	}
	sort.Strings(names)
	if len(names) != 1 {
		q.fail("%s: Loom reads one quantization group, got %d (%s)", groups.prefix[:len(groups.prefix)-1], len(names), strings.Join(names, ", "))
		return nil
	}
	g := groups.object(names[0])
	if g == nil {
		return nil
	}
	c.targets = g.strs("targets")
	w := g.object("weights")
	if w == nil {
		g.fail("%s is missing", g.key("weights"))
		return nil
	}
	if bits := w.int("num_bits", 0); bits != 8 {
		w.fail("%s %d is not supported (Loom reads 8-bit float weights)", w.key("num_bits"), bits)
	}
	if typ := w.str("type", ""); typ != "float" {
		w.fail("%s %q is not supported (Loom reads float (FP8) weights)", w.key("type"), typ)
	}
	if w.bool("dynamic", false) {
		w.fail("%s: dynamic weight scales are not supported", w.key("dynamic"))
	}
	switch strategy := w.str("strategy", ""); strategy {
	case "tensor":
		c.Scheme = graph.QuantTensor
	case "channel":
		c.Scheme = graph.QuantChannel
	case "block":
		c.Scheme, c.Block = graph.QuantBlock, w.intList("block_structure")
		if len(c.Block) != 2 || c.Block[0] < 1 || c.Block[1] < 1 {
			w.fail("%s must be two positive integers, got %v", w.key("block_structure"), c.Block)
		}
	default:
		w.fail("%s %q is not supported (want tensor, channel or block)", w.key("strategy"), strategy)
	}
	if a := g.object("input_activations"); a != nil {
		if bits, typ := a.int("num_bits", 0), a.str("type", ""); bits != 8 || typ != "float" {
			a.fail("%s: %d-bit %s activations are not supported (want 8-bit float)", a.prefix[:len(a.prefix)-1], bits, typ)
		}
		c.Activations = "static"
		if a.bool("dynamic", false) {
			c.Activations = "dynamic"
		}
	}
	for _, p := range append(slices.Clone(c.Ignore), c.targets...) {
		if re, ok := strings.CutPrefix(p, "re:"); ok {
			if _, err := regexp.Compile(re); err != nil {
				q.fail("%s: bad pattern %q: %v", q.key("ignore"), p, err)
			}
		}
	}
	return c
}

// matchModule reports whether a compressed-tensors pattern names module: "re:<regex>" (the
// whole name), else the name itself or its last components.
func matchModule(p, module string) bool {
	if re, ok := strings.CutPrefix(p, "re:"); ok {
		m, err := regexp.MatchString("^(?:"+re+")$", module)
		return err == nil && m
	}
	return module == p || strings.HasSuffix(module, "."+p)
}

// Quantized reports whether the linear module (such as "model.layers.0.mlp.up_proj") holds
// a quantized weight.
func (q *QuantConfig) Quantized(module string) bool {
	if q == nil {
		return false
	}
	if q.Method == QuantFP8 && module == "lm_head" {
		return false
	}
	for _, p := range q.Ignore {
		if q.substring && strings.Contains(module, p) || !q.substring && matchModule(p, module) {
			return false
		}
	}
	if q.Method != QuantCompressedTensors || len(q.targets) == 0 {
		return true
	}
	for _, t := range q.targets {
		if t == "Linear" || matchModule(t, module) {
			return true
		}
	}
	return false
}

// ScaleShape is the scale shape of a quantized weight [n,k].
func (q *QuantConfig) ScaleShape(n, k int) []int {
	s, _ := graph.FP8ScaleShape(q.Scheme, n, k, q.Block)
	return s
}

// LoadQuantMethods are the values of --quantize (engine.LoadOptions.Quantize).
var LoadQuantMethods = []string{"fp8"}

// WithLoadQuantization makes the config quantize its checkpoint while loading (--quantize
// method; only "fp8"), as vLLM's --quantization fp8 does for an unquantized checkpoint: every
// linear projection of the decoder layers (not the embeddings, not the LM head, not the norms)
// reads an f8e4m3 weight [N,K] and a per-output-channel f32 scale [N,1]
// (<module>.weight_scale), which the checkpoint computes from the stored weight
// (Checkpoint.QuantizeWhileLoading). A checkpoint that is already quantized is an error.
func (c *Config) WithLoadQuantization(method string) error {
	if method != "fp8" {
		return fmt.Errorf("--quantize %q is not supported (want %s)", method, strings.Join(LoadQuantMethods, " or "))
	}
	if c.Quant != nil {
		return fmt.Errorf("--quantize %s: the checkpoint is already quantized (quantization_config: %s); load it without --quantize", method, c.Quant)
	}
	c.Quant = &QuantConfig{Method: QuantLoad, WeightDType: tensor.F8E4M3, Scheme: graph.QuantChannel, ScaleSuffix: "weight_scale",
		Activations: "dynamic", Ignore: []string{"lm_head"}}
	return nil
}

// String describes the configuration for messages: "fp8 block [128 128]".
func (q *QuantConfig) String() string {
	if q.Method == QuantLoad {
		return "--quantize fp8, " + q.Scheme + " scales"
	}
	s := q.Method + " " + q.Scheme
	if q.Scheme == graph.QuantBlock {
		s += fmt.Sprint(" ", q.Block)
	}
	return s
}
