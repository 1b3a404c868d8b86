package model

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// lfsHeader begins a Git LFS pointer file: what a clone without git-lfs holds in place of
// each large file.
const lfsHeader = "version https://git-lfs.github.com/spec/v1"

// lfsPointer explains a weights file that is a Git LFS pointer (a small text file that names
// the real file's sha256 and size); nil when path is no such file.
func lfsPointer(path string) error {
	st, err := os.Stat(path)
	if err != nil || st.Size() > 1024 {
		return nil
	}
	data, err := os.ReadFile(path)
	if err != nil || !bytes.HasPrefix(data, []byte(lfsHeader)) {
		return nil
	}
	real := ""
	for line := range strings.Lines(string(data)) {
		if n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimPrefix(line, "size ")), 10, 64); strings.HasPrefix(line, "size ") && err == nil {
			real = fmt.Sprintf(" (the real file has %d bytes)", n)
		}
	}
	return fmt.Errorf("%s is a Git LFS pointer file of %d bytes, not the weights%s: the repository was cloned without Git LFS; "+
		"fetch the real files with \"git lfs install && git lfs pull\" in the clone, or download the model with \"loom pull ORG/NAME\"", path, st.Size(), real)
}

// noSafetensors explains a checkpoint folder without safetensors weights: one with PyTorch
// (or other) weights gets a hint that Loom reads safetensors only.
func noSafetensors(dir string) error {
	entries, _ := os.ReadDir(dir)
	var other []string
	for _, e := range entries {
		switch filepath.Ext(e.Name()) {
		case ".bin", ".pt", ".pth", ".gguf":
			other = append(other, e.Name())
		}
	}
	if len(other) == 0 {
		return fmt.Errorf("checkpoint %s: no %s, %s or *.safetensors files", dir, IndexFile, SingleFile)
	}
	slices.Sort(other)
	if len(other) > 3 {
		other = append(other[:3], "...")
	}
	return fmt.Errorf("checkpoint %s: no %s, %s or *.safetensors files, only %s: Loom reads safetensors weights only "+
		"(many Hugging Face models have them: loom pull ORG/NAME fetches them; or convert these with transformers' save_pretrained(dir, safe_serialization=True))",
		dir, IndexFile, SingleFile, strings.Join(other, ", "))
}
