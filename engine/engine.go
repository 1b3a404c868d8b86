package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/kvcache"
	"github.com/loom-ml/loom/model"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/transform"
)

// Errors of Submit. Each is wrapped with the request's details; test with errors.Is.
var (
	// ErrInvalidRequest: an empty prompt, a token id outside the vocabulary, MaxTokens < 1,
	// a prompt plus MaxTokens beyond the model's context, or bad sampling parameters.
	ErrInvalidRequest = errors.New("invalid request")
	// ErrRequestTooLarge: the request needs more KV cache blocks than the whole cache has,
	// so it could never run.
	ErrRequestTooLarge = errors.New("request does not fit the KV cache")
	// ErrKVCacheFull: with QueueOnFull off, the KV cache has no room for the prompt now.
	ErrKVCacheFull = errors.New("KV cache full")
	// ErrQueueFull: with QueueOnFull off, MaxQueue requests are already waiting; with it on,
	// MaxQueue requests are already waiting when a request must be held for a slot
	// (MaxConcurrent).
	ErrQueueFull = errors.New("request queue full")
	// ErrAtCapacity: with QueueOnFull off, MaxConcurrent requests are already in the engine.
	ErrAtCapacity = errors.New("engine at its limit of concurrent requests")
	// ErrClosed: the engine is shutting down or closed. Requests in flight when Close is
	// called end with FinishError and this error.
	ErrClosed = errors.New("engine closed")
)

// Options configure an Engine. Zero fields take the defaults noted.
type Options struct {
	// MaxBatch is the most sequences in one step (default 16 in host memory; on a GPU see
	// New).
	MaxBatch int
	// MaxTokensPerStep is the most tokens one step computes, decodes and prefill chunks
	// together (default 512 in host memory, on a GPU see New; at least MaxBatch). A prompt
	// longer than what is left of it is prefilled in chunks over several steps.
	MaxTokensPerStep int
	// KVBlocks is the number of KV cache blocks. When 0 it comes from KVCacheBytes, the
	// cache's memory budget per rank; when that is 0 too, the cache holds MaxBatch sequences
	// of the model's whole context, but at most 1 GiB.
	KVBlocks     int
	KVCacheBytes int64
	// BlockSize is the tokens per block. The cached graph fixes it (the block_size option of
	// insert_cached_attention); 0 takes the graph's, another value must agree with it.
	BlockSize int
	// QueueOnFull chooses what Submit does when the engine is full. Off (the default): Submit
	// fails with ErrAtCapacity when MaxConcurrent requests are in the engine, with
	// ErrKVCacheFull when the cache has no free blocks for the prompt (after the prompts
	// already waiting) and with ErrQueueFull when MaxQueue requests wait. On: the request
	// waits in the queue for memory, and Submit waits for a slot and for room in the queue
	// (until its context ends); a request held for a slot counts among the waiting, and when
	// MaxQueue are waiting it fails with ErrQueueFull instead. A request that could never
	// fit fails with ErrRequestTooLarge either way.
	//
	// The engine is the one admission layer: the server and the CLI set these limits here
	// (loom serve --max-concurrent, --max-queue, --overload).
	QueueOnFull bool
	// MaxConcurrent is the most requests in the engine at once, running or waiting in its
	// queue (0: no limit).
	MaxConcurrent int
	// HostSampling makes every token be chosen on the host from logits brought back, even
	// when the executables could sample on their devices (see backend.Launcher).
	HostSampling bool
	// SyncSteps waits for each step's tokens before queuing the next. By default, when the
	// device chooses the tokens, the next decode step is queued while the current one runs
	// (see overlap.go), so that the device does not wait for the host between steps.
	SyncSteps bool
	// MaxQueue is the most requests waiting to start (default 1024): in the queue, and with
	// MaxConcurrent held for a slot (see QueueOnFull).
	MaxQueue int
	// DisablePrefixCaching turns off automatic prefix caching (see prefix.go): by default a
	// sequence whose tokens start with full KV blocks that another has computed shares those
	// blocks and computes only the rest, and blocks stay cached after their sequences end
	// until the cache needs the space. Context parallelism never shares blocks.
	DisablePrefixCaching bool
	// Logger receives the engine's messages (default slog.Default()).
	Logger *slog.Logger
}

const (
	defaultMaxBatch      = 16
	defaultTokensPerStep = 512
	defaultMaxQueue      = 1024
	defaultCacheBudget   = 1 << 30
	idlePoll             = time.Second
)

// ModelInfo is what the engine needs to know of a model beyond its graphs.
type ModelInfo struct {
	Name string
	// MaxPositions is the context length (max_position_embeddings); 0 means no limit.
	MaxPositions int
	// EOSTokenIDs end generation unless a request sets IgnoreEOS.
	EOSTokenIDs []int
}

