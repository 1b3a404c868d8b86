package main

import (
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// inspect --summary prints counts instead of the graph: params and bytes by dtype, layers,
// ops by kind (summing to the node count) of the plain and the optimized graph, and the
// transforms that changed it.
func TestInspectSummary(t *testing.T) {
	dir := filepath.Join("..", "..", "testdata", "tiny-qwen3")
	stdout, stderr, err := run(t, "inspect", "--model", dir, "--summary")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if strings.Contains(stdout, "graph Qwen3ForCausalLM(") || strings.Contains(stdout, `param "`) {
		t.Errorf("--summary printed the graph:\n%s", stdout)
	}
	for _, want := range []string{"architecture: Qwen3ForCausalLM", "parameters: ", "graph layers: 2\n", "transforms applied (matches): ", "match_rmsnorm_pattern (", "fuse_gemms ("} {
		if !strings.Contains(stdout, want) {
			t.Errorf("summary lacks %q:\n%s", want, stdout)
		}
	}
	if !regexp.MustCompile(`(?m)^  (f32|bf16|f16): \d+ params, \d+ bytes$`).MatchString(stdout) {
		t.Errorf("no params and bytes by dtype:\n%s", stdout)
	}
	graphs := regexp.MustCompile(`(?m)^(plain|optimized) graph: (\d+) nodes \(\d+ params\)\n  ops: (.*)$`).FindAllStringSubmatch(stdout, -1)
	if len(graphs) != 2 {
		t.Fatalf("want the plain and the optimized graph's op counts:\n%s", stdout)
	}
	for _, g := range graphs {
		nodes, _ := strconv.Atoi(g[2])
		sum := 0
		for _, part := range strings.Split(g[3], ", ") {
			op, n, ok := strings.Cut(part, " ")
			c, err := strconv.Atoi(n)
			if !ok || err != nil || op == "" {
				t.Fatalf("%s graph: op count %q", g[1], part)
			}
			sum += c
		}
		if sum != nodes {
			t.Errorf("%s graph: ops add up to %d, %d nodes", g[1], sum, nodes)
		}
	}
	if !strings.Contains(graphs[1][3], "sdpa 2") || strings.Contains(graphs[0][3], "sdpa") {
		t.Errorf("the optimized graph should have one sdpa a layer, the plain none: %q / %q", graphs[0][3], graphs[1][3])
	}
	// --set reaches the pipeline.
	stdout, _, err = run(t, "inspect", "--model", dir, "--summary", "--set", "transforms.fuse_gemms.enabled=false")
	if err != nil || !regexp.MustCompile(`transforms disabled: .*fuse_gemms`).MatchString(stdout) {
		t.Errorf("--set transforms.fuse_gemms.enabled=false: %v\n%s", err, stdout)
	}
}
