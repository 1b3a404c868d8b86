package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/loom-ml/loom/bench"
	"github.com/loom-ml/loom/chattemplate"
	"github.com/loom-ml/loom/engine"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tokenizer"
)

func newBenchCmd() *cobra.Command {
	var (
		url, servedModel, apiKey string
		dir, tokDir, dataset     string
		endpoint                 string
		inputLen, outputLen      int
		numRequests, concurrency int
		warmup                   int
		rate, temperature        float64
		seed                     uint64
		ignoreEOS, asJSON        bool
		output, baseline         string
		timeout                  time.Duration
		ef                       engineFlags
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure throughput and latency of a server (or of an in-process engine) under load",
		Long: `Sends a workload to an OpenAI-compatible server (--url: Loom's or any other) or, with --model
and no --url, to an engine in this process, and reports requests/s, tokens/s, time to first
token, inter-token latency, time per output token and end-to-end latency (mean, p50, p90, p99).

The workload is synthetic (--num-requests prompts of --input-len tokens, each generating
--output-len tokens) or a JSONL --dataset (one {"prompt"|"prompt_ids"|"messages", "max_tokens"}
object per line). Synthetic prompts are random token ids when a tokenizer is at hand (--tokenizer,
or --model), so their length is exact; otherwise they are text of about --input-len words.
Requests go at --concurrency at most, and at --rate per second (Poisson arrivals) when set.

The report is a table, or JSON with --json; --output also writes the JSON to a file, and
--baseline FILE compares each figure with an earlier JSON result and prints the ratio.`,
		Example: `  loom serve --model /tmp/qwen --port 8000 &
  loom bench --url http://127.0.0.1:8000 --tokenizer /tmp/qwen --input-len 128 --output-len 64 --concurrency 4 --output run.json
  loom bench --model testdata/tiny-llama --num-requests 16 --concurrency 4 --baseline run.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if err := resolveModels(&dir, &tokDir); err != nil {
				return err
			}
			if url == "" && dir == "" {
				return errors.New("give --url (a running server) or --model (an in-process engine)")
			}
			if endpoint != "completions" && endpoint != "chat" {
				return fmt.Errorf("--endpoint must be completions or chat, got %q", endpoint)
			}
			chat := endpoint == "chat"
			if tokDir == "" {
				tokDir = dir
			}
			var tok *tokenizer.Tokenizer
			if tokDir != "" {
				var err error
				if tok, err = tokenizer.LoadDir(tokDir); err != nil {
					return err
				}
			}
			var base *bench.Result
			if baseline != "" {
				var err error
				if base, err = bench.LoadResult(baseline); err != nil {
					return fmt.Errorf("--baseline: %w", err)
				}
			}

			var target bench.Target
			var inProcess *engine.Engine // the engine, when it runs in this process
			vocab := 0
			if tok != nil {
				vocab = tok.VocabSize()
			}
			if url != "" {
				root := strings.TrimRight(url, "/")
				if !strings.HasSuffix(root, "/v1") {
					root += "/v1"
				}
				client := &http.Client{Timeout: timeout}
				if servedModel == "" {
					models, err := bench.Models(ctx, client, root)
					if err != nil {
						return err
					}
					if len(models) == 0 {
						return fmt.Errorf("%s/models lists no model; give --served-model", root)
					}
					servedModel = models[0]
				}
				if apiKey == "" {
					apiKey = os.Getenv("OPENAI_API_KEY")
				}
				target = &bench.OpenAI{BaseURL: root, Model: servedModel, Chat: chat, IgnoreEOS: ignoreEOS,
					Temperature: temperature, APIKey: apiKey, Client: client}
			} else {
				m, eng, done, err := ef.start(cmd, dir, true, 0, 0)
				if err != nil {
					return err
				}
				defer done()
				defer eng.Close()
				inProcess = eng
				et := &engineTarget{eng: eng, tok: tok, name: "in-process engine on " + dir,
					params: sample.Params{Temperature: temperature}, ignoreEOS: ignoreEOS}
				if chat {
					if et.tmpl, err = chattemplate.Load(dir); err != nil {
						return err
					}
				}
				vocab = min(vocab, m.Config.VocabSize)
				target = et
			}

			workload, err := benchWorkload(dataset, numRequests, inputLen, outputLen, vocab, tok, chat, seed)
			if err != nil {
				return err
			}
			if warmup > 0 {
				// Unmeasured requests first: kernels compile, CUDA graphs are captured.
				warm, err := warmupRequests(dataset, workload, warmup, inputLen, outputLen, vocab, tok, chat, seed)
				if err != nil {
					return err
				}
				slog.Info("warming up", "requests", warmup)
				if _, err := bench.Run(ctx, target, warm, bench.Config{Concurrency: concurrency, Seed: seed}); err != nil {
					return fmt.Errorf("warm-up: %w", err)
				}
				if inProcess != nil {
					inProcess.ResetStats()
				}
			}
			slog.Info("benchmark", "target", target.Name(), "requests", len(workload), "concurrency", concurrency, "rate", rate)
			res, err := bench.Run(ctx, target, workload, bench.Config{Concurrency: concurrency, Rate: rate, Seed: seed})
			if err != nil && res == nil {
				return err
			}
			if err != nil {
				slog.Warn("benchmark stopped early; reporting the requests that finished", "err", err)
			}
			out := cmd.OutOrStdout()
			if output != "" {
				f, ferr := os.Create(output)
				if ferr != nil {
					return fmt.Errorf("--output: %w", ferr)
				}
				if werr := res.WriteJSON(f); werr != nil {
					f.Close()
					return fmt.Errorf("--output: %w", werr)
				}
				if cerr := f.Close(); cerr != nil {
					return fmt.Errorf("--output: %w", cerr)
				}
			}
			if asJSON {
				if err := res.WriteJSON(out); err != nil {
					return err
				}
			} else if err := res.WriteTable(out); err != nil {
				return err
			} else if inProcess != nil {
				st := inProcess.Stats()
				if n := float64(st.TimedSteps); n > 0 {
					gpu := ""
					if st.DeviceSeconds > 0 {
						gpu = fmt.Sprintf(" (GPU %.2f ms)", 1e3*st.DeviceSeconds/n)
					}
					fmt.Fprintf(out, "\nengine: %d steps (%d launched ahead of their tokens in all), %.2f ms each: model %.2f ms%s, sampling %.2f ms, other %.2f ms\n",
						st.TimedSteps, st.AheadStepsTotal, 1e3*st.StepSeconds/n, 1e3*st.ModelSeconds/n, gpu, 1e3*st.SampleSeconds/n, 1e3*(st.StepSeconds-st.ModelSeconds-st.SampleSeconds)/n)
				}
			}
			if base != nil {
				fmt.Fprintf(out, "\ncompared with %s:\n", baseline)
				if err := bench.WriteComparison(out, res, base); err != nil {
					return err
				}
			}
			if res.Requests == 0 {
				return fmt.Errorf("all %d requests failed", res.Failed)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&url, "url", "", "base URL of an OpenAI-compatible server, such as http://127.0.0.1:8000")
	f.StringVar(&servedModel, "served-model", "", "model name sent to the server (default: the first of GET /v1/models)")
	f.StringVar(&apiKey, "api-key", "", "API key for the server (default: $OPENAI_API_KEY)")
	f.StringVar(&dir, "model", "", modelUsage+": without --url, benchmark an engine in this process")
	f.StringVar(&tokDir, "tokenizer", "", "directory or Hugging Face name with the server's tokenizer, for synthetic prompts of exact lengths (default: --model)")
	f.StringVar(&dataset, "dataset", "", "JSONL file of requests instead of synthetic prompts")
	f.StringVar(&endpoint, "endpoint", "completions", "API to load: completions or chat")
	f.IntVar(&inputLen, "input-len", 128, "prompt tokens of synthetic requests")
	f.IntVar(&outputLen, "output-len", 128, "tokens to generate per request (dataset lines may set their own)")
	f.IntVar(&numRequests, "num-requests", 32, "number of requests")
	f.IntVar(&warmup, "warmup", 0, "requests sent first, at --concurrency, and left out of the report (kernels compile, CUDA graphs are captured)")
	f.IntVar(&concurrency, "concurrency", 4, "most requests in flight at once (0 with --rate: no limit)")
	f.Float64Var(&rate, "rate", 0, "requests started per second, Poisson arrivals (0: as fast as --concurrency allows)")
	f.Float64Var(&temperature, "temperature", 0, "sampling temperature of the requests")
	f.Uint64Var(&seed, "seed", 0, "seed of the synthetic prompts and the arrival times")
	f.BoolVar(&ignoreEOS, "ignore-eos", true, "ask for exactly the requested output lengths (the ignore_eos extension)")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON instead of a table")
	f.StringVar(&output, "output", "", "also write the JSON result to this file")
	f.StringVar(&baseline, "baseline", "", "earlier JSON result to compare with (ratios current/baseline)")
	f.DurationVar(&timeout, "request-timeout", 10*time.Minute, "time limit of one HTTP request")
	ef.register(cmd)
	return cmd
}

// benchWorkload makes the measured requests: n lines of the dataset, or n synthetic prompts
// of inputLen tokens (token ids drawn from the vocabulary when the tokenizer is known, as text
// for the chat endpoint; else common words).
func benchWorkload(dataset string, n, inputLen, outputLen, vocab int, tok *tokenizer.Tokenizer, chat bool, seed uint64) ([]bench.Request, error) {
	switch {
	case dataset != "":
		return bench.LoadJSONL(dataset, n, outputLen)
	case tok != nil:
		reqs, err := bench.Synthetic(n, inputLen, outputLen, vocab, tok.IsSpecial, seed)
		if err == nil && chat {
			err = idsToText(reqs, tok)
		}
		return reqs, err
	default:
		return bench.SyntheticText(n, inputLen, outputLen, seed)
	}
}

// warmupSeed derives the seed of the warm-up prompts from the workload's, so that the two
// share no prompt.
const warmupSeed = 0x7761726d

// warmupRequests makes n warm-up requests that share no prompt with the measured workload: a
// server with prefix caching would otherwise answer the measured requests from the warm-up's
// cached blocks and report a time to first token that no new prompt gets. Synthetic workloads
// get other synthetic prompts of the same lengths; a dataset gets synthetic prompts of
// inputLen tokens when the tokenizer is known, else its own first lines (with a warning).
func warmupRequests(dataset string, workload []bench.Request, n, inputLen, outputLen, vocab int, tok *tokenizer.Tokenizer, chat bool, seed uint64) ([]bench.Request, error) {
	if dataset != "" && tok == nil {
		slog.Warn("warming up with the dataset's own requests (no tokenizer for synthetic ones): a server with prefix caching serves the measured ones' shared prefixes from its cache")
		warm := make([]bench.Request, n)
		for i := range warm {
			warm[i] = workload[i%len(workload)]
		}
		return warm, nil
	}
	return benchWorkload("", n, inputLen, outputLen, vocab, tok, chat, seed^warmupSeed)
}

// idsToText turns token-id prompts into their text, for the chat endpoint.
func idsToText(reqs []bench.Request, tok *tokenizer.Tokenizer) error {
	for i := range reqs {
		text, err := tok.Decode(reqs[i].PromptIDs, true)
		if err != nil {
			return err
		}
		reqs[i].Prompt, reqs[i].PromptIDs = text, nil
	}
	return nil
}

// engineTarget runs benchmark requests on an engine in this process.
type engineTarget struct {
	eng       *engine.Engine
	tok       *tokenizer.Tokenizer
	tmpl      *chattemplate.Template // for chat requests
	name      string
	params    sample.Params
	ignoreEOS bool
}

func (t *engineTarget) Name() string { return t.name }

// prompt returns a request's token ids.
func (t *engineTarget) prompt(r bench.Request) ([]int, error) {
	switch {
	case r.PromptIDs != nil:
		return r.PromptIDs, nil
	case r.Messages != nil || t.tmpl != nil:
		if t.tmpl == nil {
			return nil, errors.New("chat messages need --endpoint chat")
		}
		msgs := make([]chattemplate.Message, len(r.Messages))
		for i, m := range r.Messages {
			msgs[i] = chattemplate.Message{Role: m.Role, Content: m.Content}
		}
		if r.Messages == nil {
			msgs = []chattemplate.Message{{Role: "user", Content: r.Prompt}}
		}
		text, err := t.tmpl.Render(msgs, true)
		if err != nil {
			return nil, err
		}
		return t.tok.Encode(text, false)
	}
	return t.tok.Encode(r.Prompt, true)
}

// Do implements bench.Target: it times each generated token as the engine delivers it.
func (t *engineTarget) Do(ctx context.Context, r bench.Request) (s bench.Sample) {
	ids, err := t.prompt(r)
	if err != nil {
		s.Err = err
		return s
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	st, err := t.eng.Submit(ctx, engine.Request{Prompt: ids, MaxTokens: r.MaxTokens, Sampling: t.params, IgnoreEOS: t.ignoreEOS})
	if err != nil {
		s.Err = err
		return s
	}
	s.PromptTokens = len(ids)
	for {
		ev, err := st.Recv(ctx)
		if err != nil {
			s.Err = err
			return s
		}
		switch ev.Finish {
		case engine.FinishCancelled:
			s.Err = context.Canceled
			return s
		case engine.FinishError:
			s.Err = ev.Err
			return s
		}
		now := time.Now()
		s.Arrived(start, now)
		s.OutputTokens++
		if ev.Finish != engine.FinishNone {
			s.Latency = now.Sub(start)
			return s
		}
	}
}
