package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// setInt sets element i of an i32 or i64 tensor.
func setInt(t *tensor.Tensor, i, v int) {
	if t.DType == tensor.I64 {
		t.I64[i] = int64(v)
	} else {
		t.I32[i] = int32(v)
	}
}

// paged_attention on the GPU matches the CPU reference kernel: output and both caches, for
// several sequences whose blocks are scattered through the cache, decoding (one new token
// after a cached context) or prefilling (a whole prompt), with block sizes 1 and 16, GQA
// 1, 2 and 4, and windows 0 and 3.
func TestPagedAttentionMatchesCPU(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(7, 11))
	const KV, D = 2, 40
	for _, bs := range []int{1, 16} {
		for _, group := range []int{1, 2, 4} {
			for _, window := range []int{0, 3} {
				for _, mode := range []string{"decode", "prefill"} {
					for _, dt := range []tensor.DType{tensor.F32, tensor.BF16} {
						idt := tensor.I32
						if group == 2 {
							idt = tensor.I64
						}
						ctx, nw := []int{5, 17, 33}, []int{1, 1, 1}
						if mode == "prefill" {
							ctx, nw = []int{0, 0, 3}, []int{7, 20, 9}
						}
						H := KV * group
						S, M, need := 0, 0, 0
						for i := range ctx {
							S += nw[i]
							nb := (ctx[i] + nw[i] + bs - 1) / bs
							M = max(M, nb)
							need += nb
						}
						NB := need + 3
						perm := rng.Perm(NB)
						tables := tensor.New(idt, len(ctx), M)
						for i := range tables.Numel() {
							setInt(tables, i, NB-1) // unused entries point at a real block
						}
						slots, seqs, pos := tensor.New(idt, S), tensor.New(idt, S), tensor.New(idt, 1, S)
						next, tok := 0, 0
						for i := range ctx {
							nb := (ctx[i] + nw[i] + bs - 1) / bs
							for b := range nb {
								setInt(tables, i*M+b, perm[next])
								next++
							}
							for j := range nw[i] {
								p := ctx[i] + j
								setInt(pos, tok, p)
								setInt(seqs, tok, i)
								setInt(slots, tok, perm[next-nb+p/bs]*bs+p%bs)
								tok++
							}
						}
						q := randTensor(rng, dt, []int{1, H, S, D}, -2, 2)
						k := randTensor(rng, dt, []int{1, KV, S, D}, -2, 2)
						v := randTensor(rng, dt, []int{1, KV, S, D}, -1, 1)
						kc := randTensor(rng, dt, []int{NB, bs, KV, D}, -2, 2)
						vc := randTensor(rng, dt, []int{NB, bs, KV, D}, -1, 1)
						in := up(t, d, q, k, v, pos, kc, vc, slots, seqs, tables) // before the CPU updates the caches
						scale := 1 / math.Sqrt(float64(D))
						want := cpuOp(t, "paged_attention", graph.Attrs{"scale": scale, "window": window}, q, k, v, pos, kc, vc, slots, seqs, tables)[0]
						out := like(t, d, want)
						if err := d.PagedAttention(out[0], in, float32(scale), window); err != nil {
							t.Fatal(err)
						}
						tl := tol{atol: 2e-5, rtol: 1e-4}
						if dt == tensor.BF16 {
							tl = tol{atol: 1.0 / 64, rtol: 1.0 / 64}
						}
						name := fmt.Sprintf("%s %s BS%d H%d KV%d S%d window %d", dt, mode, bs, H, KV, S, window)
						compare(t, "paged_attention", name, down(t, d, out[0]), want, tl)
						compare(t, "paged_kcache", name, down(t, d, in[4]), kc, tol{})
						compare(t, "paged_vcache", name, down(t, d, in[5]), vc, tol{})
					}
				}
			}
		}
	}
}

// gather on the GPU matches the CPU along the first, middle and last axes.
func TestGatherMatchesCPU(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(3, 5))
	for _, tc := range []struct {
		shape []int
		axis  int
		idx   []int
		dt    tensor.DType
	}{
		{[]int{1, 9, 33}, 1, []int{8, 0, 3}, tensor.F32},
		{[]int{4, 5}, 0, []int{2, 2, 1, 3}, tensor.BF16},
		{[]int{2, 3, 7}, 2, []int{6}, tensor.F32},
	} {
		x := randTensor(rng, tc.dt, tc.shape, -1, 1)
		idx := tensor.New(tensor.I32, len(tc.idx))
		for i, v := range tc.idx {
			idx.I32[i] = int32(v)
		}
		want := cpuOp(t, "gather", graph.Attrs{"axis": tc.axis}, x, idx)[0]
		in := up(t, d, x, idx)
		out := like(t, d, want)
		if err := d.Gather(out[0], in[0], in[1], tc.axis); err != nil {
			t.Fatal(err)
		}
		compare(t, "gather", fmt.Sprintf("%s%v axis %d", tc.dt, tc.shape, tc.axis), down(t, d, out[0]), want, tol{})
	}
}
