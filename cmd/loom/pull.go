package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/loom-ml/loom/hub"
)

func newPullCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "pull ORG/NAME[@REVISION]",
		Short: "Download a model from the Hugging Face Hub into the Hugging Face cache",
		Long: `Downloads the files of a Hugging Face model that Loom reads (config.json, generation_config.json,
the tokenizer files, the chat template, and the safetensors weights: the shards that
model.safetensors.index.json names, else model.safetensors, else every *.safetensors file) into
the Hugging Face cache, in the layout huggingface-cli download and transformers use, so that each
tool finds what the others fetched. Prints the snapshot folder on stdout; every command then takes
the name as its model (loom serve ORG/NAME, --model ORG/NAME).

A broken download keeps what it got (blobs/*.incomplete) and the next pull resumes it. Every file
is checked against the size and the hash (sha256, or git's object id) the Hub lists; a file that
does not match is removed and named in the error.

Environment, as for huggingface_hub: HF_ENDPOINT (default https://huggingface.co), HF_TOKEN (an
access token for private and gated models; else the token of huggingface-cli login), HF_HUB_CACHE
or HF_HOME (where the cache is; default ~/.cache/huggingface/hub), HF_HUB_OFFLINE=1 (download
nothing: only report a model already cached).`,
		Example: `  loom pull Qwen/Qwen3-0.6B
  loom pull meta-llama/Llama-3.2-1B-Instruct@main
  loom serve Qwen/Qwen3-0.6B`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ref, err := hub.ParseRef(args[0])
			if err != nil {
				return err
			}
			env := hub.FromEnv()
			c := hub.NewClient(env)
			errw := cmd.ErrOrStderr()
			p := &pullProgress{w: errw, tty: isTerminal(errw), name: ref.String(), start: time.Now()}
			c.Progress = p.event
			dir, err := c.Pull(cmd.Context(), ref)
			p.clear()
			if err != nil {
				return err
			}
			if env.Offline {
				fmt.Fprintf(errw, "%s: HF_HUB_OFFLINE is set: the cached snapshot, not checked against the Hub\n", ref)
			} else {
				fmt.Fprintf(errw, "pulled %s (%s downloaded in %s)\n", ref, humanBytes(p.fetched), time.Since(p.start).Round(100*time.Millisecond))
			}
			_, err = fmt.Fprintln(cmd.OutOrStdout(), dir)
			return err
		},
	}
}

// pullProgress shows a pull on stderr: on a terminal one status line with a bar over the
// bytes of the whole pull; elsewhere a plain line when a file starts and ends, and every
// 10 seconds of a long file.
type pullProgress struct {
	w     io.Writer
	tty   bool
	name  string
	start time.Time

	total   int64 // bytes of the files of the pull (Planned)
	settled int64 // bytes of the files cached or finished
	fetched int64 // bytes downloaded by this pull
	file    string
	size    int64 // the current file's bytes
	done    int64 // the current file's bytes on disk
	resumed int64 // of which were on disk before the pull
	began   time.Time
	drawn   time.Time // of the last status line, or of the last plain progress line
	shown   bool
}

func (p *pullProgress) event(e hub.Event) {
	switch e.Kind {
	case hub.Planned:
		p.total = e.Size
		p.line("%s: %d files, %s", p.name, e.Files, humanBytes(e.Size))
	case hub.Cached:
		p.settled += e.Size
		p.line("  %s (%s) is in the cache", e.File, humanBytes(e.Size))
	case hub.Started:
		p.file, p.size, p.done, p.resumed, p.began, p.drawn = e.File, e.Size, e.Done, e.Done, time.Now(), time.Now()
		if e.Done > 0 {
			p.line("  resuming %s at %s of %s", e.File, humanBytes(e.Done), humanBytes(e.Size))
		} else {
			p.line("  downloading %s (%s)", e.File, humanBytes(e.Size))
		}
	case hub.Retrying:
		p.line("  %s: the transfer broke at %s of %s (%v); trying again", e.File, humanBytes(e.Done), humanBytes(e.Size), e.Err)
	case hub.Restarted:
		p.done, p.resumed = 0, 0
		p.line("  %s: the server sent the whole file, not the rest: starting it over", e.File)
	case hub.Advanced:
		p.fetched += e.Done - p.done
		p.done = e.Done
		if time.Since(p.drawn) < 100*time.Millisecond || !p.tty && time.Since(p.drawn) < 10*time.Second {
			return
		}
		p.drawn = time.Now()
		if p.tty {
			p.draw()
		} else {
			fmt.Fprintf(p.w, "  %s: %d%% (%s of %s, %s)\n", p.file, 100*p.done/max(p.size, 1), humanBytes(p.done), humanBytes(p.size), p.rate())
		}
	case hub.Finished:
		p.settled += e.Size
		p.file = ""
		p.line("  done %s (%s, %s)", e.File, humanBytes(e.Size), p.rate())
	}
}

// rate is the current file's download speed.
func (p *pullProgress) rate() string {
	secs := time.Since(p.began).Seconds()
	if secs <= 0 {
		return "-"
	}
	return humanBytes(int64(float64(p.done-p.resumed)/secs)) + "/s"
}

// line prints a line: on a terminal only the files downloaded (above the status line).
func (p *pullProgress) line(format string, args ...any) {
	if !p.tty {
		fmt.Fprintf(p.w, format+"\n", args...)
		return
	}
	if strings.Contains(format, "is in the cache") {
		return
	}
	p.clear()
	fmt.Fprintf(p.w, format+"\n", args...)
	if p.file != "" {
		p.draw()
	}
}

func (p *pullProgress) draw() {
	now := p.settled + p.done
	filled := 0
	if p.total > 0 {
		filled = int(min(int64(barWidth), int64(barWidth)*now/p.total))
	}
	fmt.Fprintf(p.w, "\r\x1b[2K%s [%s%s] %d%% %s of %s  %s  %s", p.name, strings.Repeat("=", filled), strings.Repeat(" ", barWidth-filled),
		100*now/max(p.total, 1), humanBytes(now), humanBytes(p.total), p.rate(), p.file)
	p.shown = true
}

// clear removes the status line.
func (p *pullProgress) clear() {
	if p.shown {
		fmt.Fprint(p.w, "\r\x1b[2K")
		p.shown = false
	}
}

// humanBytes writes n in B, KB, MB, GB or TB (powers of 1000, as the Hub shows sizes).
func humanBytes(n int64) string {
	const unit = 1000
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 3; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %cB", float64(n)/float64(div), "KMGT"[exp])
}
