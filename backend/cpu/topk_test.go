package cpu

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

func TestTopK(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		name    string
		dt      tensor.DType
		shape   []int
		x       []float64
		k       int
		vals    []float64
		indices []int32
	}{
		{"rows", tensor.F32, []int{2, 4}, []float64{0.1, 0.4, 0.3, 0.2, -1, -3, -2, 5}, 2,
			[]float64{0.4, 0.3, 5, -1}, []int32{1, 2, 3, 0}},
		{"ties lowest index first", tensor.F32, []int{5}, []float64{1, 2, 2, 0, 2}, 3, []float64{2, 2, 2}, []int32{1, 2, 4}},
		{"nan above all", tensor.F32, []int{4}, []float64{1, nan, math.Inf(1), nan}, 3, []float64{nan, nan, math.Inf(1)}, []int32{1, 3, 2}},
		{"k = N sorts", tensor.F32, []int{1, 1, 3}, []float64{-0.5, 0.25, 0}, 3, []float64{0.25, 0, -0.5}, []int32{1, 2, 0}},
		{"bf16 keeps its values", tensor.BF16, []int{3}, []float64{0.1, 0.7, 0.3}, 1, []float64{0.7}, []int32{1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := fromValues(tc.dt, tc.shape, tc.x)
			outs := mustRunOp(t, "topk", graph.Attrs{"k": tc.k}, x)
			want := slices.Clone(tc.shape)
			want[len(want)-1] = tc.k
			if outs[0].DType != tc.dt || !slices.Equal(outs[0].Shape, want) || outs[1].DType != tensor.I32 || !slices.Equal(outs[1].Shape, want) {
				t.Fatalf("outputs %s%v and %s%v, want %s%v and i32%v", outs[0].DType, outs[0].Shape, outs[1].DType, outs[1].Shape, tc.dt, want, want)
			}
			wantVals := fromValues(tc.dt, want, tc.vals).Float32s()
			for i, v := range outs[0].Float32s() {
				if w := wantVals[i]; v != w && !(math.IsNaN(float64(v)) && math.IsNaN(float64(w))) {
					t.Errorf("values %v, want %v", outs[0].Float32s(), wantVals)
					break
				}
			}
			if !slices.Equal(outs[1].I32, tc.indices) {
				t.Errorf("indices %v, want %v", outs[1].I32, tc.indices)
			}
		})
	}
}

func TestTopKKernelErrors(t *testing.T) {
	b := graph.NewBuilder("t")
	x := b.Input("x", tensor.F32, graph.Dims(4))
	v, _ := b.TopK(x, 2)
	n := v.Producer
	in := []*tensor.Tensor{tensor.FromF32([]float32{1, 2, 3, 4}, 4)}
	for _, tc := range []struct {
		out  []Out
		want string
	}{
		{[]Out{{DType: tensor.F32, Shape: []int{2}}, {DType: tensor.I64, Shape: []int{2}}}, "asked for f32 and i64"},
		{[]Out{{DType: tensor.F32, Shape: []int{3}}, {DType: tensor.I32, Shape: []int{3}}}, "output is declared [3]"},
	} {
		if _, err := topk(n, in, tc.out); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want %q", err, tc.want)
		}
	}
}

// The masked-dense MoE block (graph.DecomposeMoE: every expert on every token, weighed by
// routing weights that are exactly 0 off the top k) gives, bit for bit, what Hugging Face's
// sparse loop gives: each token's chosen experts only, their weighted outputs added in
// expert order to zero.
func TestMoEMaskedDenseIsSparse(t *testing.T) {
	const T, H, I, E = 7, 16, 12, 5
	rng := rand.New(rand.NewPCG(1, 2))
	for _, tc := range []struct {
		k      int
		renorm bool
	}{{2, true}, {2, false}, {3, true}, {3, false}, {1, false}} {
		t.Run(fmt.Sprintf("k=%d/renorm=%v", tc.k, tc.renorm), func(t *testing.T) {
			b := graph.NewBuilder("moe")
			x := b.Input("x", tensor.F32, graph.Shape{graph.Sym("B"), graph.Sym("S"), graph.D(H)})
			w := MapWeights{"router": randTensor(rng, tensor.BF16, []int{E, H}, -1, 1)}
			router := b.Param("router", tensor.BF16, graph.Dims(E, H))
			var experts []graph.MoEExpert
			for e := range E {
				ex := graph.MoEExpert{}
				for _, p := range []struct {
					name  string
					dst   **graph.Value
					shape []int
				}{{"gate", &ex.Gate, []int{I, H}}, {"up", &ex.Up, []int{I, H}}, {"down", &ex.Down, []int{H, I}}} {
					key := fmt.Sprintf("experts.%d.%s", e, p.name)
					w[key] = randTensor(rng, tensor.BF16, p.shape, -0.5, 0.5)
					*p.dst = b.Param(key, tensor.BF16, graph.Dims(p.shape...))
				}
				experts = append(experts, ex)
			}
			r := graph.MoERouting{TopK: tc.k, Renormalize: tc.renorm, WeightDType: tensor.F32}
			logits := b.Linear(x, router)
			// The block, then the same routing weights, probabilities and expert outputs
			// again (same ops, same kernels, same bits) for the sparse sum below.
			b.Output(graph.DecomposeMoE(b, x, router, experts, r), graph.DecomposeMoERouting(b, logits, r), b.Softmax(logits, -1))
			for _, ex := range experts {
				b.Output(b.Linear(b.Mul(b.Unary("silu", b.Linear(x, ex.Gate)), b.Linear(x, ex.Up)), ex.Down))
			}
			p, err := Compile(context.Background(), mustBuild(t, b), w)
			if err != nil {
				t.Fatal(err)
			}
			outs, err := p.Run(context.Background(), map[string]*tensor.Tensor{"x": randTensor(rng, tensor.F32, []int{1, T, H}, -2, 2)})
			if err != nil {
				t.Fatal(err)
			}
			got, weights, probs := outs[0].F32, outs[1].F32, outs[2].F32
			for tok := range T {
				pr, wt := probs[tok*E:(tok+1)*E], weights[tok*E:(tok+1)*E]
				order := []int{0, 1, 2, 3, 4}
				sort.SliceStable(order, func(a, b int) bool { return pr[order[a]] > pr[order[b]] })
				chosen := slices.Clone(order[:tc.k])
				var sum float64 // the sum kernel accumulates in float64, rounds once
				for _, e := range chosen {
					sum += float64(pr[e])
				}
				top := float32(sum)
				slices.Sort(chosen) // Hugging Face's eager loop visits experts in index order
				for e := range E {
					want := float32(0)
					if slices.Contains(chosen, e) {
						want = pr[e]
						if tc.renorm {
							want = pr[e] / top
						}
					}
					if wt[e] != want {
						t.Fatalf("token %d: routing weights %v, want the top %d of %v (renormalised: %v)", tok, wt, tc.k, pr, tc.renorm)
					}
				}
				for h := range H {
					var acc float32
					for _, e := range chosen {
						acc += float32(outs[3+e].F32[tok*H+h] * wt[e])
					}
					if g := got[tok*H+h]; g != acc {
						t.Fatalf("token %d, feature %d: masked-dense %v, sparse %v (experts %v)", tok, h, g, acc, chosen)
					}
				}
			}
		})
	}
}
