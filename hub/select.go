package hub

import (
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"
)

// IndexFile is the index of a sharded safetensors checkpoint.
const IndexFile = "model.safetensors.index.json"

// loomFiles are the files besides the weights that Loom reads when a repository has them:
// the model and generation configs, the tokenizer, the chat template.
var loomFiles = []string{
	"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
	"special_tokens_map.json", "chat_template.jinja",
}

// Select returns the files of a repository that Loom reads, the way model.OpenCheckpoint
// finds the weights: with model.safetensors.index.json the index (its shards come from
// Shards once it is read), else model.safetensors, else every *.safetensors file at the top
// level; and the configs, tokenizer and chat templates. sharded reports an index. A repository
// without config.json or without safetensors weights is an error that says what it holds.
func Select(files []File) (sel []File, sharded bool, err error) {
	byName := map[string]File{}
	for _, f := range files {
		byName[f.Name] = f
	}
	if _, ok := byName["config.json"]; !ok {
		return nil, false, fmt.Errorf("no config.json: not a transformers model")
	}
	for _, name := range loomFiles {
		if f, ok := byName[name]; ok {
			sel = append(sel, f)
		}
	}
	for _, f := range files {
		if dir, file := path.Split(f.Name); dir == "additional_chat_templates/" && strings.HasSuffix(file, ".jinja") {
			sel = append(sel, f)
		}
	}
	if f, ok := byName[IndexFile]; ok {
		return append(sel, f), true, nil
	}
	if f, ok := byName["model.safetensors"]; ok {
		return append(sel, f), false, nil
	}
	n := len(sel)
	for _, f := range files {
		if !strings.Contains(f.Name, "/") && strings.HasSuffix(f.Name, ".safetensors") {
			sel = append(sel, f)
		}
	}
	if len(sel) > n {
		return sel, false, nil
	}
	var other []string
	for _, f := range files {
		if strings.HasSuffix(f.Name, ".bin") || strings.HasSuffix(f.Name, ".pt") || strings.HasSuffix(f.Name, ".pth") || strings.HasSuffix(f.Name, ".gguf") {
			other = append(other, f.Name)
		}
	}
	if len(other) > 0 {
		slices.Sort(other)
		if len(other) > 3 {
			other = append(other[:3], "...")
		}
		return nil, false, fmt.Errorf("no *.safetensors weights, only %s: Loom reads safetensors (look for a safetensors revision, e.g. a refs/pr/N of the Hub's conversion bot, as ORG/NAME@refs/pr/N)", strings.Join(other, ", "))
	}
	return nil, false, fmt.Errorf("no *.safetensors weights")
}

// Shards returns the files that an index's weight_map names, each once, in order, checked
// against the repository's files.
func Shards(index []byte, files []File) ([]File, error) {
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(index, &idx); err != nil {
		return nil, fmt.Errorf("%s: invalid JSON: %w", IndexFile, err)
	}
	if len(idx.WeightMap) == 0 {
		return nil, fmt.Errorf("%s has no weight_map entries", IndexFile)
	}
	byName := map[string]File{}
	for _, f := range files {
		byName[f.Name] = f
	}
	var names []string
	for _, file := range idx.WeightMap {
		if !slices.Contains(names, file) {
			names = append(names, file)
		}
	}
	slices.Sort(names)
	out := make([]File, 0, len(names))
	for _, name := range names {
		f, ok := byName[name]
		if !ok {
			return nil, fmt.Errorf("%s names %s, which the repository does not have", IndexFile, name)
		}
		out = append(out, f)
	}
	return out, nil
}
