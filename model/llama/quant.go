package llama

import (
	"fmt"
	"slices"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model"
	"github.com/loom-ml/loom/tensor"
)

// Quantized linears. A module that the config's quantization_config quantizes reads its
// weight [out,in] as an fp8 matrix and its scale <module>.<weight_scale_inv|weight_scale>,
// and becomes one linear_fp8 op. With the checkpoint at hand (BuildOptions.Tensors), the
// weight's dtype and the scale's presence and shape are checked here, naming the tensor,
// before any weight is read.

// project is x @ w^T for the module's weight [out,in]: linear, or linear_fp8 when the
// module is quantized.
func (b *builder) project(x *graph.Value, module string, in, out int) *graph.Value {
	q := b.cfg.Quant
	if !q.Quantized(module) {
		return b.Linear(x, b.param(module+".weight", out, in))
	}
	wkey, skey := module+".weight", module+"."+q.ScaleSuffix
	scaleShape, scaleDT := q.ScaleShape(out, in), tensor.F32
	if st, ok := b.scales[module]; ok {
		scaleShape, scaleDT = st.shape, st.dtype
	}
	w := b.Param(wkey, q.WeightDType, graph.Dims(out, in))
	s := b.Param(skey, scaleDT, graph.Dims(scaleShape...))
	return b.LinearFP8(x, w, s, q.Scheme, q.Block, q.Activations)
}

// scaleType is the stored shape and dtype of a scale.
type scaleType struct {
	shape []int
	dtype tensor.DType
}

// quantScales checks the tensors of every quantized linear module of a Llama-family model
// (attention, dense MLPs, Qwen2-MoE's shared experts, the LM head; not the experts, see
// sparseParam) in the checkpoint (when the options give it), before the graph is built, and returns each
// scale's stored shape and dtype by module.
func quantScales(cfg *model.Config, opts model.BuildOptions) (map[string]scaleType, error) {
	q, t := cfg.Quant, opts.Tensors
	if q == nil || t == nil || q.Method == model.QuantLoad {
		return nil, nil
	}
	H, KV, D, I := cfg.NumAttentionHeads, cfg.NumKeyValueHeads, cfg.HeadDim, cfg.IntermediateSize
	type mod struct {
		name    string
		out, in int
	}
	var mods []mod
	for l := range cfg.NumHiddenLayers {
		p := fmt.Sprintf("model.layers.%d.", l)
		mods = append(mods,
			mod{p + "self_attn.q_proj", H * D, cfg.HiddenSize}, mod{p + "self_attn.k_proj", KV * D, cfg.HiddenSize},
			mod{p + "self_attn.v_proj", KV * D, cfg.HiddenSize}, mod{p + "self_attn.o_proj", cfg.HiddenSize, H * D},
			mod{p + "mlp.gate_proj", I, cfg.HiddenSize}, mod{p + "mlp.up_proj", I, cfg.HiddenSize}, mod{p + "mlp.down_proj", cfg.HiddenSize, I})
		if S := cfg.MoE.SharedExpertIntermediateSize; S > 0 && cfg.IsSparseLayer(l) { // Qwen2-MoE's shared expert: linears of their own
			mods = append(mods, mod{p + "mlp.shared_expert.gate_proj", S, cfg.HiddenSize}, mod{p + "mlp.shared_expert.up_proj", S, cfg.HiddenSize},
				mod{p + "mlp.shared_expert.down_proj", cfg.HiddenSize, S})
		}
	}
	if !cfg.TieWordEmbeddings {
		mods = append(mods, mod{"lm_head", cfg.VocabSize, cfg.HiddenSize})
	}
	out := map[string]scaleType{}
	for _, m := range mods {
		if !q.Quantized(m.name) {
			continue
		}
		st := scaleType{q.ScaleShape(m.out, m.in), tensor.F32}
		if err := checkQuantTensors(t, q, m.name+".weight", m.name+"."+q.ScaleSuffix, m.out, m.in, &st.shape, &st.dtype); err != nil {
			return nil, err
		}
		out[m.name] = st
	}
	return out, nil
}

