package transform_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/loom-ml/loom/internal/parity"
	"github.com/loom-ml/loom/transform"
)

// moeFixtures are the mixture-of-experts checkpoints (4 experts each).
var moeFixtures = []string{"tiny-mixtral", "tiny-qwen2moe", "tiny-qwen3moe"}

// The MoE fixtures split by experts (ep), by features within every expert (tp) and both
// (each expert of an ep rank cut over tp), with either ep strategy: every rank's logits
// equal the single-rank optimized graph's, bit for bit with ep alone (all_reduce: a token's
// two experts are added in expert order on one rank or across two, with exact zeros beside
// them; all_to_all: each token's owner adds its experts' rows in expert order as the fused
// op does) and within 1e-4 when tp splits sums. With all_to_all on ep alone the two
// strategies agree bit for bit as well. Rank 0 runs what it should.
func TestMoEShardedEqualsSingleRank(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every MoE fixture on several ranks")
	}
	for _, name := range moeFixtures {
		t.Run(name, func(t *testing.T) {
			m, plain := openFixture(t, name)
			one := ranksOf(t, m, plain, "")
			want := runRanks(t, m, one, "", func(int) []int32 { return testIDs })[0]
			for _, c := range []struct{ mesh, strategy string }{
				{"ep=2", "all_reduce"}, {"ep=4", "all_reduce"}, {"tp=2", "all_reduce"}, {"tp=2,ep=2", "all_reduce"}, {"tp=4", "all_reduce"},
				{"ep=2", "all_to_all"}, {"ep=4", "all_to_all"}, {"tp=2,ep=2", "all_to_all"},
			} {
				graphs := ranksOf(t, m, plain, c.mesh, "transforms.sharding_executor.ep_strategy="+c.strategy)
				ops, reductions := map[string]int{}, map[string]int{}
				for _, n := range graphs[0].Nodes {
					ops[n.Op]++
					if n.Spec() != nil && n.Spec().Collective {
						reductions[n.Attrs.String("group")+" "+n.Op]++
					}
				}
				moes := ops["moe"]
				if c.strategy == "all_to_all" {
					moes = ops["moe_combine"]
					if ops["moe"] != 0 || ops["moe_dispatch"] != moes || ops["moe_experts"] != moes || reductions["ep all_to_all"] != 3*moes {
						t.Errorf("%s all_to_all: rank 0 runs %v, collectives %v", c.mesh, ops, reductions)
					}
				}
				if moes == 0 {
					t.Fatalf("%s %s: rank 0 has no moe op", c.mesh, c.strategy)
				}
				overEP := 0 // reductions over ep: all_reduce, or fused with the next norm
				for k, v := range reductions {
					if strings.HasPrefix(k, "ep ") && k != "ep all_to_all" {
						overEP += v
					}
				}
				if strings.Contains(c.mesh, "ep") && overEP != moes {
					t.Errorf("%s: %d reductions over ep for %d moe ops", c.mesh, overEP, moes)
				}
				if c.mesh == "tp=2,ep=2" { // each expert cut over tp: a reduction over tp per moe op
					for _, n := range graphs[0].Nodes {
						if n.Op == "moe" || n.Op == "moe_experts" {
							if I := n.Inputs[2].Type.Shape[1].Size; I*2 != n.Inputs[2].Producer.Attrs.Shape("shape")[1].Size {
								t.Errorf("%s %s: rank 0's experts are %s, not cut over tp", c.mesh, c.strategy, n.Inputs[2].Type)
							}
						}
					}
				}
				exact := !strings.Contains(c.mesh, "tp")
				for r, logits := range runRanks(t, m, graphs, c.mesh, func(int) []int32 { return testIDs }) {
					d, at := parity.MaxAbsDiff(logits, want)
					if exact && d != 0 || !(d <= 1e-4) {
						t.Errorf("%s %s rank %d: logits differ from one rank's by %.2e at %d", c.mesh, c.strategy, r, d, at)
					}
				}
			}
		})
	}
}

// The MoE plans: experts by ep, else by tp as a dense MLP, and both (each expert of an ep
// rank cut over tp) when the plan splits the experts as an MLP; an ep size that does not
// divide the experts, or an unknown ep strategy, is an error naming it before any weight is
// read.
func TestDetectShardingMoE(t *testing.T) {
	m, plain := openFixture(t, "tiny-qwen3moe")
	g := matchedGraph(t, m, plain)
	defer func() {
		if n := m.Checkpoint.BytesRead(); n != 0 {
			t.Errorf("%d bytes of weights read", n)
		}
	}()
	cfg, err := transform.LoadConfig(transform.ConfigOptions{Arch: m.Config.ModelType, Sets: []string{"transforms.sharding_executor.ep_strategy=scatter"}})
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = (&transform.Optimizer{Config: cfg}).Run(context.Background(), shardContext(t, m, mesh(t, "ep=2")), plain.Clone())
	if want := `option ep_strategy: "scatter" is not all_reduce or all_to_all`; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("ep_strategy scatter: error %v, want one containing %q", err, want)
	}
	const gate, down = "model.layers.1.mlp.experts.*.gate_proj.weight", "model.layers.1.mlp.experts.*.down_proj.weight"
	for _, c := range []struct {
		mesh, options string
		want          map[string]string
		err           string
	}{
		{mesh: "ep=2", want: map[string]string{gate: "experts/2", down: "experts/2", "model.layers.0.self_attn.q_proj.weight": "/0"}},
		{mesh: "ep=4", want: map[string]string{gate: "experts/4"}},
		{mesh: "tp=2,ep=2", want: map[string]string{gate: "experts/2 colwise", down: "experts/2 rowwise", "model.layers.0.self_attn.q_proj.weight": "colwise/2", "model.layers.0.mlp.down_proj.weight": "rowwise/2"}},
		{mesh: "tp=2,ep=2", options: `{sharding_source: [manual], tp_plan: {"model.layers.*.mlp.experts.*.gate_proj": colwise}}`, want: map[string]string{gate: "experts/2", down: "experts/2"}},
		{mesh: "tp=4,ep=2", want: map[string]string{gate: "experts/2 colwise", down: "experts/2 rowwise"}},
		{mesh: "tp=2", want: map[string]string{gate: "colwise/2", down: "rowwise/2", "model.layers.1.mlp.gate.weight": "/0"}},
		{mesh: "tp=2,ep=2", options: "sharding_dims: [tp]", want: map[string]string{gate: "colwise/2"}},
		{mesh: "tp=2", options: `{sharding_source: [manual], tp_plan: {"model.layers.*.mlp.experts.*.gate_proj": colwise, "model.layers.*.mlp.experts.*.up_proj": colwise}}`,
			want: map[string]string{gate: "replicate/0", down: "replicate/0"}},
		{mesh: "ep=3", err: "ep=3 does not divide the 4 experts of the moe op of model.layers.1.mlp"},
		{mesh: "ep=8", err: "ep=8 does not divide the 4 experts"},
	} {
		t.Run(fmt.Sprintf("%s %s", c.mesh, c.options), func(t *testing.T) {
			plan, err := detect(t, m, g, c.mesh, c.options)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want one containing %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for key, want := range c.want {
				w := plan.Weights[key]
				got := fmt.Sprintf("%s/%d", w.Kind, w.Parts)
				if w.PerExpert != "" {
					got += " " + w.PerExpert
				}
				if got != want {
					t.Errorf("%s: %s, want %s\n%s", key, got, want, plan)
				}
			}
		})
	}
}
