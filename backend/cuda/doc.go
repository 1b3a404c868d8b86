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
// softmax, batched matmul and iota. They compute as the CPU's reference kernels do and are
// there so that fused ops can run as their decompositions (see below), not for speed.
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
package cuda
