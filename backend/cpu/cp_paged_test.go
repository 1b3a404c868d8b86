package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// TestPagedAttentionPartial: a rank's keys at scattered positions, written through
// slot_mapping into blocks out of order, give the same o and log-sum-exp as attention_partial
// over those keys as one block (GQA, a window, a query that sees no key and one of no
// sequence); a second call that writes nothing reads the same cache back.
func TestPagedAttentionPartial(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	const H, KV, Sq, Sk, D, BS = 4, 2, 5, 6, 8, 2
	kpos := []int32{0, 3, 4, 7, 8, 11} // this rank's share of a sequence
	qpos := []int32{-1, 2, 5, 9, 11}
	tables := []int32{3, 0, 2, -1} // entry j in block tables[j/BS]
	slots := make([]int32, Sk)
	kvp := make([]int32, len(tables)*BS)
	for j := range kvp {
		kvp[j] = -1
	}
	for j := range Sk {
		slots[j] = tables[j/BS]*BS + int32(j%BS)
		kvp[j] = kpos[j]
	}
	qseq := []int32{0, 0, 0, 0, -1}
	for _, window := range []int{0, 4} {
		q := randTensor(rng, tensor.F32, []int{1, 1, H, Sq, D}, -1, 1)
		k := randTensor(rng, tensor.F32, []int{1, KV, Sk, D}, -1, 1)
		v := randTensor(rng, tensor.F32, []int{1, KV, Sk, D}, -1, 1)
		kc, vc := tensor.New(tensor.F32, 4, BS, KV, D), tensor.New(tensor.F32, 4, BS, KV, D)
		attrs := graph.Attrs{"scale": 0.35, "window": window}
		run := func(sl []int32) []*tensor.Tensor {
			return mustRunOp(t, "paged_attention_partial", attrs, q, k, v, tensor.FromI32(qpos, 1, 1, Sq), kc, vc,
				tensor.FromI32(sl, Sk), tensor.FromI32(qseq, 1, Sq), tensor.FromI32(tables, 1, len(tables)), tensor.FromI32(kvp, 1, len(kvp)))
		}
		got := run(slots)
		block := func(x *tensor.Tensor) *tensor.Tensor {
			return &tensor.Tensor{DType: x.DType, Shape: append([]int{1}, x.Shape...), F32: x.F32}
		}
		want := mustRunOp(t, "attention_partial", attrs, q, block(k), block(v), tensor.FromI32(qpos, 1, 1, Sq), tensor.FromI32(kpos, 1, 1, Sk))
		for i := range want[0].F32 {
			if h := i / D / Sq; qseq[i/D%Sq] >= 0 && !(math.Abs(float64(got[0].F32[i]-want[0].F32[i])) <= 1e-6) {
				t.Fatalf("window %d: o[%d] (head %d) = %v, attention_partial %v", window, i, h, got[0].F32[i], want[0].F32[i])
			}
		}
		for i, w := range want[1].F32 {
			g := got[1].F32[i]
			if qseq[i%Sq] < 0 {
				w = float32(math.Inf(-1))
			}
			if math.IsInf(float64(w), -1) != math.IsInf(float64(g), -1) || !math.IsInf(float64(w), -1) && !(math.Abs(float64(g-w)) <= 1e-5) {
				t.Errorf("window %d: lse[%d] = %v, want %v", window, i, g, w)
			}
		}
		none := []int32{-1, -1, -1, -1, -1, -1}
		again := run(none)
		if !bitsEq(again[0].F32, got[0].F32) || !bitsEq(again[1].F32, got[1].F32) {
			t.Errorf("window %d: a call that writes nothing reads another result from the cache", window)
		}
	}
}

func bitsEq(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}
