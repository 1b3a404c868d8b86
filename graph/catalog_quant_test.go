package graph

import (
	"testing"

	"github.com/loom-ml/loom/tensor"
)

var f8 = tensor.F8E4M3

func quantInferCases() []inferCase {
	blk := func(bn, bk int) Attrs { return Attrs{"scheme": "block", "block": []int{bn, bk}} }
	return []inferCase{
		{op: "linear_fp8", in: []Type{ty(bf16, "B", "S", 80), ty(f8, 64, 80), ty(f32t, 1)}, attrs: Attrs{"scheme": "tensor"}, want: []Type{ty(bf16, "B", "S", 64)}},
		{op: "linear_fp8", in: []Type{ty(f32t, "B", 80), ty(f8, 64, 80), ty(f32t)}, attrs: Attrs{"scheme": "tensor", "activation_scheme": "static"}, want: []Type{ty(f32t, "B", 64)}},
		{op: "linear_fp8", in: []Type{ty(f32t, "B", 80), ty(tensor.F8E5M2, 64, 80), ty(bf16, 64, 1)}, attrs: Attrs{"scheme": "channel", "activation_scheme": "dynamic"}, want: []Type{ty(f32t, "B", 64)}},
		{op: "linear_fp8", in: []Type{ty(f32t, "B", 80), ty(f8, 64, 80), ty(f32t, 64)}, attrs: Attrs{"scheme": "channel"}, want: []Type{ty(f32t, "B", 64)}},
		{op: "linear_fp8", in: []Type{ty(f32t, "B", 80), ty(f8, 64, 80), ty(f32t, 4, 3)}, attrs: blk(16, 32), want: []Type{ty(f32t, "B", 64)}},
		{op: "linear_fp8", in: []Type{ty(f32t, "B", 80), ty(f8, 64, 80), ty(f32t, 4, 2)}, attrs: blk(16, 32), err: "scale [4,2] does not fit weight [64,80] under the block scheme of [16 32] blocks (want [4 3])"},
		{op: "linear_fp8", in: []Type{ty(f32t, "B", 80), ty(f8, 64, 80), ty(f32t, 32, 1)}, attrs: Attrs{"scheme": "channel"}, err: "scale [32,1] does not fit weight [64,80] under the channel scheme (want [64 1])"},
		{op: "linear_fp8", in: []Type{ty(f32t, "B", 80), ty(f8, 64, 80), ty(f32t, 2)}, attrs: Attrs{"scheme": "tensor"}, err: "scale [2] does not fit weight [64,80] under the tensor scheme"},
		{op: "linear_fp8", in: []Type{ty(f32t, "B", 80), ty(bf16, 64, 80), ty(f32t, 1)}, attrs: Attrs{"scheme": "tensor"}, err: "the weight must be a 2-D f8e4m3 or f8e5m2 matrix, got bf16[64,80]"},
		{op: "linear_fp8", in: []Type{ty(f32t, "B", 80), ty(f8, 64, 80), ty(i32, 1)}, attrs: Attrs{"scheme": "tensor"}, err: "the scale must be a float tensor"},
		{op: "linear_fp8", in: []Type{ty(f32t, "B", 80), ty(f8, 64, 80), ty(f32t, 1)}, attrs: Attrs{"scheme": "row"}, err: `unknown fp8 scheme "row"`},
		{op: "linear_fp8", in: []Type{ty(f32t, "B", 80), ty(f8, 64, 80), ty(f32t, 1)}, attrs: Attrs{"scheme": "tensor", "block": []int{1, 1}}, err: "block [1 1] is only for the block scheme"},
		{op: "linear_fp8", in: []Type{ty(f32t, "B", 80), ty(f8, 64, 80), ty(f32t, 1, 1)}, attrs: Attrs{"scheme": "block"}, err: "block scheme needs block = [rows, cols]"},
		{op: "linear_fp8", in: []Type{ty(f32t, "B", 40), ty(f8, 64, 80), ty(f32t, 1)}, attrs: Attrs{"scheme": "tensor"}, err: "x's last dimension 40 differs from the weight's input dimension 80"},
		{op: "linear_fp8", in: []Type{ty(f32t, "B", 80), ty(f8, 64, 80), ty(f32t, 1)}, attrs: Attrs{"scheme": "tensor", "activation_scheme": "int8"}, err: `activation_scheme "int8"`},
		{op: "linear_fp8", in: []Type{ty(f32t, "B", 80), ty(f8, 64, 80), ty(f32t, 1)}, err: "missing required attribute scheme"},
		{op: "dequantize_fp8", in: []Type{ty(f8, 64, 80), ty(f32t, 4, 3)}, attrs: Attrs{"scheme": "block", "block": []int{16, 32}, "dtype": bf16}, want: []Type{ty(bf16, 64, 80)}},
		{op: "dequantize_fp8", in: []Type{ty(f8, 64, 80), ty(f32t, 1)}, attrs: Attrs{"scheme": "tensor", "dtype": i32}, err: "dtype must be a float type, got i32"},
		{op: "dequantize_fp8", in: []Type{ty(f8, "N", 80), ty(f32t, 1)}, attrs: Attrs{"scheme": "tensor", "dtype": f32t}, err: "must be constant"},
	}
}

// buildFP8 uses the quantized ops, as an FP8 checkpoint's frontend writes them (sharded: a
// block scale sliced with its weight).
func buildFP8() (*Graph, error) {
	b := NewBuilder("fp8")
	x := b.Input("x", tensor.BF16, Shape{symB, symS, D(64)})
	b.SetScope("model.layers.0.mlp")
	w := b.Op(OpParam, Attrs{"key": "model.layers.0.mlp.up_proj.weight", "dtype": tensor.F8E4M3, "shape": Dims(128, 64), "slice_dim": 0, "slice_index": 1, "slice_count": 2})
	s := b.Op(OpParam, Attrs{"key": "model.layers.0.mlp.up_proj.weight_scale_inv", "dtype": tensor.F32, "shape": Dims(8, 4), "slice_dim": 0, "slice_index": 1, "slice_count": 2})
	h := b.LinearFP8(x, w, s, QuantBlock, []int{16, 16}, "dynamic")
	dw := b.Param("model.layers.0.mlp.down_proj.weight", tensor.F8E5M2, Dims(64, 64))
	ds := b.Param("model.layers.0.mlp.down_proj.weight_scale", tensor.BF16, Dims(64, 1))
	y := b.Linear(h, b.DequantizeFP8(dw, ds, QuantChannel, nil, tensor.BF16))
	ts := b.Param("lm_head.weight_scale", tensor.F32, Dims(1))
	hw := b.Param("lm_head.weight", tensor.F8E4M3, Dims(32, 64))
	b.Output(b.LinearFP8(y, hw, ts, QuantTensor, nil, ""))
	return b.Build()
}

func TestIsLinear(t *testing.T) {
	g, err := buildFP8()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, v := range g.Nodes {
		if IsLinear(v) {
			n++
		}
	}
	if n != 3 {
		t.Errorf("IsLinear finds %d linears, want 3", n)
	}
}
