package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/loom-ml/loom/hub"
)

// modelUsage is the help of every --model flag.
const modelUsage = "checkpoint directory, or a Hugging Face model ORG/NAME[@REVISION] in the Hugging Face cache (see loom pull)"

// resolveModels turns each model a command was given (a --model or --tokenizer value) into a
// checkpoint directory, in place: a path that exists stays as it is; else a Hugging Face name
// ORG/NAME[@REVISION] becomes its snapshot folder in the Hugging Face cache (HF_HUB_CACHE,
// HF_HOME; see package hub). Nothing is downloaded: a name that is not in the cache is an
// error that says to run loom pull. An empty value, or one that is no name (./dir, /abs/dir),
// stays as it is, for the command's own checks.
func resolveModels(models ...*string) error {
	for _, m := range models {
		dir, err := resolveModel(*m)
		if err != nil {
			return err
		}
		*m = dir
	}
	return nil
}

func resolveModel(model string) (string, error) {
	if model == "" {
		return "", nil
	}
	if _, err := os.Stat(model); err == nil {
		return model, nil
	}
	ref, err := hub.ParseRef(model)
	if err != nil {
		return model, nil
	}
	env := hub.FromEnv()
	dir, err := hub.Cache{Dir: env.CacheDir}.Resolve(ref)
	var nc *hub.NotCachedError
	switch {
	case errors.As(err, &nc) && env.Offline:
		return "", fmt.Errorf("model %s: no such directory, and %w; download it with \"loom pull %s\" (HF_HUB_OFFLINE is set: unset it first)", model, err, ref)
	case errors.As(err, &nc):
		return "", fmt.Errorf("model %s: no such directory, and %w; download it with \"loom pull %s\"", model, err, ref)
	case err != nil:
		return "", fmt.Errorf("model %s: %w", model, err)
	}
	slog.Info("model from the Hugging Face cache", "model", ref.String(), "dir", dir)
	return dir, nil
}

// resolveServeModel resolves the model of loom serve, given as its argument (loom serve
// ORG/NAME, as vllm serve takes it) or with --model (one of the two, or both the same), into
// *dir; and, when the model is a Hugging Face name and --served-model-name is not set, makes
// that name the model's name in the API (as vLLM does) in *name.
func resolveServeModel(dir, name *string, args []string) error {
	model := *dir
	switch {
	case len(args) == 0 && model == "":
		return errors.New("no model: give a checkpoint directory or a Hugging Face name as the argument (loom serve Qwen/Qwen3-0.6B) or with --model")
	case len(args) > 0 && model != "" && model != args[0]:
		return fmt.Errorf("two models: %q as the argument and %q with --model", args[0], model)
	case len(args) > 0:
		model = args[0]
	}
	resolved, err := resolveModel(model)
	if err != nil {
		return err
	}
	if *name == "" && resolved != model {
		*name = model
	}
	*dir = resolved
	return nil
}