// Engine generates tokens for many requests at once with continuous batching over a paged
// KV cache. One goroutine runs the steps: at each step it drops cancelled requests, gathers
// one token of every running sequence that is decoding, chunks of the prompts being
// prefilled and new requests while MaxBatch and MaxTokensPerStep allow, runs every rank on
// the flattened tokens, samples the next token of each sequence whose prompt is complete,
// and sends the events. When the cache runs out of blocks during a step, the most recently
// started sequences are preempted: their blocks are freed and they go back to the front of
// the queue, to be recomputed (their tokens so far become their prompt; the output does not
// change).
//
// Engine's methods are safe for concurrent use.
type Engine struct {
	opts   Options
	log    *slog.Logger
	info   ModelInfo
	layout Layout
	ranks  *rankSet
	// kv hands out the KV cache's blocks: alloc's (every rank shares the block tables), or
	// with context parallelism cpa's, one allocator per cp index (cp_cache.go), alloc nil.
	kv    blockAllocator
	alloc *kvcache.Allocator
	cp    *cpGroup
	cpa   *cpAlloc
	// launchers are the ranks' backend.Launchers when every rank has one (else nil): steps
	// that sample on the device are then queued and collected apart (see overlap.go).
	launchers []backend.Launcher
	// lastCollect is when the loop last finished collecting a step.
	lastCollect time.Time

	mu       sync.Mutex
	waiting  []*sequence   // FIFO; preempted sequences go back to the front
	running  []*sequence   // in the order they started
	closing  bool          // no new requests (Shutdown or Close)
	abort    bool          // end every request now (Close, or Shutdown's deadline)
	space    chan struct{} // closed (and renewed) when a request leaves the queue or the engine
	held     int           // Submit calls waiting for a slot (MaxConcurrent)
	nextID   uint64
	counters Stats
	// stepsAtReset is StepsTotal at the last ResetStats.
	stepsAtReset int64

	wake     chan struct{} // capacity 1: something changed for the loop
	done     chan struct{} // closed when the loop has exited
	loopCtx  context.Context
	stopLoop context.CancelFunc
	steps    atomic.Int64
}

// sequence is one request in the engine.
type sequence struct {
	id        kvcache.SeqID
	req       Request
	ctx       context.Context
	stopWatch func() bool // stops waking the loop on ctx's end
	stream    *Stream
	sampler   *sample.Sampler
	stop      map[int]bool
	tokens    []int // prompt, then generated tokens
	promptLen int
	computed  int                 // tokens whose keys and values are in the cache
	hashes    []kvcache.BlockHash // the hash chain of its full blocks so far (prefix.go)
	started   bool
	finished  bool // finishLocked has ended it
}

func (s *sequence) generated() int { return len(s.tokens) - s.promptLen }

// New starts an engine on a loaded model (see Load; the model must have gone through the
// optimizer so that its graph runs on the paged KV cache). It allocates the KV cache once
// and starts the step loop; Close or Shutdown stop it. ctx bounds the setup only. The
// engine must be closed before the model. On rank 0 of a world of processes it runs every
// rank (the others through the step transport); a follower runs Model.Follow instead.
//
// When the model's executables keep the KV cache in device memory (a GPU), the options left
// at 0 are sized from that device (see deviceDefaults): the KV cache takes
// deviceCacheFraction of the device memory still free after the weights on the emptiest
// device of any rank, less deviceReserveBytes for activations, and MaxBatch and
// MaxTokensPerStep are large enough to keep the GPU busy. In host memory, see Options.
func New(ctx context.Context, m *Model, opts Options) (*Engine, error) {
	if m == nil || m.Model == nil || m.Program == nil {
		return nil, errors.New("engine: no model")
	}
	if m.Follower() {
		return nil, fmt.Errorf("engine: rank %d of a model loaded one process per rank follows rank 0 (Model.Follow); only rank 0 runs the engine", m.Rank())
	}
	if m.dep != nil && m.dep.FreeMemory != nil {
		free := m.dep.FreeMemory
		if m.proc != nil {
			free = func() (uint64, error) { return m.proc.leastFree(m) }
		}
		least, err := free()
		if err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		if opts, err = deviceDefaults(opts, least); err != nil {
			return nil, err
		}
	}
	return newRanks(ctx, m.Ranks(), modelInfo(m.Model), opts, m.Mesh)
}

// The batch defaults on a GPU, as vLLM's max_num_seqs and max_num_batched_tokens: enough
// sequences that a decode step's GEMMs read each weight once for many rows, and prefill
// chunks long enough that attention and GEMMs run near the tensor cores' rate (an H200 run:
// a 32,000-token prompt in chunks of 512 tokens took 1.10x the time of chunks of 8,192).
// A device with less than deviceLargeBytes free after the weights gets smaller chunks, whose
// activations take less of the memory reserved for them.
const (
	deviceMaxBatch        = 256
	deviceTokensPerStep   = 8192
	deviceSmallTokensStep = 2048
	deviceLargeBytes      = 40 << 30
)

