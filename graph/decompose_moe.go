package graph

import (
	"fmt"

	"github.com/loom-ml/loom/tensor"
)

// The primitive form of a sparse mixture-of-experts block, as the frontends write it (see
// decompose.go for the other building blocks).

// MoEExpert is one expert's SwiGLU weights: down(silu(x·gateᵀ) * (x·upᵀ)).
type MoEExpert struct{ Gate, Up, Down *Value }

// MoERouting says how a router's logits become each token's expert weights.
type MoERouting struct {
	// TopK is how many experts each token goes to.
	TopK int
	// Renormalize divides the top-k probabilities by their sum (Mixtral; Qwen's
	// norm_topk_prob).
	Renormalize bool
	// WeightDType is the dtype the expert weights are rounded to before they multiply the
	// experts' outputs: f32 for Mixtral, the activations' for Qwen-MoE, which casts them to
	// the router logits' dtype.
	WeightDType tensor.DType
}

// DecomposeMoERouting emits the dense routing weights [...,E] of router logits[...,E], as
// Hugging Face's top-k routers compute them: softmax over the experts in f32, the k largest
// probabilities (topk), divided by their sum when r.Renormalize, cast to r.WeightDType, each
// put back in its expert's column; the other columns are exactly 0.
func DecomposeMoERouting(b *Builder, logits *Value, r MoERouting) *Value {
	s := logits.Type.Shape
	if b.Err() != nil {
		return b.placeholder()
	}
	if len(s) == 0 || s[len(s)-1].IsSym() {
		b.Fail(fmt.Errorf("moe routing: router logits %s need a constant expert axis", s))
		return b.placeholder()
	}
	vals, idx := decomposeTopKRouting(b, logits, r)
	return scatterRouting(b, vals, idx, s[len(s)-1].Size)
}

// decomposeTopKRouting emits each token's routing weights[...,k] (in r.WeightDType) and
// experts[...,k] (i32, largest probability first) of router logits[...,E]: softmax over the
// experts in f32, topk, divided by their sum when r.Renormalize, cast to r.WeightDType.
func decomposeTopKRouting(b *Builder, logits *Value, r MoERouting) (weights, experts *Value) {
	probs := b.Softmax(castTo(b, logits, tensor.F32), -1)
	vals, idx := b.TopK(probs, r.TopK)
	if r.Renormalize {
		vals = b.Div(vals, b.Reduce("sum", vals, true, -1))
	}
	return castTo(b, vals, r.WeightDType), idx
}

// scatterRouting emits the dense routing weights [...,E] of weights[...,k] and distinct
// experts[...,k] (i32): column e of token t holds the weight of the slot that chose e, the
// other columns exactly 0.
func scatterRouting(b *Builder, weights, experts *Value, numExperts int) *Value {
	s := experts.Type.Shape
	// A token picks distinct experts, so each sum below adds one weight to exact zeros.
	slot := append(s.Clone(), D(1)) // [...,k,1]
	chosen := b.Compare("eq", b.Reshape(experts, slot...), b.Iota(tensor.I32, Dims(numExperts), 0))
	spread := b.Where(chosen, b.Reshape(weights, slot...), b.Scalar(weights.Type.DType, 0)) // [...,k,E]
	return b.Reduce("sum", spread, false, -2)
}

// DecomposeMoE emits a sparse mixture-of-experts block on x[...,H] in primitives: router
// logits x·routerᵀ, the dense routing weights of DecomposeMoERouting, then every expert's
// SwiGLU on every token, each output times its column of weights (cast back to x's dtype),
// summed in expert order. Tokens skip no expert here, but a weight of exactly 0 adds exact
// zeros (as long as no unchosen expert's output is infinite or NaN), so the sum is Hugging
// Face's, which adds only the chosen experts, in expert order (its eager experts loop; its
// grouped implementation sums in top-k order, the same sum for k = 2). The fused moe op
// computes only the chosen experts; this is its reference.
func DecomposeMoE(b *Builder, x, router *Value, experts []MoEExpert, r MoERouting) *Value {
	if n := router.Type.Shape; b.Err() == nil && (len(n) != 2 || n[0] != D(len(experts))) {
		b.Fail(fmt.Errorf("moe: router weight %s does not fit %d experts", n, len(experts)))
	}
	return DecomposeMoEExperts(b, x, DecomposeMoERouting(b, b.Linear(x, router), r), experts, 0)
}

// DecomposeMoEExperts emits the experts' part of DecomposeMoE on x[...,H] with the dense
// routing weights[...,E]: expert j of experts is expert offset+j of the router (an
// expert-parallel rank's local experts), weighed by that column. Each output times its
// weight is cast back to x's dtype and the products are summed in expert order.
func DecomposeMoEExperts(b *Builder, x, weights *Value, experts []MoEExpert, offset int) *Value {
	var out *Value
	for j, w := range experts {
		e := offset + j
		y := castTo(b, b.Mul(expertMLP(b, x, w), b.Slice(weights, -1, e, e+1)), x.Type.DType)
		if out == nil {
			out = y
		} else {
			out = b.Add(out, y)
		}
	}
	if out == nil { // no experts: an error is recorded
		if b.Err() == nil {
			b.Fail(fmt.Errorf("moe: no experts"))
		}
		return b.placeholder()
	}
	return out
}

// expertMLP emits one expert's SwiGLU on x[...,H]: down(silu(x·gateᵀ) * (x·upᵀ)), [...,H].
func expertMLP(b *Builder, x *Value, w MoEExpert) *Value {
	return b.Linear(b.Mul(b.Unary("silu", b.Linear(x, w.Gate)), b.Linear(x, w.Up)), w.Down)
}

// castTo casts x to dt unless it already has that dtype.
func castTo(b *Builder, x *Value, dt tensor.DType) *Value {
	if x.Type.DType == dt {
		return x
	}
	return b.Cast(x, dt)
}
