// Package engine runs compiled models: it loads a checkpoint, builds, optimizes and compiles
// its graph (Load), and generates tokens for many requests at once (Engine).
//
// An Engine owns the paged KV cache (package kvcache) and a continuous-batching scheduler:
// requests join and leave the running batch at every step, a step holds decodes and prompt
// chunks together, and each request streams its tokens back (Submit, Stream.Recv). The graph
// it runs went through insert_cached_attention, so a step is one row of flattened tokens
// (B = 1, S = every sequence's new tokens) with per-sequence metadata; see stepInputs.
//
//	m, _ := engine.Load(ctx, dir, engine.LoadOptions{Optimize: true})
//	e, _ := engine.New(ctx, m, engine.Options{MaxBatch: 16})
//	defer e.Close()
//	st, _ := e.Submit(ctx, engine.Request{Prompt: ids, MaxTokens: 32})
//	for {
//		ev, err := st.Recv(ctx) // io.EOF after the event with Finish set
//		...
//	}
//
// GreedyRecompute, which runs the whole sequence again for every token, is the reference
// the engine is tested against.
//
// # Steps
//
// engine.Load opens the checkpoint, builds the graph, runs the pipeline (with the cache stage
// on) and compiles one program per rank. After insert_cached_attention the graph runs on the
// flattened new tokens of every sequence in a step (B = 1, S = tokens in the step) and reads
// the layout from slot_mapping, token_seq and block_tables; paged_attention writes each
// token's K/V into its cache slot and attends over the sequence's blocks (on CUDA, decode
// steps do both in one kernel: the step's own keys and values come from the inputs, and the
// last warp of the last split, which has the fewest cached keys, writes them to the cache;
// splits of a context merge in paged_combine, or with two splits inside one thread-block
// cluster through distributed shared memory). gather_logits computes the LM head only for each
// sequence's last token.
//
// The Engine is the one admission layer (Options.MaxConcurrent, MaxQueue, QueueOnFull: loom
// serve --max-concurrent, --max-queue, --overload; the server only maps refusals to 429). It
// runs one step loop: it admits requests within the KV-block budget (or queues them), mixes
// decodes and chunks of prefills up to the per-step token budget, preempts the newest sequence
// when blocks run out, samples (sample: penalties, temperature, top-k, top-p, min-p, seeds,
// log-probabilities) and streams events. A request's context cancels it and frees its blocks.
// A step is launched and later collected. When every rank can queue steps (backend.Launcher: a
// CUDA program) and the device chooses the tokens, the loop launches step n+1 before
// collecting step n (launchAhead, engine/overlap.go), its input_ids fed on each rank's device
// from step n's ids (every rank samples the same ids from the same all-gathered logits and
// draws, the draw counter one ahead). It does so only when step n+1 is what the scheduler
// would plan: every sequence takes a token and goes on decoding, none reaches its limit, none
// is cancelled, nothing waits that could be admitted, the blocks are there. A sequence that
// step n's token stops has its row of step n+1 computed for nothing and dropped; its freed
// blocks are written by that row before any later step uses them (one stream per device). The
// host's work per step (collecting, delivering, scheduling, launching) then runs while the GPU
// computes. Options.SyncSteps (--sync-steps) turns this off; Stats.AheadStepsTotal counts the
// steps launched ahead.
package engine
