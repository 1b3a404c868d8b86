package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/chattemplate"
	"github.com/loom-ml/loom/engine"
	"github.com/loom-ml/loom/model"
	"github.com/loom-ml/loom/server"
	"github.com/loom-ml/loom/tensor"
	"github.com/loom-ml/loom/tokenizer"
	"github.com/loom-ml/loom/transform"
)

// engineFlags are the runtime settings that serve, chat and bench share.
type engineFlags struct {
	maxBatch     int
	tokensPerStp int
	kvBlocks     int
	kvCacheBytes int64
	ranks        meshFlags
	noOptimize   bool
	device       string
	dtype        string
	cudaProfile  bool
	syncSteps    bool
	noPrefix     bool
	transforms   transform.Flags
	// maxModelLen, when set, lowers the context the engine serves (serve's --max-model-len).
	maxModelLen int
}

func (e *engineFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.IntVar(&e.maxBatch, "max-batch", 0, "most sequences in one engine step (0: 16 on the CPU; on a GPU 256, logged at start)")
	f.IntVar(&e.tokensPerStp, "max-tokens-per-step", 0, "most tokens one step computes (0: 512 on the CPU; on a GPU 8192, or 2048 with less than 40 GiB free after the weights)")
	f.IntVar(&e.kvBlocks, "kv-blocks", 0, "KV cache blocks (0: from --kv-cache-bytes)")
	f.Int64Var(&e.kvCacheBytes, "kv-cache-bytes", 0, "KV cache memory budget in bytes per rank (0: on the CPU max-batch full-context sequences, at most 1 GiB; on CUDA 90% of the GPU memory left after the weights, less 4 GiB)")
	f.BoolVar(&e.noOptimize, "no-optimize", false, "run the plain graph, without the transform pipeline (not servable: the engine needs the paged KV cache)")
	f.StringVar(&e.device, "device", "auto", "where the model runs: auto (CUDA when a GPU can be used, else the CPU), cpu or cuda")
	f.BoolVar(&e.cudaProfile, "cuda-profile", false, "time every CUDA kernel (eagerly, without CUDA graphs) and print the GPU time per op on stderr at the end")
	f.BoolVar(&e.syncSteps, "sync-steps", false, "wait for each step's tokens before queuing the next (by default a decode step is queued while the one before runs on the GPU); for measuring what the overlap gives")
	f.BoolVar(&e.noPrefix, "no-prefix-caching", false, "compute every prompt whole: no sharing of the KV blocks of prompts that start alike (automatic prefix caching is on by default)")
	f.StringVar(&e.dtype, "dtype", "auto", "activation and KV cache dtype: auto (bf16 on CUDA, f32 on the CPU), bf16 or f32")
	addTransformFlags(cmd, &e.transforms)
	addMeshFlags(cmd, &e.ranks)
}

