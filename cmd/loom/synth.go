package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/loom-ml/loom/model/synth"
)

func newSynthCmd() *cobra.Command {
	var (
		out  string
		opts synth.Options
	)
	cmd := &cobra.Command{
		Use:   "synth NAME --out DIR",
		Short: "Write a random-weight checkpoint of a named model shape (" + strings.Join(synth.Names(), ", ") + ")",
		Long: `Writes config.json, generation_config.json, bf16 safetensors with random weights (sharded
above 4 GB) and a byte-level tokenizer for a named model shape, so benchmarks need no downloads.
The mixture-of-experts shapes store one tensor per expert projection, as their released
checkpoints do; --layers and --experts write smaller copies of them.`,
		Example: "  loom synth llama-3.1-8b --out /tmp/llama8b\n  loom synth qwen2.5-0.5b --out /tmp/qwen --layers 2\n  loom synth qwen3-30b-a3b --out /tmp/qwen3moe --layers 2 --experts 16",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if out == "" {
				return fmt.Errorf("--out is required")
			}
			if err := synth.Write(cmd.Context(), args[0], out, opts); err != nil {
				return err
			}
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "wrote %s to %s\n", args[0], out)
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&out, "out", "", "directory to write the checkpoint to")
	f.IntVar(&opts.Layers, "layers", 0, "override the number of layers (0: the shape's own)")
	f.IntVar(&opts.Experts, "experts", 0, "override the number of experts of a mixture-of-experts shape (0: the shape's own)")
	f.Uint64Var(&opts.Seed, "seed", 0, "random seed of the weights")
	return cmd
}
