package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/chattemplate"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/engine"
	"github.com/loom-ml/loom/model"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tokenizer"
	"github.com/loom-ml/loom/transform"
)

// generateFlags are loom generate's settings.
type generateFlags struct {
	dir        string
	prompt     string
	promptIDs  string
	system     string
	chat       bool
	maxNew     int
	asJSON     bool
	withLogits bool
	noOptimize bool
	transforms transform.Flags
	ranks      meshFlags
	device     string
	params     sample.Params
	seed       int64
}

func newGenerateCmd() *cobra.Command {
	var g generateFlags
	cmd := &cobra.Command{
		Use:   "generate",
		Short: "Generate tokens from a prompt through the engine, streaming them as they come",
		Long: `Generates tokens from a prompt given as token ids (--prompt-ids) or as text (--prompt, encoded
with the tokenizer's special tokens; with --system or --chat rendered first with the model's
chat template as one user message, after the system message). The tokens come from the engine
that loom serve runs (the paged KV cache: each step computes only the new token), greedily by
default or sampled with --temperature, --top-p, --top-k and --seed.

With --prompt the new text streams to stdout as it is generated, up to the first
end-of-sequence token. With --prompt-ids the new ids stream, comma-separated, and with --json
one object {"ids": [...]} is printed at the end; these two give exactly --max-new-tokens ids
(end-of-sequence tokens included, as a reference continuation is written). --no-optimize runs
the plain graph instead (the reference: the whole sequence is computed again for every token,
greedy only).`,
		Example: `  loom generate --model testdata/tiny-llama --prompt-ids 0,56,76 --max-new-tokens 8 --json
  loom generate --model testdata/tiny-llama --prompt "The quick brown fox" --max-new-tokens 8
  loom generate --model testdata/tiny-qwen2 --system "You are terse." --prompt "Hi" --temperature 0.7 --seed 1`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := resolveModels(&g.dir); err != nil {
				return err
			}
			if cmd.Flags().Changed("seed") {
				g.params.Seed, g.params.HasSeed = g.seed, true
			}
			g.chat = g.chat || cmd.Flags().Changed("system")
			return g.run(cmd)
		},
	}
	f := cmd.Flags()
	f.StringVar(&g.dir, "model", "", modelUsage)
	f.StringVar(&g.prompt, "prompt", "", "prompt as text, encoded with the tokenizer's special tokens")
	f.StringVar(&g.promptIDs, "prompt-ids", "", "prompt as comma-separated token ids, e.g. 0,1,2")
	f.StringVar(&g.system, "system", "", "system message: render --prompt with the model's chat template, after this system message")
	f.BoolVar(&g.chat, "chat", false, "render --prompt with the model's chat template as one user message (implied by --system)")
	f.IntVar(&g.maxNew, "max-new-tokens", 16, "most tokens to generate (the prompt plus these must fit the model's context)")
	f.BoolVar(&g.asJSON, "json", false, `print one JSON object {"ids": [...], "logits": [...]} on stdout`)
	f.BoolVar(&g.withLogits, "logits", false, "with --json: include the full-vocabulary logits of the last prompt position")
	f.BoolVar(&g.noOptimize, "no-optimize", false, "run the plain graph, without the transform pipeline (greedy, the whole sequence recomputed per token)")
	f.StringVar(&g.device, "device", "auto", "where the model runs: auto (CUDA when a GPU can be used, else the CPU), cpu or cuda")
	f.Float64Var(&g.params.Temperature, "temperature", 0, "sampling temperature (0: greedy)")
	f.Float64Var(&g.params.TopP, "top-p", 0, "nucleus sampling: keep the most likely tokens up to this probability (0 or 1: all)")
	f.IntVar(&g.params.TopK, "top-k", 0, "keep the K most likely tokens (0: all)")
	f.Float64Var(&g.params.MinP, "min-p", 0, "drop tokens below this fraction of the top token's probability")
	f.Float64Var(&g.params.RepetitionPenalty, "repetition-penalty", 0, "penalty of tokens seen before (1 or 0: none)")
	f.Int64Var(&g.seed, "seed", 0, "random seed, for reproducible sampling")
	addTransformFlags(cmd, &g.transforms)
	addMeshFlags(cmd, &g.ranks)
	_ = cmd.MarkFlagRequired("model")
	cmd.MarkFlagsOneRequired("prompt", "prompt-ids")
	cmd.MarkFlagsMutuallyExclusive("prompt", "prompt-ids")
	return cmd
}