// deviceDefaults fills the options left at 0 for a GPU whose emptiest device has least bytes
// free after the weights: the KV cache budget (deviceCacheBytes), MaxBatch and
// MaxTokensPerStep; it logs what it picked.
func deviceDefaults(opts Options, least uint64) (Options, error) {
	var picked []any
	if opts.KVBlocks == 0 && opts.KVCacheBytes == 0 {
		b, err := deviceCacheBytes(least)
		if err != nil {
			return opts, err
		}
		opts.KVCacheBytes = b
		picked = append(picked, "kv_cache_bytes", b)
	}
	if opts.MaxBatch == 0 {
		opts.MaxBatch = deviceMaxBatch
		if opts.MaxTokensPerStep > 0 {
			opts.MaxBatch = min(opts.MaxBatch, opts.MaxTokensPerStep)
		}
		picked = append(picked, "max_batch", opts.MaxBatch)
	}
	if opts.MaxTokensPerStep == 0 {
		opts.MaxTokensPerStep = deviceTokensPerStep
		if least < deviceLargeBytes {
			opts.MaxTokensPerStep = deviceSmallTokensStep
		}
		opts.MaxTokensPerStep = max(opts.MaxTokensPerStep, opts.MaxBatch)
		picked = append(picked, "max_tokens_per_step", opts.MaxTokensPerStep)
	}
	if len(picked) > 0 {
		logger := opts.Logger
		if logger == nil {
			logger = slog.Default()
		}
		logger.Info("engine: sized from the GPU's free memory", append([]any{"free_after_weights_bytes", least}, picked...)...)
	}
	return opts, nil
}

// The default KV cache size in device memory: this fraction of the memory free after
// loading, keeping deviceReserveBytes back for activations, cuBLAS and captured graphs.
const (
	deviceCacheFraction = 0.9
	deviceReserveBytes  = 4 << 30
)

// deviceCacheBytes is the default KV cache budget per device when the emptiest device has
// least bytes free after the weights.
func deviceCacheBytes(least uint64) (int64, error) {
	if least <= deviceReserveBytes {
		return 0, fmt.Errorf("engine: a GPU has %d MiB free after the weights, too little for a KV cache", least>>20)
	}
	return int64(float64(least-deviceReserveBytes) * deviceCacheFraction), nil
}

// cacheNames names the inputs of a cache spec's tensors.
func cacheNames(spec kvcache.Spec) []string {
	names := make([]string, 0, 2*len(spec.Layers))
	for _, l := range spec.Layers {
		names = append(names, l.K, l.V)
	}
	return names
}

// modelInfo is what the engine needs to know of a checkpoint.
func modelInfo(m *model.Model) ModelInfo {
	return ModelInfo{Name: m.Dir, MaxPositions: m.Config.MaxPositionEmbeddings, EOSTokenIDs: m.EOSTokenIDs()}
}

// NewRanks starts an engine on the ranks of a deployment (one rank on one device). Every
// rank's graph must run on the paged KV cache with the same block size; rank 0's logits are
// the ones sampled.
func NewRanks(ctx context.Context, ranks []Rank, info ModelInfo, opts Options) (*Engine, error) {
	return newRanks(ctx, ranks, info, opts, dist.Mesh{})
}

