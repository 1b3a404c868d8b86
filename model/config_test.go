package model

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/loom-ml/loom/tensor"
)

// fixtures is where the tiny Hugging Face checkpoints live.
const fixtures = "../testdata"

// wantErr fails unless err is non-nil and its message holds every fragment.
func wantErr(t *testing.T, err error, fragments ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one naming %q", fragments)
	}
	for _, f := range fragments {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error %q does not mention %q", err, f)
		}
	}
}

// del marks a key to remove in configJSON.
type del struct{}

// configJSON is a small valid Llama config with edits applied: a value of del{} removes the
// key, nil writes JSON null.
func configJSON(t *testing.T, edits map[string]any) []byte {
	t.Helper()
	base := map[string]any{
		"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama",
		"vocab_size": 512, "hidden_size": 64, "intermediate_size": 160, "num_hidden_layers": 2,
		"num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
		"rms_norm_eps": 1e-5, "hidden_act": "silu", "torch_dtype": "bfloat16",
		"bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": false,
	}
	for k, v := range edits {
		if _, ok := v.(del); ok {
			delete(base, k)
		} else {
			base[k] = v
		}
	}
	b, err := json.Marshal(base)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestFixtureConfigs(t *testing.T) {
	for _, tc := range []struct {
		dir                                         string
		arch                                        string
		vocab, hidden, inter, layers, heads, kv, hd int
		tie, bias                                   bool
		window                                      int
		rope                                        RopeConfig
		bos                                         int
		eos                                         []int
		experts, perTok                             int
	}{
		{"tiny-llama", "LlamaForCausalLM", 512, 64, 160, 2, 4, 2, 16, false, false, 0, RopeConfig{Theta: 10000, Type: "default", Factor: 1}, 0, []int{4}, 0, 0},
		{"tiny-llama2", "LlamaForCausalLM", 556, 64, 160, 2, 4, 4, 16, false, false, 0, RopeConfig{Theta: 10000, Type: "linear", Factor: 2}, 1, []int{2}, 0, 0},
		{"tiny-llama31", "LlamaForCausalLM", 512, 64, 160, 2, 4, 2, 16, true, false, 0,
			RopeConfig{Theta: 500000, Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 32}, 0, []int{4}, 0, 0},
		{"tiny-gqa6", "LlamaForCausalLM", 512, 96, 192, 2, 6, 1, 16, false, false, 0, RopeConfig{Theta: 10000, Type: "default", Factor: 1}, 0, []int{4}, 0, 0},
		{"tiny-mistral", "MistralForCausalLM", 556, 64, 160, 2, 4, 2, 16, false, false, 8, RopeConfig{Theta: 10000, Type: "default", Factor: 1}, 1, []int{2}, 0, 0},
		{"tiny-mixtral", "MixtralForCausalLM", 512, 64, 96, 2, 4, 2, 16, false, false, 0, RopeConfig{Theta: 1e6, Type: "default", Factor: 1}, 0, []int{4}, 4, 2},
		{"tiny-qwen2", "Qwen2ForCausalLM", 512, 64, 160, 2, 4, 2, 16, true, false, 0, RopeConfig{Theta: 1e6, Type: "default", Factor: 1}, -1, []int{2}, 0, 0},
		{"tiny-qwen3", "Qwen3ForCausalLM", 512, 64, 160, 2, 4, 2, 24, false, false, 0, RopeConfig{Theta: 1e6, Type: "default", Factor: 1}, -1, []int{2}, 0, 0},
	} {
		t.Run(tc.dir, func(t *testing.T) {
			c, err := LoadConfig(filepath.Join(fixtures, tc.dir, "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			got := []int{c.VocabSize, c.HiddenSize, c.IntermediateSize, c.NumHiddenLayers, c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim, c.SlidingWindow, c.BOSTokenID, c.NumLocalExperts, c.NumExpertsPerTok}
			want := []int{tc.vocab, tc.hidden, tc.inter, tc.layers, tc.heads, tc.kv, tc.hd, tc.window, tc.bos, tc.experts, tc.perTok}
			if !slices.Equal(got, want) {
				t.Errorf("sizes %v, want %v", got, want)
			}
			if len(c.Architectures) != 1 || c.Architectures[0] != tc.arch {
				t.Errorf("architectures %v, want %s", c.Architectures, tc.arch)
			}
			if c.TieWordEmbeddings != tc.tie || c.AttentionBias != tc.bias || c.MLPBias {
				t.Errorf("tie %v bias %v mlp bias %v", c.TieWordEmbeddings, c.AttentionBias, c.MLPBias)
			}
			if c.Rope != tc.rope {
				t.Errorf("rope %+v, want %+v", c.Rope, tc.rope)
			}
			if !slices.Equal(c.EOSTokenIDs, tc.eos) {
				t.Errorf("eos %v, want %v", c.EOSTokenIDs, tc.eos)
			}
			if c.DType != tensor.BF16 || c.WeightDType() != tensor.BF16 || c.HiddenAct != "silu" || c.RMSNormEps <= 0 || c.MaxPositionEmbeddings != 1024 {
				t.Errorf("dtype %s act %q eps %g maxpos %d", c.DType, c.HiddenAct, c.RMSNormEps, c.MaxPositionEmbeddings)
			}
			if c.Raw["model_type"] != c.ModelType || c.ModelType == "" {
				t.Errorf("raw model_type %v, typed %q", c.Raw["model_type"], c.ModelType)
			}
		})
	}
}

func TestConfigRope(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edits map[string]any
		want  RopeConfig
	}{
		{"absent", nil, RopeConfig{Theta: 10000, Type: "default", Factor: 1}},
		{"old theta only", map[string]any{"rope_theta": 500000.0}, RopeConfig{Theta: 500000, Type: "default", Factor: 1}},
		{"old scaling null", map[string]any{"rope_theta": 1e6, "rope_scaling": nil}, RopeConfig{Theta: 1e6, Type: "default", Factor: 1}},
		{"old linear type key", map[string]any{"rope_theta": 10000.0, "rope_scaling": map[string]any{"type": "linear", "factor": 4.0}},
			RopeConfig{Theta: 10000, Type: "linear", Factor: 4}},
		{"old dynamic", map[string]any{"rope_scaling": map[string]any{"type": "dynamic", "factor": 2}},
			RopeConfig{Theta: 10000, Type: "dynamic", Factor: 2}},
		{"old llama3 rope_type key", map[string]any{"rope_theta": 500000.0, "rope_scaling": map[string]any{
			"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
			RopeConfig{Theta: 500000, Type: "llama3", Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192}},
		{"old yarn with top-level original", map[string]any{"original_max_position_embeddings": 4096, "rope_scaling": map[string]any{
			"type": "yarn", "factor": 4.0, "beta_fast": 32, "beta_slow": 1, "attention_factor": 0.1}},
			RopeConfig{Theta: 10000, Type: "yarn", Factor: 4, OriginalMaxPositionEmbeddings: 4096, BetaFast: 32, BetaSlow: 1, AttentionFactor: 0.1}},
		{"new default", map[string]any{"rope_parameters": map[string]any{"rope_theta": 1e6, "rope_type": "default"}},
			RopeConfig{Theta: 1e6, Type: "default", Factor: 1}},
		{"new llama3", map[string]any{"rope_parameters": map[string]any{"rope_theta": 500000.0, "rope_type": "llama3", "factor": 32.0,
			"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}},
			RopeConfig{Theta: 500000, Type: "llama3", Factor: 32, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPositionEmbeddings: 8192}},
		{"new without theta uses top level", map[string]any{"rope_theta": 2e5, "rope_parameters": map[string]any{"rope_type": "linear", "factor": 2}},
			RopeConfig{Theta: 2e5, Type: "linear", Factor: 2}},
		{"new per layer type", map[string]any{"rope_parameters": map[string]any{
			"full_attention":    map[string]any{"rope_theta": 1e6, "rope_type": "linear", "factor": 8},
			"sliding_attention": map[string]any{"rope_theta": 10000, "rope_type": "default"}}},
			RopeConfig{Theta: 1e6, Type: "linear", Factor: 8}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig(configJSON(t, tc.edits), "config.json")
			if err != nil {
				t.Fatal(err)
			}
			if c.Rope != tc.want {
				t.Errorf("rope %+v, want %+v", c.Rope, tc.want)
			}
		})
	}
}

func TestConfigFields(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edits map[string]any
		check func(*Config) bool
	}{
		{"eos int", map[string]any{"eos_token_id": 7}, func(c *Config) bool { return slices.Equal(c.EOSTokenIDs, []int{7}) }},
		{"eos list", map[string]any{"eos_token_id": []int{128001, 128008, 128009}}, func(c *Config) bool {
			return slices.Equal(c.EOSTokenIDs, []int{128001, 128008, 128009})
		}},
		{"eos null", map[string]any{"eos_token_id": nil}, func(c *Config) bool { return len(c.EOSTokenIDs) == 0 }},
		{"bos null", map[string]any{"bos_token_id": nil}, func(c *Config) bool { return c.BOSTokenID == -1 }},
		{"bos absent", map[string]any{"bos_token_id": del{}}, func(c *Config) bool { return c.BOSTokenID == -1 }},
		{"head_dim null", map[string]any{"head_dim": nil}, func(c *Config) bool { return c.HeadDim == 16 }},
		{"head_dim absent", nil, func(c *Config) bool { return c.HeadDim == 16 }},
		{"head_dim explicit, hidden not divisible", map[string]any{"head_dim": 32, "num_attention_heads": 5, "num_key_value_heads": 5},
			func(c *Config) bool { return c.HeadDim == 32 }},
		{"kv heads default to heads", map[string]any{"num_key_value_heads": del{}}, func(c *Config) bool { return c.NumKeyValueHeads == 4 }},
		{"sliding window", map[string]any{"sliding_window": 4096}, func(c *Config) bool { return c.SlidingWindow == 4096 }},
		{"sliding window null", map[string]any{"sliding_window": nil}, func(c *Config) bool { return c.SlidingWindow == 0 }},
		{"use_sliding_window false", map[string]any{"sliding_window": 4096, "use_sliding_window": false}, func(c *Config) bool { return c.SlidingWindow == 0 }},
		{"use_sliding_window true", map[string]any{"sliding_window": 4096, "use_sliding_window": true}, func(c *Config) bool { return c.SlidingWindow == 4096 }},
		{"dtype beats torch_dtype", map[string]any{"dtype": "float16", "torch_dtype": "float32"}, func(c *Config) bool { return c.DType == tensor.F16 }},
		{"no dtype", map[string]any{"torch_dtype": del{}}, func(c *Config) bool { return c.DType == tensor.Invalid && c.WeightDType() == tensor.F32 }},
		{"integral float", map[string]any{"hidden_size": 64.0}, func(c *Config) bool { return c.HiddenSize == 64 }},
		{"defaults", map[string]any{"rms_norm_eps": del{}, "hidden_act": del{}, "tie_word_embeddings": del{}},
			func(c *Config) bool { return c.RMSNormEps == 1e-6 && c.HiddenAct == "silu" && !c.TieWordEmbeddings }},
		{"qwen moe experts", map[string]any{"num_experts": 8, "num_experts_per_tok": 2}, func(c *Config) bool {
			return c.NumLocalExperts == 8 && c.NumExpertsPerTok == 2 && c.IsMoE()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ParseConfig(configJSON(t, tc.edits), "config.json")
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(c) {
				t.Errorf("unexpected config %+v", c)
			}
		})
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		data  []byte
		edits map[string]any
		want  []string
	}{
		{name: "malformed JSON", data: []byte(`{"hidden_size": 64,`), want: []string{"invalid JSON"}},
		{name: "not an object", data: []byte(`[1]`), want: []string{"not a JSON object"}},
		{name: "empty", data: []byte(``), want: []string{"not a JSON object"}},
		{name: "heads zero", edits: map[string]any{"num_attention_heads": 0}, want: []string{"num_attention_heads must be positive, got 0"}},
		{name: "hidden missing", edits: map[string]any{"hidden_size": del{}}, want: []string{"hidden_size is missing"}},
		{name: "vocab negative", edits: map[string]any{"vocab_size": -3}, want: []string{"vocab_size must be positive, got -3"}},
		{name: "layers null", edits: map[string]any{"num_hidden_layers": nil}, want: []string{"num_hidden_layers is missing"}},
		{name: "hidden not divisible", edits: map[string]any{"num_attention_heads": 5, "num_key_value_heads": 5},
			want: []string{"hidden_size 64 is not divisible by num_attention_heads 5"}},
		{name: "hidden not divisible, head_dim null", edits: map[string]any{"num_attention_heads": 5, "num_key_value_heads": 5, "head_dim": nil},
			want: []string{"hidden_size 64 is not divisible by num_attention_heads 5"}},
		{name: "kv not divisor", edits: map[string]any{"num_key_value_heads": 3}, want: []string{"num_attention_heads 4 is not divisible by num_key_value_heads 3"}},
		{name: "kv zero", edits: map[string]any{"num_key_value_heads": 0}, want: []string{"num_key_value_heads must be positive, got 0"}},
		{name: "head_dim zero", edits: map[string]any{"head_dim": 0}, want: []string{"head_dim must be positive, got 0"}},
		{name: "string size", edits: map[string]any{"hidden_size": "64"}, want: []string{"hidden_size", `want an integer, got "64"`}},
		{name: "fractional size", edits: map[string]any{"intermediate_size": 160.5}, want: []string{"intermediate_size", "want an integer"}},
		{name: "bool as string", edits: map[string]any{"tie_word_embeddings": "yes"}, want: []string{"tie_word_embeddings", "want true or false"}},
		{name: "architectures not list", edits: map[string]any{"architectures": "LlamaForCausalLM"}, want: []string{"architectures", "list of strings"}},
		{name: "eos string", edits: map[string]any{"eos_token_id": "</s>"}, want: []string{"eos_token_id", "want an integer, a list of integers or null"}},
		{name: "eos list of strings", edits: map[string]any{"eos_token_id": []any{1, "x"}}, want: []string{"eos_token_id", "want integers"}},
		{name: "eos negative", edits: map[string]any{"eos_token_id": -1}, want: []string{"eos_token_id must not be negative"}},
		{name: "eps zero", edits: map[string]any{"rms_norm_eps": 0}, want: []string{"rms_norm_eps must be positive"}},
		{name: "window negative", edits: map[string]any{"sliding_window": -1}, want: []string{"sliding_window must not be negative"}},
		{name: "experts per tok", edits: map[string]any{"num_local_experts": 4, "num_experts_per_tok": 5}, want: []string{"num_experts_per_tok must be in [1, 4]"}},
		{name: "theta negative", edits: map[string]any{"rope_theta": -1}, want: []string{"rope_theta must be positive"}},
		{name: "theta string", edits: map[string]any{"rope_theta": "big"}, want: []string{"rope_theta", "want a number"}},
		{name: "new theta zero", edits: map[string]any{"rope_parameters": map[string]any{"rope_theta": 0, "rope_type": "default"}},
			want: []string{"rope_parameters.rope_theta must be positive"}},
		{name: "old scaling not object", edits: map[string]any{"rope_scaling": 2}, want: []string{"rope_scaling", "want an object"}},
		{name: "old linear factor", edits: map[string]any{"rope_scaling": map[string]any{"type": "linear", "factor": 0}},
			want: []string{"rope_scaling.factor must be positive for rope type linear"}},
		{name: "old llama3 missing low", edits: map[string]any{"rope_scaling": map[string]any{"rope_type": "llama3", "factor": 8, "high_freq_factor": 4, "original_max_position_embeddings": 8192}},
			want: []string{"rope_scaling.low_freq_factor must be positive"}},
		{name: "new llama3 missing original", edits: map[string]any{"rope_parameters": map[string]any{"rope_type": "llama3", "rope_theta": 5e5, "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4}},
			want: []string{"rope_parameters.original_max_position_embeddings must be positive"}},
		{name: "new llama3 high below low", edits: map[string]any{"rope_parameters": map[string]any{"rope_type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 1, "original_max_position_embeddings": 8192}},
			want: []string{"rope_parameters.high_freq_factor (1) must exceed low_freq_factor (4)"}},
		{name: "new factor string", edits: map[string]any{"rope_parameters": map[string]any{"rope_type": "linear", "factor": "x"}},
			want: []string{"rope_parameters.factor", "want a number"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data := tc.data
			if data == nil {
				data = configJSON(t, tc.edits)
			}
			src := "models/x/config.json"
			c, err := ParseConfig(data, src)
			if c != nil {
				t.Errorf("got a config with the error")
			}
			wantErr(t, err, append([]string{src + ": "}, tc.want...)...)
		})
	}
}

func TestLoadConfigFile(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "config.json")
	if err := os.WriteFile(p, configJSON(t, map[string]any{"num_attention_heads": 0}), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := LoadConfig(p)
	wantErr(t, err, p+": num_attention_heads must be positive, got 0")
	_, err = LoadConfig(filepath.Join(dir, "none.json"))
	wantErr(t, err, "none.json")
}

func TestGenerationConfig(t *testing.T) {
	g, err := LoadGenerationConfig(filepath.Join(fixtures, "tiny-llama", "generation_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if g.BOSTokenID != 0 || !slices.Equal(g.EOSTokenIDs, []int{4}) || g.DoSample || g.Temperature != 1 || g.TopK != 50 || g.TopP != 1 || g.RepetitionPenalty != 1 || g.MaxNewTokens != 0 {
		t.Errorf("tiny-llama generation config %+v", g)
	}
	g, err = ParseGenerationConfig([]byte(`{"bos_token_id": 128000, "eos_token_id": [128001, 128009], "do_sample": true,
		"temperature": 0.6, "top_k": 0, "top_p": 0.9, "max_new_tokens": 256, "repetition_penalty": 1.1, "max_length": 4096}`), "generation_config.json")
	if err != nil {
		t.Fatal(err)
	}
	want := GenerationConfig{Source: "generation_config.json", BOSTokenID: 128000, EOSTokenIDs: []int{128001, 128009}, PadTokenID: -1,
		DoSample: true, Temperature: 0.6, TopK: 0, TopP: 0.9, RepetitionPenalty: 1.1, MaxNewTokens: 256, MaxLength: 4096}
	g.Raw = nil
	if !reflect.DeepEqual(*g, want) {
		t.Errorf("got %+v, want %+v", *g, want)
	}
	for _, tc := range []struct{ data, want string }{
		{`{"temperature": -1}`, "temperature must not be negative"},
		{`{"top_p": 0}`, "top_p must be in (0, 1]"},
		{`{"top_p": 1.5}`, "top_p must be in (0, 1]"},
		{`{"top_k": -2}`, "top_k must not be negative"},
		{`{"repetition_penalty": 0}`, "repetition_penalty must be positive"},
		{`{"max_new_tokens": "many"}`, "max_new_tokens: want an integer"},
		{`{"do_sample": 1}`, "do_sample: want true or false"},
		{`{"eos_token_id": {}}`, "eos_token_id"},
		{`{"eos_token_id": 2,}`, "invalid JSON"},
	} {
		_, err := ParseGenerationConfig([]byte(tc.data), "gen.json")
		wantErr(t, err, "gen.json: ", tc.want)
	}
}
