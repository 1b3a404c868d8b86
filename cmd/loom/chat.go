package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/loom-ml/loom/chattemplate"
	"github.com/loom-ml/loom/engine"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tokenizer"
)

func newChatCmd() *cobra.Command {
	var (
		dir       string
		system    string
		maxTokens int
		params    sample.Params
		seed      int64
		ef        engineFlags
	)
	cmd := &cobra.Command{
		Use:   "chat",
		Short: "Chat with a model in the terminal, the reply streaming as it is generated",
		Long: `Loads a model and reads your messages line by line, rendering the conversation with the model's
chat template and streaming each reply as it is generated. Commands: /reset forgets the
conversation, /exit (or end of input) quits.`,
		Example: `  loom chat --model testdata/tiny-qwen2 --temperature 0.7`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := resolveModels(&dir); err != nil {
				return err
			}
			if cmd.Flags().Changed("seed") {
				params.Seed, params.HasSeed = seed, true
			}
			if err := params.Validate(); err != nil {
				return err
			}
			if maxTokens < 1 {
				return fmt.Errorf("--max-tokens must be at least 1, got %d", maxTokens)
			}
			tok, err := tokenizer.LoadDir(dir)
			if err != nil {
				return err
			}
			tmpl, err := chattemplate.Load(dir)
			if err != nil {
				return err
			}
			m, eng, done, err := ef.start(cmd, dir, true, 0, 0)
			if err != nil {
				return err
			}
			defer done()
			defer eng.Close()
			c := &chatSession{
				eng: eng, tok: tok, tmpl: tmpl, params: params, maxTokens: maxTokens,
				ctxLen: m.Config.MaxPositionEmbeddings, system: system,
				out: cmd.OutOrStdout(), interactive: isTerminal(cmd.InOrStdin()) && isTerminal(cmd.OutOrStdout()),
			}
			return c.run(cmd.Context(), cmd.InOrStdin())
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "model", "", modelUsage)
	f.StringVar(&system, "system", "", "system message that opens the conversation")
	f.IntVar(&maxTokens, "max-tokens", 512, "most tokens of a reply")
	f.Float64Var(&params.Temperature, "temperature", 0.7, "sampling temperature (0: greedy)")
	f.Float64Var(&params.TopP, "top-p", 0.9, "nucleus sampling: keep the most likely tokens up to this probability")
	f.IntVar(&params.TopK, "top-k", 0, "keep the K most likely tokens (0: all)")
	f.Float64Var(&params.MinP, "min-p", 0, "drop tokens below this fraction of the top token's probability")
	f.Float64Var(&params.RepetitionPenalty, "repetition-penalty", 0, "penalty of tokens seen before (1 or 0: none)")
	f.Int64Var(&seed, "seed", 0, "random seed, for reproducible replies")
	ef.register(cmd)
	_ = cmd.MarkFlagRequired("model")
	return cmd
}

// chatSession is one conversation in the terminal.
type chatSession struct {
	eng         *engine.Engine
	tok         *tokenizer.Tokenizer
	tmpl        *chattemplate.Template
	params      sample.Params
	maxTokens   int
	ctxLen      int
	system      string
	out         io.Writer
	interactive bool
	history     []chattemplate.Message
}

func (c *chatSession) reset() {
	c.history = c.history[:0]
	if c.system != "" {
		c.history = append(c.history, chattemplate.Message{Role: "system", Content: c.system})
	}
}

// run reads lines until /exit, the end of input or ctx's end.
func (c *chatSession) run(ctx context.Context, in io.Reader) error {
	c.reset()
	lines := make(chan string)
	readErr := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(in)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-ctx.Done():
				return
			}
		}
		readErr <- sc.Err()
		close(lines)
	}()
	if c.interactive {
		fmt.Fprintln(c.out, "Type a message; /reset starts over, /exit quits.")
	}
	for {
		if c.interactive {
			fmt.Fprint(c.out, ">>> ")
		}
		var line string
		var ok bool
		select {
		case line, ok = <-lines:
		case <-ctx.Done():
			fmt.Fprintln(c.out)
			return nil
		}
		if !ok {
			if c.interactive {
				fmt.Fprintln(c.out)
			}
			if err := <-readErr; err != nil {
				return fmt.Errorf("read input: %w", err)
			}
			return nil
		}
		switch line = strings.TrimSpace(line); line {
		case "":
			continue
		case "/exit", "/quit", "/bye":
			return nil
		case "/reset", "/clear":
			c.reset()
			fmt.Fprintln(c.out, "(conversation cleared)")
			continue
		}
		if err := c.turn(ctx, line); err != nil {
			if ctx.Err() != nil {
				fmt.Fprintln(c.out)
				return nil
			}
			return err
		}
	}
}

// turn answers one user message, streaming the reply to out.
func (c *chatSession) turn(ctx context.Context, text string) error {
	msgs := append(slices.Clone(c.history), chattemplate.Message{Role: "user", Content: text})
	prompt, err := c.tmpl.Render(msgs, true)
	if err != nil {
		return err
	}
	ids, err := c.tok.Encode(prompt, false)
	if err != nil {
		return err
	}
	room := c.ctxLen - len(ids)
	if c.ctxLen > 0 && room < 1 {
		fmt.Fprintf(c.out, "(the conversation has %d tokens, the model's context %d; /reset to start over)\n", len(ids), c.ctxLen)
		return nil
	}
	maxTokens := c.maxTokens
	if c.ctxLen > 0 {
		maxTokens = min(maxTokens, room)
	}
	reqCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.eng.Submit(reqCtx, engine.Request{Prompt: ids, MaxTokens: maxTokens, Sampling: c.params})
	if err != nil {
		return err
	}
	dec := c.tok.NewStream(tokenizer.SkipSpecialTokens())
	var reply strings.Builder
	write := func(s string) error {
		reply.WriteString(s)
		_, err := io.WriteString(c.out, s)
		return err
	}
	for {
		ev, err := st.Recv(ctx)
		if err != nil {
			return err
		}
		switch ev.Finish {
		case engine.FinishCancelled:
			return ctx.Err()
		case engine.FinishError:
			return fmt.Errorf("generate: %w", ev.Err)
		}
		if ev.Finish != engine.FinishStop {
			// A token outside the tokenizer's vocabulary (the model's may be larger) has no text.
			piece, _ := dec.Next(ev.Token)
			if err := write(piece); err != nil {
				return err
			}
		}
		if ev.Finish == engine.FinishNone {
			continue
		}
		if err := write(dec.Flush()); err != nil {
			return err
		}
		if ev.Finish == engine.FinishLength {
			fmt.Fprint(c.out, " [reply cut at --max-tokens]")
		}
		fmt.Fprintln(c.out)
		c.history = append(msgs, chattemplate.Message{Role: "assistant", Content: reply.String()})
		return nil
	}
}
