package main

import (
	"path/filepath"
	"strings"
	"testing"
)

// A tp size that does not divide the model's heads (issue 21 defect 10: --world-size 3 on a
// 4-head model printed a warning per weight and loaded a full copy per rank) is refused
// before any weight is read, naming --allow-replicated; with it the model runs, giving the
// one-rank tokens, with one summary line instead of one per weight.
func TestShardingFallbackRefused(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tiny-llama") // 4 query heads, 2 KV heads
	args := []string{"generate", "--model", dir, "--prompt-ids", "0,56,76", "--max-new-tokens", "4"}
	want, _, err := run(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	for _, ranks := range [][]string{{"--world-size", "3"}, {"--mesh", "tp=3"}} {
		stdout, stderr, err := run(t, append(args, ranks...)...)
		if err == nil || !strings.Contains(err.Error(), "--allow-replicated") || !strings.Contains(err.Error(), "tp=3") || !strings.Contains(err.Error(), "whole on every rank") {
			t.Errorf("%v: error %v, want a refusal naming tp=3 and --allow-replicated", ranks, err)
		}
		if stdout != "" || strings.Contains(stderr, "model loaded") {
			t.Errorf("%v: the refused model loaded or printed: %q\n%s", ranks, stdout, stderr)
		}
		got, stderr, err := run(t, append(append(args, ranks...), "--allow-replicated")...)
		if err != nil {
			t.Fatalf("%v --allow-replicated: %v\n%s", ranks, err, stderr)
		}
		if got != want {
			t.Errorf("%v --allow-replicated: %q, one rank %q", ranks, got, want)
		}
		if n := strings.Count(stderr, "detect_sharding:"); n != 1 || !strings.Contains(stderr, "leaves 15 of 15 weights whole on every rank") {
			t.Errorf("%v --allow-replicated: %d detect_sharding lines, want one summary:\n%s", ranks, n, stderr)
		}
	}
	// Each weight's decision is still there at debug level.
	_, stderr, err := run(t, append(args, "--world-size", "3", "--allow-replicated", "--log-level", "debug")...)
	if err != nil || strings.Count(stderr, "detect_sharding: not split: ") != 15 {
		t.Errorf("--log-level debug: %v, %d per-weight lines, want 15", err, strings.Count(stderr, "detect_sharding: not split: "))
	}
	// compile takes the flag too.
	if _, _, err := run(t, "compile", "--model", dir, "--world-size", "3", "-o", filepath.Join(t.TempDir(), "g.txt")); err == nil || !strings.Contains(err.Error(), "--allow-replicated") {
		t.Errorf("compile --world-size 3: error %v", err)
	}
}
