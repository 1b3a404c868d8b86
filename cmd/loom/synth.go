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
empty is refused unless --force, which replaces its checkpoint files.

--fp8 block writes the checkpoint in Hugging Face's fp8 format, as Qwen3-*-FP8 and
DeepSeek-V3 ship it: every linear weight of the decoder layers (attention q/k/v/o, MLP
gate/up/down, each expert's projections) is float8_e4m3fn with <module>.weight_scale_inv, one
f32 multiplier per 128x128 block (amax/448 of the block), and config.json gets a
quantization_config (quant_method fp8, weight_block_size [128, 128], dynamic activations).
The embeddings, the LM head, the norms, the biases and the MoE routers stay bf16. The values
quantized are the bf16 weights the same --seed writes without --fp8.`,
		Example: "  loom synth llama-3.1-8b --out /tmp/llama8b\n  loom synth qwen2.5-0.5b --out /tmp/qwen --layers 2\n  loom synth qwen3-30b-a3b --out /tmp/qwen3moe --layers 2 --experts 16\n  loom synth llama-3.1-8b --out /tmp/llama8b-fp8 --fp8 block",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return fmt.Errorf("--out is required")
			}
			if _, ok := synth.Shapes[args[0]]; !ok {
				return fmt.Errorf("unknown model shape %q; known: %s", args[0], strings.Join(synth.Names(), ", "))
			}
			if err := opts.Validate(); err != nil {
				return err
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
	f.StringVar(&opts.FP8, "fp8", "", "write the decoder layers' linear weights in an FP8 format: "+strings.Join(synth.FP8Formats, ", ")+" (Hugging Face fp8, 128x128 block scales); empty: bf16")
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
