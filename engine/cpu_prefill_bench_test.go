package engine

import (
	"context"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"testing"
	"time"
)

// BenchmarkCPUModel runs a real checkpoint on the CPU backend, in process, so that a CPU
// profile (go test -cpuprofile) shows one workload alone: LOOM_BENCH_MODEL names the
// checkpoint directory (e.g. `loom synth qwen2.5-0.5b --out /tmp/q05`); without it the
// benchmark skips. Sub-benchmarks:
//
//	prefill128: one request of 128 prompt tokens and 1 new token (the time to first token)
//	decode1:    one request of 8 prompt tokens and 32 new tokens
//	decode8:    8 such requests at once (continuous batching: 8 sequences a step)
//	serve1:     one request of 32 prompt tokens and 32 new tokens (loom bench --input-len 32
//	            --output-len 32 --concurrency 1)
//	serve8:     8 such requests at once (the same at --concurrency 8)
//
// Each reports ms per iteration, garbage collections per iteration (gc/op) and, for decode,
// output tokens per second.
func BenchmarkCPUModel(b *testing.B) {
	dir := os.Getenv("LOOM_BENCH_MODEL")
	if dir == "" {
		b.Skip("LOOM_BENCH_MODEL is not set (a checkpoint directory, e.g. from loom synth qwen2.5-0.5b)")
	}
	defer slog.SetDefault(slog.Default())
	slog.SetDefault(quiet)
	ctx := context.Background()
	m, err := Load(ctx, dir, LoadOptions{Optimize: true, Device: "cpu"})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	e, err := New(ctx, m, Options{Logger: quiet, DisablePrefixCaching: true})
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	run := func(b *testing.B, n, promptLen, newTokens int, salt int) {
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for r := range n {
			prompt := make([]int, promptLen)
			for i := range prompt {
				prompt[i] = 100 + (i*37+r*101+salt*13)%5000
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				st, err := e.Submit(ctx, Request{Prompt: prompt, MaxTokens: newTokens, IgnoreEOS: true})
				if err != nil {
					errs <- err
					return
				}
				if _, _, err := st.Collect(ctx); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
	}
	for _, c := range []struct {
		name                  string
		n, promptLen, newToks int
	}{
		{"prefill128", 1, 128, 1},
		{"decode1", 1, 8, 32},
		{"decode8", 8, 8, 32},
		{"serve1", 1, 32, 32},
		{"serve8", 8, 32, 32},
	} {
		b.Run(c.name, func(b *testing.B) {
			run(b, c.n, c.promptLen, c.newToks, -1) // warm-up
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			gcs := ms.NumGC
			i := 0
			start := time.Now()
			for b.Loop() {
				run(b, c.n, c.promptLen, c.newToks, i)
				i++
			}
			el := time.Since(start)
			runtime.ReadMemStats(&ms)
			b.ReportMetric(el.Seconds()*1e3/float64(i), "ms/op")
			b.ReportMetric(float64(ms.NumGC-gcs)/float64(i), "gc/op")
			if c.newToks > 1 {
				b.ReportMetric(float64(c.n*c.newToks*i)/el.Seconds(), "tok/s")
			}
		})
	}
}
