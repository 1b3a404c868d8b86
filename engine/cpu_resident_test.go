package engine

import (
	"context"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/loom-ml/loom/backend"
)

// TestCPUKeepsKVCache: on the CPU the deployment's program keeps the engine's KV caches
// itself (backend.Resident) in memory outside the Go heap, so a cache of 256 MiB neither
// grows the heap nor, with it, the collector's goal (which once let dead activations pile up
// to the cache's size again: 2.1 GB of peak RSS serving 0.99 GB of weights); the engine
// passes shape-only caches, and generates the tokens of an engine given heap caches
// (greedy, the same bits step for step).
func TestCPUKeepsKVCache(t *testing.T) {
	ctx := context.Background()
	m, err := Load(ctx, filepath.Join("..", "testdata", "tiny-llama"), LoadOptions{Optimize: true, Device: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	r, ok := m.Program.(backend.Resident)
	if !ok {
		t.Fatalf("the CPU program %T keeps no inputs (backend.Resident)", m.Program)
	}
	var caches []string
	for _, in := range m.Graph.Inputs {
		if strings.HasPrefix(in.Name, "kv_cache.") {
			caches = append(caches, in.Name)
		}
	}
	slices.Sort(caches)
	if kept := r.Resident(); len(caches) == 0 || !slices.Equal(kept, caches) {
		t.Fatalf("the CPU program keeps %v, want the caches %v", kept, caches)
	}

	prompt := []int{1, 150, 292, 59, 102, 338, 263, 17, 400}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	e, err := New(ctx, m, Options{Logger: quiet, KVCacheBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := generate(t, e, Request{Prompt: prompt, MaxTokens: 12, IgnoreEOS: true})
	runtime.GC()
	runtime.ReadMemStats(&after)
	e.Close()
	if grew := int64(after.HeapSys) - int64(before.HeapSys); grew > 64<<20 {
		t.Errorf("the Go heap grew by %d bytes for a 256 MiB KV cache, want the cache off the heap", grew)
	}

	// The same model with heap caches (a program that is not Resident): the measure above
	// sees them.
	runtime.GC()
	runtime.ReadMemStats(&before)
	e2, err := New(ctx, &Model{Model: m.Model, Device: m.Device, Program: notResident{m.Program}, Graph: m.Graph}, Options{Logger: quiet, KVCacheBytes: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer e2.Close()
	want, _ := generate(t, e2, Request{Prompt: prompt, MaxTokens: 12, IgnoreEOS: true})
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapSys) - int64(before.HeapSys); grew < 200<<20 {
		t.Errorf("the Go heap grew by only %d bytes for a 256 MiB KV cache in it: the measure is broken", grew)
	}
	if !slices.Equal(got, want) {
		t.Errorf("kept caches generate %v, heap caches %v", got, want)
	}
}

// notResident hides an executable's powers but Run.
type notResident struct{ backend.Executable }
