package model

import (
	"os"
	"path/filepath"
	"testing"
)

// TestOpenNotSafetensors: a clone without Git LFS (pointer files where the weights should be)
// and a PyTorch-only checkpoint get errors that say what is wrong and what to do.
func TestOpenNotSafetensors(t *testing.T) {
	ptr := "version https://git-lfs.github.com/spec/v1\noid sha256:4d7a214614ab2935c943f9e0ff69d22eadbb8f32b1258daaa5e2ca24d17e2393\nsize 988097824\n"
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  []string
	}{
		{"lfs pointer", map[string]string{SingleFile: ptr},
			[]string{SingleFile, "is a Git LFS pointer file of 134 bytes, not the weights", "988097824 bytes", "git lfs pull", "loom pull ORG/NAME"}},
		{"lfs pointer shards", map[string]string{
			IndexFile:                          `{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}`,
			"model-00001-of-00002.safetensors": ptr, "model-00002-of-00002.safetensors": ptr},
			[]string{"model-00001-of-00002.safetensors is a Git LFS pointer file", "git lfs pull"}},
		{"pytorch only", map[string]string{"pytorch_model.bin": "PK\x03\x04"},
			[]string{"only pytorch_model.bin", "Loom reads safetensors weights only", "safe_serialization=True"}},
		{"sharded pytorch", map[string]string{"pytorch_model-00001-of-00002.bin": "x", "pytorch_model-00002-of-00002.bin": "x", "pytorch_model.bin.index.json": "{}"},
			[]string{"only pytorch_model-00001-of-00002.bin, pytorch_model-00002-of-00002.bin", "Loom reads safetensors"}},
		{"no weights", map[string]string{},
			[]string{"no model.safetensors.index.json, model.safetensors or *.safetensors files"}},
		{"short file, not a pointer", map[string]string{SingleFile: "version 1"},
			[]string{SingleFile, "runs past the end of the file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			cfg, err := os.ReadFile(filepath.Join(fixtures, "tiny-llama", "config.json"))
			if err != nil {
				t.Fatal(err)
			}
			tc.files["config.json"] = string(cfg)
			for name, content := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			_, err = Open(dir)
			wantErr(t, err, append([]string{"open model " + dir}, tc.want...)...)
		})
	}
}
