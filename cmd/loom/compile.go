package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/loom-ml/loom/engine"
	"github.com/loom-ml/loom/transform"
	"github.com/loom-ml/loom/transform/candidates"
)

func newCompileCmd() *cobra.Command {
	var (
		dir        string
		output     string
		report     bool
		transforms transform.Flags
		ranks      meshFlags
	)
	cmd := &cobra.Command{
		Use:   "compile",
		Short: "Run the transform pipeline on a model's graph and write the final graph text",
		Long: `Builds the model's plain graph, runs the transform pipeline over it (one summary line per
transform on stderr) and writes the final graph in text form to stdout or --output.`,
		Example: `  loom compile --model testdata/tiny-llama --dump-graphs /tmp/dump --check
  loom compile --model testdata/tiny-llama --set transforms.fuse_gemms.enabled=false --report-candidates
  loom compile --model testdata/tiny-llama --world-size 2 --dump-graphs /tmp/dump`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := resolveModels(&dir); err != nil {
				return err
			}
			m, g, err := engine.OpenGraph(dir, engine.LoadOptions{})
			if err != nil {
				return err
			}
			defer m.Close()
			mesh, err := ranks.resolve()
			if err != nil {
				return err
			}
			graphs, _, err := engine.OptimizeRanks(cmd.Context(), &transforms, m, g, mesh)
			if err != nil {
				return err
			}
			if g = graphs[0]; len(graphs) > 1 {
				fmt.Fprintf(cmd.ErrOrStderr(), "rank 0 of %d (mesh %s): the graph and the dumps are rank 0's\n", len(graphs), mesh)
			}
			out := cmd.OutOrStdout()
			if output != "" {
				if err := os.WriteFile(output, []byte(g.String()), 0o644); err != nil {
					return fmt.Errorf("--output: %w", err)
				}
			} else if _, err := fmt.Fprint(out, g.String()); err != nil {
				return err
			}
			if report {
				fmt.Fprintln(cmd.ErrOrStderr(), "\nrepeated chains of unfused ops (fusion candidates):")
				return candidates.Write(cmd.ErrOrStderr(), candidates.Find(g))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "model", "", modelUsage)
	f.StringVarP(&output, "output", "o", "", "write the final graph text to this file instead of stdout")
	f.BoolVar(&report, "report-candidates", false, "list the chains of unfused ops that repeat in the final graph, with counts and layers (on stderr)")
	addTransformFlags(cmd, &transforms)
	addMeshFlags(cmd, &ranks)
	_ = cmd.MarkFlagRequired("model")
	return cmd
}
