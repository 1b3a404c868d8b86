package main

import (
	"flag"

	"github.com/spf13/cobra"

	"github.com/loom-ml/loom/transform"
)

// addTransformFlags adds the pipeline's flags (--config, --set, --dump-graphs, --check) to cmd.
func addTransformFlags(cmd *cobra.Command, f *transform.Flags) {
	fs := flag.NewFlagSet(cmd.Name(), flag.ContinueOnError)
	f.Register(fs)
	cmd.Flags().AddGoFlagSet(fs)
}
