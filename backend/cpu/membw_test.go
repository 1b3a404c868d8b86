package cpu

import (
	"runtime"
	"sync"
	"testing"
)

// BenchmarkMemoryRead measures this machine's memory read bandwidth with every core reading
// its share of a 1 GiB buffer: the floor that memory-bound decoding is judged against
// (model bytes ÷ this figure = the least time one decode step can take).
//
//	scalar: a Go loop summing 64-bit words, four accumulators
//	vector: readHalf, the kernels' own loads (32-byte AVX2 loads where the CPU has them)
func BenchmarkMemoryRead(b *testing.B) {
	buf := make([]uint64, 1<<27) // 1 GiB
	for i := range buf {
		buf[i] = uint64(i)
	}
	workers := runtime.GOMAXPROCS(0)
	chunk := len(buf) / workers
	sums := make([]uint64, workers)
	run := func(b *testing.B, read func(part []uint64) uint64) {
		b.SetBytes(int64(len(buf) * 8))
		for b.Loop() {
			var wg sync.WaitGroup
			for w := range workers {
				wg.Go(func() { sums[w] = read(buf[w*chunk : (w+1)*chunk]) })
			}
			wg.Wait()
		}
	}
	b.Run("scalar", func(b *testing.B) {
		run(b, func(part []uint64) uint64 {
			var s0, s1, s2, s3 uint64
			for i := 0; i+3 < len(part); i += 4 {
				s0 += part[i]
				s1 += part[i+1]
				s2 += part[i+2]
				s3 += part[i+3]
			}
			return s0 + s1 + s2 + s3
		})
	})
	b.Run("vector", func(b *testing.B) {
		run(b, func(part []uint64) uint64 { return readHalf(unsafeHalves(part)) })
	})
}