// newRanks is NewRanks on the ranks of mesh; a cp axis of more than one rank makes every cp
// index keep its own blocks (cp_cache.go), which the graphs must be made for
// (transform.CPCachedAttention).
func newRanks(ctx context.Context, ranks []Rank, info ModelInfo, opts Options, mesh dist.Mesh) (*Engine, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	if len(ranks) == 0 {
		return nil, errors.New("engine: no ranks")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	var layouts []Layout
	for r, rank := range ranks {
		if rank.Exe == nil {
			return nil, fmt.Errorf("engine: rank %d has no executable", r)
		}
		l, err := CacheLayout(rank.Graph)
		if err != nil {
			return nil, fmt.Errorf("engine: rank %d: %w", r, err)
		}
		if r > 0 && (l.Cache.BlockSize != layouts[0].Cache.BlockSize || l.Vocab != layouts[0].Vocab) {
			return nil, fmt.Errorf("engine: rank %d has block size %d and vocabulary %d, rank 0 %d and %d",
				r, l.Cache.BlockSize, l.Vocab, layouts[0].Cache.BlockSize, layouts[0].Vocab)
		}
		layouts = append(layouts, l)
	}
	layout := layouts[0]
	bs := layout.Cache.BlockSize
	if opts.BlockSize != 0 && opts.BlockSize != bs {
		return nil, fmt.Errorf("engine: BlockSize %d, but the graph's caches have blocks of %d tokens "+
			"(set transforms.insert_cached_attention.block_size=%d when loading)", opts.BlockSize, bs, opts.BlockSize)
	}
	opts.BlockSize = bs
	// Blocks: from the option, else from the budget of the rank that needs most per block.
	var blockBytes int64
	for _, l := range layouts {
		blockBytes = max(blockBytes, l.Cache.BlockBytes())
	}
	blocks := opts.KVBlocks
	if blocks == 0 {
		budget := opts.KVCacheBytes
		if budget == 0 {
			ctxLen := info.MaxPositions
			if ctxLen <= 0 {
				ctxLen = 4096
			}
			want := int64(opts.MaxBatch) * int64((ctxLen+bs-1)/bs) * blockBytes
			budget = min(want, defaultCacheBudget)
		}
		blocks = kvcache.NumBlocks(budget, blockBytes)
		if blocks < 1 {
			return nil, fmt.Errorf("engine: a KV cache budget of %d bytes holds no block (one block is %d bytes)", budget, blockBytes)
		}
	}
	cg, err := newCPGroup(mesh)
	if err != nil {
		return nil, fmt.Errorf("engine: %w", err)
	}
	if cg != nil && len(cg.index) != len(ranks) {
		return nil, fmt.Errorf("engine: %d ranks for the mesh %q of %d", len(ranks), mesh, len(cg.index))
	}
	for r, rank := range ranks {
		if has := rank.Graph.Input(transform.CPKVPositionsInput) != nil; has != (cg != nil) {
			return nil, fmt.Errorf("engine: rank %d's graph %s input %s, but the mesh %q has a cp axis of %d ranks (cp_cached_attention makes the graphs of a cp mesh)",
				r, map[bool]string{true: "has the", false: "lacks the"}[has], transform.CPKVPositionsInput, mesh, cpSize(mesh))
		}
	}
	var alloc *kvcache.Allocator
	var kv blockAllocator
	var cpa *cpAlloc
	if cg != nil {
		if cpa, err = newCPAlloc(cg.size, blocks, bs); err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		kv = cpa
	} else {
		if alloc, err = kvcache.NewAllocator(blocks, bs); err != nil {
			return nil, fmt.Errorf("engine: %w", err)
		}
		kv = plainAlloc{alloc}
	}
	rs := &rankSet{ranks: ranks}
	for r, l := range layouts {
		newCache := kvcache.NewCache
		if backend.Keeps(ranks[r].Exe, cacheNames(l.Cache)) {
			newCache = kvcache.NewCacheShapes
		}
		c, err := newCache(l.Cache, blocks)
		if err != nil {
			return nil, fmt.Errorf("engine: rank %d: %w", r, err)
		}
		rs.caches = append(rs.caches, c)
	}
	loopCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	e := &Engine{
		opts: opts, log: opts.Logger, info: info, layout: layout, ranks: rs, kv: kv, alloc: alloc, cp: cg, cpa: cpa,
		space: make(chan struct{}), wake: make(chan struct{}, 1), done: make(chan struct{}),
		loopCtx: loopCtx, stopLoop: stop,
	}
	if layout.LogitRows && !opts.HostSampling && cg == nil { // cp steps run their ranks on their own inputs
		e.launchers = rs.launchers()
	}
	e.log.Info("engine started", "model", info.Name, "ranks", len(ranks), "kv_blocks", blocks, "block_size", bs,
		"kv_bytes_per_rank", int64(blocks)*blockBytes, "max_batch", opts.MaxBatch, "max_tokens_per_step", opts.MaxTokensPerStep)
	go e.loop()
	return e, nil
}

func (o Options) withDefaults() (Options, error) {
	if o.MaxBatch == 0 {
		o.MaxBatch = defaultMaxBatch
	}
	if o.MaxTokensPerStep == 0 {
		o.MaxTokensPerStep = max(defaultTokensPerStep, o.MaxBatch)
	}
	if o.MaxQueue == 0 {
		o.MaxQueue = defaultMaxQueue
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	switch {
	case o.MaxBatch < 1:
		return o, fmt.Errorf("MaxBatch must be >= 1, got %d", o.MaxBatch)
	case o.MaxTokensPerStep < o.MaxBatch:
		return o, fmt.Errorf("MaxTokensPerStep (%d) must be at least MaxBatch (%d), so that every running sequence can decode at each step", o.MaxTokensPerStep, o.MaxBatch)
	case o.KVBlocks < 0 || o.KVCacheBytes < 0 || o.BlockSize < 0:
		return o, fmt.Errorf("KVBlocks, KVCacheBytes and BlockSize must not be negative")
	case o.MaxQueue < 1:
		return o, fmt.Errorf("MaxQueue must be >= 1, got %d", o.MaxQueue)
	case o.MaxConcurrent < 0:
		return o, fmt.Errorf("MaxConcurrent must not be negative, got %d", o.MaxConcurrent)
	}
	return o, nil
}

// Options returns the engine's options, defaults filled in.
func (e *Engine) Options() Options { return e.opts }

// Submit validates a request and queues it. The returned Stream delivers its events. The
// request lives as long as ctx: when ctx ends, the request is removed at the next step, its
// blocks are freed and its stream ends with FinishCancelled. Errors wrap ErrInvalidRequest,
// ErrRequestTooLarge, ErrKVCacheFull, ErrQueueFull or ErrClosed (see Options.QueueOnFull).
func (e *Engine) Submit(ctx context.Context, req Request) (*Stream, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("submit: %w", err)
	}
	if err := e.validate(&req); err != nil {
		return nil, err
	}
	// The last generated token's keys and values are never computed, so the cache must hold
	// len(Prompt)+MaxTokens-1 tokens; compared without that sum, which could overflow.
	if capacity := e.kv.Capacity(); req.MaxTokens-1 > capacity-len(req.Prompt) {
		return nil, fmt.Errorf("submit %s: %w: %d prompt tokens + max_tokens %d exceed the KV cache's %d blocks of %d tokens (raise KVCacheBytes or KVBlocks)",
			reqName(req), ErrRequestTooLarge, len(req.Prompt), req.MaxTokens, e.kv.NumBlocks(), e.kv.BlockSize())
	}
	sampler, err := sample.New(req.Sampling, req.Prompt)
	if err != nil {
		return nil, fmt.Errorf("submit %s: %w: %w", reqName(req), ErrInvalidRequest, err)
	}
	stop := map[int]bool{}
	for _, id := range req.StopTokenIDs {
		stop[id] = true
	}
	if !req.IgnoreEOS {
		for _, id := range e.info.EOSTokenIDs {
			stop[id] = true
		}
	}

	e.mu.Lock()
	if err := e.admitLocked(ctx, req); err != nil {
		e.mu.Unlock()
		return nil, err
	}
	if !e.opts.QueueOnFull {
		pending := 0
		for _, w := range e.waiting {
			pending += e.kv.BlocksFor(len(w.tokens))
		}
		if free := e.kv.Stats().Free - pending; e.kv.BlocksFor(len(req.Prompt)) > free {
			err := fmt.Errorf("submit %s: %w: the prompt needs %d blocks, %d are free after the %d waiting requests",
				reqName(req), ErrKVCacheFull, e.kv.BlocksFor(len(req.Prompt)), max(free, 0), len(e.waiting))
			e.mu.Unlock()
			return nil, err
		}
	}
	e.nextID++
	if req.ID == "" {
		req.ID = "req-" + strconv.FormatUint(e.nextID, 10)
	}
	req.Prompt = slices.Clone(req.Prompt)
	s := &sequence{
		id: kvcache.SeqID(e.nextID), req: req, ctx: ctx, stream: newStream(req.ID), sampler: sampler, stop: stop,
		tokens: slices.Clone(req.Prompt), promptLen: len(req.Prompt),
	}
	s.stopWatch = context.AfterFunc(ctx, e.signal)
	e.waiting = append(e.waiting, s)
	e.mu.Unlock()
	e.signal()
	return s.stream, nil
}

// admitLocked waits, with QueueOnFull, for a slot among the MaxConcurrent requests in the
// engine and for room in the queue, or fails (see Options.QueueOnFull). It returns with
// e.mu held, as it was called.
func (e *Engine) admitLocked(ctx context.Context, req Request) error {
	held := false
	defer func() {
		if held {
			e.held--
		}
	}()
	for {
		if e.closing {
			return fmt.Errorf("submit %s: %w", reqName(req), ErrClosed)
		}
		in := len(e.running) + len(e.waiting)
		slot := e.opts.MaxConcurrent == 0 || in < e.opts.MaxConcurrent
		room := len(e.waiting) < e.opts.MaxQueue
		switch {
		case slot && room:
			return nil
		case !slot && !e.opts.QueueOnFull:
			return fmt.Errorf("submit %s: %w: %d requests are in the engine, its limit", reqName(req), ErrAtCapacity, in)
		case !e.opts.QueueOnFull:
			return fmt.Errorf("submit %s: %w: %d requests are waiting", reqName(req), ErrQueueFull, len(e.waiting))
		case !slot && !held:
			// Held for a slot, the request waits to start: it counts among the waiting.
			if n := len(e.waiting) + e.held; n >= e.opts.MaxQueue {
				return fmt.Errorf("submit %s: %w: %d requests are waiting, %d of them for one of the engine's %d slots",
					reqName(req), ErrQueueFull, n, e.held, e.opts.MaxConcurrent)
			}
			held = true
			e.held++
		}
		space := e.space
		e.mu.Unlock()
		select {
		case <-space:
		case <-ctx.Done():
			e.mu.Lock()
			return fmt.Errorf("submit %s: waiting for room in the engine: %w", reqName(req), ctx.Err())
		case <-e.done:
			e.mu.Lock()
			return fmt.Errorf("submit %s: %w", reqName(req), ErrClosed)
		}
		e.mu.Lock()
	}
}

func reqName(r Request) string {
	if r.ID == "" {
		return "request"
	}
	return "request " + r.ID
}

// validate checks a request against the model.
func (e *Engine) validate(r *Request) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("submit %s: %w: %s", reqName(*r), ErrInvalidRequest, fmt.Sprintf(format, args...))
	}
	if len(r.Prompt) == 0 {
		return bad("empty prompt")
	}
	if r.MaxTokens < 1 {
		return bad("max_tokens must be >= 1, got %d", r.MaxTokens)
	}
	// Compared as MaxTokens > room, not len+MaxTokens > limit, so that a MaxTokens near
	// the largest int cannot overflow past the check.
	if mp := e.info.MaxPositions; mp > 0 && r.MaxTokens > mp-len(r.Prompt) {
		return bad("%d prompt tokens + max_tokens %d exceed the model's context of %d tokens", len(r.Prompt), r.MaxTokens, mp)
	}
	for i, id := range r.Prompt {
		if id < 0 || id >= e.layout.Vocab {
			return bad("prompt token %d is %d, outside the vocabulary [0, %d)", i, id, e.layout.Vocab)
		}
	}
	for _, id := range r.StopTokenIDs {
		if id < 0 || id >= e.layout.Vocab {
			return bad("stop token id %d is outside the vocabulary [0, %d)", id, e.layout.Vocab)
		}
	}
	if err := r.Sampling.Validate(); err != nil {
		return bad("%v", err)
	}
	return nil
}

