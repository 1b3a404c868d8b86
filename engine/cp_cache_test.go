package engine

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/loom-ml/loom/internal/parity"
	"github.com/loom-ml/loom/kvcache"
)

// loadCachedCP loads fixture name for the engine (the paged KV cache) on mesh, with the cp
// strategy given, and starts an engine on it with blocks KV blocks per rank.
func loadCachedCP(t *testing.T, name, mesh, strategy string, blocks int) *Engine {
	t.Helper()
	opts := LoadOptions{Optimize: true}
	if mesh != "" {
		opts.Mesh = mustMeshFor(t, 0, mesh)
	}
	opts.Transforms.Sets = []string{"transforms.rewrite_cp_attention.cp_strategy=" + strategy}
	m, err := Load(context.Background(), filepath.Join("..", "testdata", name), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	e, err := New(context.Background(), m, Options{Logger: quiet, KVBlocks: blocks})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// cpPromptLogits feeds prompt through a cp engine's caches in chunks of chunk tokens (each
// split over the cp ranks; later chunks attend to every rank's earlier keys) and returns
// the logits of its last position. The engine's own loop must be idle.
func cpPromptLogits(t *testing.T, e *Engine, prompt []int, chunk int) []float32 {
	t.Helper()
	const id = kvcache.SeqID(1 << 20) // far from the engine's own ids
	defer e.kv.Free(id)
	var last []float32
	for from := 0; from < len(prompt); from += chunk {
		n := min(chunk, len(prompt)-from)
		if err := e.kv.Reserve(id, from+n); err != nil {
			t.Fatal(err)
		}
		rows, err := e.runStep([]stepSeq{{seq: id, tokens: prompt, from: from, n: n}})
		if err != nil {
			t.Fatal(err)
		}
		last = slices.Clone(rows[0])
	}
	return last
}

// checkCPBlocksFree holds every cp rank's allocator to empty: no block leaked.
func checkCPBlocksFree(t *testing.T, e *Engine) {
	t.Helper()
	if e.cpa == nil {
		t.Fatal("the engine does not keep per-cp-rank blocks")
	}
	for c, a := range e.cpa.ranks {
		if st := a.Stats(); st.Used != 0 || st.Sequences != 0 {
			t.Errorf("cp rank %d: %d blocks of %d sequences still in use", c, st.Used, st.Sequences)
		}
	}
	e.cpa.mu.Lock()
	defer e.cpa.mu.Unlock()
	if len(e.cpa.seqs) != 0 {
		t.Errorf("%d sequences still placed on the cp ranks", len(e.cpa.seqs))
	}
}

// cpCachedCases is the test matrix of the cached engine with context parallelism: every
// mesh and strategy on tiny-llama (GQA) and tiny-mistral (a sliding window of 8, which
// the ranks' keys cross), and cp=2 ring on every other fixture (MoE included). In -short
// mode, tiny-llama's matrix and cp=2 ring on tiny-qwen3; under the race detector (ten times
// slower), every mesh once on tiny-llama, both strategies among them.
func cpCachedCases() (cases []struct{ name, mesh, strategy string }) {
	if raceEnabled {
		return []struct{ name, mesh, strategy string }{
			{"tiny-llama", "cp=2", "ring"}, {"tiny-llama", "cp=4", "all_to_all"},
			{"tiny-llama", "tp=2,cp=2", "all_to_all"}, {"tiny-llama", "dp=2,cp=2", "ring"},
		}
	}
	full := []string{"tiny-llama", "tiny-mistral"}
	others := slices.DeleteFunc(slices.Concat(supportedFixtures, moeFixtures), func(n string) bool { return slices.Contains(full, n) })
	if testing.Short() {
		full, others = full[:1], []string{"tiny-qwen3"}
	}
	for _, name := range full {
		for _, mesh := range cpMeshes {
			for _, strategy := range []string{"ring", "all_to_all"} {
				cases = append(cases, struct{ name, mesh, strategy string }{name, mesh, strategy})
			}
		}
	}
	for _, name := range others {
		cases = append(cases, struct{ name, mesh, strategy string }{name, "cp=2", "ring"})
	}
	return cases
}

// TestCPCachedEngineHuggingFaceParity runs context parallelism on the engine's paged KV
// cache: each cp rank caches its share of every prompt (dist.CPShare) and of the decoded
// tokens (one rank each), and every step's attention runs over every rank's keys.
// Held to Hugging Face: the last-position logits of every reference prompt prefilled in one
// step and, on tiny-llama, in chunks of 7 (later chunks over earlier keys on every rank;
// under the race detector at cp=2 only);
// prompts of 1 and 3 tokens (prefixes of the first prompt, whose every position the
// reference holds) and of 64 tokens (a prefix of the long prompt, against the engine without
// cp); and the greedy continuations of every prompt, all requests at once, decoding every
// token of Hugging Face's continuation after the cp prefill (teacher-forced past near ties
// through the same engine). After the requests every cp rank's allocator is empty.
func TestCPCachedEngineHuggingFaceParity(t *testing.T) {
	bases := map[string]*Engine{}
	for _, c := range cpCachedCases() {
		dir := filepath.Join("..", "testdata", c.name)
		ref := loadReference(t, dir)
		longest := 0
		for _, p := range ref.Prompts {
			longest = max(longest, len(p.IDs)+len(p.GreedyNewIDs))
		}
		// Every prompt with its continuation at once, each rank holding about 1/cp.
		blocks := len(ref.Prompts)*(longest/16+2) + 4
		// The engine without cp serves every case of the fixture, so it lives as long as the
		// whole test (its model, whose weights map the checkpoint, closes at the end).
		base := bases[c.name]
		if base == nil {
			base = loadCachedCP(t, c.name, "", "ring", blocks)
			bases[c.name] = base
		}
		t.Run(fmt.Sprintf("%s/%s/%s", c.name, c.mesh, c.strategy), func(t *testing.T) {
			e := loadCachedCP(t, c.name, c.mesh, c.strategy, blocks)
			checkCPCachedGraph(t, e, c.mesh, c.strategy)
			for _, p := range ref.Prompts {
				if err := parity.CheckLogits(cpPromptLogits(t, e, p.IDs, len(p.IDs)), p, logitTol); err != nil {
					t.Errorf("one-step prefill: %v", err)
				}
				if c.name == "tiny-llama" && (!raceEnabled || c.mesh == "cp=2") {
					if err := parity.CheckLogits(cpPromptLogits(t, e, p.IDs, 7), p, logitTol); err != nil {
						t.Errorf("prefill in chunks of 7: %v", err)
					}
				}
			}
			first, long := ref.Prompts[0], ref.Prompts[len(ref.Prompts)-1]
			for _, n := range []int{1, 3} {
				if len(first.AllLogits) < n {
					t.Fatalf("the reference's first prompt has %d rows of logits", len(first.AllLogits))
				}
				if d, at := maxAbsDiff(cpPromptLogits(t, e, first.IDs[:n], n), first.AllLogits[n-1]); d > logitTol {
					t.Errorf("%d-token prompt: last logits %.3g from Hugging Face's at %d", n, d, at)
				}
			}
			if len(long.IDs) < 64 {
				t.Fatalf("the long prompt has %d tokens", len(long.IDs))
			}
			got, want := cpPromptLogits(t, e, long.IDs[:64], 64), cachedPromptLogits(t, base, long.IDs[:64], 64)
			if d, at := maxAbsDiff(got, want); d > logitTol {
				t.Errorf("64 tokens: last logits %.3g from the engine's without cp at %d", d, at)
			}
			checkCPBlocksFree(t, e)
			checkGreedyAll(t, ref, generateAll(t, e, greedyRequests(ref)), engineGen(t, e))
			if st := e.Stats(); st.KVBlocksUsed != 0 || st.Running != 0 || st.Waiting != 0 || st.GeneratedTokensTotal == 0 {
				t.Errorf("after all requests: %+v", st)
			}
			checkCPBlocksFree(t, e)
		})
	}
}

// checkCPCachedGraph makes sure rank 0 of a cp mesh attends through its own cache with the
// chosen strategy's collectives over cp, and that its engine keeps one allocator per cp
// index.
func checkCPCachedGraph(t *testing.T, e *Engine, mesh, strategy string) {
	t.Helper()
	ops := map[string]int{}
	for _, n := range e.ranks.ranks[0].Graph.Nodes {
		ops[n.Op]++
		if s := n.Spec(); s != nil && s.Collective {
			ops[n.Op+"@"+n.Attrs.String("group")]++
		}
	}
	if ops["paged_attention"] != 0 || ops["paged_attention_partial"] == 0 || ops["attention_merge"] == 0 {
		t.Errorf("%s: %d paged_attention, %d paged_attention_partial, %d attention_merge on rank 0",
			mesh, ops["paged_attention"], ops["paged_attention_partial"], ops["attention_merge"])
	}
	switch {
	case strategy == "ring" && (ops["ring_shift@cp"] == 0 || ops["all_to_all@cp"] != 0):
		t.Errorf("%s ring: %d ring_shift and %d all_to_all over cp", mesh, ops["ring_shift@cp"], ops["all_to_all@cp"])
	case strategy == "all_to_all" && (ops["all_to_all@cp"] == 0 || ops["ring_shift@cp"] != 0):
		t.Errorf("%s all_to_all: %d all_to_all and %d ring_shift over cp", mesh, ops["all_to_all@cp"], ops["ring_shift@cp"])
	}
	if e.cpa == nil || len(e.cpa.ranks) != cpSizeOf(t, mesh) {
		t.Errorf("%s: the engine does not keep one allocator per cp index", mesh)
	}
}

// TestCPCachedEnginePreemption runs every tiny-llama prompt at once at cp=2 on caches too
// small for all of them: sequences wait for blocks and are preempted (their blocks freed on
// every cp rank, recomputed later as a cp prefill of their tokens so far), and the greedy
// tokens stay Hugging Face's, with no block left on any cp rank afterwards.
func TestCPCachedEnginePreemption(t *testing.T) {
	const name = "tiny-llama"
	ref := loadReference(t, filepath.Join("..", "testdata", name))
	longest := 0
	for _, p := range ref.Prompts {
		longest = max(longest, len(p.IDs)+len(p.GreedyNewIDs))
	}
	m, err := Load(context.Background(), filepath.Join("..", "testdata", name), LoadOptions{Optimize: true, Mesh: mustMeshFor(t, 0, "cp=2")})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	// Each rank holds a little over half of the longest sequence.
	e, err := New(context.Background(), m, Options{Logger: quiet, KVBlocks: longest/32 + 2, QueueOnFull: true, MaxTokensPerStep: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	// The long prompt first: the short ones start beside it as its blocks allow, and as they
	// all decode the cache runs out.
	reqs := greedyRequests(ref)
	slices.Reverse(reqs)
	got := generateAll(t, e, reqs)
	slices.Reverse(got)
	checkGreedyAll(t, ref, got, engineGen(t, e))
	st := e.Stats()
	if st.PreemptionsTotal == 0 {
		t.Errorf("no sequence was preempted: the test proves less than it says")
	}
	t.Logf("%d preemptions, %d steps, %d of %d blocks at the peak", st.PreemptionsTotal, st.StepsTotal, e.cpa.Stats().Peak, st.KVBlocks)
	if st.KVBlocksUsed != 0 || st.Running != 0 || st.Waiting != 0 {
		t.Errorf("after all requests: %+v", st)
	}
	checkCPBlocksFree(t, e)
}
