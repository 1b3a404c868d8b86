package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/loom-ml/loom/engine"
	"github.com/loom-ml/loom/model"
)

// isTerminal reports whether w is a terminal (a character device other than /dev/null).
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok || os.Getenv("TERM") == "dumb" {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0 && f.Name() != os.DevNull
}

// progressBar draws one status line on a terminal: a bar over the transforms of the
// pipeline, then a spinner while the backend compiles and loads the weights. Log records
// printed meanwhile go above it. It is safe for concurrent use.
type progressBar struct {
	w      io.Writer
	label  string
	total  int
	start  time.Time
	mu     sync.Mutex
	done   int
	phase  string
	frame  int
	shown  bool
	closed bool
}

const barWidth = 24

func (p *progressBar) draw() {
	if p.closed {
		return
	}
	elapsed := time.Since(p.start).Truncate(100 * time.Millisecond)
	var line string
	if p.done < p.total {
		filled := barWidth * p.done / max(p.total, 1)
		line = fmt.Sprintf("%s [%s%s] %d/%d transforms (%s) %s", p.label,
			strings.Repeat("=", filled), strings.Repeat(" ", barWidth-filled), p.done, p.total, p.phase, elapsed)
	} else {
		spin := `|/-\`[p.frame%4]
		line = fmt.Sprintf("%s [%s] compiling and loading weights %c %s", p.label, strings.Repeat("=", barWidth), spin, elapsed)
	}
	fmt.Fprintf(p.w, "\r\x1b[2K%s", line)
	p.shown = true
}

// clear removes the status line (before a log line, or at the end).
func (p *progressBar) clear() {
	if p.shown {
		fmt.Fprint(p.w, "\r\x1b[2K")
		p.shown = false
	}
}

// progressHandler passes records to the real handler above the bar and advances the bar on
// the optimizer's per-transform summary lines.
type progressHandler struct {
	slog.Handler
	p *progressBar
}

func (h progressHandler) Handle(ctx context.Context, r slog.Record) error {
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	if strings.HasPrefix(r.Message, "[stage=") {
		h.p.done++
		if stage, _, ok := strings.Cut(strings.TrimPrefix(r.Message, "[stage="), " "); ok {
			h.p.phase = stage
		}
	}
	var err error
	if h.Handler.Enabled(ctx, r.Level) {
		h.p.clear()
		err = h.Handler.Handle(ctx, r)
	}
	h.p.draw()
	return err
}

func (h progressHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return progressHandler{h.Handler.WithAttrs(as), h.p}
}

func (h progressHandler) WithGroup(name string) slog.Handler {
	return progressHandler{h.Handler.WithGroup(name), h.p}
}

// Enabled lets every record through so that the bar sees the summaries even when the log
// level hides them.
func (h progressHandler) Enabled(context.Context, slog.Level) bool { return true }

// loadWithProgress loads and compiles the model in dir. On a terminal (stderr) it shows a
// progress bar while it works; elsewhere it is quiet apart from the logs.
func loadWithProgress(cmd *cobra.Command, dir string, opts engine.LoadOptions) (*engine.Model, error) {
	if q := cmd.Flags().Lookup("quantize"); q != nil && opts.Quantize == "" {
		opts.Quantize = q.Value.String() // --quantize (addMeshFlags), on every command that loads a model
	}
	optimize, flags := opts.Optimize, opts.Transforms
	errw := cmd.ErrOrStderr()
	if !isTerminal(errw) {
		return engine.Load(cmd.Context(), dir, opts)
	}
	total := 0
	if optimize {
		if cfg, err := model.LoadConfig(filepath.Join(dir, "config.json")); err == nil {
			if o, err := flags.Optimizer(cfg.ModelType); err == nil {
				total = len(o.Config.Entries())
			}
		}
	}
	p := &progressBar{w: errw, label: "loading " + filepath.Base(filepath.Clean(dir)), total: total, start: time.Now(), phase: "building the graph"}
	prev := slog.Default()
	slog.SetDefault(slog.New(progressHandler{prev.Handler(), p}))
	defer slog.SetDefault(prev)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				p.mu.Lock()
				p.frame++
				p.draw()
				p.mu.Unlock()
			}
		}
	})
	m, err := engine.Load(cmd.Context(), dir, opts)
	close(stop)
	wg.Wait()
	p.mu.Lock()
	p.clear()
	p.closed = true
	p.mu.Unlock()
	return m, err
}
