package engine

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/internal/parity"
	"github.com/loom-ml/loom/tensor"
)

// checkCP lets context parallelism run on the cpu and cuda devices and refuses any other
// device and one process per rank, naming the mesh; without a cp axis (or at cp=1) it
// refuses nothing.
func TestCheckCPDevices(t *testing.T) {
	cp2, cp1 := mustMeshFor(t, 0, "cp=2"), mustMeshFor(t, 0, "cp=1,tp=2")
	for _, tc := range []struct {
		name, device string
		opts         LoadOptions
		want         string // "" for no error
	}{
		{"cpu", "cpu", LoadOptions{Mesh: cp2}, ""},
		{"cuda", "cuda", LoadOptions{Mesh: cp2}, ""},
		{"other device", "rocm", LoadOptions{Mesh: cp2}, `mesh "cp=2": context parallelism (cp=2) runs on the cpu and cuda devices only; the rocm backend`},
		{"one process per rank", "cuda", LoadOptions{Mesh: cp2, Process: &dist.ProcessEnv{WorldSize: 2}}, "runs its ranks in one process only"},
		{"cp=1 anywhere", "rocm", LoadOptions{Mesh: cp1}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkCP(tc.opts, tc.device)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("checkCP: %v, want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("checkCP: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// Context parallelism on two GPUs (cp=2, one GPU per rank, NCCL in this process) with f32
// activations: the whole-sequence graph with both strategies gives Hugging Face's logits at
// every position the reference holds, and the engine on the paged KV cache (each GPU caching
// its share) gives its last-position logits and greedy continuations. Skips with fewer than
// two GPUs (issue 23 runs it).
func TestCUDAContextParallel(t *testing.T) {
	needGPUs(t, 2)
	const name = "tiny-llama"
	dir := filepath.Join("..", "testdata", name)
	ref := loadReference(t, dir)
	for _, strategy := range []string{"ring", "all_to_all"} {
		opts := onCUDA(LoadOptions{Optimize: true, Mesh: mustMeshFor(t, 0, "cp=2"), ActivationDType: tensor.F32})
		opts.Transforms.Sets = []string{"transforms.rewrite_cp_attention.cp_strategy=" + strategy}
		t.Run(fmt.Sprintf("whole/%s", strategy), func(t *testing.T) {
			o := opts
			o.WholeSequences = true
			m, err := Load(context.Background(), dir, o)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			checkCPGraph(t, m, "cp=2", strategy)
			for _, p := range ref.Prompts {
				logits, _ := runAll(t, m.Executable(), p.IDs)
				checkLogits(t, logits, p)
			}
		})
		t.Run(fmt.Sprintf("cached/%s", strategy), func(t *testing.T) {
			m, err := Load(context.Background(), dir, opts)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			longest := 0
			for _, p := range ref.Prompts {
				longest = max(longest, len(p.IDs)+len(p.GreedyNewIDs))
			}
			e, err := New(context.Background(), m, Options{Logger: quiet, KVBlocks: len(ref.Prompts)*(longest/16+2) + 4})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			checkCPCachedGraph(t, e, "cp=2", strategy)
			for _, p := range ref.Prompts {
				if err := parity.CheckLogits(cpPromptLogits(t, e, p.IDs, len(p.IDs)), p, logitTol); err != nil {
					t.Errorf("one-step prefill: %v", err)
				}
				if err := parity.CheckLogits(cpPromptLogits(t, e, p.IDs, 7), p, logitTol); err != nil {
					t.Errorf("prefill in chunks of 7: %v", err)
				}
			}
			checkGreedyAll(t, ref, generateAll(t, e, greedyRequests(ref)), engineGen(t, e))
			checkCPBlocksFree(t, e)
		})
	}
}
