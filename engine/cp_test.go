package engine

import (
	"cmp"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loom-ml/loom/backend/cpu"
	"github.com/loom-ml/loom/dist/local"
	"github.com/loom-ml/loom/internal/parity"
	"github.com/loom-ml/loom/tensor"
)

// cpMeshes are the meshes the context-parallel parity tests run on.
var cpMeshes = []string{"cp=2", "cp=4", "tp=2,cp=2", "dp=2,cp=2"}

// loadCP loads fixture name on mesh (empty: one rank) as a whole-sequence graph with the
// given cp strategy.
func loadCP(t *testing.T, name, mesh, strategy string) *Model {
	t.Helper()
	opts := LoadOptions{Optimize: true, WholeSequences: true}
	if mesh != "" {
		opts.Mesh = mustMeshFor(t, 0, mesh)
	}
	opts.Transforms.Sets = []string{"transforms.rewrite_cp_attention.cp_strategy=" + strategy}
	m, err := Load(context.Background(), filepath.Join("..", "testdata", name), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestContextParallelHuggingFaceParity holds whole-sequence runs split by sequence over cp
// ranks, with both attention strategies, to Hugging Face: the logits of every position of
// every reference prompt (all of them where the reference has them, else the last, and every
// position against the unsharded run within logitTol), the greedy continuations
// (teacher-forced, forcedGen), and prompts of 1 and 3 tokens (prefixes of the first prompt,
// whose every position the reference holds) and of 64 tokens (a prefix of the long prompt,
// every position against the unsharded run, itself held to Hugging Face above).
//
// Every fixture runs every mesh and strategy; in -short mode and under the race detector,
// the cached engine's trimmed matrix (cpCachedCases).
func TestContextParallelHuggingFaceParity(t *testing.T) {
	var cases []struct{ name, mesh, strategy string }
	if testing.Short() || raceEnabled {
		cases = cpCachedCases()
	} else {
		for _, name := range slices.Concat(supportedFixtures, moeFixtures) {
			for _, mesh := range cpMeshes {
				for _, strategy := range []string{"ring", "all_to_all"} {
					cases = append(cases, struct{ name, mesh, strategy string }{name, mesh, strategy})
				}
			}
		}
	}
	refs, bases := map[string]*parity.Reference{}, map[string]*Model{}
	for _, c := range cases {
		name, mesh, strategy := c.name, c.mesh, c.strategy
		if refs[name] == nil {
			refs[name] = loadReference(t, filepath.Join("..", "testdata", name))
		}
		if bases[name] == nil {
			bases[name] = loadCP(t, name, "", "ring")
		}
		ref, base := refs[name], bases[name]
		t.Run(fmt.Sprintf("%s/%s/%s", name, mesh, strategy), func(t *testing.T) {
			m := loadCP(t, name, mesh, strategy)
			checkCPGraph(t, m, mesh, strategy)
			exe := m.Executable()
			for _, p := range ref.Prompts {
				logits, V := runAll(t, exe, p.IDs)
				checkLogits(t, logits, p)
				want, _ := runAll(t, base.Program, p.IDs)
				if d, at := maxAbsDiff(logits, want); d > logitTol {
					t.Errorf("%d tokens: logits differ from the unsharded run's by %.3g at position %d", len(p.IDs), d, at/V)
				}
				checkGreedy(t, forcedGen(t, exe, p), p)
			}
			first, long := ref.Prompts[0], ref.Prompts[len(ref.Prompts)-1]
			for _, n := range []int{1, 3} {
				logits, V := runAll(t, exe, first.IDs[:n])
				if len(first.AllLogits) < n {
					t.Fatalf("the reference's first prompt has %d rows of logits", len(first.AllLogits))
				}
				for pos := range n {
					if d, at := maxAbsDiff(logits[pos*V:(pos+1)*V], first.AllLogits[pos]); d > logitTol {
						t.Errorf("%d-token prompt, position %d: logits %.3g from Hugging Face's at %d", n, pos, d, at)
					}
				}
			}
			if len(long.IDs) < 64 {
				t.Fatalf("the long prompt has %d tokens", len(long.IDs))
			}
			logits, V := runAll(t, exe, long.IDs[:64])
			want, _ := runAll(t, base.Program, long.IDs[:64])
			if d, at := maxAbsDiff(logits, want); d > logitTol {
				t.Errorf("64 tokens: logits differ from the unsharded run's by %.3g at position %d", d, at/V)
			}
		})
	}
}

// checkCPGraph makes sure that rank 0 of a cp mesh runs the chosen strategy over the cp
// axis (and tp's collectives over tp), with no sdpa left, and needs every rank of the mesh.
func checkCPGraph(t *testing.T, m *Model, mesh, strategy string) {
	t.Helper()
	ops := map[string]int{}
	for _, n := range m.Graph.Nodes {
		ops[n.Op]++
		if s := n.Spec(); s != nil && s.Collective {
			ops[n.Op+"@"+n.Attrs.String("group")]++
		}
	}
	if ops["sdpa"] != 0 || ops["attention_partial"] == 0 {
		t.Errorf("%s: %d sdpa and %d attention_partial ops on rank 0", mesh, ops["sdpa"], ops["attention_partial"])
	}
	switch {
	case strategy == "ring" && (ops["ring_shift@cp"] == 0 || ops["attention_merge"] == 0):
		t.Errorf("%s ring: %d ring_shift over cp and %d attention_merge", mesh, ops["ring_shift@cp"], ops["attention_merge"])
	case strategy == "all_to_all" && ops["all_to_all@cp"] == 0 && ops["ring_shift@cp"] == 0:
		t.Errorf("%s all_to_all: no all_to_all over cp", mesh)
	case strings.Contains(mesh, "tp") && ops["all_reduce@tp"]+ops["all_gather@tp"] == 0:
		t.Errorf("%s: no collective over tp", mesh)
	}
	if r, ok := m.Program.(interface{ Ranks() int }); !ok {
		t.Errorf("%s: the program does not report its rank count", mesh)
	} else if want := cpSizeOf(t, mesh); r.Ranks() < want {
		t.Errorf("%s: the program needs %d ranks, its cp group alone has %d", mesh, r.Ranks(), want)
	}
}

func cpSizeOf(t *testing.T, mesh string) int {
	return cpSize(mustMeshFor(t, 0, mesh))
}

// BenchmarkContextParallelPrefill runs tiny-llama's long reference prompt (449 tokens) as one
// whole-sequence prefill at cp=1 and cp=2 (ring and all_to_all), on the CPU:
//
//	go test ./engine -run '^$' -bench ContextParallelPrefill -benchtime 5x
func BenchmarkContextParallelPrefill(b *testing.B) {
	const name = "tiny-llama"
	ref, err := parity.Load(filepath.Join("..", "testdata", name))
	if err != nil {
		b.Fatal(err)
	}
	ids := ref.Prompts[len(ref.Prompts)-1].IDs
	for _, tc := range []struct{ mesh, strategy string }{{"", "ring"}, {"cp=2", "ring"}, {"cp=2", "all_to_all"}} {
		b.Run(fmt.Sprintf("mesh=%s/%s", cmp.Or(tc.mesh, "cp=1"), tc.strategy), func(b *testing.B) {
			opts := LoadOptions{Optimize: true, WholeSequences: true}
			if tc.mesh != "" {
				mesh, err := MeshFor(0, tc.mesh)
				if err != nil {
					b.Fatal(err)
				}
				opts.Mesh = mesh
			}
			opts.Transforms.Sets = []string{"transforms.rewrite_cp_attention.cp_strategy=" + tc.strategy}
			m, err := Load(context.Background(), filepath.Join("..", "testdata", name), opts)
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			exe := m.Executable()
			in := make([]int32, len(ids))
			pos := make([]int32, len(ids))
			for i, id := range ids {
				in[i], pos[i] = int32(id), int32(i)
			}
			inputs := map[string]*tensor.Tensor{"input_ids": tensor.FromI32(in, 1, len(ids)), "positions": tensor.FromI32(pos, 1, len(ids))}
			b.ResetTimer()
			for range b.N {
				if _, err := exe.Run(context.Background(), inputs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestContextParallelWrongAxis gives the 2-D mesh teeth: on tp=2,cp=2 the ring's
// ring_shift ops bound to tp instead of cp (the same group size, so everything still
// compiles and runs) exchange blocks between the tp ranks, which hold the same tokens'
// other heads, and the logits must move away from Hugging Face's; bound right, they match.
func TestContextParallelWrongAxis(t *testing.T) {
	const name = "tiny-llama"
	ref := loadReference(t, filepath.Join("..", "testdata", name))
	m := loadCP(t, name, "tp=2,cp=2", "ring")
	p := ref.Prompts[0]
	for _, group := range []string{"cp", "tp"} {
		comms, err := local.New(m.Mesh.Size(), local.Options{Timeout: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		rg := &RankGroup{Mesh: m.Mesh}
		for r, g := range m.Graphs {
			g = g.Clone()
			for _, n := range g.Nodes {
				if n.Op == "ring_shift" {
					n.Attrs["group"] = group
				}
			}
			prog, err := cpu.CompileWith(context.Background(), g, m.Model.Checkpoint, cpu.Options{Comm: comms[r], Mesh: m.Mesh})
			if err != nil {
				t.Fatal(err)
			}
			rg.Ranks = append(rg.Ranks, prog)
			rg.Graphs = append(rg.Graphs, g)
		}
		logits, _ := runAll(t, rg, p.IDs)
		err = parity.CheckLogits(logits, p, logitTol)
		switch {
		case group == "cp" && err != nil:
			t.Errorf("ring_shift over cp: %v", err)
		case group == "tp" && err == nil:
			t.Errorf("ring_shift over tp gives Hugging Face's logits too: the test cannot tell the axes apart")
		default:
			t.Logf("ring_shift over %s: %v", group, err)
		}
	}
}
