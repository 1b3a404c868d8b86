// Package cpu is Loom's pure-Go CPU backend: a table of kernels, one per graph op, and an
// executor (Compile, Program.Run) that loads a graph's parameters and runs its nodes in order.
//
// Every op of the catalog in package graph (except param, which is loaded, not run) has a
// reference kernel here: primitives have their own, and fused ops (those that declare a
// decomposition) run their decomposition. Reference kernels are simple and exact about
// semantics: they compute in float32 from any float storage dtype (bf16 and f16 are
// widened), in int64 for integer ops and with plain bools for logical ops, and store the
// result in the node's declared output dtype. Faster kernels (fused ops, SIMD, tuned GEMMs)
// replace them with Register; Reference keeps the originals reachable so tests can hold the
// fast ones equal to them.
//
// The fast kernels registered by this package (fast_linear.go, fast_fused.go, fast_moe.go)
// cover linear, matmul and the fused ops rmsnorm, add_rmsnorm, rope, repeat_kv, sdpa, swiglu
// and moe (only the experts each token chose, grouped by expert). They split
// their work over a shared pool of GOMAXPROCS workers and keep bf16 weights as bf16, widening
// them inside the kernel. Linear's dot products run on the kernel set chosen at start-up by
// CPU feature detection (kernels.go): Go assembly on amd64 in every build, AVX-512F/BW where the
// CPU has it (kernels_avx512_amd64.s), else AVX2/FMA (kernels_amd64.s), portable Go
// elsewhere; LOOM_CPU_KERNELS forces a set, such as avx512bf16 (VDPBF16PS, x rounded to
// bf16), which never runs by default.
package cpu

import (
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Out describes one output a kernel must produce: its dtype and its concrete shape (the
// node's declared shape with every symbol resolved).
type Out struct {
	DType tensor.DType
	Shape []int

	// arena, set by Program.Run, is where this package's kernels take the output's storage
	// (newOut, arena.go); nil outside a run (folding, tests, other callers): the Go heap.
	arena *arena
}

func (o Out) String() string { return fmt.Sprintf("%s%v", o.DType, o.Shape) }

// Kernel computes node n. in holds one tensor per node input, in order; out gives the dtype
// and concrete shape of each node output. A kernel returns one new tensor per output, of
// exactly that dtype and shape. It never modifies its inputs and never returns one of them
// (inputs may be weights or caller data that outlive the run). Bad inputs are errors, never
// panics.
type Kernel func(n *graph.Node, in []*tensor.Tensor, out []Out) ([]*tensor.Tensor, error)

var (
	mu        sync.RWMutex
	reference = map[string]Kernel{} // filled once by init functions, read-only afterwards
	overrides = map[string]Kernel{}
)

// registerReference declares the reference kernel of op; called from init functions only.
func registerReference(op string, k Kernel) {
	if _, dup := reference[op]; dup {
		panic("cpu: duplicate reference kernel for " + op) // programming error found at init
	}
	reference[op] = k
}

// Register installs k as the kernel for op, in place of the reference kernel (if any). It is
// meant for faster kernels and for kernels of ops that have no reference here, such as fused
// ops. Register(op, nil) removes an installed kernel, so the reference kernel is used again.
// Programs already compiled keep the kernels they were compiled with.
func Register(op string, k Kernel) {
	mu.Lock()
	defer mu.Unlock()
	if k == nil {
		delete(overrides, op)
		return
	}
	overrides[op] = k
}

// Lookup returns the kernel Compile uses for op: the registered one if any, else the
// reference kernel.
func Lookup(op string) (Kernel, bool) {
	mu.RLock()
	k, ok := overrides[op]
	mu.RUnlock()
	if ok {
		return k, true
	}
	return Reference(op)
}

// Reference returns the reference kernel of op, whatever Register installed. An op of the
// graph catalog that declares a decomposition (a fused op) and has no reference kernel of
// its own gets one that runs its decomposition with reference kernels.
func Reference(op string) (Kernel, bool) {
	if k, ok := reference[op]; ok {
		return k, true
	}
	if spec, ok := graph.Lookup(op); ok && spec.Decompose != nil {
		return decomposed, true
	}
	return nil, false
}

// ReferenceOps lists the ops that have a reference kernel (see Reference), sorted.
func ReferenceOps() []string {
	ops := slices.Collect(maps.Keys(reference))
	for _, spec := range graph.Ops() {
		if _, own := reference[spec.Name]; !own && spec.Decompose != nil {
			ops = append(ops, spec.Name)
		}
	}
	slices.Sort(ops)
	return ops
}
