// Package cuda is Loom's CUDA backend: kernels for the ops of the graph catalog, GEMMs
// through cuBLAS, and an executor that lowers an optimized graph to kernel launches with a
// static memory plan. It uses no cgo: package cubind opens the CUDA libraries at run time,
// so binaries built with CGO_ENABLED=0 run on machines without a GPU and use one when it is
// there.
//
// # Devices and memory
//
// Open(ordinal) returns a Device: the GPU's primary context, one non-blocking stream that
// orders all of the device's work, a cuBLAS handle, a pooling Allocator (size classes,
// freed blocks reused) and the compiled kernel modules. Tensors live in device memory
// (Alloc, Upload, Download, Free); their dtype and row-major shape are those of package
// tensor. Every Device method locks the device, pins the goroutine to its OS thread and
// makes the context current, so a Device may be used from any goroutine.
//
// # Kernels
//
// Kernels are CUDA C in kernels/*.cu, embedded in the binary and compiled at run time by
// NVRTC for the device's architecture (sm_90 on an H100 or H200). Cubins are cached on disk
// under $LOOM_CACHE_DIR/cubin, or os.UserCacheDir()/loom/cubin, keyed by a hash of the
// source, the architecture, the compile options and NVRTC's version.
//
// The Device holds the runtime only. The launchers are functions of this package that take
// the Device, one file per op or family of ops (ops.go says what they share), each file
// entering its graph ops in the executor's table. The exported launchers lock the device;
// each checks shapes and dtypes (floats f32 or bf16; positions and ids i32 or i64):
//
//	Embedding          table[V,D] by ids[...] -> [...,D] (the table's dtype, or the other one: a fused cast)
//	RMSNorm            x[...,D], w[D] -> [...,D], as graph op rmsnorm (f32 math, double sum of squares)
//	AddRMSNorm         x, residual [...,D], w[D] -> normed, sum, as graph op add_rmsnorm
//	Rope               q[B,H,S,D], k[B,KV,S,D], positions[B,S], inv_freq f32[D/2] -> q', k'
//	SDPA               causal GQA attention, flash style (online softmax, sliding window), D <= 256
//	QKVRoPE            packed q|k|v projections -> q, k (rotated), v as heads (graph op qkv_rope)
//	QKVNormRoPE        QKVRoPE with q's and k's heads RMS-normed first (Qwen3; graph op qkv_norm_rope)
//	SwiGLU             silu(gate) * up; SwiGLUPacked on packed gate|up (graph op swiglu_packed)
//	Linear             x[...,K] @ w[N,K]ᵀ: the decode GEMV for few rows, else cuBLAS (bf16 or f32, f32 accumulation)
//	LinearSwiGLU       linear then swiglu_packed, the activation in the GEMV's epilogue (graph op linear_swiglu)
//	LinearQKVRoPE      linear then qkv_rope, in the GEMV's epilogue (graph op linear_qkv_rope)
//	PagedAttention     attention over the paged KV cache: split-KV decode, tensor-core (flash.cu) or tiled prefill
//	Gather             entries of x along an axis by indices (gather_logits)
//	Add, Mul           NumPy broadcasting
//	Cast, Transpose, Slice, Concat, Expand: strided copies (also split and repeat_kv)
//	Argmax             x[...,V] -> i32[...], the first maximum (NaN never wins)
//	SampleRows         one token per row of logits by temperature, top-k, top-p, min-p and a seeded draw
//	GreedyRows         the argmax of each row of logits, over many blocks per row
//
// The collective ops (all_reduce, all_gather, reduce_scatter, all_reduce_add_rmsnorm,
// linear_all_reduce) run through a Collectives (NCCL) or, for small all-reduces, the
// one-shot peer kernel of a PeerGroup (peer.go; AllReduce, AllReduceAddRMSNorm).
//
// The primitive ops the fused kernels leave out have generic kernels (primitive.go,
// kernels/primitive.cu): the unary math of the catalog, sub, div, pow, maximum, minimum,
// comparisons, logical ops, where, casts and add and mul of any dtype, sum, mean, max,
// softmax, batched matmul, iota and topk (so that moe runs decomposed). They compute as the
// CPU's reference kernels do and are there so that fused ops can run as their
// decompositions (see below), not for speed.
//
// The fused mixture-of-experts block (graph op moe: moe.go, kernels/moe.cu) runs without a
// host round trip, so decode steps with it are captured in CUDA graphs: router logits (a GEMV,
// or cuBLAS for many bf16 tokens), routing (softmax, top-k, renormalisation) one warp per
// token with the last block grouping the assignments by local expert (counts, offsets, the
// active experts, tensor-core tiles), the experts on their own tokens only (a grouped GEMV
// over active-expert slots, blocks of slots without an expert exiting at once; a tensor-core
// grouped GEMM, mma.sync on bf16, above 8 rows per active expert), and the combine in expert
// order with the CPU kernel's roundings (bf16 results match backend/cpu's fastMoE bit for bit
// but for an element in thousands; f32 ones to the order of the f32 sums). Nodes it does not
// take (f16 operands, sizes not multiples of 8, more than 1024 experts, top_k above 32) run as
// the decomposition, with the reason logged (opKernel.supports).
//
// Kernels round where the graph op's decomposition rounds, so f32 results match the CPU
// backend to the last bits and bf16 results to one bf16 ulp; attention differs from the
// decomposition only in never rounding probabilities to bf16.
//
// # Executor
//
// Compile lowers a graph whose ops are all in Ops() to a Program: params and consts
// uploaded once, nodes of constant inputs evaluated once. A node whose op has no CUDA
// kernel but a decomposition in the graph catalog (a fused op) is first replaced by its
// decomposition, recursively (graph.Expand), and the op logged once: a new fused op runs on
// the GPU before it has a kernel. An op with neither is a compile-time error naming it,
// never a CPU fallback. Program.Run binds the symbolic dimensions from the inputs, lays
// every intermediate value out in one arena by a static memory plan made once per binding
// (package backend/memplan: values alive at the same time never share bytes; reshapes are
// views), launches the kernels in order and copies the outputs back; with Options.Graphs
// the launches of a binding are captured as a CUDA graph and replayed.
//
// # How the pieces work together
//
// (Moved here from docs/ARCHITECTURE.md, which keeps the map.)
//
// backend/cuda (over cubind, no cgo): CUDA C kernels compiled by NVRTC for the device's
// architecture and cached on disk, cuBLAS GEMMs in bf16 with f32 accumulation (a custom GEMV
// for decode-sized batches; per-shape cuBLASLt algorithm tuning behind LOOM_CUDA_GEMM_TUNE=1),
// a pooling allocator and an executor with a static memory plan. The Device holds the runtime
// (context, streams, memory, compiled modules); each op's launchers are functions of the
// device in the op's own file, which enters the op in the executor's table. A fused op without
// a CUDA kernel runs as its catalog decomposition: Compile expands such nodes (graph.Expand,
// recursively) into primitives, which all have kernels (generic ones in primitive.cu: unary
// math, arithmetic, comparisons, logic, where, casts, reductions, softmax, batched matmul,
// topk),
// and logs each such op once; so a new fused op needs only its catalog entry to run
// everywhere, and a kernel of its own to run fast. An op with neither kernel nor decomposition
// is a compile error naming it, never a CPU fallback. paged_attention picks its kernel by
// shape: a split-KV decode kernel (splits and warps chosen from the block-table width, a
// combine kernel when split), a tensor-core flash-attention prefill (flash.cu, mma.sync on
// bf16, K/V tiles staged from the paged cache with cp.async) for bf16, and a CUDA-core tiled
// prefill otherwise. The fused linears linear_swiglu and linear_qkv_rope (a fused gate|up or
// q|k|v projection joined with the packed op that reads it) run on the decode GEMV with the
// activation, or the layout of q, k and v as heads and the rotation of q and k, in its
// epilogue: each warp takes the weight rows whose outputs its epilogue pairs (gate row j and
// up row I+j; the rows f and half+f of one head), so the packed projections are never written
// and the packed op's kernel is gone, with the bits of the two ops run apart. Products the
// GEMV does not take go through linear into the step's workspace, then the packed kernel.
//
// The executor (Program) numbers every value, and per binding of the symbolic dimensions (a
// bucket of shapes) lays all intermediates and each step's scratch (workspace) out in one
// arena (backend/memplan), values whose lifetimes overlap never sharing bytes. Because
// addresses are fixed per bucket, a run can be captured: with Options.Graphs the first run of
// a bucket is eager, the second is captured as a CUDA graph and replayed from then on; inputs
// are copied in before the graph and outputs out after it. The engine pads block tables to a
// power of two so that decode steps fall into few buckets. Options.Resident keeps inputs on
// the device (the engine's KV caches, which paged_attention updates in place; the host never
// holds a copy). RunSampled chooses tokens on the GPU (SampleRows: greedy, temperature, top-k,
// top-p, min-p, a counter-based draw keyed by the request's seed and token index) and brings
// back token ids instead of logits; the engine samples so whenever no request of a step needs
// the host sampler (penalties, log-probabilities), through Launch and Launched.Wait, which
// split such a run in two: Launch copies the inputs in, queues the kernels and the sampling
// and returns; Wait waits for that work (through the communicator on a sharded graph) and
// reads the ids back on a side stream, which does not wait for a step queued behind. With
// LaunchOptions.FeedIDs a step's input_ids are the ids the previous launch sampled, copied on
// the device, so that step n+1 can be queued before step n's tokens reach the host. Two
// launches may be in flight (two launch slots: ids buffer and events each). RunSampled is
// Launch then Wait. Wait polls its event (or the communicator) without holding the device's
// lock, so that another goroutine can launch meanwhile: a follower rank queues step n+1 as it
// reads rank 0's frame while its reply goroutine still waits for step n. Inputs are copied
// from Go memory (the driver stages them before the call returns); copies through pinned host
// memory were tried and, on the gVisor-run GPU host, now and then moved stale bytes.
// Options.Profile times every step with events and reports GPU time per op (loom bench --cuda-
// profile). RunDiscard runs a step without bringing outputs back: ranks other than 0 run so,
// since only rank 0's logits are read. Every run is timed on the device by two events around
// its copies and kernels (DeviceTime); the engine reports it as Stats.DeviceSeconds, so that a
// step's host overhead is the model time minus it.
//
// Kernels of the files in pdlFiles (GEMV, fused qkv_rope/swiglu, rope, embedding, the one-shot
// all-reduce) launch with programmatic dependent launch (cubind.LaunchKernelPDL, sm_90+): each
// may start while the kernel before it drains, waits (pdl_wait in common.cuh) before touching
// memory another kernel uses, and lets the next one start right after its own wait. The GEMV
// loads its first weights before waiting. A kernel queued right after a copy or memset
// launches without PDL: its wait covers the kernel before it, not the copy. TestPDLFilesWait
// checks that every kernel of those files waits; LOOM_CUDA_PDL=0 turns it off. (Asking L2 for
// the GEMV's remaining weight rows before its wait was measured: tp=2 decode 2.72 → 3.11 ms,
// so it is not done.)
//
// Sharded graphs run one rank per GPU. Collective ops are bound to the rank at compile time
// and queue their work on the device's stream, so CUDA graphs capture them with the rest of a
// step: through Collectives (NCCL, dist/nccl) or, for all-reduces up to OneShotMaxBytes, the
// one-shot peer kernel (PeerGroup), which also fuses the residual add and RMSNorm of
// all_reduce_add_rmsnorm. The one-shot kernel pushes: every rank writes its input over NVLink
// into its slot of every rank's buffer, whose elements read as empty (a NaN pattern) until a
// value lands, and each rank waits on the values in its own buffer and sums the slots in rank
// order (bit-identical on every rank). Three buffers rotate by a call counter kept on the
// device (graph replays need nothing from the host); each call clears the buffer of the call
// before, which no peer can be writing (kernels/allreduce.cu gives the argument). No flags, no
// barrier: one crossing of NVLink per call. A program with collectives waits for its stream
// through the communicator, which reports a failed or silent peer by rank within a timeout.
//
// Backends register under a device name (backend.Register: backend/cpu as "cpu", backend/cuda
// as "cuda"; cmd/loom imports backend/all). backend.Resolve is the one device resolver:
// --device auto|cpu|cuda, auto picking the backend of highest priority whose Check passes
// (CUDA when a GPU and the libraries are present, the optimized graph runs and there are
// enough GPUs for the mesh; else the CPU). engine.Load (every device and mesh, one process or
// one rank of many) optimizes the graph (per rank on a mesh) and hands it to the backend's
// Deploy: backend/cuda opens one GPU per rank, makes the NCCL communicators of this process
// (nccl.InitAll, sub-communicators per mesh group) and the peer group, and compiles each
// rank's program; engine.New runs the continuous-batching engine on them, with the KV cache
// sized from the device memory left after the weights (Deployment.FreeMemory). The engine
// finds what an executable can do through package backend's interfaces (Launcher, Resident,
// Discarder, DeviceClock, Profiler), never through a backend's types. OneShotMaxBytes (4 MiB)
// is the one threshold of the one-shot all-reduce: the size of every peer buffer and the
// largest all-reduce auto sends through it.
//
// dist/nccl binds NCCL through purego: World is one rank's communicators (world and one per
// mesh group, from ncclCommSplit), in one process (InitAll) or one process per rank (Init,
// after a TCP rendezvous on rank 0 that hands out the NCCL id from torchrun-style
// RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT and keeps a liveness connection to every rank); loom
// launch --nproc N -- cmd starts such ranks. With one process per rank (WORLD_SIZE > 1 in the
// environment), each process compiles only its own rank's program (engine.LoadOptions.Process,
// on GPU LOCAL_RANK); rank 0 runs the engine, scheduler and server as usual, and each other
// rank is, in rank 0's engine, a steps.Remote (package engine/steps) that sends every step's
// inputs (not the KV caches, which stay on each rank's GPU) over TCP to that process, where
// steps.Follow (Model.Follow) runs them and replies; the collectives inside the programs meet
// over NCCL. A follower that can launch steps (a CUDA program; its hello says so) also takes
// launch frames, which carry the step's draws and whether its input_ids are fed from its own
// last sampled ids: it queues the step and reads on while a goroutine of its own replies to
// the steps in order, each once it is done, so that steps launched ahead work across processes
// too. When all ranks are on one host and can map each other's memory (they check and vote
// through World.AllGatherBytes), the processes also form a one-shot peer group through CUDA
// IPC handles (cuda.NewPeerRankIPC), so small all-reduces skip NCCL as they do in one process.
// A follower's error comes back naming its rank; a dead follower fails rank 0's step, and a
// dead rank 0 ends the followers. World.Sync waits for a stream while polling NCCL's
// asynchronous errors and the peers, and aborts the communicators on a failure or timeout. Its
// spin yields the processor only every 1024 looks: the caller's goroutine is locked to the OS
// thread that holds the GPU's context, and a yield there costs two thread wake-ups.
// NCCL_NVLS_ENABLE=0 is always set: NVLink multicast is never used.
package cuda
