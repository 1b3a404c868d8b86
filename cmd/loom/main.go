// Command loom compiles and runs Hugging Face language models.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	_ "github.com/loom-ml/loom/backend/all" // every backend: --device cpu, cuda and auto
	"github.com/loom-ml/loom/transform"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRootCmd().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "loom:", err)
		os.Exit(1)
	}
}

func newRootCmd() *cobra.Command {
	var logLevel string
	root := &cobra.Command{
		Use:           "loom",
		Short:         "Loom compiles Hugging Face language models into fast executables and runs them",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			var level slog.Level
			if err := level.UnmarshalText([]byte(logLevel)); err != nil {
				return fmt.Errorf("--log-level: %w", err)
			}
			// One plain line per record (message, then key=value attributes): the optimizer's
			// summary lines come out exactly as specified.
			slog.SetDefault(slog.New(transform.NewLineHandler(cmd.ErrOrStderr(), level)))
			return nil
		},
	}
	root.Version = readBuildVersion().short()
	root.AddCommand(newVersionCmd())
	root.PersistentFlags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn or error (logs go to stderr)")
	root.AddCommand(newGenerateCmd(), newInspectCmd(), newCompileCmd(), newSynthCmd(),
		newServeCmd(), newChatCmd(), newTokenizeCmd(), newBenchCmd(), newLaunchCmd(), newPullCmd(), newListCmd())
	return root
}
