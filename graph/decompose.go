package graph

import (
	"math"

	"github.com/loom-ml/loom/tensor"
)

// Primitive forms of the model building blocks. Frontends write models with these and the
// fused ops of catalog_fused.go decompose into them, so a fused op's decomposition is by
// construction the pattern the frontends emit.

// DecomposeRMSNorm emits x[...,D] normalised with w[D]: Hugging Face's RMSNorm in primitives.
func DecomposeRMSNorm(b *Builder, x, w *Value, eps float64) *Value {
	x32 := b.Cast(x, tensor.F32)
	variance := b.Reduce("mean", b.Pow(x32, b.Scalar(tensor.F32, 2)), true, -1)
	y := b.Mul(x32, b.Unary("rsqrt", b.Add(variance, b.Scalar(tensor.F32, eps))))
	return b.Mul(w, b.Cast(y, x.Type.DType))
}

// DecomposeRotaryTables emits cos and sin [B,S,D] of positions[B,S] in primitives, as
// Hugging Face's rotary embedding computes them: emb = concat(f, f) with f = positions ⊗
// inv_freq, then cos(emb)*scaling and sin(emb)*scaling (no multiply when scaling is 1), cast
// to dt.
func DecomposeRotaryTables(b *Builder, pos *Value, invFreq []float64, scaling float64, dt tensor.DType) (cos, sin *Value) {
	bd, sd := pos.Type.Shape[0], pos.Type.Shape[1]
	inv := b.Const(tensor.F32, Dims(len(invFreq)), invFreq...)
	p := b.Reshape(b.Cast(pos, tensor.F32), bd, sd, D(1))
	freqs := b.Mul(p, inv)
	emb := b.Concat(-1, freqs, freqs)
	cos, sin = b.Unary("cos", emb), b.Unary("sin", emb)
	if scaling != 1 {
		cos = b.Mul(cos, b.Scalar(tensor.F32, scaling))
		sin = b.Mul(sin, b.Scalar(tensor.F32, scaling))
	}
	return b.Cast(cos, dt), b.Cast(sin, dt)
}

// ApplyRotary emits x*cos + rotate_half(x)*sin for x[B,N,S,D] and cos, sin [B,S,D].
func ApplyRotary(b *Builder, x, cos, sin *Value) *Value {
	s := x.Type.Shape
	c := b.Reshape(cos, s[0], D(1), s[2], s[3])
	sn := b.Reshape(sin, s[0], D(1), s[2], s[3])
	half := s[3].Size / 2
	rot := b.Concat(-1, b.Neg(b.Slice(x, -1, half, 2*half)), b.Slice(x, -1, 0, half))
	return b.Add(b.Mul(x, c), b.Mul(rot, sn))
}

// DecomposeRepeatKV emits, for x[B,KV,S,D], Hugging Face's repeat_kv: reshape, expand, reshape.
func DecomposeRepeatKV(b *Builder, x *Value, n int) *Value {
	if n == 1 {
		return x
	}
	s := x.Type.Shape
	x = b.Reshape(x, s[0], s[1], D(1), s[2], s[3])
	x = b.Expand(x, s[0], s[1], D(n), s[2], s[3])
	return b.Reshape(x, s[0], D(s[1].Size*n), s[2], s[3])
}

// DecomposeCausalMask emits the additive mask [B,1,S,S] of positions[B,S]: 0 where the key
// position is <= the query position (and > query - window when window > 0), -inf elsewhere.
func DecomposeCausalMask(b *Builder, pos *Value, window int) *Value {
	bd, sd := pos.Type.Shape[0], pos.Type.Shape[1]
	q := b.Reshape(pos, bd, D(1), sd, D(1))
	k := b.Reshape(pos, bd, D(1), D(1), sd)
	allowed := b.Compare("le", k, q)
	if window > 0 {
		allowed = b.And(allowed, b.Compare("gt", b.Add(k, b.Scalar(pos.Type.DType, float64(window))), q))
	}
	return b.Where(allowed, b.Scalar(tensor.F32, 0), b.Scalar(tensor.F32, math.Inf(-1)))
}
