package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/loom-ml/loom/model"
	_ "github.com/loom-ml/loom/model/all"
)

func newInspectCmd() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "inspect",
		Short: "Print a checkpoint's architecture, sizes and graph",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := resolveModels(&dir); err != nil {
				return err
			}
			m, err := model.Open(dir)
			if err != nil {
				return err
			}
			defer m.Close()
			g, err := model.BuildGraph(m.Config, model.BuildOptions{Tensors: m.Checkpoint})
			if err != nil {
				return err
			}
			c := m.Config
			var params, bytes int64
			for _, name := range m.Checkpoint.Names() {
				info, _ := m.Checkpoint.Info(name)
				n := int64(1)
				for _, d := range info.Shape {
					n *= int64(d)
				}
				params += n
				bytes += n * int64(info.DType.Size())
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "architecture: %s (model_type %s)\n", c.Architectures[0], c.ModelType)
			fmt.Fprintf(out, "layers: %d  hidden: %d  intermediate: %d  heads: %d  kv_heads: %d  head_dim: %d  vocab: %d\n",
				c.NumHiddenLayers, c.HiddenSize, c.IntermediateSize, c.NumAttentionHeads, c.NumKeyValueHeads, c.HeadDim, c.VocabSize)
			fmt.Fprintf(out, "rope: type %s theta %g  tie_word_embeddings: %v  sliding_window: %d\n", ropeType(c.Rope.Type), c.Rope.Theta, c.TieWordEmbeddings, c.SlidingWindow)
			fmt.Fprintf(out, "parameters: %d (%d tensors, %.2f MB)\n", params, len(m.Checkpoint.Names()), float64(bytes)/1e6)
			fmt.Fprintf(out, "graph: %d nodes, %d params\n\n", len(g.Nodes), len(g.Params()))
			_, err = fmt.Fprint(out, g.String())
			return err
		},
	}
	cmd.Flags().StringVar(&dir, "model", "", modelUsage)
	_ = cmd.MarkFlagRequired("model")
	return cmd
}

func ropeType(t string) string {
	if t == "" {
		return "default"
	}
	return t
}
