package graph

import (
	"fmt"

	"github.com/loom-ml/loom/tensor"
)

// Ops of mixture-of-experts routing.

func init() {
	Register(&OpSpec{
		Name: "topk", Doc: "The k largest entries of x[...,N] along its last axis, largest first, and where they are: values[...,k] in x's dtype and indices[...,k] i32 (torch.topk with sorted=True). Equal values come lowest index first; NaN counts as larger than every number.",
		Inputs: []string{"x"},
		Attrs:  []AttrSpec{{Name: "k", Type: AttrInt, Doc: "how many entries, 1 <= k <= N"}},
		Infer: func(n *Node) ([]Type, error) {
			x, k := inType(n, 0), n.Attrs.Int("k")
			if !x.DType.IsFloat() || len(x.Shape) == 0 {
				return nil, fmt.Errorf("topk needs a float input of rank >= 1, got %s", x)
			}
			last := x.Shape[len(x.Shape)-1]
			if last.IsSym() {
				return nil, fmt.Errorf("topk along a symbolic axis (%s) is not supported", last)
			}
			if k < 1 || k > last.Size {
				return nil, fmt.Errorf("topk: k = %d is not in [1, %d] (the last axis of %s)", k, last.Size, x.Shape)
			}
			s := x.Shape.Clone()
			s[len(s)-1] = D(k)
			return []Type{{x.DType, s}, {tensor.I32, s.Clone()}}, nil
		},
	})
}

// The fused sparse mixture-of-experts block.

func init() {
	Register(&OpSpec{
		Name:   "moe",
		Doc:    "A sparse mixture-of-experts block with SwiGLU experts on x[...,H]: router logits x·routerᵀ (router [E,H]), softmax over the E experts in f32, the top_k largest probabilities (renormalised to sum 1 when normalize), rounded to weight_dtype; each token's output is the sum, in expert order, of cast(down_e(silu(x·gate_eᵀ) * (x·up_eᵀ)) * weight_e, x.dtype) over the experts it chose. gate and up are [L,I,H], down [L,H,I]: the stacked weights of L experts, expert j being the router's expert expert_offset+j; with L < E (an expert-parallel rank's local experts) tokens routed elsewhere contribute 0 here and an all_reduce over the ranks completes the sum. Returns [...,H] in x's dtype. A shared expert (Qwen2-MoE) is not part of the op: it stays a dense MLP beside it. The decomposition is DecomposeMoE's masked-dense form, every local expert on every token.",
		Inputs: []string{"x", "router", "gate", "up", "down"},
		Attrs: []AttrSpec{
			{Name: "top_k", Type: AttrInt, Doc: "experts per token, 1 <= top_k <= E"},
			{Name: "normalize", Type: AttrBool, Default: false, Doc: "divide the top_k probabilities by their sum (Mixtral; Qwen's norm_topk_prob)"},
			{Name: "weight_dtype", Type: AttrDType, Default: tensor.F32, Doc: "the dtype the routing weights are rounded to before they multiply the experts' outputs: f32 for Mixtral, the activations' for Qwen-MoE"},
			{Name: "expert_offset", Type: AttrInt, Default: 0, Doc: "the router's index of the first local expert"},
		},
		Infer: inferMoE,
		Decompose: func(b *Builder, n *Node) ([]*Value, error) {
			x, router, gate, up, down := n.Inputs[0], n.Inputs[1], n.Inputs[2], n.Inputs[3], n.Inputs[4]
			r := MoERouting{TopK: n.Attrs.Int("top_k"), Renormalize: n.Attrs.Bool("normalize"), WeightDType: n.Attrs.DType("weight_dtype")}
			experts := stackedExperts(b, gate, up, down)
			weights := DecomposeMoERouting(b, b.Linear(x, router), r)
			return []*Value{DecomposeMoEExperts(b, x, weights, experts, n.Attrs.Int("expert_offset"))}, b.Err()
		},
	})
}

// inferMoE checks the operands of a moe node and gives its output type.
func inferMoE(n *Node) ([]Type, error) {
	x, router, gate, up, down := inType(n, 0), inType(n, 1), inType(n, 2), inType(n, 3), inType(n, 4)
	for _, t := range []Type{x, router, gate, up, down} {
		if !t.DType.IsFloat() {
			return nil, fmt.Errorf("moe needs float operands, got %s, %s, %s, %s, %s", x, router, gate, up, down)
		}
	}
	if len(x.Shape) == 0 {
		return nil, fmt.Errorf("moe: x %s needs a hidden axis", x)
	}
	if len(router.Shape) != 2 || !router.Shape.IsConst() {
		return nil, fmt.Errorf("moe: router %s must be a constant [E,H]", router.Shape)
	}
	E, H := router.Shape[0].Size, router.Shape[1]
	if x.Shape[len(x.Shape)-1] != H {
		return nil, fmt.Errorf("moe: x %s does not fit router [E,H] = %s", x.Shape, router.Shape)
	}
	if len(gate.Shape) != 3 || !gate.Shape.IsConst() || gate.Shape[2] != H || !up.Shape.Equal(gate.Shape) {
		return nil, fmt.Errorf("moe: gate %s and up %s must be [L,I,H] with H = %s", gate.Shape, up.Shape, H)
	}
	L, I := gate.Shape[0].Size, gate.Shape[1]
	if !down.Shape.Equal(Shape{D(L), H, I}) {
		return nil, fmt.Errorf("moe: down %s must be [L,H,I] = [%d,%s,%s]", down.Shape, L, H, I)
	}
	if off := n.Attrs.Int("expert_offset"); L < 1 || off < 0 || off > E-L {
		return nil, fmt.Errorf("moe: %d local experts at expert_offset %d do not fit the router's %d experts", L, off, E)
	}
	if k := n.Attrs.Int("top_k"); k < 1 || k > E {
		return nil, fmt.Errorf("moe: top_k = %d is not in [1, %d]", k, E)
	}
	if wd := n.Attrs.DType("weight_dtype"); !wd.IsFloat() {
		return nil, fmt.Errorf("moe: weight_dtype %s is not a float dtype", wd)
	}
	return one(Type{x.DType, x.Shape.Clone()}), nil
}

// MoE applies the fused moe op (see its Doc) to x with the stacked expert weights.
func (b *Builder) MoE(x, router, gate, up, down *Value, r MoERouting, offset int) *Value {
	return b.Op("moe", Attrs{"top_k": r.TopK, "normalize": r.Renormalize, "weight_dtype": r.WeightDType, "expert_offset": offset}, x, router, gate, up, down)
}

// TopK returns the k largest entries of x along its last axis and their indices (op topk).
func (b *Builder) TopK(x *Value, k int) (values, indices *Value) {
	outs := b.Apply("topk", Attrs{"k": k}, x) // placeholders enough for both on an error
	return outs[0], outs[1]
}