// ResetStats zeroes the time counters of Stats (step, model and sampling seconds) and a
// profiled program's times per op (backend.Profiler), so that a benchmark can leave its
// warm-up out.
func (e *Engine) ResetStats() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.counters.StepSeconds, e.counters.ModelSeconds, e.counters.SampleSeconds = 0, 0, 0
	e.stepsAtReset = e.steps.Load()
	if c, ok := e.ranks.ranks[0].Exe.(backend.DeviceClock); ok {
		c.ResetDeviceTime()
	}
	if p, ok := e.ranks.ranks[0].Exe.(backend.Profiler); ok {
		p.OpTimes() // which resets them
	}
}

// Stats returns a snapshot of the engine's state.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	st := e.counters
	st.Running, st.Waiting = len(e.running), len(e.waiting)+e.held
	e.mu.Unlock()
	a := e.kv.Stats()
	st.KVBlocksUsed, st.KVBlocks, st.BlockSize = a.Used, a.Blocks, e.kv.BlockSize()
	st.KVBlocksCached, st.KVBlocksPeak, st.PrefixCacheHitBlocks = a.Cached, a.Peak, a.PrefixHitBlocks
	st.StepsTotal = e.steps.Load()
	e.mu.Lock()
	st.TimedSteps = st.StepsTotal - e.stepsAtReset
	e.mu.Unlock()
	if c, ok := e.ranks.ranks[0].Exe.(backend.DeviceClock); ok {
		d, _ := c.DeviceTime()
		st.DeviceSeconds = d.Seconds()
	}
	return st
}

