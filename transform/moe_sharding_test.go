package transform_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/loom-ml/loom/internal/parity"
)

// moeFixtures are the mixture-of-experts checkpoints (4 experts each).
var moeFixtures = []string{"tiny-mixtral", "tiny-qwen2moe", "tiny-qwen3moe"}

// The MoE fixtures split by experts (ep), by features within every expert (tp) and both:
// every rank's logits equal the single-rank optimized graph's, bit for bit with ep alone (a
// token's two experts are added in expert order on one rank or across two, with exact
// zeros beside them) and within 1e-4 when tp splits sums. Rank 0's plan splits what it
// should.
func TestMoEShardedEqualsSingleRank(t *testing.T) {
	if testing.Short() {
		t.Skip("runs every MoE fixture on several ranks")
	}
	for _, name := range moeFixtures {
		t.Run(name, func(t *testing.T) {
			m, plain := openFixture(t, name)
			one := ranksOf(t, m, plain, "")
			want := runRanks(t, m, one, "", func(int) []int32 { return testIDs })[0]
			for _, meshText := range []string{"ep=2", "ep=4", "tp=2", "tp=2,ep=2", "tp=4"} {
				graphs := ranksOf(t, m, plain, meshText)
				moes, reductions := 0, map[string]int{}
				for _, n := range graphs[0].Nodes {
					switch {
					case n.Op == "moe":
						moes++
					case n.Spec() != nil && n.Spec().Collective:
						reductions[n.Attrs.String("group")]++
					}
				}
				if moes == 0 {
					t.Fatalf("%s: rank 0 has no moe op", meshText)
				}
				if strings.Contains(meshText, "ep") && reductions["ep"] != moes {
					t.Errorf("%s: %d collectives over ep for %d moe ops", meshText, reductions["ep"], moes)
				}
				exact := !strings.Contains(meshText, "tp")
				for r, logits := range runRanks(t, m, graphs, meshText, func(int) []int32 { return testIDs }) {
					d, at := parity.MaxAbsDiff(logits, want)
					if exact && d != 0 || !(d <= 1e-4) {
						t.Errorf("%s rank %d: logits differ from one rank's by %.2e at %d", meshText, r, d, at)
					}
				}
			}
		})
	}
}

// The MoE plans: experts by ep, else by tp as a dense MLP; an ep size that does not divide
// the experts is an error before any weight is read.
func TestDetectShardingMoE(t *testing.T) {
	m, plain := openFixture(t, "tiny-qwen3moe")
	g := matchedGraph(t, m, plain)
	const gate, down = "model.layers.1.mlp.experts.*.gate_proj.weight", "model.layers.1.mlp.experts.*.down_proj.weight"
	for _, c := range []struct {
		mesh, options string
		want          map[string]string
		err           string
	}{
		{mesh: "ep=2", want: map[string]string{gate: "experts/2", down: "experts/2", "model.layers.0.self_attn.q_proj.weight": "/0"}},
		{mesh: "ep=4", want: map[string]string{gate: "experts/4"}},
		{mesh: "tp=2,ep=2", want: map[string]string{gate: "experts/2", "model.layers.0.self_attn.q_proj.weight": "colwise/2", "model.layers.0.mlp.down_proj.weight": "rowwise/2"}},
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
				if got := fmt.Sprintf("%s/%d", w.Kind, w.Parts); got != want {
					t.Errorf("%s: %s, want %s\n%s", key, got, want, plan)
				}
			}
		})
	}
}
