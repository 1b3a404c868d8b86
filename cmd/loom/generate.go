package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/engine"
	"github.com/loom-ml/loom/tokenizer"
	"github.com/loom-ml/loom/transform"
)

func newGenerateCmd() *cobra.Command {
	var (
		dir        string
		prompt     string
		promptIDs  string
		maxNew     int
		asJSON     bool
		withLogits bool
		noOptimize bool
		transforms transform.Flags
		ranks      meshFlags
		device     string
	)
	cmd := &cobra.Command{
		Use:   "generate",
		Short: "Generate tokens greedily from a prompt",
		Long: `Generates tokens greedily from a prompt given as token ids (--prompt-ids) or as text (--prompt,
encoded with the tokenizer's special tokens). Prints the new ids, or with --prompt the new text
(up to the first end-of-sequence token), or with --json one object {"ids": [...]}.`,
		Example: `  loom generate --model testdata/tiny-llama --prompt-ids 0,56,76 --max-new-tokens 8 --json
  loom generate --model testdata/tiny-llama --prompt "The quick brown fox" --max-new-tokens 8`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var (
				ids []int
				tok *tokenizer.Tokenizer
				err error
			)
			if cmd.Flags().Changed("prompt") {
				if tok, err = tokenizer.LoadDir(dir); err != nil {
					return err
				}
				if ids, err = tok.Encode(prompt, true); err != nil {
					return fmt.Errorf("--prompt: %w", err)
				}
				if len(ids) == 0 {
					return fmt.Errorf("--prompt: the prompt has no tokens")
				}
			} else if ids, err = parseIDs(promptIDs); err != nil {
				return fmt.Errorf("--prompt-ids: %w", err)
			}
			if maxNew < 0 {
				return fmt.Errorf("--max-new-tokens must be >= 0, got %d", maxNew)
			}
			mesh, err := ranks.resolve()
			if err != nil {
				return err
			}
			dev, err := pickDevice(device, noOptimize, mesh, ranks.distBackend)
			if err != nil {
				return err
			}
			// GreedyRecompute runs the graph over the whole sequence at every token: on CUDA the
			// optimized graph without the cache stage, on the CPU the paged graph as one
			// prefill over a fresh cache (recomputeInputs).
			opts := engine.LoadOptions{
				Device: dev.Name(), Optimize: !noOptimize, WholeSequences: dev.Name() == "cuda",
				Transforms: transforms, Mesh: mesh, DistBackend: ranks.distBackend,
			}
			if err := withProcessEnv(&opts, dev); err != nil {
				return err
			}
			m, err := loadWithProgress(cmd, dir, opts)
			if err != nil {
				return err
			}
			if m.Follower() {
				return follow(m)
			}
			defer m.Close()
			exe, vocab, eos := m.Executable(), m.Config.VocabSize, m.EOSTokenIDs()
			for _, id := range ids {
				if id >= vocab {
					return fmt.Errorf("prompt: token id %d is outside the vocabulary (size %d)", id, vocab)
				}
			}
			res, err := engine.GreedyRecompute(cmd.Context(), exe, ids, maxNew)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if tok != nil && !asJSON {
				return printText(out, tok, res.NewIDs, eos)
			}
			if !asJSON {
				parts := make([]string, len(res.NewIDs))
				for i, id := range res.NewIDs {
					parts[i] = strconv.Itoa(id)
				}
				_, err := fmt.Fprintln(out, strings.Join(parts, ","))
				return err
			}
			obj := struct {
				IDs    []int     `json:"ids"`
				Logits []float32 `json:"logits,omitempty"`
			}{IDs: res.NewIDs}
			if obj.IDs == nil {
				obj.IDs = []int{}
			}
			if withLogits {
				obj.Logits = res.PromptLogits
			}
			return json.NewEncoder(out).Encode(obj)
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "model", "", "checkpoint directory (config.json, *.safetensors)")
	f.StringVar(&prompt, "prompt", "", "prompt as text, encoded with the tokenizer's special tokens")
	f.StringVar(&promptIDs, "prompt-ids", "", "prompt as comma-separated token ids, e.g. 0,1,2")
	f.IntVar(&maxNew, "max-new-tokens", 16, "number of tokens to generate")
	f.BoolVar(&asJSON, "json", false, `print one JSON object {"ids": [...], "logits": [...]} on stdout`)
	f.BoolVar(&withLogits, "logits", false, "with --json: include the full-vocabulary logits of the last prompt position")
	f.BoolVar(&noOptimize, "no-optimize", false, "run the plain graph, without the transform pipeline")
	f.StringVar(&device, "device", "auto", "where the model runs: auto (CUDA when a GPU can be used, else the CPU), cpu or cuda")
	addTransformFlags(cmd, &transforms)
	addMeshFlags(cmd, &ranks)
	_ = cmd.MarkFlagRequired("model")
	cmd.MarkFlagsOneRequired("prompt", "prompt-ids")
	cmd.MarkFlagsMutuallyExclusive("prompt", "prompt-ids")
	return cmd
}

// pickDevice resolves --device (backend.Resolve, the one device resolver) and logs the
// device picked and why. auto takes the CPU for what the CUDA backend does not run: the
// plain graph (--no-optimize), meshes of more ranks than the machine has GPUs, the local
// communicator; --device cuda with the plain graph, or without a usable GPU, or with too
// few GPUs for the mesh, is an error.
func pickDevice(flag string, noOptimize bool, mesh dist.Mesh, distBackend string) (backend.Backend, error) {
	b, reason, err := backend.Resolve(flag, backend.Needs{Mesh: mesh, PlainGraph: noOptimize, DistBackend: distBackend})
	if errors.Is(err, backend.ErrPlainGraph) {
		return nil, fmt.Errorf("--device: %w; drop --no-optimize", err)
	}
	if err != nil {
		return nil, fmt.Errorf("--device: %w", err)
	}
	slog.Info("device picked", "device", b.Name(), "reason", reason)
	return b, nil
}

// printText prints the text of ids up to the first end-of-sequence id, special tokens left
// out. Ids the tokenizer does not know (a model's vocabulary may be larger) are skipped.
func printText(w io.Writer, tok *tokenizer.Tokenizer, ids, eos []int) error {
	var known []int
	for _, id := range ids {
		if slices.Contains(eos, id) {
			break
		}
		if _, ok := tok.IDToken(id); !ok {
			slog.Warn("generated token id not in the tokenizer's vocabulary; left out of the text", "id", id)
			continue
		}
		known = append(known, id)
	}
	text, err := tok.Decode(known, true)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, text)
	return err
}

// parseIDs reads "0,1,2" into token ids.
func parseIDs(s string) ([]int, error) {
	var ids []int
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		id, err := strconv.Atoi(part)
		if err != nil || id < 0 {
			return nil, fmt.Errorf("%q is not a token id", part)
		}
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("no token ids in %q", s)
	}
	return ids, nil
}
