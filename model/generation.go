package model

import (
	"encoding/json"
	"fmt"
	"os"
)

// GenerationConfig holds a model's default sampling settings from generation_config.json.
// Fields absent from the file take Hugging Face's defaults, noted per field.
type GenerationConfig struct {
	// Source names the file the settings came from, for messages.
	Source string

	BOSTokenID  int   // -1 when absent or null
	EOSTokenIDs []int // eos_token_id as a list (it may be an int or a list)
	PadTokenID  int   // -1 when absent or null

	DoSample          bool    // false: greedy decoding
	Temperature       float64 // 1 when absent
	TopK              int     // 50 when absent; 0 disables top-k
	TopP              float64 // 1 when absent
	RepetitionPenalty float64 // 1 (none) when absent
	MaxNewTokens      int     // 0 when absent: no limit of its own
	MaxLength         int     // max_length (prompt + generated); 0 when absent

	// Raw is the whole decoded JSON object.
	Raw map[string]any
}

// LoadGenerationConfig reads and validates a generation_config.json.
func LoadGenerationConfig(path string) (*GenerationConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read generation config: %w", err)
	}
	return ParseGenerationConfig(data, path)
}

// ParseGenerationConfig decodes and validates the contents of a generation_config.json;
// source names the file in error messages.
func ParseGenerationConfig(data []byte, source string) (*GenerationConfig, error) {
	f, err := parseObject(data, source)
	if err != nil {
		return nil, err
	}
	g := &GenerationConfig{Source: source}
	if err := json.Unmarshal(data, &g.Raw); err != nil {
		return nil, fmt.Errorf("%s: invalid JSON: %w", source, err)
	}
	g.BOSTokenID = firstID(f.ids("bos_token_id"))
	g.EOSTokenIDs = f.ids("eos_token_id")
	g.PadTokenID = firstID(f.ids("pad_token_id"))
	g.DoSample = f.bool("do_sample", false)
	g.Temperature = f.float("temperature", 1)
	g.TopK = f.int("top_k", 50)
	g.TopP = f.float("top_p", 1)
	g.RepetitionPenalty = f.float("repetition_penalty", 1)
	g.MaxNewTokens = f.int("max_new_tokens", 0)
	g.MaxLength = f.int("max_length", 0)

	if g.Temperature < 0 {
		f.fail("temperature must not be negative, got %g", g.Temperature)
	}
	f.nonNegative("top_k", g.TopK)
	if !(g.TopP > 0 && g.TopP <= 1) {
		f.fail("top_p must be in (0, 1], got %g", g.TopP)
	}
	if !(g.RepetitionPenalty > 0) {
		f.fail("repetition_penalty must be positive, got %g", g.RepetitionPenalty)
	}
	f.nonNegative("max_new_tokens", g.MaxNewTokens)
	f.nonNegative("max_length", g.MaxLength)
	for _, id := range g.EOSTokenIDs {
		if id < 0 {
			f.fail("eos_token_id must not be negative, got %d", id)
		}
	}
	if *f.err != nil {
		return nil, *f.err
	}
	return g, nil
}
