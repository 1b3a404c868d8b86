package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/loom-ml/loom/model"
	"github.com/loom-ml/loom/model/synth"
)

func newSynthCmd() *cobra.Command {
	var (
		out   string
		force bool
		opts  synth.Options
	)
	cmd := &cobra.Command{
		Use:   "synth NAME --out DIR",
		Short: "Write a random-weight checkpoint of a named model shape (" + strings.Join(synth.Names(), ", ") + ")",
		Long: `Writes config.json, generation_config.json, bf16 safetensors with random weights (sharded
above 4 GB) and a byte-level BPE tokenizer for a named model shape, so benchmarks need no
downloads. The tokenizer covers the whole vocabulary: every byte is a token, the shape's
special tokens (and the chat template's) sit at their ids, and every other id is a token of
lowercase letters reachable through the merges, so whatever id the model picks has text.
The mixture-of-experts shapes store one tensor per expert projection, as their released
checkpoints do; --layers and --experts write smaller copies of them. A folder that is not
empty is refused unless --force, which replaces its checkpoint files.`,
		Example: "  loom synth llama-3.1-8b --out /tmp/llama8b\n  loom synth qwen2.5-0.5b --out /tmp/qwen --layers 2\n  loom synth qwen3-30b-a3b --out /tmp/qwen3moe --layers 2 --experts 16",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return fmt.Errorf("--out is required")
			}
			if _, ok := synth.Shapes[args[0]]; !ok {
				return fmt.Errorf("unknown model shape %q; known: %s", args[0], strings.Join(synth.Names(), ", "))
			}
			if err := checkOutDir(out, force); err != nil {
				return err
			}
			if err := synth.Write(cmd.Context(), args[0], out, opts); err != nil {
				return err
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "wrote %s to %s\n", args[0], out)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&out, "out", "", "directory to write the checkpoint to (new or empty, or any with --force)")
	f.BoolVar(&force, "force", false, "write into a folder that is not empty, replacing its checkpoint files (config, tokenizer, safetensors)")
	f.IntVar(&opts.Layers, "layers", 0, "override the number of layers (0: the shape's own)")
	f.IntVar(&opts.Experts, "experts", 0, "override the number of experts of a mixture-of-experts shape (0: the shape's own)")
	f.Uint64Var(&opts.Seed, "seed", 0, "random seed of the weights")
	return cmd
}

// checkOutDir refuses an --out folder that holds anything, unless force; with force it
// removes the safetensors files and index there, so that the folder holds one checkpoint (a
// single file left from an earlier write would shadow a new sharded one, or the other way).
func checkOutDir(dir string, force bool) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("--out: %w", err)
	case len(entries) == 0:
		return nil
	case !force:
		return fmt.Errorf("--out: %s is not empty (%d entries, such as %s); pass --force to write the checkpoint over it, or name a new folder", dir, len(entries), entries[0].Name())
	}
	for _, e := range entries {
		if n := e.Name(); !e.IsDir() && (n == model.IndexFile || strings.HasSuffix(n, ".safetensors")) {
			if err := os.Remove(filepath.Join(dir, n)); err != nil {
				return fmt.Errorf("--force: %w", err)
			}
		}
	}
	return nil
}
