package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestGenerateOnRanks: generate gives the same tokens on one rank, tp=2, tp=4 and a 2-D
// mesh (whose dp replicas run the same prompt).
func TestGenerateOnRanks(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tiny-gqa6")
	args := []string{"generate", "--model", dir, "--prompt-ids", "0,56,76,12", "--max-new-tokens", "6", "--log-level", "warn"}
	want, stderr, err := run(t, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	// tp=4 does not divide the 6 query heads: attention falls back, with --allow-replicated.
	for _, ranks := range [][]string{{"--world-size", "2"}, {"--world-size", "4", "--allow-replicated"}, {"--mesh", "tp=2,dp=2"}, {"--world-size", "4", "--mesh", "tp=4", "--allow-replicated"}} {
		got, stderr, err := run(t, append(args, ranks...)...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", ranks, err, stderr)
		}
		if got != want {
			t.Errorf("%v: generated %q, one rank %q", ranks, got, want)
		}
	}
	for _, c := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--world-size", "3", "--mesh", "tp=2"}, `world size 3, but mesh "tp=2" has 2 ranks`},
		{[]string{"--mesh", "tp=2,tp=2"}, `mesh axis "tp" appears twice`},
		{[]string{"--world-size", "2", "--no-optimize"}, "needs the optimizer"},
		{[]string{"--world-size", "4"}, "--allow-replicated"},
	} {
		if _, _, err := run(t, append(args, c.flags...)...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want one containing %q", c.flags, err, c.want)
		}
	}
}

// TestCompileOnRanks: compile --world-size prints and dumps rank 0's graphs.
func TestCompileOnRanks(t *testing.T) {
	dump := t.TempDir()
	stdout, stderr, err := run(t, "compile", "--model", filepath.Join("..", "..", "testdata", "tiny-llama"), "--world-size", "2", "--dump-graphs", dump)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	for _, want := range []string{`slice_dim=0, slice_count=2`, `all_reduce_add_rmsnorm(`, `all_gather(`, `{group="tp", group_size=2`} {
		if !strings.Contains(stdout, want) {
			t.Errorf("rank 0's graph lacks %s:\n%s", want, stdout)
		}
	}
	if !strings.Contains(stderr, "rank 0 of 2 (mesh tp=2)") {
		t.Errorf("stderr does not say whose graph it is:\n%s", stderr)
	}
	files, err := filepath.Glob(filepath.Join(dump, "*_sharding_sharding_executor.txt"))
	if err != nil || len(files) != 1 {
		t.Fatalf("the dumps hold %d sharding_executor files (%v)", len(files), err)
	}
	data, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), "slice_count=2") {
		t.Errorf("the sharding dump is not rank 0's sharded graph:\n%s", data)
	}
}

func TestDistBackendFlag(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tiny-llama")
	_, _, err := run(t, "generate", "--model", dir, "--prompt-ids", "0,1", "--max-new-tokens", "1", "--world-size", "2", "--dist-backend", "nccl")
	if err == nil || !strings.Contains(err.Error(), "needs a cuda device") {
		t.Errorf("nccl on the CPU: error = %v, want one that says it needs a cuda device", err)
	}
	if _, _, err := run(t, "generate", "--model", dir, "--prompt-ids", "0,1", "--max-new-tokens", "1", "--world-size", "2", "--dist-backend", "local"); err != nil {
		t.Errorf("local: %v", err)
	}
}
