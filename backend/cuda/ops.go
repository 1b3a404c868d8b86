package cuda

import (
	"fmt"
	"maps"
	"math/bits"
	"slices"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// Launchers. Each op (or family of ops) has its own file holding its launchers, plain
// functions of the Device (norm.go, rope.go, attention.go, elementwise.go, strided.go,
// linear.go, gemv.go, gemm_tune.go, packed.go, linear_fused.go, paged.go, flash.go,
// sample.go, collective.go, ...), and the init function that enters its graph ops in
// opKernels; the Device itself only holds the runtime (context, streams, memory, compiled
// modules, launches). An exported launcher (RMSNorm(d, ...)) locks the device and calls the
// unexported one (rmsnorm(d, ...)), which the executor calls with the device already
// locked. Every launcher checks shapes and dtypes, queues its kernels on the device's
// stream and returns; outputs are tensors the caller allocated with the shape and dtype the
// op's doc gives. Float tensors may be f32 or bf16; math is f32 (see each kernel file for
// where it rounds). Inputs and outputs must not overlap unless a launcher says so.
//
// This file holds what the launchers share: dtype names and checks, launch shapes, and the
// table of the ops the executor lowers.

// floatName returns the kernel suffix of a float dtype the kernels support.
func floatName(what string, dt tensor.DType) (string, error) {
	switch dt {
	case tensor.F32, tensor.BF16:
		return dtypeName(dt), nil
	}
	return "", fmt.Errorf("%s is %s; CUDA kernels take f32 or bf16", what, dt)
}

// intName returns the kernel suffix of an index dtype (positions, ids).
func intName(what string, dt tensor.DType) (string, error) {
	switch dt {
	case tensor.I32, tensor.I64:
		return dtypeName(dt), nil
	}
	return "", fmt.Errorf("%s is %s; want i32 or i64", what, dt)
}

// promote is the dtype of a binary op on a and b: bf16 only when both are.
func promote(a, b tensor.DType) tensor.DType {
	if a == tensor.BF16 && b == tensor.BF16 {
		return tensor.BF16
	}
	return tensor.F32
}

func checkOut(what string, t *Tensor, dt tensor.DType, shape []int) error {
	if t == nil {
		return fmt.Errorf("%s is nil", what)
	}
	if t.DType != dt || !slices.Equal(t.Shape, shape) {
		return fmt.Errorf("%s is %s%v, want %s%v", what, t.DType, t.Shape, dt, shape)
	}
	return nil
}

func checkLive(ts ...*Tensor) error {
	for i, t := range ts {
		if t == nil {
			return fmt.Errorf("operand %d is nil", i)
		}
		if t.ptr == 0 && t.Numel() > 0 {
			return fmt.Errorf("operand %d (%s%v) was freed", i, t.DType, t.Shape)
		}
	}
	return nil
}

// gridStride returns the grid of a grid-stride loop over n elements with blocks of 256.
func gridStride(d *Device, n int64) cubind.Dim3 {
	g := (n + 255) / 256
	g = min(g, int64(d.info.SMs)*16)
	return cubind.Dim3{X: int(max(g, 1)), Y: 1, Z: 1}
}

var block256 = cubind.Dim3{X: 256, Y: 1, Z: 1}

// rowBlock picks a block size (a multiple of 32, at most 1024) for one row of n elements.
func rowBlock(n int) cubind.Dim3 {
	t := 32
	if n > 256 {
		t = min(1024, 1<<bits.Len(uint(n/8-1)))
	}
	return cubind.Dim3{X: max(t, 32), Y: 1, Z: 1}
}

func wrap(what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%s: %w", what, err)
}

// opKernel lowers one graph op to device work.
type opKernel struct {
	// view marks ops whose output is the input reinterpreted: no kernel, no memory.
	view bool
	// prepare, when set, runs once at compile time; its result is passed to run.
	prepare func(d *Device, n *graph.Node) (any, error)
	// workspace, when set, gives the bytes of scratch memory a run of n needs, from the
	// concrete shapes of its inputs. The memory plan reserves it for that step only, and run
	// receives it as one extra byte tensor (dtype bool) after n's outputs (out[len(n.Outputs)]). Being part
	// of the plan, it is at a fixed address for a set of shapes, so steps that use it can be
	// captured in CUDA graphs.
	workspace func(n *graph.Node, in [][]int) int64
	// collective marks the collective ops: at compile time they are bound to the program's
	// rank of its mesh (Options.Comm, Mesh, Rank), and the binding is their state.
	collective bool
	// supports, when set, tells whether the kernel takes node n (dtypes, sizes): a graph
	// with a node it refuses runs every node of that op as the op's decomposition, and
	// Compile logs why (expandGraph).
	supports func(n *graph.Node) error
	run      func(d *Device, n *graph.Node, in, out []*Tensor, state any) error
}

// opKernels is the table of ops the executor lowers, filled by the init functions of the
// files that hold each op's launcher. A node whose op is missing here runs as its
// decomposition in the graph catalog (expand.go) or, for an op without one, is a
// compile-time error: there is no CPU fallback.
var opKernels = map[string]*opKernel{}

// Ops lists the graph ops the CUDA executor runs (besides param and const, which it loads).
func Ops() []string { return slices.Sorted(maps.Keys(opKernels)) }
