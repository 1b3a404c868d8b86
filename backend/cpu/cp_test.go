package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// refPartial is attention_partial in float64 plain loops: o [NQ,B,H,Sq,D] and lse
// [NQ,B,H,Sq] from q, k, v and positions as the op's doc states.
func refPartial(q, k, v, qp, kp *tensor.Tensor, scale float64, window int) (o, lse []float64) {
	NQ, B, H, Sq, D := q.Shape[0], q.Shape[1], q.Shape[2], q.Shape[3], q.Shape[4]
	NK, KV, Sk := k.Shape[0], k.Shape[2], k.Shape[3]
	o, lse = make([]float64, q.Numel()), make([]float64, NQ*B*H*Sq)
	for a := range NQ {
		for b := range B {
			for h := range H {
				kh := h / (H / KV)
				for i := range Sq {
					pi := qp.At(flatten([]int{a, b, i}, qp.Shape))
					var ws []float64
					var at [][2]int
					for c := range NK {
						for j := range Sk {
							pj := kp.At(flatten([]int{c, b, j}, kp.Shape))
							if pj > pi || window > 0 && pj <= pi-float64(window) {
								continue
							}
							s := 0.0
							for d := range D {
								s += q.At(flatten([]int{a, b, h, i, d}, q.Shape)) * k.At(flatten([]int{c, b, kh, j, d}, k.Shape))
							}
							ws, at = append(ws, s*scale), append(at, [2]int{c, j})
						}
					}
					row := flatten([]int{a, b, h, i}, []int{NQ, B, H, Sq})
					if len(ws) == 0 {
						lse[row] = math.Inf(-1)
						continue
					}
					m := math.Inf(-1)
					for _, s := range ws {
						m = math.Max(m, s)
					}
					den := 0.0
					for x := range ws {
						ws[x] = math.Exp(ws[x] - m)
						den += ws[x]
					}
					lse[row] = m + math.Log(den)
					for d := range D {
						acc := 0.0
						for x, cj := range at {
							acc += ws[x] / den * v.At(flatten([]int{cj[0], b, kh, cj[1], d}, v.Shape))
						}
						o[flatten([]int{a, b, h, i, d}, q.Shape)] = acc
					}
				}
			}
		}
	}
	return o, lse
}

// TestAttentionPartial holds attention_partial to plain float64 loops over blocks whose
// positions interleave (as cp shares do), with a query that sees no key (o 0, lse -inf),
// GQA, a sliding window and bf16 inputs.
func TestAttentionPartial(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const NQ, NK, B, H, KV, Sq, Sk, D = 2, 3, 2, 4, 2, 3, 4, 8
	qpos := make([]int32, NQ*B*Sq)
	for i := range qpos {
		qpos[i] = int32(rng.IntN(12)) + 2
	}
	qpos[0] = -1 // sees nothing
	kpos := make([]int32, NK*B*Sk)
	for i := range kpos {
		kpos[i] = int32(rng.IntN(14))
	}
	qp, kp := tensor.FromI32(qpos, NQ, B, Sq), tensor.FromI32(kpos, NK, B, Sk)
	for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
		for _, window := range []int{0, 3} {
			q := randTensor(rng, dt, []int{NQ, B, H, Sq, D}, -1, 1)
			k := randTensor(rng, dt, []int{NK, B, KV, Sk, D}, -1, 1)
			v := randTensor(rng, dt, []int{NK, B, KV, Sk, D}, -1, 1)
			scale := 1 / math.Sqrt(D)
			wantO, wantL := refPartial(q, k, v, qp, kp, scale, window)
			got := mustRunOp(t, "attention_partial", graph.Attrs{"scale": scale, "window": window}, q, k, v, qp, kp)
			what := fmt.Sprintf("%s window=%d", dt, window)
			checkTensorAbs(t, what+" o", got[0], tensor.F32, q.Shape, wantO, 1e-5)
			for r, w := range wantL {
				g := float64(got[1].F32[r])
				if math.IsInf(w, -1) != math.IsInf(g, -1) || !math.IsInf(w, -1) && !(math.Abs(g-w) <= 1e-5) {
					t.Errorf("%s lse[%d] = %v, want %v", what, r, g, w)
				}
			}
			if !math.IsInf(float64(got[1].F32[0]), -1) {
				t.Errorf("%s: the query at position -1 has lse %v, want -inf", what, got[1].F32[0])
			}
		}
	}
}

