package graph

import (
	"fmt"
	"math"

	"github.com/loom-ml/loom/tensor"
)

// Fused ops. The transform pipeline replaces primitive patterns with these; each declares its
// decomposition into primitives, which is exactly the pattern the frontends emit, and tests
// hold every fused kernel equal to it.

func init() {
	Register(&OpSpec{
		Name: "rmsnorm", Doc: "RMSNorm over the last axis, as Hugging Face computes it: w * cast(x32 * rsqrt(mean(x32^2) + eps), x.dtype) with x32 = cast(x, f32). x[...,D], w[D].",
		Inputs: []string{"x", "w"},
		Attrs:  []AttrSpec{{Name: "eps", Type: AttrFloat}},
		Infer: func(n *Node) ([]Type, error) {
			x, w := inType(n, 0), inType(n, 1)
			if err := checkNormWeight(x, w); err != nil {
				return nil, err
			}
			dt, err := Promote(w.DType, x.DType)
			if err != nil {
				return nil, err
			}
			return one(Type{dt, x.Shape.Clone()}), nil
		},
		Decompose: func(b *Builder, n *Node) ([]*Value, error) {
			return []*Value{DecomposeRMSNorm(b, n.Inputs[0], n.Inputs[1], n.Attrs.Float("eps"))}, b.Err()
		},
	})
	Register(&OpSpec{
		Name: "add_rmsnorm", Doc: "Residual add then RMSNorm: sum = x + residual; returns (rmsnorm(sum, w), sum). x, residual [...,D], w[D].",
		Inputs: []string{"x", "residual", "w"},
		Attrs:  []AttrSpec{{Name: "eps", Type: AttrFloat}},
		Infer: func(n *Node) ([]Type, error) {
			x, r, w := inType(n, 0), inType(n, 1), inType(n, 2)
			if !x.Shape.Equal(r.Shape) {
				return nil, fmt.Errorf("x %s and residual %s differ in shape", x.Shape, r.Shape)
			}
			sumDT, err := Promote(x.DType, r.DType)
			if err != nil {
				return nil, err
			}
			sum := Type{sumDT, x.Shape.Clone()}
			if err := checkNormWeight(sum, w); err != nil {
				return nil, err
			}
			dt, err := Promote(w.DType, sumDT)
			if err != nil {
				return nil, err
			}
			return []Type{{dt, x.Shape.Clone()}, sum}, nil
		},
		Decompose: func(b *Builder, n *Node) ([]*Value, error) {
			sum := b.Add(n.Inputs[0], n.Inputs[1])
			return []*Value{DecomposeRMSNorm(b, sum, n.Inputs[2], n.Attrs.Float("eps")), sum}, b.Err()
		},
	})
	Register(&OpSpec{
		Name: "rope", Doc: "Rotary position embedding of q[B,H,S,D] and k[B,KV,S,D] at positions[B,S]: x*cos + rotate_half(x)*sin, with cos/sin of positions ⊗ inv_freq (D/2 frequencies, repeated twice) times scaling, cast to x's dtype. Returns (q, k).",
		Inputs: []string{"q", "k", "positions"},
		Attrs: []AttrSpec{
			{Name: "inv_freq", Type: AttrFloats, Doc: "the D/2 inverse frequencies"},
			{Name: "scaling", Type: AttrFloat, Default: 1.0, Doc: "attention scaling applied to cos and sin"},
		},
		Infer: func(n *Node) ([]Type, error) {
			q, k, pos := inType(n, 0), inType(n, 1), inType(n, 2)
			if len(pos.Shape) != 2 || !pos.DType.IsInt() { // checked first: the loop indexes pos.Shape
				return nil, fmt.Errorf("positions must be integer [B,S], got %s", pos)
			}
			for _, t := range []Type{q, k} {
				if len(t.Shape) != 4 {
					return nil, fmt.Errorf("q and k must be [B,heads,S,D], got %s", t.Shape)
				}
				if t.Shape[0] != pos.Shape[0] || t.Shape[2] != pos.Shape[1] || t.Shape[3] != q.Shape[3] {
					return nil, fmt.Errorf("%s does not fit positions %s and head size %s", t.Shape, pos.Shape, q.Shape[3])
				}
			}
			if d := q.Shape[3]; d.IsSym() || d.Size != 2*len(n.Attrs.Floats("inv_freq")) {
				return nil, fmt.Errorf("head size %s needs %s/2 inverse frequencies, got %d", d, d, len(n.Attrs.Floats("inv_freq")))
			}
			return []Type{q, k}, nil
		},
		Decompose: func(b *Builder, n *Node) ([]*Value, error) {
			q, k, pos := n.Inputs[0], n.Inputs[1], n.Inputs[2]
			cos, sin := DecomposeRotaryTables(b, pos, n.Attrs.Floats("inv_freq"), n.Attrs.Float("scaling"), q.Type.DType)
			return []*Value{ApplyRotary(b, q, cos, sin), ApplyRotary(b, k, cos, sin)}, b.Err()
		},
	})
	Register(&OpSpec{
		Name: "repeat_kv", Doc: "Repeats each KV head n times in place: x[B,KV,S,D] -> [B,KV*n,S,D] (Hugging Face's repeat_kv).",
		Inputs: []string{"x"},
		Attrs:  []AttrSpec{{Name: "n", Type: AttrInt}},
		Infer: func(n *Node) ([]Type, error) {
			x, rep := inType(n, 0), n.Attrs.Int("n")
			if len(x.Shape) != 4 || x.Shape[1].IsSym() || rep < 1 {
				return nil, fmt.Errorf("repeat_kv needs x [B,KV,S,D] with constant KV and n >= 1, got %s and n=%d", x.Shape, rep)
			}
			if x.Shape[1].Size > 0 && rep > math.MaxInt/x.Shape[1].Size {
				return nil, fmt.Errorf("repeat_kv: %d heads repeated %d times overflows", x.Shape[1].Size, rep)
			}
			out := x.Shape.Clone()
			out[1] = D(x.Shape[1].Size * rep)
			return one(Type{x.DType, out}), nil
		},
		Decompose: func(b *Builder, n *Node) ([]*Value, error) {
			return []*Value{DecomposeRepeatKV(b, n.Inputs[0], n.Attrs.Int("n"))}, b.Err()
		},
	})
	Register(&OpSpec{
		Name: "sdpa", Doc: "Causal scaled dot-product attention with grouped KV heads: softmax(q·kᵀ·scale + mask)·v, q[B,H,S,D], k,v[B,KV,S,D] (H a multiple of KV), the mask from positions[B,S]: key position <= query position, and > query position - window when window > 0. Returns [B,H,S,D].",
		Inputs: []string{"q", "k", "v", "positions"},
		Attrs: []AttrSpec{
			{Name: "scale", Type: AttrFloat},
			{Name: "window", Type: AttrInt, Default: 0, Doc: "sliding window; 0 means none"},
		},
		Infer: func(n *Node) ([]Type, error) {
			q, k, v, pos := inType(n, 0), inType(n, 1), inType(n, 2), inType(n, 3)
			if len(q.Shape) != 4 || len(k.Shape) != 4 || !k.Shape.Equal(v.Shape) {
				return nil, fmt.Errorf("want q [B,H,S,D] and k, v [B,KV,S,D], got %s, %s, %s", q.Shape, k.Shape, v.Shape)
			}
			H, KV := q.Shape[1], k.Shape[1]
			if H.IsSym() || KV.IsSym() || KV.Size == 0 || H.Size%KV.Size != 0 {
				return nil, fmt.Errorf("query heads %s are not a multiple of KV heads %s", H, KV)
			}
			if q.Shape[0] != k.Shape[0] || q.Shape[2] != k.Shape[2] || q.Shape[3] != k.Shape[3] {
				return nil, fmt.Errorf("q %s and k %s disagree on batch, sequence or head size", q.Shape, k.Shape)
			}
			if len(pos.Shape) != 2 || !pos.DType.IsInt() || pos.Shape[0] != q.Shape[0] || pos.Shape[1] != q.Shape[2] {
				return nil, fmt.Errorf("positions must be integer [B,S] matching q %s, got %s", q.Shape, pos)
			}
			return one(q), nil
		},
		Decompose: func(b *Builder, n *Node) ([]*Value, error) {
			q, k, v, pos := n.Inputs[0], n.Inputs[1], n.Inputs[2], n.Inputs[3]
			rep := q.Type.Shape[1].Size / k.Type.Shape[1].Size
			k, v = DecomposeRepeatKV(b, k, rep), DecomposeRepeatKV(b, v, rep)
			mask := DecomposeCausalMask(b, pos, n.Attrs.Int("window"))
			scores := b.Mul(b.Matmul(q, b.Transpose(k, 0, 1, 3, 2)), b.Scalar(tensor.F32, n.Attrs.Float("scale")))
			probs := b.Cast(b.Softmax(b.Cast(b.Add(scores, mask), tensor.F32), -1), q.Type.DType)
			return []*Value{b.Matmul(probs, v)}, b.Err()
		},
	})
	Register(&OpSpec{
		Name: "swiglu", Doc: "silu(gate) * up, elementwise.",
		Inputs: []string{"gate", "up"},
		Infer: func(n *Node) ([]Type, error) {
			g, u := inType(n, 0), inType(n, 1)
			if !g.Shape.Equal(u.Shape) || !g.DType.IsFloat() {
				return nil, fmt.Errorf("gate %s and up %s must be float tensors of one shape", g, u)
			}
			dt, err := Promote(g.DType, u.DType)
			if err != nil {
				return nil, err
			}
			return one(Type{dt, g.Shape.Clone()}), nil
		},
		Decompose: func(b *Builder, n *Node) ([]*Value, error) {
			return []*Value{b.Mul(b.Unary("silu", n.Inputs[0]), n.Inputs[1])}, b.Err()
		},
	})
}

