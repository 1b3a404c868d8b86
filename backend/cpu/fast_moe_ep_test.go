package cpu

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// epKernels are the kernels runEP uses.
type epKernels struct{ route, dispatch, experts, combine Kernel }

// runEP runs one moe block run by all_to_all dispatch and combine over G ep ranks with the
// given kernels, the all_to_all exchanges done by hand: each rank's output (only its own
// tokens nonzero) and their sum.

func runEP(t *testing.T, k epKernels, c moeCase, in []*tensor.Tensor, G int) (perRank [][]float64, sum []float64) {
	t.Helper()
	run := func(kern Kernel, op string, attrs graph.Attrs, ins ...*tensor.Tensor) []*tensor.Tensor {
		t.Helper()
		n, outs := nodeFor(t, op, attrs, ins)
		res, err := runKernel(kern, n, ins, outs)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	// exchange is the all_to_all along axis 0 of per-rank [G,...] tensors: rank r gets
	// piece r of every rank, in rank order.
	exchange := func(sent []*tensor.Tensor) []*tensor.Tensor {
		got := make([]*tensor.Tensor, G)
		for r := range G {
			piece := sent[0].Numel() / G
			got[r] = tensor.New(sent[0].DType, sent[0].Shape...)
			for s := range G {
				if sent[s].DType == tensor.I32 {
					copy(got[r].I32[s*piece:(s+1)*piece], sent[s].I32[r*piece:(r+1)*piece])
				} else {
					tensor.CopyRange(got[r], s*piece, sent[s], r*piece, piece)
				}
			}
		}
		return got
	}
	route := run(k.route, "moe_route", graph.Attrs{"top_k": c.k, "normalize": c.normalize, "weight_dtype": c.wd}, in[0], in[1])
	rows, ids := make([]*tensor.Tensor, G), make([]*tensor.Tensor, G)
	for r := range G {
		d := run(k.dispatch, "moe_dispatch", graph.Attrs{"num_experts": c.E, "group_size": G, "rank": r}, in[0], route[1])
		rows[r], ids[r] = d[0], d[1]
	}
	rows, ids = exchange(rows), exchange(ids)
	L := c.E / G
	ys := make([]*tensor.Tensor, G)
	for r := range G {
		part := func(w *tensor.Tensor) *tensor.Tensor {
			size := w.Numel() / c.E
			v := tensor.New(w.DType, append([]int{L}, w.Shape[1:]...)...)
			tensor.CopyRange(v, 0, w, r*L*size, L*size)
			return v
		}
		ys[r] = run(k.experts, "moe_experts", graph.Attrs{"expert_offset": r * L}, rows[r], ids[r], part(in[2]), part(in[3]), part(in[4]))[0]
	}
	ys = exchange(ys)
	for r := range G {
		out := run(k.combine, "moe_combine", graph.Attrs{"num_experts": c.E}, ys[r], route[1], route[0])[0]
		perRank = append(perRank, values(out))
		if sum == nil {
			sum = make([]float64, out.Numel())
		}
		for i, v := range perRank[r] {
			sum[i] += v
		}
	}
	return perRank, sum
}

var epCases = []moeCase{
	{name: "mixtral f32", act: tensor.F32, w: tensor.BF16, wd: tensor.F32, tokens: []int{2, 5}, E: 4, I: 6, H: 8, k: 2, normalize: true},
	{name: "qwen bf16", act: tensor.BF16, w: tensor.BF16, wd: tensor.BF16, tokens: []int{3, 4}, E: 8, I: 12, H: 16, k: 2},
	{name: "top-3 f32 normalized", act: tensor.F32, w: tensor.BF16, wd: tensor.F32, tokens: []int{2, 7}, E: 8, I: 5, H: 12, k: 3, normalize: true},
	{name: "f16 every expert", act: tensor.F16, w: tensor.F32, wd: tensor.F16, tokens: []int{9}, E: 4, I: 4, H: 8, k: 4},
	{name: "ties", act: tensor.F32, w: tensor.BF16, wd: tensor.F32, tokens: []int{2, 3}, E: 4, I: 4, H: 8, k: 2, zeroRouter: true},
	{name: "one token, no leading axes", act: tensor.F32, w: tensor.BF16, wd: tensor.F32, tokens: nil, E: 4, I: 4, H: 8, k: 2},
	{name: "no tokens", act: tensor.BF16, w: tensor.BF16, wd: tensor.BF16, tokens: []int{0, 3}, E: 4, I: 4, H: 8, k: 2},
}

// The four kernels of all_to_all expert parallelism against their references (the ops'
// decompositions run with reference kernels), each on the inputs the pipeline gives it:
// bit for bit where the linear kernel is the portable one on amd64, else within rounding.
// And the pipeline over G ranks against the fused moe kernel on one rank: every token's
// output comes from the one rank that owns it, and equals the fused op's bit for bit in
// the portable build (the same routing, each expert's rows through the same linear kernel,
// the same sum in expert order).
func TestMoEAllToAllKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(301, 302))
	exact := exactLinear()
	fast := epKernels{fastMoERoute, fastMoEDispatch, fastMoEExperts, fastMoECombine}
	reference := func(op string) Kernel {
		k, ok := Reference(op)
		if !ok {
			t.Fatalf("no reference kernel for %s", op)
		}
		return k
	}
	ref := epKernels{reference("moe_route"), reference("moe_dispatch"), reference("moe_experts"), reference("moe_combine")}
	for _, c := range epCases {
		c.L = c.E
		t.Run(c.name, func(t *testing.T) {
			in := c.inputs(rng)
			n, outs := nodeFor(t, "moe", c.attrs(), in)
			whole, err := runKernel(fastMoE, n, in, outs)
			if err != nil {
				t.Fatal(err)
			}
			want := values(whole[0])
			scale := 1.0
			for _, v := range want {
				scale = max(scale, math.Abs(v))
			}
			tol := 0.0
			if !exact {
				tol = (1e-5 + 4*linearRelErr() + 4*ulp(c.act)) * scale // linearRelErr: where the kernel set rounds x to bf16
			}
			for _, G := range []int{1, 2, 4} {
				if c.E%G != 0 {
					continue
				}
				perRank, got := runEP(t, fast, c, in, G)
				_, refSum := runEP(t, ref, c, in, G)
				owners := moeTokenOwners(c.tokens, G)
				for i := range want {
					tok := i / c.H
					for r, out := range perRank {
						if r != owners[tok] && out[i] != 0 {
							t.Fatalf("G=%d: rank %d gives %v for token %d, owned by rank %d", G, r, out[i], tok, owners[tok])
						}
					}
					if d := math.Abs(got[i] - want[i]); d > tol || math.IsNaN(d) {
						t.Fatalf("G=%d: element %d (index %v): all_to_all %v, fused moe %v", G, i, unflatten(i, outs[0].Shape), got[i], want[i])
					}
					if d := math.Abs(refSum[i] - want[i]); d > tol || math.IsNaN(d) {
						t.Fatalf("G=%d: element %d: decompositions give %v, fused moe %v", G, i, refSum[i], want[i])
					}
				}
			}
		})
	}
}

