// Package cuda is Loom's CUDA backend: kernels for the fused ops of the graph catalog,
// GEMMs through cuBLAS, and an executor that lowers an optimized graph to kernel launches
// with a static memory plan. It uses no cgo: package cubind opens the CUDA libraries at run
// time, so binaries built with CGO_ENABLED=0 run on machines without a GPU and use one when
// it is there.
//
// # Devices and memory
//
// Open(ordinal) returns a Device: the GPU's primary context, one non-blocking stream that
// orders all of the device's work, a cuBLAS handle and a pooling Allocator (size classes,
// freed blocks reused). Tensors live in device memory (Alloc, Upload, Download, Free); their
// dtype and row-major shape are those of package tensor. Every Device method locks the
// device, pins the goroutine to its OS thread and makes the context current, so a Device
// may be used from any goroutine.
//
// # Kernels
//
// Kernels are CUDA C in kernels/*.cu, embedded in the binary and compiled at run time by
// NVRTC for the device's architecture (sm_90 on an H100 or H200). Cubins are cached on disk
// under $LOOM_CACHE_DIR/cubin, or os.UserCacheDir()/loom/cubin, keyed by a hash of the
// source, the architecture, the compile options and NVRTC's version. One Device method per
// op, each checking shapes and dtypes (f32 or bf16; positions and ids i32 or i64):
//
//	Embedding   table[V,D] by ids[...] -> [...,D] (the table's dtype, or the other one: a fused cast)
//	RMSNorm     x[...,D], w[D] -> [...,D], as graph op rmsnorm (f32 math, double sum of squares)
//	AddRMSNorm  x, residual [...,D], w[D] -> normed, sum, as graph op add_rmsnorm
//	Rope        q[B,H,S,D], k[B,KV,S,D], positions[B,S], inv_freq f32[D/2] -> q', k'
//	SDPA        causal GQA attention, flash style (online softmax, sliding window), D <= 256
//	SwiGLU      silu(gate) * up
//	Add, Mul    NumPy broadcasting
//	Linear      x[...,K] @ w[N,K]ᵀ through cublasGemmEx, bf16 or f32 with f32 accumulation
//	Argmax      x[...,V] -> i32[...], the first maximum (NaN never wins)
//	Cast, Transpose, Slice, Concat, Expand: strided copies
//
// Kernels round where the graph op's decomposition rounds, so f32 results match the CPU
// backend to the last bits and bf16 results to one bf16 ulp; attention differs from the
// decomposition only in never rounding probabilities to bf16.
//
// # Executor
//
// Compile lowers a graph whose ops are all in Ops() (the fused ops above, linear, add, mul,
// cast and the shape ops reshape, transpose, slice, concat, split, expand, repeat_kv) to a
// Program: params and consts uploaded once, nodes of constant inputs evaluated once, and an
// op without a CUDA kernel a compile-time error naming it (never a CPU fallback).
// Program.Run binds the symbolic dimensions from the inputs, lays every intermediate value
// out in one arena by a static memory plan made once per binding (values alive at the same
// time never share bytes; reshapes are views), launches the kernels in order and copies the
// outputs back.
package cuda