// start loads the model in dir on the device the flags pick and starts an engine on it.
// The caller closes the engine, then calls done to release the model. In a multi-process
// world (WORLD_SIZE > 1, see processEnv) this process loads its own rank only; rank 0 gets
// its engine, the other ranks follow it and exit without returning (see startFollower).
// queueOnFull, maxConcurrent and maxQueue are the engine's admission (engine.Options).
func (e *engineFlags) start(cmd *cobra.Command, dir string, queueOnFull bool, maxConcurrent, maxQueue int) (*model.Model, *engine.Engine, func() error, error) {
	mesh, err := e.ranks.resolve()
	if err != nil {
		return nil, nil, nil, err
	}
	dev, err := pickDevice(e.device, e.noOptimize, mesh, e.ranks.distBackend)
	if err != nil {
		return nil, nil, nil, err
	}
	act, err := activationDType(e.dtype, dev.Name())
	if err != nil {
		return nil, nil, nil, err
	}
	opts := engine.LoadOptions{
		Device: dev.Name(), Optimize: !e.noOptimize, Transforms: e.transforms, Mesh: mesh, DistBackend: e.ranks.distBackend,
		ActivationDType: act, ProfileCUDA: e.cudaProfile,
	}
	eopts := engine.Options{
		MaxBatch: e.maxBatch, MaxTokensPerStep: e.tokensPerStp, KVBlocks: e.kvBlocks, KVCacheBytes: e.kvCacheBytes,
		QueueOnFull: queueOnFull, MaxConcurrent: maxConcurrent, MaxQueue: maxQueue, SyncSteps: e.syncSteps,
		DisablePrefixCaching: e.noPrefix,
	}
	if err := withProcessEnv(&opts, dev); err != nil {
		return nil, nil, nil, err
	}
	m, err := loadWithProgress(cmd, dir, opts)
	if err != nil {
		return nil, nil, nil, err
	}
	if m.Follower() {
		startFollower(cmd, m)
		return nil, nil, nil, errors.New("unreachable: a follower exits")
	}
	if n := e.maxModelLen; n > 0 {
		if n > m.Config.MaxPositionEmbeddings {
			m.Close()
			return nil, nil, nil, fmt.Errorf("--max-model-len %d is more than the model's context, %d (max_position_embeddings)", n, m.Config.MaxPositionEmbeddings)
		}
		// The graph is built; the engine reads the context from here (its checks, and the
		// default KV cache size).
		m.Config.MaxPositionEmbeddings = n
	}
	// The engine outlives the command's context: a signal must let it drain, not kill it.
	eng, err := engine.New(context.WithoutCancel(cmd.Context()), m, eopts)
	if err != nil {
		m.Close()
		return nil, nil, nil, err
	}
	return m.Model, eng, e.closer(cmd, m), nil
}

// closer returns m.Close, preceded with --cuda-profile by printing the GPU time per op of
// the program (backend.Profiler).
func (e *engineFlags) closer(cmd *cobra.Command, m *engine.Model) func() error {
	p, ok := m.Program.(backend.Profiler)
	if !e.cudaProfile || !ok {
		return m.Close
	}
	return func() error {
		printProfile(cmd.ErrOrStderr(), p.OpTimes())
		return m.Close()
	}
}

// printProfile writes the GPU time per op as a table, most time first.
func printProfile(w io.Writer, ops []backend.OpTime) {
	var total time.Duration
	for _, o := range ops {
		total += o.Time
	}
	fmt.Fprintf(w, "\nGPU time per op (eager launches, each timed by events):\n%-36s %8s %12s %10s %6s\n", "op", "calls", "total ms", "mean µs", "share")
	for _, o := range ops {
		fmt.Fprintf(w, "%-36s %8d %12.2f %10.1f %5.1f%%\n", o.Op, o.Calls, o.Time.Seconds()*1e3,
			o.Time.Seconds()*1e6/float64(max(o.Calls, 1)), 100*o.Time.Seconds()/max(total.Seconds(), 1e-12))
	}
}

// activationDType resolves --dtype for the device that runs: auto is bf16 on CUDA (what
// serving engines run; half the memory traffic) and f32 on the CPU (the reference).
func activationDType(flag, dev string) (tensor.DType, error) {
	switch flag {
	case "auto", "":
		if dev == "cuda" {
			return tensor.BF16, nil
		}
		return tensor.F32, nil
	case "bf16":
		return tensor.BF16, nil
	case "f32":
		return tensor.F32, nil
	}
	return tensor.Invalid, fmt.Errorf("--dtype must be auto, bf16 or f32, got %q", flag)
}

