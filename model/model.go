package model

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Model is an opened Hugging Face checkpoint directory: its config, its generation defaults
// when it has them, and its weights.
type Model struct {
	Dir        string
	Config     *Config
	Generation *GenerationConfig // nil when the directory has no generation_config.json
	Checkpoint *Checkpoint
}

// Open reads config.json and, if present, generation_config.json from dir, and opens the
// checkpoint's weights (see OpenCheckpoint). With a quantization_config, a quantized weight
// that a graph reads as a float param is dequantized as it is read (quant_dequantize.go).
// Errors name the directory.
func Open(dir string) (*Model, error) {
	cfg, err := LoadConfig(filepath.Join(dir, "config.json"))
	if err != nil {
		return nil, fmt.Errorf("open model %s: %w", dir, err)
	}
	m := &Model{Dir: dir, Config: cfg}
	genPath := filepath.Join(dir, "generation_config.json")
	switch _, err := os.Stat(genPath); {
	case err == nil:
		if m.Generation, err = LoadGenerationConfig(genPath); err != nil {
			return nil, fmt.Errorf("open model %s: %w", dir, err)
		}
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("open model %s: %w", dir, err)
	}
	if m.Checkpoint, err = OpenCheckpoint(dir); err != nil {
		return nil, fmt.Errorf("open model %s: %w", dir, err)
	}
	if cfg.Quant != nil && cfg.Quant.Method != QuantLoad {
		m.Checkpoint.stored = cfg.Quant // quant_dequantize.go
	}
	return m, nil
}

// EOSTokenIDs are the ids that end generation: the generation config's when it names any,
// else the model config's.
func (m *Model) EOSTokenIDs() []int {
	if m.Generation != nil && len(m.Generation.EOSTokenIDs) > 0 {
		return m.Generation.EOSTokenIDs
	}
	return m.Config.EOSTokenIDs
}

// Close releases the checkpoint's files.
func (m *Model) Close() error {
	if m.Checkpoint == nil {
		return nil
	}
	return m.Checkpoint.Close()
}
