package local

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/tensor"
)

// benchSizes are the message sizes of BenchmarkAllReduce, in bytes per rank: 8 KB to 64 MB,
// and below, where the crossover of auto lies on multi-core machines.
var benchSizes = []int{1 << 10, 2 << 10, 4 << 10, 8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, 512 << 10,
	1 << 20, 2 << 20, 4 << 20, 8 << 20, 16 << 20, 32 << 20, 64 << 20}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMB", n>>20)
	}
	return fmt.Sprintf("%dKB", n>>10)
}

// BenchmarkAllReduce measures an f32 sum all_reduce over the world of 2 and 4 ranks, per
// strategy. One op is one all_reduce on every rank; bytes/s count one rank's message. The
// crossover between oneshot and twoshot is dist.LocalCrossover, which auto follows.
func BenchmarkAllReduce(b *testing.B) {
	ctx := context.Background()
	for _, n := range []int{2, 4} {
		for _, size := range benchSizes {
			for _, strategy := range []string{dist.StrategyOneShot, dist.StrategyTwoShot, dist.StrategyAuto} {
				b.Run(fmt.Sprintf("ranks=%d/size=%s/%s", n, sizeName(size), strategy), func(b *testing.B) {
					comms := newWorld(b, n, Options{AllReduceStrategy: strategy})
					xs := make([]*tensor.Tensor, n)
					for r := range xs {
						xs[r] = tensor.New(tensor.F32, size/4) // zeros: sums stay finite
					}
					b.SetBytes(int64(size))
					b.ReportAllocs()
					b.ResetTimer()
					var wg sync.WaitGroup
					errs := make([]error, n)
					for r, c := range comms {
						wg.Go(func() {
							g := worldGroup(n, r)
							for range b.N {
								if err := c.AllReduce(ctx, g, dist.Sum, xs[r]); err != nil {
									errs[r] = err
									return
								}
							}
						})
					}
					wg.Wait()
					b.StopTimer()
					if err := firstErr(errs...); err != nil {
						b.Fatal(err)
					}
				})
			}
		}
	}
}