func newServeCmd() *cobra.Command {
	var (
		dir             string
		host            string
		port            int
		name            string
		overload        string
		maxQueue        int
		maxConcurrent   int
		defaultMax      int
		shutdownTimeout time.Duration
		chatTemplate    string
		apiKey          string
		allowedOrigins  []string
		maxRequestBytes int64
		maxConns        int
		readTimeout     time.Duration
		writeTimeout    time.Duration
		idleTimeout     time.Duration
		gpuMemUtil      float64
		tpShort         vllmTP
		ef              engineFlags
	)
	cmd := &cobra.Command{
		Use:   "serve [MODEL]",
		Short: "Serve a model over HTTP with the OpenAI API",
		Long: `Loads a model and serves it with an OpenAI-compatible API:

  POST /v1/completions, POST /v1/chat/completions (streaming with "stream": true, n choices)
  GET /v1/models, GET /v1/models/{id}, POST /tokenize, POST /detokenize (vLLM's shapes)
  GET /health, GET /metrics (Prometheus)

The port is bound and the tokenizer and chat template read before the weights load; until
the model is ready GET /health answers 503 {"status": "loading"} and the API 503.

--api-key (or LOOM_API_KEY) makes every route but /health ask for "Authorization: Bearer KEY".
--allowed-origins lets browsers on those origins call the API (CORS).

--overload chooses what happens when the engine is full: "queue" (the default) makes requests
wait, "reject" answers HTTP 429 at once. On SIGTERM or SIGINT the server stops accepting
connections, finishes the requests in flight (up to --shutdown-timeout) and exits; a second
signal, or the timeout, ends the open streams with an error event and [DONE].

vLLM's names of the same settings work too: --tensor-parallel-size and -tp (--world-size),
--max-num-seqs (--max-batch), --max-num-batched-tokens (--max-tokens-per-step),
--max-model-len, --served-model-name, --chat-template. Loom has no --gpu-memory-utilization:
the KV cache takes 90% of the GPU memory free after the weights, less 4 GiB, or
--kv-cache-bytes.`,
		Example: `  loom serve Qwen/Qwen3-0.6B   # from the Hugging Face cache: loom pull Qwen/Qwen3-0.6B first
  loom serve --model testdata/tiny-llama --port 8000
  curl localhost:8000/v1/completions -d '{"prompt": "Hello", "max_tokens": 8}'`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := resolveServeModel(&dir, &name, args); err != nil {
				return err
			}
			if overload != "queue" && overload != "reject" {
				return fmt.Errorf("--overload must be queue or reject, got %q", overload)
			}
			if port < 0 || port > 65535 {
				return fmt.Errorf("--port must be between 0 and 65535, got %d", port)
			}
			if cmd.Flags().Changed("gpu-memory-utilization") {
				return fmt.Errorf("--gpu-memory-utilization %g: Loom has no such setting; the KV cache takes 90%% of the GPU memory free after the weights, less 4 GiB; set its size with --kv-cache-bytes", gpuMemUtil)
			}
			if err := tpShort.apply(cmd, &ef.ranks); err != nil {
				return err
			}
			if ef.maxModelLen < 0 {
				return fmt.Errorf("--max-model-len must be positive, got %d", ef.maxModelLen)
			}
			if apiKey == "" {
				apiKey = os.Getenv("LOOM_API_KEY")
			}
			if _, err := ef.ranks.resolve(); err != nil {
				return err
			}
			queue := overload == "queue"
			env, multi, err := processEnv(os.LookupEnv)
			if err != nil {
				return err
			}
			if multi && env.Rank != 0 {
				// A follower rank serves nothing: it follows rank 0 and exits in start.
				_, _, _, err := ef.start(cmd, dir, queue, maxConcurrent, maxQueue)
				return err
			}

			// What needs no weights comes first: the tokenizer, the chat template, the port.
			cfg, err := server.DirConfig(dir, name)
			if err != nil {
				return err
			}
			if n := ef.maxModelLen; n > 0 {
				if n > cfg.ContextLength {
					return fmt.Errorf("--max-model-len %d is more than the model's context, %d (max_position_embeddings in %s)", n, cfg.ContextLength, filepath.Join(dir, "config.json"))
				}
				cfg.ContextLength = n
			}
			if chatTemplate != "" {
				if cfg.ChatTemplate, err = loadChatTemplate(chatTemplate, dir, cfg.Tokenizer); err != nil {
					return err
				}
			}
			reg := prometheus.NewRegistry()
			for _, c := range []prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
				if err := reg.Register(c); err != nil {
					return fmt.Errorf("metrics: %w", err)
				}
			}
			cfg.Registry = reg
			if defaultMax > 0 {
				cfg.DefaultMaxTokens = defaultMax
			}
			cfg.APIKey, cfg.AllowedOrigins, cfg.MaxBodyBytes, cfg.MaxConnections = apiKey, allowedOrigins, maxRequestBytes, maxConns
			cfg.ReadTimeout, cfg.WriteTimeout, cfg.IdleTimeout = none(readTimeout), none(writeTimeout), none(idleTimeout)
			if maxConns == 0 {
				cfg.MaxConnections = -1
			}
			srv, err := server.NewLoading(cfg)
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
			if err != nil {
				return fmt.Errorf("listen: %w", err)
			}
			url := "http://" + ln.Addr().String() + "/v1"
			served := make(chan error, 1)
			go func() { served <- srv.Serve(ln) }()
			slog.Info("listening", "url", url, "model", cfg.Model, "status", "loading")

			_, eng, done, err := ef.start(cmd, dir, queue, maxConcurrent, maxQueue)
			if err != nil {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = srv.Shutdown(ctx)
				<-served
				return err
			}
			defer done()
			defer eng.Close()
			if err := srv.Ready(server.FromEngine(eng)); err != nil {
				return err
			}
			slog.Info("ready", "url", url, "model", cfg.Model)
			select {
			case err := <-served:
				return err
			case <-cmd.Context().Done():
			}
			ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
			defer cancel()
			sigs := make(chan os.Signal, 1)
			signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
			defer signal.Stop(sigs)
			slog.Info("signal received; finishing the requests in flight (a second signal ends them now)", "timeout", shutdownTimeout)
			go func() {
				select {
				case <-sigs:
					slog.Warn("second signal: ending the open streams now")
					cancel()
				case <-ctx.Done():
				}
			}()
			err = srv.Shutdown(ctx)
			if serr := <-served; serr != nil {
				err = errors.Join(err, serr)
			}
			if err == nil {
				slog.Info("server stopped")
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&dir, "model", "", modelUsage+"; or give it as the argument")
	f.StringVar(&host, "host", "127.0.0.1", "address to listen on")
	f.IntVar(&port, "port", 8000, "port to listen on (0: any free port)")
	f.StringVar(&name, "served-model-name", "", "model name in the API (default: the Hugging Face name given, else the directory's name)")
	f.StringVar(&overload, "overload", "queue", "when the engine is full: queue (wait) or reject (HTTP 429)")
	f.IntVar(&maxQueue, "max-queue", 0, "most requests waiting to start, in the engine's queue or held for a slot of --max-concurrent (0: the engine's default, 1024)")
	f.IntVar(&maxConcurrent, "max-concurrent", 0, "most requests in the engine at once, running or queued (0: no limit); past it requests wait for a slot (--overload queue) or get HTTP 429")
	f.IntVar(&defaultMax, "default-max-tokens", 0, "max_tokens of completion requests that give none (0: 16, as OpenAI)")
	f.DurationVar(&shutdownTimeout, "shutdown-timeout", 5*time.Minute, "how long to wait for requests in flight on SIGTERM")
	f.IntVar(&ef.maxModelLen, "max-model-len", 0, "most tokens of a request, prompt and completion (0: the model's max_position_embeddings); less also sizes a smaller default KV cache")
	f.StringVar(&chatTemplate, "chat-template", "", "chat template: a file, a template's text, or the name of one of the checkpoint's templates (default: the checkpoint's)")
	f.StringVar(&apiKey, "api-key", "", "API key that clients must send as Authorization: Bearer KEY on every route but /health (default: $LOOM_API_KEY; none: no check)")
	f.StringSliceVar(&allowedOrigins, "allowed-origins", nil, "origins that browsers may call the API from, comma-separated, or * for any (CORS; none: no CORS headers)")
	f.Int64Var(&maxRequestBytes, "max-request-bytes", 16<<20, "largest request body in bytes; a text prompt is also bounded by the context, at 32 bytes a token")
	f.IntVar(&maxConns, "max-connections", 1024, "most open connections; one past it gets 503 (0: no limit)")
	f.DurationVar(&readTimeout, "read-timeout", 30*time.Second, "how long a client may take to send a request's headers, and then its body (0: no limit)")
	f.DurationVar(&writeTimeout, "write-timeout", 60*time.Second, "how long one write to a client may take, so that one that stops reading is dropped; a stream may last longer (0: no limit)")
	f.DurationVar(&idleTimeout, "idle-timeout", 60*time.Second, "how long a keep-alive connection may wait for its next request (0: no limit)")
	f.Float64Var(&gpuMemUtil, "gpu-memory-utilization", 0, "vLLM's setting, which Loom has not: see --kv-cache-bytes")
	_ = f.MarkHidden("gpu-memory-utilization")
	ef.register(cmd)
	tpShort.register(cmd)
	// vLLM's names for the same settings.
	aliases := map[string]string{
		"tensor-parallel-size":   "world-size",
		"tp":                     "world-size",
		"max-num-seqs":           "max-batch",
		"max-num-batched-tokens": "max-tokens-per-step",
	}
	f.SetNormalizeFunc(func(_ *pflag.FlagSet, name string) pflag.NormalizedName {
		if to, ok := aliases[name]; ok {
			name = to
		}
		return pflag.NormalizedName(name)
	})
	return cmd
}