// Each token belongs to the rank of its indices' sum modulo G; the rows dispatch lays out
// for another rank hold the token and its expert, and are 0 and -1 elsewhere.
func TestMoEDispatchLayout(t *testing.T) {
	if got, want := moeTokenOwners([]int{2, 3}, 2), []int{0, 1, 0, 1, 0, 1}; !slices.Equal(got, want) {
		t.Errorf("owners of [2,3] over 2: %v, want %v", got, want)
	}
	if got, want := moeTokenOwners([]int{3, 2}, 3), []int{0, 1, 1, 2, 2, 0}; !slices.Equal(got, want) {
		t.Errorf("owners of [3,2] over 3: %v, want %v", got, want)
	}
	x := fromValues(tensor.F32, []int{3, 2}, []float64{1, 2, 3, 4, 5, 6})
	ex := &tensor.Tensor{DType: tensor.I32, Shape: []int{3, 2}, I32: []int32{3, 0, 1, 2, 0, 3}}
	n, outs := nodeFor(t, "moe_dispatch", graph.Attrs{"num_experts": 4, "group_size": 2, "rank": 0}, []*tensor.Tensor{x, ex})
	res, err := runKernel(fastMoEDispatch, n, []*tensor.Tensor{x, ex}, outs)
	if err != nil {
		t.Fatal(err)
	}
	// Rank 0 owns tokens 0 and 2; experts 0, 1 live on rank 0, experts 2, 3 on rank 1.
	wantIDs := []int32{-1, 0, -1, -1, 0, -1 /* to rank 0 */, 3, -1, -1, -1, -1, 3 /* to rank 1 */}
	if !slices.Equal(res[1].I32, wantIDs) {
		t.Errorf("ids %v, want %v", res[1].I32, wantIDs)
	}
	wantRows := []float64{0, 0, 1, 2, 0, 0, 0, 0, 5, 6, 0, 0, 1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 5, 6}
	if got := values(res[0]); !slices.Equal(got, wantRows) {
		t.Errorf("rows %v, want %v", got, wantRows)
	}
	bad := &tensor.Tensor{DType: tensor.I32, Shape: []int{3, 2}, I32: []int32{3, 0, 1, 4, 0, 3}}
	if _, err := runKernel(fastMoEDispatch, n, []*tensor.Tensor{x, bad}, outs); err == nil {
		t.Error("expert 4 of 4 dispatched")
	}
}
