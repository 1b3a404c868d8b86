package main

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/loom-ml/loom/hub"
)

func newListCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the models in the Hugging Face cache",
		Long: `Lists the models in the Hugging Face cache (HF_HUB_CACHE, else HF_HOME/hub, else
~/.cache/huggingface/hub), whoever downloaded them (loom pull, huggingface-cli download,
transformers): a line per snapshot with the revisions that name it, its commit, its size and its
files. Any of these names is a model for the other commands: ORG/NAME (main), ORG/NAME@REVISION,
ORG/NAME@COMMIT.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cache := hub.Cache{Dir: hub.FromEnv().CacheDir}
			models, err := cache.List()
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if len(models) == 0 {
				_, err := fmt.Fprintf(out, "no models in the Hugging Face cache %s (loom pull ORG/NAME downloads one)\n", cache.Dir)
				return err
			}
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "MODEL\tREVISION\tCOMMIT\tSIZE\tFILES\tNOTE")
			for _, m := range models {
				revs := strings.Join(m.Revisions, ",")
				if revs == "" {
					revs = "-"
				}
				var notes []string
				if m.Missing > 0 {
					notes = append(notes, fmt.Sprintf("%d files missing", m.Missing))
				}
				if m.Unfinished {
					notes = append(notes, "unfinished download (loom pull resumes it)")
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", m.Repo, revs, m.Commit, humanBytes(m.Size), m.Files, strings.Join(notes, "; "))
			}
			return tw.Flush()
		},
	}
}
