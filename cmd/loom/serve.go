package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/engine"
	"github.com/loom-ml/loom/model"
	"github.com/loom-ml/loom/server"
	"github.com/loom-ml/loom/tensor"
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
	transforms   transform.Flags
}

func (e *engineFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.IntVar(&e.maxBatch, "max-batch", 0, "most sequences in one engine step (0: the engine's default, 16)")
	f.IntVar(&e.tokensPerStp, "max-tokens-per-step", 0, "most tokens one step computes (0: the engine's default, 512)")
	f.IntVar(&e.kvBlocks, "kv-blocks", 0, "KV cache blocks (0: from --kv-cache-bytes)")
	f.Int64Var(&e.kvCacheBytes, "kv-cache-bytes", 0, "KV cache memory budget in bytes per rank (0: on the CPU max-batch full-context sequences, at most 1 GiB; on CUDA 90% of the GPU memory left after the weights, less 4 GiB)")
	f.BoolVar(&e.noOptimize, "no-optimize", false, "run the plain graph, without the transform pipeline (not servable: the engine needs the paged KV cache)")
	f.StringVar(&e.device, "device", "auto", "where the model runs: auto (CUDA when a GPU can be used, else the CPU), cpu or cuda")
	f.BoolVar(&e.cudaProfile, "cuda-profile", false, "time every CUDA kernel (eagerly, without CUDA graphs) and print the GPU time per op on stderr at the end")
	f.BoolVar(&e.syncSteps, "sync-steps", false, "wait for each step's tokens before queuing the next (by default a decode step is queued while the one before runs on the GPU); for measuring what the overlap gives")
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
	fmt.Fprintf(w, "\nGPU time per op (eager launches, each timed by events):\n%-24s %8s %12s %10s %6s\n", "op", "calls", "total ms", "mean µs", "share")
	for _, o := range ops {
		fmt.Fprintf(w, "%-24s %8d %12.2f %10.1f %5.1f%%\n", o.Op, o.Calls, o.Time.Seconds()*1e3,
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
		ef              engineFlags
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve a model over HTTP with the OpenAI API",
		Long: `Loads a model and serves it with an OpenAI-compatible API:

  POST /v1/completions, POST /v1/chat/completions (streaming with "stream": true)
  GET /v1/models, GET /health, GET /metrics (Prometheus)

--overload chooses what happens when the engine is full: "queue" (the default) makes requests
wait, "reject" answers HTTP 429 at once. On SIGTERM or SIGINT the server stops accepting
connections, finishes the requests in flight (up to --shutdown-timeout) and exits.`,
		Example: `  loom serve --model testdata/tiny-llama --port 8000
  curl localhost:8000/v1/completions -d '{"prompt": "Hello", "max_tokens": 8}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if overload != "queue" && overload != "reject" {
				return fmt.Errorf("--overload must be queue or reject, got %q", overload)
			}
			if port < 0 || port > 65535 {
				return fmt.Errorf("--port must be between 0 and 65535, got %d", port)
			}
			queue := overload == "queue"
			m, eng, done, err := ef.start(cmd, dir, queue, maxConcurrent, maxQueue)
			if err != nil {
				return err
			}
			defer done()
			defer eng.Close()
			cfg, err := server.ModelConfig(m, name)
			if err != nil {
				return err
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
			srv, err := server.New(server.FromEngine(eng), cfg)
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
			if err != nil {
				return fmt.Errorf("listen: %w", err)
			}
			served := make(chan error, 1)
			go func() { served <- srv.Serve(ln) }()
			slog.Info("listening", "url", "http://"+ln.Addr().String()+"/v1", "model", cfg.Model)
			select {
			case err := <-served:
				return err
			case <-cmd.Context().Done():
			}
			slog.Info("signal received; finishing the requests in flight", "timeout", shutdownTimeout)
			ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
			defer cancel()
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
	f.StringVar(&dir, "model", "", "checkpoint directory")
	f.StringVar(&host, "host", "127.0.0.1", "address to listen on")
	f.IntVar(&port, "port", 8000, "port to listen on (0: any free port)")
	f.StringVar(&name, "served-model-name", "", "model name in the API (default: the directory's name)")
	f.StringVar(&overload, "overload", "queue", "when the engine is full: queue (wait) or reject (HTTP 429)")
	f.IntVar(&maxQueue, "max-queue", 0, "most requests waiting to start, in the engine's queue or held for a slot of --max-concurrent (0: the engine's default, 1024)")
	f.IntVar(&maxConcurrent, "max-concurrent", 0, "most requests in the engine at once, running or queued (0: no limit); past it requests wait for a slot (--overload queue) or get HTTP 429")
	f.IntVar(&defaultMax, "default-max-tokens", 0, "max_tokens of completion requests that give none (0: 16, as OpenAI)")
	f.DurationVar(&shutdownTimeout, "shutdown-timeout", 5*time.Minute, "how long to wait for requests in flight on SIGTERM")
	ef.register(cmd)
	_ = cmd.MarkFlagRequired("model")
	return cmd
}
