package engine

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// On a GPU the options left at 0 are sized from the free memory and logged; options given
// stay as they are, and MaxTokensPerStep stays at least MaxBatch.
func TestDeviceDefaults(t *testing.T) {
	const gib = 1 << 30
	// The cache takes 90% of what is free less 4 GiB.
	cache := func(free uint64) int64 { return int64(float64(free-4*gib) * 0.9) }
	for _, tc := range []struct {
		name                string
		opts                Options
		free                uint64
		batch, tokens       int
		cacheBytes          int64
		wantErr, wantLogged bool
	}{
		{name: "large GPU", free: 100 * gib, batch: 256, tokens: 8192, cacheBytes: cache(100 * gib), wantLogged: true},
		{name: "small GPU", free: 20 * gib, batch: 256, tokens: 2048, cacheBytes: cache(20 * gib), wantLogged: true},
		{name: "flags kept", opts: Options{MaxBatch: 8, MaxTokensPerStep: 1024, KVCacheBytes: gib}, free: 100 * gib, batch: 8, tokens: 1024, cacheBytes: gib},
		{name: "batch bounded by tokens", opts: Options{MaxTokensPerStep: 64}, free: 100 * gib, batch: 64, tokens: 64, cacheBytes: cache(100 * gib), wantLogged: true},
		{name: "tokens at least batch", opts: Options{MaxBatch: 4096}, free: 100 * gib, batch: 4096, tokens: 8192, cacheBytes: cache(100 * gib), wantLogged: true},
		{name: "tokens raised to batch", opts: Options{MaxBatch: 9000}, free: 100 * gib, batch: 9000, tokens: 9000, cacheBytes: cache(100 * gib), wantLogged: true},
		{name: "kv blocks given", opts: Options{KVBlocks: 10}, free: 100 * gib, batch: 256, tokens: 8192, wantLogged: true},
		{name: "no room for a cache", free: 3 * gib, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var log bytes.Buffer
			tc.opts.Logger = slog.New(slog.NewTextHandler(&log, nil))
			got, err := deviceDefaults(tc.opts, tc.free)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("no error for %d bytes free", tc.free)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.MaxBatch != tc.batch || got.MaxTokensPerStep != tc.tokens || got.KVCacheBytes != tc.cacheBytes {
				t.Errorf("MaxBatch %d, MaxTokensPerStep %d, KVCacheBytes %d; want %d, %d, %d",
					got.MaxBatch, got.MaxTokensPerStep, got.KVCacheBytes, tc.batch, tc.tokens, tc.cacheBytes)
			}
			if logged := strings.Contains(log.String(), "sized from the GPU"); logged != tc.wantLogged {
				t.Errorf("logged %v, want %v: %q", logged, tc.wantLogged, log.String())
			}
			if _, err := got.withDefaults(); err != nil {
				t.Errorf("the picked options are refused: %v", err)
			}
		})
	}
}