// Shutdown stops accepting requests and waits until every request in flight (running or
// waiting) has finished, or until ctx ends; then it ends the remaining requests with
// ErrClosed, stops the engine and returns ctx's error.
func (e *Engine) Shutdown(ctx context.Context) error {
	e.mu.Lock()
	e.closing = true
	e.mu.Unlock()
	e.signal()
	select {
	case <-e.done:
		return nil
	case <-ctx.Done():
		e.Close()
		return fmt.Errorf("engine shutdown: %w", ctx.Err())
	}
}

// Close stops the engine now: requests in flight end with FinishError and ErrClosed, and
// Close returns once the step loop has exited. Calling it again does nothing.
func (e *Engine) Close() error {
	e.mu.Lock()
	e.closing, e.abort = true, true
	e.mu.Unlock()
	e.stopLoop()
	e.signal()
	<-e.done
	return nil
}

// signal wakes the step loop.
func (e *Engine) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// loop is the step loop: schedule, launch, collect, repeat; wait when there is nothing to
// do. While a step runs on the device, the next one may be launched ahead of its tokens
// (launchAhead); the scheduler runs only when no step is in flight.
func (e *Engine) loop() {
	defer close(e.done)
	defer e.stopLoop()
	var cur *flight
	for {
		if cur != nil {
			next := e.launchAhead(cur)
			e.collect(cur)
			cur = next
			continue
		}
		plan, exit := e.schedule()
		if exit {
			e.log.Info("engine stopped", "model", e.info.Name, "steps", e.steps.Load())
			return
		}
		if len(plan) == 0 {
			// Idle. Submit, a cancellation and Close all wake the loop; the timer only
			// guards against a state the scheduler cannot make progress from.
			select {
			case <-e.wake:
			case <-time.After(idlePoll):
			}
			continue
		}
		cur = e.launch(plan)
	}
}

