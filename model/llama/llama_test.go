package llama

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model"
	"github.com/loom-ml/loom/tensor"
)

var fixtures = []string{"tiny-llama", "tiny-llama31", "tiny-llama2", "tiny-mistral", "tiny-qwen2", "tiny-qwen3", "tiny-gqa6"}

func fixtureConfig(t *testing.T, name string) (*model.Config, []byte) {
	t.Helper()
	path := filepath.Join("..", "..", "testdata", name, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := model.ParseConfig(data, path)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, data
}

func buildFixture(t *testing.T, name string) *graph.Graph {
	t.Helper()
	cfg, _ := fixtureConfig(t, name)
	g, err := model.BuildGraph(cfg, model.BuildOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// Every frontend graph prints, parses back and prints identically.
func TestGraphTextRoundTrip(t *testing.T) {
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			g := buildFixture(t, name)
			text := g.String()
			back, err := graph.Parse(text)
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			if again := back.String(); again != text {
				t.Fatalf("text changed after a round trip")
			}
			if err := graph.Equal(g, back); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// The patterns the transform pipeline matches stay visible as primitive ops.
func TestGraphKeepsPrimitives(t *testing.T) {
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			cfg, _ := fixtureConfig(t, name)
			g := buildFixture(t, name)
			count := map[string]int{}
			for _, n := range g.Nodes {
				count[n.Op]++
			}
			L := cfg.NumHiddenLayers
			norms := 2*L + 1
			if name == "tiny-qwen3" {
				norms += 2 * L
			}
			for op, want := range map[string]int{
				"rsqrt":   norms,
				"softmax": L,
				"silu":    L,
				"cos":     1, // computed once from positions, shared by every layer
				"sin":     1,
				"linear":  7*L + 1,
			} {
				if count[op] != want {
					t.Errorf("%d %s ops, want %d", count[op], op, want)
				}
			}
			if got, want := len(g.Params()), paramCount(cfg, name); got != want {
				t.Errorf("%d params, want %d", got, want)
			}
		})
	}
}

func paramCount(cfg *model.Config, name string) int {
	perLayer := 9 // 2 norms + q,k,v,o + gate,up,down
	switch name {
	case "tiny-qwen2":
		perLayer += 3
	case "tiny-qwen3":
		perLayer += 2
	}
	n := perLayer*cfg.NumHiddenLayers + 2 // embed + final norm
	if !cfg.TieWordEmbeddings {
		n++
	}
	return n
}

// The older config style (rope_theta + rope_scaling) builds the same graph as rope_parameters.
func TestOldRopeConfigStyle(t *testing.T) {
	for _, name := range []string{"tiny-llama", "tiny-llama31", "tiny-llama2"} {
		t.Run(name, func(t *testing.T) {
			_, data := fixtureConfig(t, name)
			var raw map[string]any
			if err := json.Unmarshal(data, &raw); err != nil {
				t.Fatal(err)
			}
			rp := raw["rope_parameters"].(map[string]any)
			delete(raw, "rope_parameters")
			raw["rope_theta"] = rp["rope_theta"]
			if rp["rope_type"] != "default" {
				scaling := map[string]any{}
				for k, v := range rp {
					if k != "rope_theta" && k != "rope_type" {
						scaling[k] = v
					}
				}
				scaling["type"] = rp["rope_type"] // the oldest spelling of rope_type
				raw["rope_scaling"] = scaling
			}
			old, _ := json.Marshal(raw)
			cfg, err := model.ParseConfig(old, "old-style config.json")
			if err != nil {
				t.Fatal(err)
			}
			g, err := model.BuildGraph(cfg, model.BuildOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if err := graph.Equal(buildFixture(t, name), g); err != nil {
				t.Fatalf("old-style config builds a different graph: %v", err)
			}
		})
	}
}

func TestInvFreq(t *testing.T) {
	def := func(i, dim int, theta float64) float64 { return 1 / math.Pow(theta, float64(2*i)/float64(dim)) }
	inv, _, err := invFreq(model.RopeConfig{Theta: 10000}, 16)
	if err != nil {
		t.Fatal(err)
	}
	for i, f := range inv {
		if !(math.Abs(f-def(i, 16, 10000))/def(i, 16, 10000) <= 1e-6) {
			t.Errorf("default inv_freq[%d] = %g, want %g", i, f, def(i, 16, 10000))
		}
	}
	lin, _, _ := invFreq(model.RopeConfig{Theta: 10000, Type: "linear", Factor: 4}, 16)
	for i := range lin {
		if !(math.Abs(lin[i]*4-inv[i])/inv[i] <= 1e-6) {
			t.Errorf("linear inv_freq[%d] = %g, want %g / 4", i, lin[i], inv[i])
		}
	}
	// llama3: with original context 32, wavelengths under 8 stay, over 32 shrink by factor.
	r := model.RopeConfig{Theta: 500000, Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 32}
	l3, _, _ := invFreq(r, 16)
	for i := range l3 {
		base := def(i, 16, 500000)
		wave := 2 * math.Pi / base
		switch {
		case wave < 8:
			if !(math.Abs(l3[i]-base)/base <= 1e-6) {
				t.Errorf("llama3 high-frequency inv_freq[%d] = %g, want unchanged %g", i, l3[i], base)
			}
		case wave > 32:
			if !(math.Abs(l3[i]*8-base)/base <= 1e-6) {
				t.Errorf("llama3 low-frequency inv_freq[%d] = %g, want %g / 8", i, l3[i], base)
			}
		default:
			if !(l3[i] < base && l3[i] > base/8) {
				t.Errorf("llama3 mid-band inv_freq[%d] = %g, want between %g and %g", i, l3[i], base/8, base)
			}
		}
	}
	for _, bad := range []model.RopeConfig{
		{Theta: 10000, Type: "yarn", Factor: 2},
		{Theta: 10000, Type: "linear"},
		{Theta: 0},
		{Theta: 10000, Type: "llama3", Factor: 8},
	} {
		if _, _, err := invFreq(bad, 16); err == nil {
			t.Errorf("invFreq(%+v) should fail", bad)
		} else if bad.Type == "yarn" && !strings.Contains(err.Error(), "yarn") {
			t.Errorf("error %q should name the rope type", err)
		}
	}
}

// TestRotaryFrequenciesStayF32 holds every fixture's graph (bf16 checkpoints) to the
// float32 inverse frequencies transformers keeps whatever the checkpoint's dtype: the rotary
// table constant equals invFreq's f32 values, and some of them are not bf16-representable,
// so no rounding to the weights' dtype crept back in.
func TestRotaryFrequenciesStayF32(t *testing.T) {
	for _, name := range fixtures {
		t.Run(name, func(t *testing.T) {
			cfg, _ := fixtureConfig(t, name)
			want, _, err := invFreq(cfg.Rope, cfg.HeadDim)
			if err != nil {
				t.Fatal(err)
			}
			var got []float64
			for _, n := range buildFixture(t, name).Nodes {
				if n.Op == graph.OpConst && len(n.Attrs.Floats("values")) == cfg.HeadDim/2 && len(n.Attrs.Floats("values")) > 1 {
					got = n.Attrs.Floats("values")
				}
			}
			if len(got) != len(want) {
				t.Fatalf("no rotary frequency constant of %d values in the graph", cfg.HeadDim/2)
			}
			notBF16 := 0
			for i := range want {
				if got[i] != want[i] || float64(float32(got[i])) != got[i] {
					t.Errorf("inv_freq[%d] = %v, want the float32 %v", i, got[i], want[i])
				}
				if float64(tensor.BF16ToF32(tensor.F32ToBF16(float32(got[i])))) != got[i] {
					notBF16++
				}
			}
			if notBF16 == 0 {
				t.Errorf("all %d inverse frequencies are bf16 values: rounded to the checkpoint dtype", len(got))
			}
		})
	}
}