// TestAttentionMerge: the partial results of two blocks of keys, merged, equal the partial
// result over both blocks at once; the kernel equals the op's decomposition (the reference
// kernel), rows where one or both sides saw nothing included.
func TestAttentionMerge(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	const B, H, KV, S, D = 1, 2, 1, 6, 4
	q := randTensor(rng, tensor.F32, []int{1, B, H, S, D}, -1, 1)
	k := randTensor(rng, tensor.F32, []int{2, B, KV, S, D}, -1, 1)
	v := randTensor(rng, tensor.F32, []int{2, B, KV, S, D}, -1, 1)
	qp := tensor.FromI32([]int32{-1, 0, 3, 5, 8, 11}, 1, B, S)
	kp := tensor.FromI32([]int32{0, 2, 4, 6, 8, 10, 1, 3, 5, 7, 9, 11}, 2, B, S)
	attrs := graph.Attrs{"scale": 0.5}
	both := mustRunOp(t, "attention_partial", attrs, q, k, v, qp, kp)
	half := func(c int) []*tensor.Tensor {
		kc := &tensor.Tensor{DType: tensor.F32, Shape: []int{1, B, KV, S, D}, F32: k.F32[c*B*KV*S*D:][:B*KV*S*D]}
		vc := &tensor.Tensor{DType: tensor.F32, Shape: []int{1, B, KV, S, D}, F32: v.F32[c*B*KV*S*D:][:B*KV*S*D]}
		pc := tensor.FromI32(kp.I32[c*B*S:][:B*S], 1, B, S)
		return mustRunOp(t, "attention_partial", attrs, q, kc, vc, qp, pc)
	}
	a, b := half(0), half(1)
	merged := mustRunOp(t, "attention_merge", nil, a[0], a[1], b[0], b[1])
	ref, ok := Reference("attention_merge")
	if !ok {
		t.Fatal("no reference kernel for attention_merge")
	}
	n, outs := nodeFor(t, "attention_merge", nil, []*tensor.Tensor{a[0], a[1], b[0], b[1]})
	decomposed, err := ref(n, []*tensor.Tensor{a[0], a[1], b[0], b[1]}, outs)
	if err != nil {
		t.Fatal(err)
	}
	for _, got := range [][]*tensor.Tensor{merged, decomposed} {
		for i, want := range both {
			for j, w := range want.F32 {
				g := got[i].F32[j]
				if math.IsInf(float64(w), -1) != math.IsInf(float64(g), -1) || !math.IsInf(float64(w), -1) && !(math.Abs(float64(g-w)) <= 1e-6) {
					t.Fatalf("output %d [%d] = %v, want %v (the partial over both blocks)", i, j, g, w)
				}
			}
		}
	}
	if !math.IsInf(float64(merged[1].F32[0]), -1) || merged[0].F32[0] != 0 {
		t.Errorf("a query that sees no key on either side: o %v, lse %v; want 0, -inf", merged[0].F32[0], merged[1].F32[0])
	}
}

// TestRingShift: over three in-process ranks of a cp axis (beside tp=2), rank i of each cp
// group gets the x of rank i-1 of the same group, any dtype.
func TestRingShift(t *testing.T) {
	mesh := mustMesh(t, "tp=2,cp=3")
	build := func(int) *graph.Graph {
		b := graph.NewBuilder("ring")
		x := b.Input("x", tensor.I32, graph.Shape{graph.D(2), graph.Sym("S")})
		b.Output(b.Op("ring_shift", graph.Attrs{"group": "cp", "group_size": 3}, x))
		g, err := b.Build()
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	progs := compileRanks(t, build, nil, mesh)
	outs := runRanks(t, progs, func(r int) map[string]*tensor.Tensor {
		return map[string]*tensor.Tensor{"x": tensor.FromI32([]int32{int32(r), 10, 20, int32(100 + r), 40, 50}, 2, 3)}
	})
	for r := range 6 {
		from := (r + 4) % 6 // the previous cp coordinate, same tp coordinate: rank - 2 mod 6
		if got := outs[r][0].I32; got[0] != int32(from) || got[3] != int32(100+from) {
			t.Errorf("rank %d got %v, want rank %d's x", r, got, from)
		}
	}
}
