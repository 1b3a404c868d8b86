package backend

import (
	"context"
	"slices"
	"time"

	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tensor"
)

// Executable runs a compiled graph: it takes the graph's inputs by name and returns its
// outputs in order. An engine step's graph takes input_ids i32[B,S] and positions i32[B,S]
// and returns the logits f32[B,S,vocab] first; on the paged KV cache it also takes
// slot_mapping, token_seq, block_tables and the kv_cache.<layer>.k/.v tensors. Every
// backend's program implements it (backend/cpu.Program, backend/cuda.Program).
//
// An executable may have powers beyond Run, each an interface of this file that the engine
// looks for: Discarder (run without bringing outputs back), Resident (keep some inputs on its
// device), Launcher (queue a step that samples on the device, collect it later), DeviceClock
// (time its runs on the device) and Profiler (time per op).
type Executable interface {
	Run(ctx context.Context, inputs map[string]*tensor.Tensor) ([]*tensor.Tensor, error)
}

// Discarder is an Executable that can run without bringing its outputs back to the host: the
// ranks other than 0 of a deployment run so, since only rank 0's logits are read.
type Discarder interface {
	RunDiscard(ctx context.Context, inputs map[string]*tensor.Tensor) error
}

// RunDiscard runs exe on inputs for its effects (KV cache writes, collectives with the other
// ranks): through RunDiscard when exe is a Discarder, else Run with the outputs dropped.
func RunDiscard(ctx context.Context, exe Executable, inputs map[string]*tensor.Tensor) error {
	if d, ok := exe.(Discarder); ok {
		return d.RunDiscard(ctx, inputs)
	}
	_, err := exe.Run(ctx, inputs)
	return err
}

// Resident is an Executable that keeps some of its inputs itself (the engine's KV caches,
// which paged_attention updates in place: backend/cuda on its device, backend/cpu outside the
// Go heap): the caller passes shape-only tensors for them (see kvcache.NewCacheShapes), and
// holds no copy of its own.
type Resident interface {
	// Resident names the inputs the executable keeps.
	Resident() []string
}

// Keeps reports whether exe keeps every input of names itself (see Resident).
func Keeps(exe Executable, names []string) bool {
	r, ok := exe.(Resident)
	if !ok {
		return false
	}
	kept := r.Resident()
	for _, n := range names {
		if !slices.Contains(kept, n) {
			return false
		}
	}
	return true
}

// Launcher is an Executable that can queue a step and collect it later, the step choosing
// its tokens on the device (device sampling): the engine then launches step n+1 before step
// n's tokens reach the host (launch ahead).
type Launcher interface {
	// LaunchStep queues a step that samples one token per row of its logits with draws
	// (sample.DeviceDraw: greedy, temperature, top-k, top-p, min-p, a counter-based draw).
	// With feed, input_ids are the ids the previous LaunchStep sampled, copied on the device
	// (the inputs' own input_ids only give the shape). With download, Wait returns the ids;
	// without, Wait returns nil once the step is done.
	LaunchStep(ctx context.Context, inputs map[string]*tensor.Tensor, draws []sample.DeviceDraw, feed, download bool) (Pending, error)
}

// Pending is a step a Launcher queued.
type Pending interface {
	// Wait waits for the step and returns its ids (nil unless it was launched with download).
	Wait(ctx context.Context) ([]int32, error)
}

// DeviceClock is an Executable that times its runs on its device (copies in and kernels).
type DeviceClock interface {
	// DeviceTime is the device time of the runs since the last ResetDeviceTime, and their count.
	DeviceTime() (time.Duration, int)
	ResetDeviceTime()
}

// OpTime is the device time of one op over the runs a Profiler timed.
type OpTime struct {
	Op    string // the op, and the shape of each weight its node reads: "linear [5120 2048]"
	Calls int
	Time  time.Duration
}

// Profiler is an Executable that times every op of every run on its device (backend/cuda
// with profiling on): OpTimes returns the times since the last call, most time first.
type Profiler interface {
	OpTimes() []OpTime
}
