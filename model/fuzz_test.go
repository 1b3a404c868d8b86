package model

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/loom-ml/loom/model/safetensors"
)

// Fuzz targets of the model package's parsers: config.json, generation_config.json and
// model.safetensors.index.json. Run one with
//
//	go test -run '^$' -fuzz '^FuzzParseConfig$' -fuzztime 30s ./model/
//
// or all of them with tools/fuzz.sh.

// fuzzSeedFiles adds the named file of every fixture checkpoint as a seed, and returns them.
func fuzzSeedFiles(f *testing.F, name string) [][]byte {
	paths, err := filepath.Glob(filepath.Join(fixtures, "tiny-*", name))
	if err != nil || len(paths) == 0 {
		f.Fatalf("no fixture %s: %v", name, err)
	}
	var out [][]byte
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, data)
	}
	return out
}

// malformedJSON are seeds that are not JSON objects, or barely are.
var malformedJSON = []string{
	``, ` `, `null`, `[]`, `"config"`, `1`, `{`, `{"a":}`, `{}`, `{} {}`, `{"a": 1}x`,
	"\xef\xbb\xbf{}", `{"a": "\xff"}`, `{"a": 1, "a": "two"}`, `{"a": {"b": [1, {"c": null}]}}`,
}

// fieldNamed reports whether an error message names key: the key itself, or, for a nested
// key, its top-level object.
func fieldNamed(msg, key string) bool {
	top, _, _ := strings.Cut(key, ".")
	return strings.Contains(msg, key) || strings.Contains(msg, top)
}

// checkConfig asserts what ParseConfig promises of an accepted config.
func checkConfig(t *testing.T, c *Config) {
	t.Helper()
	switch {
	case c.VocabSize <= 0 || c.HiddenSize <= 0 || c.IntermediateSize <= 0 || c.NumHiddenLayers <= 0:
		t.Fatalf("accepted non-positive sizes: %+v", c)
	case c.NumAttentionHeads <= 0 || c.NumKeyValueHeads <= 0 || c.NumAttentionHeads%c.NumKeyValueHeads != 0:
		t.Fatalf("accepted heads %d / kv heads %d", c.NumAttentionHeads, c.NumKeyValueHeads)
	case c.HeadDim <= 0:
		t.Fatalf("accepted head_dim %d", c.HeadDim)
	case !(c.RMSNormEps > 0):
		t.Fatalf("accepted rms_norm_eps %g", c.RMSNormEps)
	case c.MaxPositionEmbeddings < 0 || c.SlidingWindow < 0:
		t.Fatalf("accepted negative max_position_embeddings %d or sliding_window %d", c.MaxPositionEmbeddings, c.SlidingWindow)
	case c.NumLocalExperts < 0 || (c.NumLocalExperts > 0 && (c.NumExpertsPerTok < 1 || c.NumExpertsPerTok > c.NumLocalExperts)):
		t.Fatalf("accepted %d experts, %d per token", c.NumLocalExperts, c.NumExpertsPerTok)
	case !(c.Rope.Theta > 0) || c.Rope.Type == "":
		t.Fatalf("accepted rope %+v", c.Rope)
	case c.Raw == nil:
		t.Fatal("accepted config has no Raw")
	}
	for _, id := range c.EOSTokenIDs {
		if id < 0 {
			t.Fatalf("accepted eos_token_id %v", c.EOSTokenIDs)
		}
	}
	if c.HeadDim != 0 && c.Raw["head_dim"] == nil && c.HeadDim*c.NumAttentionHeads != c.HiddenSize {
		t.Fatalf("derived head_dim %d × %d heads != hidden_size %d", c.HeadDim, c.NumAttentionHeads, c.HiddenSize)
	}
	switch c.Rope.Type {
	case "linear", "dynamic", "yarn", "llama3":
		if !(c.Rope.Factor > 0) {
			t.Fatalf("accepted rope %s with factor %g", c.Rope.Type, c.Rope.Factor)
		}
	}
}

