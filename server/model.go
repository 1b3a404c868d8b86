package server

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/loom-ml/loom/chattemplate"
	"github.com/loom-ml/loom/model"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tokenizer"
)

// ModelConfig returns the configuration that serves a loaded model under name (the
// directory's base name when empty): its tokenizer, its chat template when it has one, its
// context length and vocabulary, and sampling defaults that follow the OpenAI API
// (temperature 1) unless generation_config.json sets temperature, top_p, top_k or
// repetition_penalty.
func ModelConfig(m *model.Model, name string) (Config, error) {
	if m == nil {
		return Config{}, errors.New("server: no model")
	}
	tok, err := tokenizer.LoadDir(m.Dir)
	if err != nil {
		return Config{}, fmt.Errorf("server: %w", err)
	}
	tmpl, err := chattemplate.Load(m.Dir)
	if err != nil && !errors.Is(err, chattemplate.ErrNoTemplate) {
		return Config{}, fmt.Errorf("server: %w", err)
	}
	if name == "" {
		name = filepath.Base(filepath.Clean(m.Dir))
	}
	defaults := sample.Params{Temperature: 1}
	if g := m.Generation; g != nil {
		if _, ok := g.Raw["temperature"]; ok {
			defaults.Temperature = g.Temperature
		}
		if _, ok := g.Raw["top_p"]; ok {
			defaults.TopP = g.TopP
		}
		if _, ok := g.Raw["top_k"]; ok {
			defaults.TopK = g.TopK
		}
		if _, ok := g.Raw["repetition_penalty"]; ok {
			defaults.RepetitionPenalty = g.RepetitionPenalty
		}
		if err := defaults.Validate(); err != nil {
			return Config{}, fmt.Errorf("server: sampling defaults of %s: %w", g.Source, err)
		}
	}
	return Config{
		Model:         name,
		Tokenizer:     tok,
		ChatTemplate:  tmpl,
		ContextLength: m.Config.MaxPositionEmbeddings,
		VocabSize:     m.Config.VocabSize,
		Defaults:      defaults,
	}, nil
}

// DirConfig is ModelConfig for the checkpoint folder dir before its weights are loaded: it
// reads config.json, generation_config.json, the tokenizer and the chat template only, so
// that a folder that cannot be served (no tokenizer, say) fails before minutes of loading.
func DirConfig(dir, name string) (Config, error) {
	cfg, err := model.LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		return Config{}, fmt.Errorf("server: %s: %w", dir, err)
	}
	m := &model.Model{Dir: dir, Config: cfg}
	genPath := filepath.Join(dir, "generation_config.json")
	switch _, err := os.Stat(genPath); {
	case err == nil:
		if m.Generation, err = model.LoadGenerationConfig(genPath); err != nil {
			return Config{}, fmt.Errorf("server: %s: %w", dir, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return Config{}, fmt.Errorf("server: %s: %w", dir, err)
	}
	return ModelConfig(m, name)
}
