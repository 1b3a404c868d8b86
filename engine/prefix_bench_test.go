package engine

import (
	"context"
	"log/slog"
	"testing"
	"time"
)

// BenchmarkPrefixCacheTTFT: time to first token of a request whose prompt is a long prefix
// (960 tokens, 60 blocks) that an earlier request has left in the prefix cache, and a short
// tail of its own (8 tokens), against the same request on an engine without prefix caching,
// in one run: each iteration times one request on either engine, alternately (tiny-llama,
// the CPU backend). It reports cached-ms, uncached-ms and speedup (uncached over cached).
func BenchmarkPrefixCacheTTFT(b *testing.B) {
	const prefixLen, tailLen = 960, 8
	defer slog.SetDefault(slog.Default())
	slog.SetDefault(quiet) // Load's lines would cut the benchmark's
	m, err := Load(context.Background(), "../testdata/tiny-llama", LoadOptions{Optimize: true})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	prefix := make([]int, prefixLen)
	for i := range prefix {
		prefix[i] = 5 + (i*37)%490
	}
	engines := map[bool]*Engine{}
	for _, on := range []bool{true, false} {
		e, err := New(context.Background(), m, Options{Logger: quiet, DisablePrefixCaching: !on})
		if err != nil {
			b.Fatal(err)
		}
		defer e.Close()
		engines[on] = e
	}
	ttft := func(e *Engine, tail int) time.Duration {
		prompt := append(append(make([]int, 0, prefixLen+tailLen), prefix...), make([]int, tailLen)...)
		for j := range tailLen {
			prompt[prefixLen+j] = 5 + (tail*7+j)%490 // a tail no earlier request had
		}
		ctx := context.Background()
		start := time.Now()
		st, err := e.Submit(ctx, Request{Prompt: prompt, MaxTokens: 1, IgnoreEOS: true})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := st.Recv(ctx); err != nil {
			b.Fatal(err)
		}
		d := time.Since(start)
		if _, _, err := st.Collect(ctx); err != nil {
			b.Fatal(err)
		}
		return d
	}
	ttft(engines[true], 1<<20) // leaves the prefix in the cache
	ttft(engines[false], 1<<20)
	var sum [2]time.Duration
	var count [2]int
	i := 0
	for b.Loop() {
		on := i%2 == 0
		k := map[bool]int{true: 0, false: 1}[on]
		sum[k] += ttft(engines[on], i)
		count[k]++
		i++
	}
	if count[0] == 0 || count[1] == 0 {
		return
	}
	cached := sum[0].Seconds() / float64(count[0])
	uncached := sum[1].Seconds() / float64(count[1])
	b.ReportMetric(cached*1e3, "cached-ms")
	b.ReportMetric(uncached*1e3, "uncached-ms")
	b.ReportMetric(uncached/cached, "speedup")
	if st := engines[true].Stats(); st.CachedTokensTotal < int64(prefixLen*count[0]) {
		b.Errorf("the cached engine took %d tokens from the cache over %d requests, want %d each", st.CachedTokensTotal, count[0], prefixLen)
	}
}