// flight is a step launched and not yet collected.
type flight struct {
	plan  []stepSeq
	seqs  []*sequence
	start time.Time
	// ahead is set for a step launched before the previous step's tokens were known.
	ahead bool
	// ranks is the step queued on every rank's device, which chooses its tokens; otherwise
	// the step ran when launched, and logits (for the host to sample) and err hold its
	// outcome (see runStep).
	ranks  *rankFlight
	logits [][]float32
	err    error
}

// launch starts one planned step: queued on the ranks' devices when they sample there,
// else run to the end.
func (e *Engine) launch(plan []stepSeq) *flight {
	f := &flight{plan: plan, seqs: make([]*sequence, len(plan)), start: time.Now()}
	e.mu.Lock()
	for i, p := range plan {
		f.seqs[i] = e.byID(p.seq)
	}
	e.mu.Unlock()
	draws := e.deviceDraws(plan, f.seqs)
	if draws == nil {
		f.logits, f.err = e.runStep(plan)
		return f
	}
	in, err := stepInputs(e.alloc, plan, e.layout.LogitRows)
	if err != nil {
		f.err = err
		return f
	}
	f.ranks = e.ranks.launch(e.loopCtx, e.launchers, in, draws, false)
	return f
}

// collect waits for a launched step and delivers its results: each sequence that finished
// its prompt takes its next token. The rows of sequences that ended since an ahead step
// was launched are dropped.
func (e *Engine) collect(f *flight) {
	start := f.start
	if f.ahead {
		start = e.lastCollect
	}
	logits, err := f.logits, f.err
	var ids []int32
	if f.ranks != nil {
		ids, err = e.ranks.wait(e.loopCtx, f.ranks)
		if err == nil && len(ids) != len(f.plan) {
			err = fmt.Errorf("the device sampler returned %d tokens for %d sequences", len(ids), len(f.plan))
		}
		if err != nil && e.loopCtx.Err() != nil {
			err = ErrClosed
		}
	}
	e.steps.Add(1)
	modelDone := time.Now()
	plan := f.plan
	// Each sequence that finished its prompt samples its next token. Samplers belong to
	// their sequences, so they run concurrently (a row of a large vocabulary takes a while).
	results := make([]stepResult, len(plan))
	done := make([]bool, len(plan)) // sequences whose step tokens are now in the cache
	tokens, sampled := 0, 0
	var wg sync.WaitGroup
	for i, p := range plan {
		s := f.seqs[i]
		if s == nil || s.finished || (f.ahead && s.ctx.Err() != nil) {
			continue // ended since the step was launched ahead: its row is dropped
		}
		tokens += p.n
		if err != nil {
			results[i] = stepResult{s, Event{Finish: FinishError, Err: fmt.Errorf("step: %w", err)}, FinishError}
			continue
		}
		s.computed = p.from + p.n
		done[i] = true
		if s.computed < len(s.tokens) {
			continue // a prefill chunk; the prompt goes on at a later step
		}
		sampled++
		if ids != nil {
			s.sampler.Record(int(ids[i]))
			results[i] = nextToken(s, sample.Result{Token: int(ids[i])})
			continue
		}
		if len(plan) == 1 {
			results[i] = sampleNext(s, logits[i])
			continue
		}
		wg.Go(func() { results[i] = sampleNext(s, logits[i]) })
	}
	wg.Wait()
	sampleDone := time.Now()
	e.commitPrefixes(f.seqs, done) // before finishLocked frees the blocks
	e.mu.Lock()
	e.counters.ComputedTokensTotal += int64(tokens)
	for _, r := range results {
		if r.s == nil {
			continue
		}
		if r.s.ctx.Err() != nil && r.end == FinishNone {
			r.s.tokens = r.s.tokens[:len(r.s.tokens)-1] // cancelled meanwhile: the next schedule ends it without this token
			continue
		}
		if r.end == FinishNone {
			r.s.stream.push(r.ev)
			e.counters.GeneratedTokensTotal++
			continue
		}
		if r.end != FinishError {
			e.counters.GeneratedTokensTotal++
		}
		r.ev.PromptTokens, r.ev.GeneratedTokens = r.s.promptLen, r.s.generated()
		e.finishLocked(r.s, r.ev)
	}
	e.lastCollect = time.Now()
	e.counters.ModelSeconds += modelDone.Sub(start).Seconds()
	e.counters.SampleSeconds += sampleDone.Sub(modelDone).Seconds()
	e.counters.StepSeconds += e.lastCollect.Sub(start).Seconds()
	e.mu.Unlock()
	e.log.Debug("engine step", "sequences", len(plan), "tokens", tokens, "sampled", sampled, "ahead", f.ahead,
		"kv_blocks_used", e.kv.Stats().Used, "elapsed", e.lastCollect.Sub(start), "error", err)
}

