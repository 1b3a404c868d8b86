package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// BenchmarkLinear times the reference linear kernel on x[M,2048] @ w[2048,2048]^T with bf16
// weights, the shape of a decode step (M=1) and a small batch (M=8).
func BenchmarkLinear(b *testing.B) {
	const K, N = 2048, 2048
	rng := rand.New(rand.NewPCG(61, 62))
	w := randTensor(rng, tensor.BF16, []int{N, K}, -1, 1)
	k, _ := Reference("linear")
	for _, tc := range []struct {
		m  int
		dx tensor.DType
	}{{1, tensor.F32}, {8, tensor.F32}, {8, tensor.BF16}} {
		b.Run(fmt.Sprintf("%sx[%d,%d]@bf16[%d,%d]", tc.dx, tc.m, K, N, K), func(b *testing.B) {
			x := randTensor(rng, tc.dx, []int{tc.m, K}, -1, 1)
			gb := graph.NewBuilder("bench")
			xv := gb.Input("x", tc.dx, graph.Dims(tc.m, K))
			wv := gb.Input("w", tensor.BF16, graph.Dims(N, K))
			n := gb.Linear(xv, wv).Producer
			if err := gb.Err(); err != nil {
				b.Fatal(err)
			}
			out := []Out{{DType: tc.dx, Shape: []int{tc.m, N}}}
			b.SetBytes(int64(N * K * 2)) // weight bytes streamed per call
			for b.Loop() {
				if _, err := k(n, []*tensor.Tensor{x, w}, out); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(2*tc.m*N*K)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
