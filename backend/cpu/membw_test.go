package cpu

import (
	"runtime"
	"sync"
	"testing"
)

// BenchmarkMemoryRead measures this machine's memory read bandwidth with every core summing
// its share of a 1 GiB buffer: the floor that memory-bound decoding is judged against
// (model bytes ÷ this figure = the least time one decode step can take).
func BenchmarkMemoryRead(b *testing.B) {
	buf := make([]uint64, 1<<27) // 1 GiB
	for i := range buf {
		buf[i] = uint64(i)
	}
	workers := runtime.GOMAXPROCS(0)
	chunk := len(buf) / workers
	sums := make([]uint64, workers)
	b.SetBytes(int64(len(buf) * 8))
	b.ResetTimer()
	for b.Loop() {
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				var s0, s1, s2, s3 uint64
				part := buf[w*chunk : (w+1)*chunk]
				for i := 0; i+3 < len(part); i += 4 {
					s0 += part[i]
					s1 += part[i+1]
					s2 += part[i+2]
					s3 += part[i+3]
				}
				sums[w] = s0 + s1 + s2 + s3
			})
		}
		wg.Wait()
	}
}