// FuzzParseConfig parses arbitrary config.json contents. Errors start with the source name;
// an accepted config satisfies every documented invariant, and re-encoding what was read
// (Raw) parses to the very same Config: the typed view depends only on the JSON values, not
// on their spelling (1e2 for 100, key order, spaces, duplicate keys, invalid UTF-8).
func FuzzParseConfig(f *testing.F) {
	for _, s := range fuzzSeedFiles(f, "config.json") {
		f.Add(s)
	}
	for _, s := range malformedJSON {
		f.Add([]byte(s))
	}
	for _, s := range []string{
		`{"vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2}`,
		`{"vocab_size": 8.0, "hidden_size": 1e1, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 5, "head_dim": 3}`,
		`{"vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 3}`,
		`{"vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 0}`,
		`{"vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "rope_scaling": {"type": "llama3", "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4, "original_max_position_embeddings": 8192}}`,
		`{"vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "rope_parameters": {"full_attention": {"rope_theta": 1e6, "rope_type": "yarn", "factor": 0}}}`,
		`{"vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 5}`,
		`{"vocab_size": 8, "hidden_size": 8, "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "eos_token_id": [1, -2], "bos_token_id": null, "pad_token_id": [3]}`,
		`{"vocab_size": 9007199254740993, "hidden_size": -0, "rms_norm_eps": 0, "sliding_window": -1, "use_sliding_window": false}`,
		`{"vocab_size": "8", "hidden_size": [8], "torch_dtype": 16, "architectures": "Llama", "tie_word_embeddings": 1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		const src = "config.json"
		c, err := ParseConfig(data, src)
		if err != nil {
			if c != nil {
				t.Fatalf("ParseConfig returned both a config and the error %v", err)
			}
			if !strings.HasPrefix(err.Error(), src+": ") || len(err.Error()) <= len(src)+2 {
				t.Fatalf("error %q does not start with %q and say what is wrong", err, src+": ")
			}
			return
		}
		checkConfig(t, c)
		again, err := json.Marshal(c.Raw)
		if err != nil {
			t.Fatalf("re-encode Raw: %v", err)
		}
		c2, err := ParseConfig(again, src)
		if err != nil {
			t.Fatalf("accepted %q, but its re-encoding %q fails: %v", data, again, err)
		}
		if !reflect.DeepEqual(c, c2) {
			t.Fatalf("re-encoding changes the config:\n%+v\n%+v", c, c2)
		}
	})
}

// configKeys are the fields ParseConfig reads, and some it reads through another
// (hidden_activation, torch_dtype, num_experts, rope_scaling).
var configKeys = []string{
	"architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
	"num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps",
	"tie_word_embeddings", "attention_bias", "mlp_bias", "hidden_act", "hidden_activation", "sliding_window",
	"use_sliding_window", "dtype", "torch_dtype", "bos_token_id", "eos_token_id", "pad_token_id",
	"num_local_experts", "num_experts", "num_experts_per_tok", "rope_theta", "rope_scaling", "rope_parameters",
	"original_max_position_embeddings",
}

// FuzzConfigField sets one field of a valid config (tiny-llama's) to an arbitrary JSON value.
// When that makes the config invalid, the error must name the field (or the field it is
// checked against, or quote the value when it is a number out of float64 range); when it
// does not, the config keeps every invariant.
func FuzzConfigField(f *testing.F) {
	base, err := os.ReadFile(filepath.Join(fixtures, "tiny-llama", "config.json"))
	if err != nil {
		f.Fatal(err)
	}
	for i, v := range []string{`0`, `-1`, `null`, `"x"`, `1.5`, `[]`, `{}`, `true`, `1e400`, `[1, -1]`, `{"rope_type": "llama3", "factor": 8}`, `{"rope_theta": -1}`, `{"full_attention": {"rope_theta": 0}}`, `4`, `3`, `"float16"`} {
		f.Add(uint8(i), []byte(v))
	}
	// num_experts, read when num_local_experts is absent, was not checked: -1 was accepted.
	f.Add(uint8(slices.Index(configKeys, "num_experts")), []byte(`-1`))
	f.Fuzz(func(t *testing.T, which uint8, value []byte) {
		key := configKeys[int(which)%len(configKeys)]
		var m map[string]json.RawMessage
		if err := json.Unmarshal(base, &m); err != nil {
			t.Fatal(err)
		}
		if !json.Valid(value) {
			return
		}
		m[key] = value
		data, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		c, err := ParseConfig(data, "config.json")
		if err != nil {
			named := fieldNamed(err.Error(), key)
			// Relations checked against another field name that field too, and the fields read
			// under another name are reported under it.
			alias := map[string][]string{
				"num_attention_heads": {"num_key_value_heads"}, "num_key_value_heads": {"num_attention_heads"},
				"num_experts": {"num_local_experts", "num_experts_per_tok"}, "num_local_experts": {"num_experts_per_tok"},
				"rope_theta": {"rope_parameters"}, "original_max_position_embeddings": {"rope_parameters", "rope_scaling"},
				"head_dim": {"hidden_size"}, "hidden_size": {"num_attention_heads"},
			}
			for _, k := range alias[key] {
				named = named || strings.Contains(err.Error(), k)
			}
			// A value no float64 holds (1e400) fails the decoding of the whole file, whose
			// error quotes the value but not the field.
			named = named || strings.Contains(err.Error(), "invalid JSON") && strings.Contains(err.Error(), string(value))
			if !named {
				t.Fatalf("setting %s to %s: error %q does not name the field", key, value, err)
			}
			return
		}
		checkConfig(t, c)
	})
}

// FuzzParseGenerationConfig parses arbitrary generation_config.json contents, with the same
// properties as FuzzParseConfig: errors start with the source, accepted settings are in
// range, and re-encoding what was read gives the same settings.
func FuzzParseGenerationConfig(f *testing.F) {
	for _, s := range fuzzSeedFiles(f, "generation_config.json") {
		f.Add(s)
	}
	for _, s := range malformedJSON {
		f.Add([]byte(s))
	}
	for _, s := range []string{
		`{"do_sample": true, "temperature": 0.6, "top_p": 0.9, "top_k": 0, "eos_token_id": [128001, 128009], "max_new_tokens": 32}`,
		`{"temperature": -1}`, `{"top_p": 0}`, `{"top_p": 1.5}`, `{"repetition_penalty": 0}`, `{"top_k": -1}`,
		`{"eos_token_id": -1}`, `{"eos_token_id": [1, "2"]}`, `{"max_length": 1e3, "max_new_tokens": 2.5}`,
		`{"do_sample": "yes", "bos_token_id": null, "pad_token_id": [0, 1]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		const src = "generation_config.json"
		g, err := ParseGenerationConfig(data, src)
		if err != nil {
			if g != nil {
				t.Fatalf("ParseGenerationConfig returned both settings and the error %v", err)
			}
			if !strings.HasPrefix(err.Error(), src+": ") || len(err.Error()) <= len(src)+2 {
				t.Fatalf("error %q does not start with %q and say what is wrong", err, src+": ")
			}
			return
		}
		switch {
		case g.Temperature < 0 || math.IsNaN(g.Temperature):
			t.Fatalf("accepted temperature %g", g.Temperature)
		case g.TopK < 0 || g.MaxNewTokens < 0 || g.MaxLength < 0:
			t.Fatalf("accepted top_k %d, max_new_tokens %d, max_length %d", g.TopK, g.MaxNewTokens, g.MaxLength)
		case !(g.TopP > 0 && g.TopP <= 1):
			t.Fatalf("accepted top_p %g", g.TopP)
		case !(g.RepetitionPenalty > 0):
			t.Fatalf("accepted repetition_penalty %g", g.RepetitionPenalty)
		case g.Raw == nil:
			t.Fatal("accepted settings have no Raw")
		}
		for _, id := range g.EOSTokenIDs {
			if id < 0 {
				t.Fatalf("accepted eos_token_id %v", g.EOSTokenIDs)
			}
		}
		again, err := json.Marshal(g.Raw)
		if err != nil {
			t.Fatalf("re-encode Raw: %v", err)
		}
		g2, err := ParseGenerationConfig(again, src)
		if err != nil {
			t.Fatalf("accepted %q, but its re-encoding %q fails: %v", data, again, err)
		}
		if !reflect.DeepEqual(g, g2) {
			t.Fatalf("re-encoding changes the settings:\n%+v\n%+v", g, g2)
		}
	})
}