func checkNormWeight(x, w Type) error {
	if len(x.Shape) == 0 || len(w.Shape) != 1 || w.Shape[0] != x.Shape[len(x.Shape)-1] {
		return fmt.Errorf("norm weight %s does not fit the last axis of %s", w.Shape, x.Shape)
	}
	if !x.DType.IsFloat() || !w.DType.IsFloat() {
		return fmt.Errorf("norm needs float operands, got %s and %s", x.DType, w.DType)
	}
	return nil
}

// Fused ops over packed projections: the fused q/k/v and gate/up GEMMs (transform fuse_gemms)
// write their results side by side on the last axis, and these ops read them in place of the
// split and the copies that lay them out.

func init() {
	Register(&OpSpec{
		Name: "qkv_rope", Doc: "Lays out the packed q|k|v projections x[B,S,(H+2*KV)*D] (last axis: H heads of q, then KV of k, then KV of v, each D wide) as q[B,H,S,D], k[B,KV,S,D] and v[B,KV,S,D], and rotates q and k at positions[B,S] exactly as op rope does. Returns (q, k, v).",
		Inputs: []string{"x", "positions"},
		Attrs:  qkvRoPEAttrs(),
		Infer: func(n *Node) ([]Type, error) {
			x, pos := inType(n, 0), inType(n, 1)
			if len(pos.Shape) != 2 || !pos.DType.IsInt() {
				return nil, fmt.Errorf("positions must be integer [B,S], got %s", pos)
			}
			if len(x.Shape) != 3 || !x.DType.IsFloat() || x.Shape[0] != pos.Shape[0] || x.Shape[1] != pos.Shape[1] {
				return nil, fmt.Errorf("x must be float [B,S,(H+2*KV)*D] fitting positions %s, got %s", pos.Shape, x)
			}
			H, KV, half := n.Attrs.Int("heads"), n.Attrs.Int("kv_heads"), len(n.Attrs.Floats("inv_freq"))
			if H < 1 || KV < 1 || half < 1 || H > math.MaxInt32 || KV > math.MaxInt32 || half > math.MaxInt32 {
				return nil, fmt.Errorf("qkv_rope needs heads, kv_heads and inverse frequencies >= 1, got %d, %d and %d", H, KV, half)
			}
			hd := 2 * half
			if last := x.Shape[2]; last.IsSym() || last.Size%hd != 0 || last.Size/hd != H+2*KV {
				return nil, fmt.Errorf("x's last axis %s is not (%d+2*%d)*%d", last, H, KV, hd)
			}
			b, s := x.Shape[0], x.Shape[1]
			return []Type{
				{x.DType, Shape{b, D(H), s, D(hd)}},
				{x.DType, Shape{b, D(KV), s, D(hd)}},
				{x.DType, Shape{b, D(KV), s, D(hd)}},
			}, nil
		},
		Decompose: func(b *Builder, n *Node) ([]*Value, error) {
			x, pos := n.Inputs[0], n.Inputs[1]
			H, KV, hd := n.Attrs.Int("heads"), n.Attrs.Int("kv_heads"), n.Outputs[0].Type.Shape[3]
			bd, sd := x.Type.Shape[0], x.Type.Shape[1]
			parts := b.Split(x, -1, H*hd.Size, KV*hd.Size, KV*hd.Size)
			if err := b.Err(); err != nil {
				return nil, err
			}
			heads := []int{H, KV, KV}
			laid := make([]*Value, len(parts)) // not in parts: Split returns the node's own outputs
			for i, p := range parts {
				laid[i] = b.Transpose(b.Reshape(p, bd, sd, D(heads[i]), hd), 0, 2, 1, 3)
			}
			cos, sin := DecomposeRotaryTables(b, pos, n.Attrs.Floats("inv_freq"), n.Attrs.Float("scaling"), x.Type.DType)
			return []*Value{ApplyRotary(b, laid[0], cos, sin), ApplyRotary(b, laid[1], cos, sin), laid[2]}, b.Err()
		},
	})
	Register(&OpSpec{
		Name: "qkv_norm_rope", Doc: "qkv_rope with a per-head RMSNorm of q and k before the rotation (Qwen3, OLMo-2 style q_norm and k_norm): x[B,S,(H+2*KV)*D] laid out as heads, q's heads normalised with q_norm[D] and k's with k_norm[D] as op rmsnorm does, then q and k rotated at positions[B,S] as op rope does. q_norm and k_norm have one dtype. Returns q[B,H,S,D] and k[B,KV,S,D] of promote(norm, x), v[B,KV,S,D] of x's dtype.",
		Inputs: []string{"x", "q_norm", "k_norm", "positions"},
		Attrs:  append(qkvRoPEAttrs(), AttrSpec{Name: "eps", Type: AttrFloat, Doc: "the norms' epsilon"}),
		Infer: func(n *Node) ([]Type, error) {
			spec, _ := Lookup("qkv_rope")
			ts, err := spec.Infer(&Node{Op: "qkv_rope", Inputs: []*Value{n.Inputs[0], n.Inputs[3]}, Attrs: n.Attrs})
			if err != nil {
				return nil, err
			}
			for i, w := range []Type{inType(n, 1), inType(n, 2)} {
				if err := checkNormWeight(ts[i], w); err != nil {
					return nil, fmt.Errorf("%s: %w", []string{"q_norm", "k_norm"}[i], err)
				}
				if ts[i].DType, err = Promote(w.DType, ts[i].DType); err != nil {
					return nil, err
				}
			}
			if inType(n, 1).DType != inType(n, 2).DType {
				return nil, fmt.Errorf("q_norm is %s and k_norm %s: the norms must have one dtype", inType(n, 1).DType, inType(n, 2).DType)
			}
			return ts, nil
		},
		Decompose: func(b *Builder, n *Node) ([]*Value, error) {
			x, pos := n.Inputs[0], n.Inputs[3]
			H, KV, hd := n.Attrs.Int("heads"), n.Attrs.Int("kv_heads"), n.Outputs[0].Type.Shape[3]
			bd, sd := x.Type.Shape[0], x.Type.Shape[1]
			parts := b.Split(x, -1, H*hd.Size, KV*hd.Size, KV*hd.Size)
			if err := b.Err(); err != nil {
				return nil, err
			}
			eps := Attrs{"eps": n.Attrs.Float("eps")}
			q := b.Op("rmsnorm", eps, b.Reshape(parts[0], bd, sd, D(H), hd), n.Inputs[1])
			k := b.Op("rmsnorm", eps, b.Reshape(parts[1], bd, sd, D(KV), hd), n.Inputs[2])
			v := b.Transpose(b.Reshape(parts[2], bd, sd, D(KV), hd), 0, 2, 1, 3)
			rot := b.Apply("rope", Attrs{"inv_freq": n.Attrs.Floats("inv_freq"), "scaling": n.Attrs.Float("scaling")},
				b.Transpose(q, 0, 2, 1, 3), b.Transpose(k, 0, 2, 1, 3), pos)
			if err := b.Err(); err != nil {
				return nil, err
			}
			return []*Value{rot[0], rot[1], v}, nil
		},
	})
	Register(&OpSpec{
		Name: "swiglu_packed", Doc: "swiglu of the packed gate|up projections: x[...,2I] (gate on the first I of the last axis, up on the last I) -> silu(gate) * up [...,I].",
		Inputs: []string{"x"},
		Infer: func(n *Node) ([]Type, error) {
			x := inType(n, 0)
			if len(x.Shape) == 0 || !x.DType.IsFloat() {
				return nil, fmt.Errorf("x must be a float tensor [...,2I], got %s", x)
			}
			last := x.Shape[len(x.Shape)-1]
			if last.IsSym() || last.Size%2 != 0 {
				return nil, fmt.Errorf("x's last axis %s is not of a constant even size", last)
			}
			out := x.Shape.Clone()
			out[len(out)-1] = D(last.Size / 2)
			return one(Type{x.DType, out}), nil
		},
		Decompose: func(b *Builder, n *Node) ([]*Value, error) {
			x := n.Inputs[0]
			half := x.Type.Shape[len(x.Type.Shape)-1].Size / 2
			parts := b.Split(x, -1, half, half)
			if err := b.Err(); err != nil {
				return nil, err
			}
			return []*Value{b.Op("swiglu", nil, parts[0], parts[1])}, b.Err()
		},
	})
}