// run checks the flags and the prompt against the model's config (before any weight is
// read), loads the model and generates.
func (g *generateFlags) run(cmd *cobra.Command) error {
	if g.maxNew < 0 {
		return fmt.Errorf("--max-new-tokens must be >= 0, got %d", g.maxNew)
	}
	if err := g.params.Validate(); err != nil {
		return err
	}
	if g.noOptimize && !g.params.Greedy() {
		return fmt.Errorf("--no-optimize runs the plain graph greedily (the reference); drop --temperature or --no-optimize")
	}
	if g.withLogits && !g.asJSON {
		return fmt.Errorf("--logits needs --json")
	}
	cfg, err := model.LoadConfig(filepath.Join(g.dir, "config.json"))
	if err != nil {
		return fmt.Errorf("--model: %w", err)
	}
	ids, tok, err := g.promptTokens(cmd)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if id >= cfg.VocabSize {
			return fmt.Errorf("prompt: token id %d is outside the vocabulary (size %d)", id, cfg.VocabSize)
		}
	}
	if ctxLen := cfg.MaxPositionEmbeddings; ctxLen > 0 && (len(ids) >= ctxLen || g.maxNew > ctxLen-len(ids)) {
		return fmt.Errorf("--max-new-tokens %d: the prompt's %d tokens and %d new ones do not fit the model's context of %d tokens (max_position_embeddings); at most %d new tokens fit",
			g.maxNew, len(ids), g.maxNew, ctxLen, max(ctxLen-len(ids), 0))
	}
	mesh, err := g.ranks.resolve()
	if err != nil {
		return err
	}
	dev, err := pickDevice(g.device, g.noOptimize, mesh, g.ranks.distBackend)
	if err != nil {
		return err
	}
	opts := engine.LoadOptions{
		Device: dev.Name(), Optimize: !g.noOptimize,
		Transforms: g.transforms, Mesh: mesh, DistBackend: g.ranks.distBackend,
	}
	if err := withProcessEnv(&opts, dev); err != nil {
		return err
	}
	m, err := loadWithProgress(cmd, g.dir, opts)
	if err != nil {
		return err
	}
	if m.Follower() {
		return follow(m)
	}
	defer m.Close()
	out := newGenOutput(cmd.OutOrStdout(), tok, g.asJSON, m.EOSTokenIDs())
	if g.noOptimize {
		// The plain graph has no KV cache: the reference, the whole sequence run per token.
		res, err := engine.GreedyRecompute(cmd.Context(), m.Executable(), ids, g.maxNew)
		if err != nil {
			return err
		}
		for _, id := range res.NewIDs {
			if err := out.token(id); err != nil {
				return err
			}
		}
		return out.finish(res.PromptLogits, g.withLogits)
	}
	var logits []float32
	if g.withLogits {
		// One prefill of the prompt over a fresh cache, before the engine owns the program.
		res, err := engine.GreedyRecompute(cmd.Context(), m.Executable(), ids, 0)
		if err != nil {
			return fmt.Errorf("--logits: %w", err)
		}
		logits = res.PromptLogits
	}
	if g.maxNew == 0 {
		return out.finish(logits, g.withLogits)
	}
	return g.stream(cmd.Context(), m, ids, out, logits)
}

// promptTokens reads the prompt: ids as given, or the text (through the chat template with
// --chat or --system) encoded by the model's tokenizer, which it returns too.
func (g *generateFlags) promptTokens(cmd *cobra.Command) ([]int, *tokenizer.Tokenizer, error) {
	if !cmd.Flags().Changed("prompt") {
		if g.chat {
			return nil, nil, fmt.Errorf("--system and --chat render a text prompt: use --prompt instead of --prompt-ids")
		}
		ids, err := parseIDs(g.promptIDs)
		if err != nil {
			return nil, nil, fmt.Errorf("--prompt-ids: %w", err)
		}
		return ids, nil, nil
	}
	tok, err := tokenizer.LoadDir(g.dir)
	if err != nil {
		return nil, nil, err
	}
	text, special := g.prompt, true
	if g.chat {
		tmpl, err := chattemplate.Load(g.dir)
		if errors.Is(err, chattemplate.ErrNoTemplate) {
			return nil, nil, fmt.Errorf("--system/--chat: %s has no chat template (tokenizer_config.json chat_template or chat_template.jinja); drop --system and --chat to use the prompt as it is", g.dir)
		}
		if err != nil {
			return nil, nil, err
		}
		var msgs []chattemplate.Message
		if g.system != "" {
			msgs = append(msgs, chattemplate.Message{Role: "system", Content: g.system})
		}
		msgs = append(msgs, chattemplate.Message{Role: "user", Content: g.prompt})
		if text, err = tmpl.Render(msgs, true); err != nil {
			return nil, nil, fmt.Errorf("--system/--chat: chat template: %w", err)
		}
		special = false // the template wrote the special tokens it wants
	}
	ids, err := tok.Encode(text, special)
	if err != nil {
		return nil, nil, fmt.Errorf("--prompt: %w", err)
	}
	if len(ids) == 0 {
		return nil, nil, fmt.Errorf("--prompt: the prompt has no tokens")
	}
	return ids, tok, nil
}