// indexFixture writes a checkpoint directory for FuzzCheckpointIndex: two shards, a third
// safetensors file no index of the seeds names, and a file that is not safetensors.
func indexFixture(f *testing.F) string {
	dir := f.TempDir()
	files := map[string][]safetensors.Entry{
		"model-00001-of-00002.safetensors": {
			{Name: "a", DType: safetensors.F32, Shape: []int{2}, Data: make([]byte, 8)},
			{Name: "b", DType: safetensors.BF16, Shape: []int{3}, Data: make([]byte, 6)},
		},
		"model-00002-of-00002.safetensors": {{Name: "c", DType: safetensors.I32, Shape: []int{1}, Data: make([]byte, 4)}},
		"extra.safetensors":                {{Name: "a", DType: safetensors.F32, Shape: []int{1}, Data: make([]byte, 4)}},
	}
	for name, entries := range files {
		if err := safetensors.WriteEntries(filepath.Join(dir, name), entries, nil); err != nil {
			f.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not a checkpoint"), 0o644); err != nil {
		f.Fatal(err)
	}
	return dir
}

// FuzzCheckpointIndex opens a checkpoint whose model.safetensors.index.json is arbitrary.
// Errors name the checkpoint directory; an accepted index only names files inside it, and
// every tensor it maps is found in the file it names; the checkpoint lists each tensor once,
// sorted.
func FuzzCheckpointIndex(f *testing.F) {
	dir := indexFixture(f)
	const s1, s2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
	for _, s := range []string{
		`{"metadata": {"total_size": 18}, "weight_map": {"a": "` + s1 + `", "b": "` + s1 + `", "c": "` + s2 + `"}}`,
		`{"weight_map": {"c": "` + s2 + `"}}`,
		`{"weight_map": {"a": "` + s2 + `"}}`,
		`{"weight_map": {"a": "extra.safetensors"}}`,
		`{"weight_map": {"a": "` + s1 + `", "d": "extra.safetensors"}}`,
		`{"weight_map": {"a": "missing.safetensors"}}`,
		`{"weight_map": {"a": "../` + s1 + `"}}`,
		`{"weight_map": {"a": "/etc/passwd"}}`,
		`{"weight_map": {"a": "notes.txt"}}`,
		`{"weight_map": {"a": "."}}`,
		`{"weight_map": {"a": ""}}`,
		`{"weight_map": {"a": "sub/../` + s1 + `"}}`,
		`{"weight_map": {}}`, `{"weight_map": null}`, `{"weight_map": ["a"]}`, `{"weight_map": {"a": 1}}`,
		`{}`, `[]`, `null`, `{`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(filepath.Join(dir, IndexFile), data, 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := OpenCheckpoint(dir)
		if err != nil {
			if c != nil {
				t.Fatalf("OpenCheckpoint returned both a checkpoint and the error %v", err)
			}
			if !strings.HasPrefix(err.Error(), "checkpoint "+dir+": ") {
				t.Fatalf("error %q does not name the checkpoint", err)
			}
			return
		}
		defer c.Close()
		var idx struct {
			WeightMap map[string]string `json:"weight_map"`
		}
		if err := json.Unmarshal(data, &idx); err != nil || len(idx.WeightMap) == 0 {
			t.Fatalf("accepted an index without a weight map: %q (%v)", data, err)
		}
		for name, file := range idx.WeightMap {
			if !filepath.IsLocal(file) {
				t.Fatalf("accepted file %q outside the checkpoint", file)
			}
			info, ok := c.Info(name)
			if !ok || info.File != filepath.Join(dir, file) {
				t.Fatalf("index puts %q in %s, checkpoint finds it in %+v (%v)", name, file, info, ok)
			}
		}
		names := c.Names()
		if !slices.IsSorted(names) || len(slices.Compact(slices.Clone(names))) != len(names) {
			t.Fatalf("names not sorted and unique: %v", names)
		}
		for _, p := range c.Files() {
			if rel, err := filepath.Rel(dir, p); err != nil || !filepath.IsLocal(rel) {
				t.Fatalf("opened %s, outside %s", p, dir)
			}
		}
	})
}