// stepResult is what a step gives one sequence: its event and how it ends (FinishNone: it
// goes on).
type stepResult struct {
	s   *sequence
	ev  Event
	end FinishReason
}

// sampleNext chooses s's next token from its logits row and appends it to s.tokens.
func sampleNext(s *sequence, logits []float32) stepResult {
	r, err := s.sampler.Sample(logits)
	if err != nil {
		return stepResult{s, Event{Finish: FinishError, Err: fmt.Errorf("sample: %w", err)}, FinishError}
	}
	return nextToken(s, r)
}

// nextToken appends the chosen token to s.tokens and makes its event.
func nextToken(s *sequence, r sample.Result) stepResult {
	s.tokens = append(s.tokens, r.Token)
	ev := Event{Token: r.Token, TopLogprobs: r.TopLogprobs, PromptTokens: s.promptLen, GeneratedTokens: s.generated()}
	if s.req.Sampling.Logprobs || s.req.Sampling.TopLogprobs > 0 {
		ev.Logprob = r.Logprob
	}
	switch {
	case s.stop[r.Token]:
		ev.Finish = FinishStop
	case s.generated() >= s.req.MaxTokens:
		ev.Finish = FinishLength
	}
	return stepResult{s, ev, ev.Finish}
}

// runStep builds the step's inputs and runs every rank. It returns rank 0's logits of each
// sequence's last token in the step, one row [vocab] per plan entry. With gather_logits in
// the graph only those rows are computed; otherwise they are taken from the full
// [1,S,vocab].
func (e *Engine) runStep(plan []stepSeq) (rows [][]float32, err error) {
	defer func() {
		if p := recover(); p != nil { // a kernel bug must not take the engine down
			rows, err = nil, fmt.Errorf("panic in step: %v\n%s", p, debug.Stack())
		}
	}()
	if e.cp != nil {
		return e.runCPStep(plan)
	}
	in, err := stepInputs(e.alloc, plan, e.layout.LogitRows)
	if err != nil {
		return nil, err
	}
	out, err := e.ranks.run(e.loopCtx, in)
	if err != nil {
		if e.loopCtx.Err() != nil {
			return nil, ErrClosed
		}
		return nil, err
	}
	V, want := e.layout.Vocab, in["input_ids"].Shape[1]
	if e.layout.LogitRows {
		want = len(plan)
	}
	if out.Shape[0] != 1 || out.Shape[1] != want || out.Shape[2] != V {
		return nil, fmt.Errorf("logits are %v, want [1,%d,%d]", out.Shape, want, V)
	}
	rows = make([][]float32, len(plan))
	end := 0
	for i, p := range plan {
		end += p.n
		row := end - 1
		if e.layout.LogitRows {
			row = i
		}
		rows[i] = out.F32[row*V : (row+1)*V]
	}
	return rows, nil
}

// deviceDraws returns the device draws of a step's sequences when the ranks sample on
// their devices (launchers) and every sequence that takes a token this step can be sampled
// there (see sample.Sampler.DeviceDraw); otherwise nil, and the step brings the logits back.
func (e *Engine) deviceDraws(plan []stepSeq, seqs []*sequence) []sample.DeviceDraw {
	if e.launchers == nil {
		return nil
	}
	draws := make([]sample.DeviceDraw, len(plan))
	for i, p := range plan {
		if p.from+p.n < len(seqs[i].tokens) {
			continue // a prefill chunk takes no token: its row is drawn greedily and dropped
		}
		d, ok := seqs[i].sampler.DeviceDraw()
		if !ok {
			return nil
		}
		draws[i] = d
	}
	return draws
}

// byID finds a running sequence; the caller holds e.mu.
func (e *Engine) byID(id kvcache.SeqID) *sequence {
	for _, s := range e.running {
		if s.id == id {
			return s
		}
	}
	return nil
}

// finishLocked ends a sequence: it sends the final event, frees its blocks and removes it
// from the queues. The caller holds e.mu.
func (e *Engine) finishLocked(s *sequence, ev Event) {
	s.finished = true
	s.stream.push(ev)
	s.stopWatch()
	e.kv.Free(s.id)
	e.running = slices.DeleteFunc(e.running, func(x *sequence) bool { return x == s })
	e.waiting = slices.DeleteFunc(e.waiting, func(x *sequence) bool { return x == s })
	e.roomLocked() // a slot, and perhaps room in the queue
	level := slog.LevelDebug
	if ev.Finish == FinishError {
		level = slog.LevelWarn
	}
	e.log.Log(context.Background(), level, "request finished", "id", s.req.ID, "finish", string(ev.Finish),
		"prompt_tokens", s.promptLen, "generated_tokens", s.generated(), "error", ev.Err)
}

// roomLocked tells Submit calls waiting for a slot or for room in the queue to look again.
func (e *Engine) roomLocked() {
	close(e.space)
	e.space = make(chan struct{})
}