// Fused ops of a linear and the packed op that reads its output: a backend can apply the
// activation or the rotation in the epilogue of its GEMM, without writing the packed
// projections out and reading them back.

func init() {
	Register(&OpSpec{
		Name: "linear_swiglu", Doc: "swiglu_packed(linear(x, w)): the fused gate|up projection and its activation. x[...,K], w[2I,K] (the gate's I rows, then the up's) -> silu(gate) * up [...,I] of x's dtype, the projections rounded to x's dtype first.",
		Inputs: []string{"x", "w"},
		Infer: func(n *Node) ([]Type, error) {
			return inferThroughLinear(n, "swiglu_packed")
		},
		Decompose: func(b *Builder, n *Node) ([]*Value, error) {
			y := b.Linear(n.Inputs[0], n.Inputs[1])
			return []*Value{b.Op("swiglu_packed", nil, y)}, b.Err()
		},
	})
	Register(&OpSpec{
		Name: "linear_qkv_rope", Doc: "qkv_rope(linear(x, w), positions): the fused q|k|v projection laid out as heads and rotated. x[B,S,K], w[(H+2*KV)*D,K], positions[B,S] -> q[B,H,S,D], k[B,KV,S,D], v[B,KV,S,D] of x's dtype, the projections rounded to x's dtype first.",
		Inputs: []string{"x", "w", "positions"},
		Attrs:  qkvRoPEAttrs(),
		Infer: func(n *Node) ([]Type, error) {
			return inferThroughLinear(n, "qkv_rope", n.Inputs[2])
		},
		Decompose: func(b *Builder, n *Node) ([]*Value, error) {
			y := b.Linear(n.Inputs[0], n.Inputs[1])
			outs := b.Apply("qkv_rope", n.Attrs, y, n.Inputs[2])
			return outs, b.Err()
		},
	})
}

// qkvRoPEAttrs are the attributes of qkv_rope and linear_qkv_rope.
func qkvRoPEAttrs() []AttrSpec {
	return []AttrSpec{
		{Name: "heads", Type: AttrInt, Doc: "query heads H"},
		{Name: "kv_heads", Type: AttrInt, Doc: "key/value heads KV"},
		{Name: "inv_freq", Type: AttrFloats, Doc: "the D/2 inverse frequencies"},
		{Name: "scaling", Type: AttrFloat, Default: 1.0, Doc: "attention scaling applied to cos and sin"},
	}
}

// inferThroughLinear infers a linear's output from n's first two inputs (x, w), then the
// types of op reading it, with n's attributes and the rest of n's inputs after it.
func inferThroughLinear(n *Node, op string, rest ...*Value) ([]Type, error) {
	lin, _ := Lookup("linear")
	t, err := lin.Infer(&Node{Op: "linear", Inputs: n.Inputs[:2]})
	if err != nil {
		return nil, err
	}
	spec, _ := Lookup(op)
	inner := &Node{Op: op, Attrs: n.Attrs, Inputs: append([]*Value{{Name: "linear", Type: t[0]}}, rest...)}
	return spec.Infer(inner)
}