// stream runs the prompt through an engine on m and hands each new token to out as it comes,
// then finishes out (before the engine stops). Text output stops at an end-of-sequence token;
// ids stop only at --max-new-tokens.
func (g *generateFlags) stream(ctx context.Context, m *engine.Model, ids []int, out *genOutput, logits []float32) error {
	eopts := engine.Options{MaxBatch: 1}
	if layout, err := engine.CacheLayout(m.Graph); err == nil && layout.Cache.BlockSize > 0 {
		// Blocks for this one sequence (and one spare), not the default cache of many.
		eopts.KVBlocks = (len(ids)+g.maxNew+layout.Cache.BlockSize-1)/layout.Cache.BlockSize + 1
	}
	// The engine outlives ctx, so that an interrupt cancels the request and the engine drains.
	eng, err := engine.New(context.WithoutCancel(ctx), m, eopts)
	if err != nil {
		return err
	}
	defer eng.Close()
	st, err := eng.Submit(ctx, engine.Request{Prompt: ids, MaxTokens: g.maxNew, Sampling: g.params, IgnoreEOS: !out.text()})
	if err != nil {
		return err
	}
	for {
		ev, err := st.Recv(ctx)
		if err != nil {
			return err
		}
		switch ev.Finish {
		case engine.FinishCancelled:
			return context.Cause(ctx)
		case engine.FinishError:
			return fmt.Errorf("generate: %w", ev.Err)
		case engine.FinishNone, engine.FinishLength:
			if err := out.token(ev.Token); err != nil {
				return err
			}
		}
		if ev.Finish != engine.FinishNone {
			return out.finish(logits, g.withLogits)
		}
	}
}

// genOutput writes generated tokens to stdout: text as it is decoded (--prompt), ids as they
// come (--prompt-ids), or one JSON object at the end (--json).
type genOutput struct {
	w       io.Writer
	asJSON  bool
	eos     []int
	dec     *tokenizer.Stream // nil: ids
	ids     []int
	unknown int  // ids the tokenizer does not know (a model's vocabulary may be larger)
	stopped bool // text: an end-of-sequence id came
}

func newGenOutput(w io.Writer, tok *tokenizer.Tokenizer, asJSON bool, eos []int) *genOutput {
	o := &genOutput{w: w, asJSON: asJSON, eos: eos}
	if tok != nil && !asJSON {
		o.dec = tok.NewStream(tokenizer.SkipSpecialTokens())
	}
	return o
}

// text reports whether the output is text (which ends at an end-of-sequence token).
func (o *genOutput) text() bool { return o.dec != nil }

func (o *genOutput) token(id int) error {
	if o.stopped {
		return nil
	}
	o.ids = append(o.ids, id)
	switch {
	case o.asJSON:
		return nil
	case o.dec == nil:
		sep := ","
		if len(o.ids) == 1 {
			sep = ""
		}
		_, err := fmt.Fprint(o.w, sep+strconv.Itoa(id))
		return err
	}
	for _, e := range o.eos {
		if id == e {
			o.stopped = true
			return nil
		}
	}
	piece, err := o.dec.Next(id)
	if err != nil {
		o.unknown++ // no text: the id is outside the tokenizer's vocabulary
		return nil
	}
	_, err = io.WriteString(o.w, piece)
	return err
}

// finish ends the output: the rest of the text and a newline, or the JSON object.
func (o *genOutput) finish(logits []float32, withLogits bool) error {
	if o.unknown > 0 {
		slog.Warn("generated token ids not in the tokenizer's vocabulary; left out of the text", "count", o.unknown)
	}
	if !o.asJSON {
		tail := "\n"
		if o.dec != nil {
			tail = o.dec.Flush() + "\n"
		}
		_, err := io.WriteString(o.w, tail)
		return err
	}
	obj := struct {
		IDs    []int     `json:"ids"`
		Logits []float32 `json:"logits,omitempty"`
	}{IDs: o.ids}
	if obj.IDs == nil {
		obj.IDs = []int{}
	}
	if withLogits {
		obj.Logits = logits
	}
	return json.NewEncoder(o.w).Encode(obj)
}

// pickDevice resolves --device (backend.Resolve, the one device resolver) and logs the
// device picked and why. auto takes the CPU for what the CUDA backend does not run: the
// plain graph (--no-optimize), meshes of more ranks than the machine has GPUs, the local
// communicator; --device cuda with the plain graph, or without a usable GPU, or with too
// few GPUs for the mesh, is an error.
func pickDevice(flag string, noOptimize bool, mesh dist.Mesh, distBackend string) (backend.Backend, error) {
	b, reason, err := backend.Resolve(flag, backend.Needs{Mesh: mesh, PlainGraph: noOptimize, DistBackend: distBackend})
	if errors.Is(err, backend.ErrPlainGraph) {
		return nil, fmt.Errorf("--device: %w; drop --no-optimize", err)
	}
	if err != nil {
		return nil, fmt.Errorf("--device: %w", err)
	}
	slog.Info("device picked", "device", b.Name(), "reason", reason)
	return b, nil
}

// parseIDs reads "0,1,2" into token ids.
func parseIDs(s string) ([]int, error) {
	var ids []int
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		id, err := strconv.Atoi(part)
		if err != nil || id < 0 {
			return nil, fmt.Errorf("%q is not a token id", part)
		}
		ids = append(ids, id)
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("no token ids in %q", s)
	}
	return ids, nil
}