// checkQuantTensors checks a quantized module's tensors in the checkpoint and returns the
// scale's stored shape (one of the forms its scheme allows) and dtype.
func checkQuantTensors(t model.TensorInfoSource, q *model.QuantConfig, wkey, skey string, out, in int, scaleShape *[]int, scaleDT *tensor.DType) error {
	w, ok := t.Info(wkey)
	if !ok {
		return nil // reported by the checkpoint check, with the files searched
	}
	if w.DType != q.WeightDType {
		return fmt.Errorf("tensor %q is stored as %s, but quantization_config (%s) quantizes it: want %s", wkey, w.StoredDType, q, q.WeightDType)
	}
	s, ok := t.Info(skey)
	if !ok {
		return fmt.Errorf("quantization_config (%s) quantizes %q, but the checkpoint has no scale tensor %q", q, wkey, skey)
	}
	if !s.DType.IsFloat() {
		return fmt.Errorf("scale tensor %q is stored as %s; want a float dtype", skey, s.StoredDType)
	}
	want := *scaleShape
	fits := slices.Equal(s.Shape, want)
	switch q.Scheme {
	case graph.QuantTensor:
		fits = len(s.Shape) <= 1 && tensor.Numel(s.Shape) == 1
	case graph.QuantChannel:
		fits = fits || slices.Equal(s.Shape, want[:1])
	}
	if !fits {
		return fmt.Errorf("scale tensor %q has shape %v, which does not fit weight %q %v under quantization_config (%s): want %v", skey, s.Shape, wkey, []int{out, in}, q, want)
	}
	*scaleShape, *scaleDT = s.Shape, s.DType
	return nil
}

// sparseParam declares the weight [out,in] of a module of a sparse block that is not a
// linear of its own (an expert's projection, a router, Qwen2-MoE's shared-expert gate). A
// module that the checkpoint stores quantized is declared in the config's weight dtype
// (bf16 for the released FP8 checkpoints) and the checkpoint dequantizes it while loading
// (model/quant_dequantize.go: decode(w)·scale in f32, rounded once, as dequantize_fp8 does):
// the moe op and its kernels have no fp8 form yet, so they see the experts in bf16 and the
// model computes what it would with the dequantized weights stored. Only the fp8 bytes of
// the experts a rank holds (and of its slice of them) are read. Other modules read as stored.
func (b *builder) sparseParam(module string, out, in int) *graph.Value {
	if st, ok := b.dequantized[module]; ok {
		return b.Param(module+".weight", st, graph.Dims(out, in))
	}
	return b.param(module+".weight", out, in)
}

// dequantizedModules checks, with the checkpoint at hand, the sparse blocks' modules that
// the checkpoint stores quantized (stored in the config's quantized dtype, quantized by its
// quantization_config): each must have a scale that fits its weight. It returns the dtype
// each such module is read in (the config's weight dtype), by module. A module the config
// quantizes but the checkpoint stores unquantized (a bf16 router, as FP8 checkpoints keep
// them whatever modules_to_not_convert says) reads as stored.
func dequantizedModules(cfg *model.Config, opts model.BuildOptions, m *moe) (map[string]tensor.DType, error) {
	q, t := cfg.Quant, opts.Tensors
	if q == nil || t == nil || q.Method == model.QuantLoad {
		return nil, nil
	}
	E, H := cfg.NumLocalExperts, cfg.HiddenSize
	I := m.expertWidth(cfg)
	type mod struct {
		name    string
		out, in int
	}
	var mods []mod
	for l := range cfg.NumHiddenLayers {
		if !cfg.IsSparseLayer(l) {
			continue
		}
		blk := fmt.Sprintf("model.layers.%d.%s", l, m.block)
		mods = append(mods, mod{blk + ".gate", E, H})
		if m.sharedExpert {
			mods = append(mods, mod{blk + ".shared_expert_gate", 1, H})
		}
		for e := range E {
			ep := fmt.Sprintf("%s.experts.%d.", blk, e)
			mods = append(mods, mod{ep + m.gate, I, H}, mod{ep + m.up, I, H}, mod{ep + m.down, H, I})
		}
	}
	out := map[string]tensor.DType{}
	for _, md := range mods {
		w, ok := t.Info(md.name + ".weight")
		if !ok || !w.DType.IsFloat8() {
			continue
		}
		if !q.Quantized(md.name) {
			return nil, fmt.Errorf("tensor %q is stored as %s, but quantization_config (%s) leaves %s unquantized", md.name+".weight", w.StoredDType, q, md.name)
		}
		st := scaleType{q.ScaleShape(md.out, md.in), tensor.F32}
		if err := checkQuantTensors(t, q, md.name+".weight", md.name+"."+q.ScaleSuffix, md.out, md.in, &st.shape, &st.dtype); err != nil {
			return nil, err
		}
		if !slices.Equal(w.Shape, []int{md.out, md.in}) {
			return nil, fmt.Errorf("tensor %q has shape %v, want %v", md.name+".weight", w.Shape, []int{md.out, md.in})
		}
		out[md.name] = cfg.WeightDType()
	}
	return out, nil
}