// none turns a flag's 0 (no limit) into the server's negative.
func none(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// vllmTP makes vLLM's "-tp N" work, which pflag cannot spell as one shorthand: -t is a
// hidden switch that needs no value and -p a hidden int, so "-tp 2" and "-tp=2" set both.
type vllmTP struct {
	t bool
	p int
}

func (v *vllmTP) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.BoolVarP(&v.t, "tp-switch", "t", false, "with -p: -tp N, vLLM's tensor-parallel size")
	f.IntVarP(&v.p, "tp-size", "p", 0, "with -t: -tp N, vLLM's tensor-parallel size")
	_ = f.MarkHidden("tp-switch")
	_ = f.MarkHidden("tp-size")
}

// apply sets the world size from -tp N, refusing -t or -p alone and a different
// --world-size.
func (v *vllmTP) apply(cmd *cobra.Command, m *meshFlags) error {
	f := cmd.Flags()
	t, p := f.Changed("tp-switch"), f.Changed("tp-size")
	switch {
	case !t && !p:
		return nil
	case t != p:
		return errors.New("-t and -p are not flags of loom serve; -tp N (--tensor-parallel-size N) sets the tensor-parallel size")
	case f.Changed("world-size") && m.worldSize != v.p:
		return fmt.Errorf("-tp %d and --world-size/--tensor-parallel-size %d disagree", v.p, m.worldSize)
	}
	m.worldSize = v.p
	return nil
}

// loadChatTemplate reads --chat-template as vLLM does: a file, else the template's text
// itself; Loom also takes the name of one of the checkpoint's own templates (such as
// tool_use). The template gets the tokenizer's special tokens.
func loadChatTemplate(arg, dir string, tok *tokenizer.Tokenizer) (*chattemplate.Template, error) {
	special := map[string]string{}
	for _, role := range []string{"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"} {
		if s, ok := tok.SpecialToken(role); ok {
			special[role] = s
		}
	}
	src := arg
	if data, err := os.ReadFile(arg); err == nil {
		src = string(data)
	} else if !strings.ContainsAny(arg, "{}") {
		t, nerr := chattemplate.LoadNamed(dir, arg)
		if nerr != nil {
			return nil, fmt.Errorf("--chat-template %q is not a readable file (%v), a template, or a template of %s (%v)", arg, err, dir, nerr)
		}
		return t, nil
	}
	t, err := chattemplate.New(src, special)
	if err != nil {
		return nil, fmt.Errorf("--chat-template: %w", err)
	}
	return t, nil
}
