package nccl

import (
	"context"
	"errors"
	"fmt"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/tensor"
)

// Comm is one rank's NCCL communicator for one group of its World. Its collectives take
// device buffers of the World's GPU and enqueue their work on stream s; they return before
// the work is done (World.Sync waits for it). Counts are in elements of dt, never bytes.
// Every rank of the group makes the same calls in the same order with the same counts,
// dtype, op and root; NCCL does not check this, and a mismatch hangs until World.Sync
// times out.
//
// A Comm is not safe for concurrent use, and a rank should issue all its NCCL calls, on
// every group, from one goroutine locked to its OS thread with the GPU's context current.
type Comm struct {
	w     *World
	group dist.Group
	h     cubind.NCCLComm // shared with the world communicator when the group is the world
	step  uint64          // calls so far, for errors
}

// Group is the group this communicator serves, seen from its rank.
func (c *Comm) Group() dist.Group { return c.group }

// Size is the number of ranks of the group.
func (c *Comm) Size() int { return c.group.Size() }

// Handle is the underlying NCCL communicator, for calls this package does not wrap.
func (c *Comm) Handle() cubind.NCCLComm { return c.h }

// ncclType maps a tensor dtype to NCCL's; reduce says the type must be reducible.
func ncclType(dt tensor.DType, reduce bool) (cubind.NCCLDataType, error) {
	switch dt {
	case tensor.F32:
		return cubind.NCCLFloat32, nil
	case tensor.BF16:
		return cubind.NCCLBfloat16, nil
	case tensor.F16:
		return cubind.NCCLFloat16, nil
	case tensor.I32:
		return cubind.NCCLInt32, nil
	case tensor.I64:
		return cubind.NCCLInt64, nil
	case tensor.Bool:
		if !reduce {
			return cubind.NCCLUint8, nil
		}
		return 0, fmt.Errorf("dtype bool does not reduce (want f32, bf16, f16, i32 or i64)")
	}
	return 0, fmt.Errorf("dtype %s is not supported by NCCL collectives", dt)
}

func ncclOp(op dist.ReduceOp) (cubind.NCCLRedOp, error) {
	switch op {
	case dist.Sum:
		return cubind.NCCLSum, nil
	case dist.Max:
		return cubind.NCCLMax, nil
	}
	return 0, fmt.Errorf("reduce op %s is not supported (want sum or max)", op)
}

// begin checks a call before it reaches NCCL and numbers it.
func (c *Comm) begin(name string, count int, dt tensor.DType, reduce bool) (uint64, cubind.NCCLDataType, error) {
	step := c.step
	c.step++
	if err := c.w.usable(); err != nil {
		return step, 0, c.fail(name, step, err)
	}
	if count < 0 {
		return step, 0, c.fail(name, step, fmt.Errorf("negative count %d", count))
	}
	ndt, err := ncclType(dt, reduce)
	if err != nil {
		return step, 0, c.fail(name, step, err)
	}
	return step, ndt, nil
}

// fail wraps err as the *dist.Error of call step; a *PeerError names its rank as the peer
// at fault.
func (c *Comm) fail(name string, step uint64, err error) error {
	e := &dist.Error{Collective: name, Group: c.group, Rank: c.w.rank, Step: step, Err: err}
	var pe *PeerError
	if errors.As(err, &pe) {
		e.Peers = []int{pe.Rank}
	}
	return e
}

// finish completes an NCCL call: ncclInProgress (a non-blocking communicator) is waited
// for; a failure aborts the world.
func (c *Comm) finish(name string, step uint64, err error) error {
	if err == nil {
		return nil
	}
	if cubind.IsNCCLInProgress(err) {
		err = c.w.await(context.Background(), name, true, c.h)
		if err == nil {
			return nil
		}
	} else {
		err = c.w.abort(err)
	}
	return c.fail(name, step, err)
}

// AllReduce reduces count elements of send elementwise over the group with op and writes
// the result to recv on every rank; send may equal recv (in place). dt is f32, bf16, f16,
// i32 or i64.
func (c *Comm) AllReduce(send, recv cubind.DevicePtr, count int, dt tensor.DType, op dist.ReduceOp, s cubind.Stream) error {
	const name = "all_reduce"
	step, ndt, err := c.begin(name, count, dt, true)
	if err != nil {
		return err
	}
	nop, err := ncclOp(op)
	if err != nil {
		return c.fail(name, step, err)
	}
	if count == 0 {
		return nil
	}
	return c.finish(name, step, cubind.NCCLAllReduce(send, recv, count, ndt, nop, c.h, s))
}

// AllGather concatenates sendCount elements of every rank's send, in group order, into
// recv, which holds Size()*sendCount elements; rank i's piece lands at element
// i*sendCount. send may be recv's own piece (in place).
func (c *Comm) AllGather(send, recv cubind.DevicePtr, sendCount int, dt tensor.DType, s cubind.Stream) error {
	const name = "all_gather"
	step, ndt, err := c.begin(name, sendCount, dt, false)
	if err != nil || sendCount == 0 {
		return err
	}
	return c.finish(name, step, cubind.NCCLAllGather(send, recv, sendCount, ndt, c.h, s))
}

// ReduceScatter reduces Size()*recvCount elements of send elementwise over the group and
// writes to recv the recvCount elements of this rank's piece: the Group().Index-th.
func (c *Comm) ReduceScatter(send, recv cubind.DevicePtr, recvCount int, dt tensor.DType, op dist.ReduceOp, s cubind.Stream) error {
	const name = "reduce_scatter"
	step, ndt, err := c.begin(name, recvCount, dt, true)
	if err != nil {
		return err
	}
	nop, err := ncclOp(op)
	if err != nil {
		return c.fail(name, step, err)
	}
	if recvCount == 0 {
		return nil
	}
	return c.finish(name, step, cubind.NCCLReduceScatter(send, recv, recvCount, ndt, nop, c.h, s))
}

// AllToAll sends the j-th piece of countPerPeer elements of send to the j-th rank of the
// group and receives that rank's piece for this rank into the j-th piece of recv (both
// hold Size()*countPerPeer elements; they must not overlap). It runs as grouped
// ncclSend/ncclRecv calls.
func (c *Comm) AllToAll(send, recv cubind.DevicePtr, countPerPeer int, dt tensor.DType, s cubind.Stream) error {
	const name = "all_to_all"
	step, ndt, err := c.begin(name, countPerPeer, dt, false)
	if err != nil || countPerPeer == 0 {
		return err
	}
	piece := cubind.DevicePtr(countPerPeer * dt.Size())
	if err := cubind.NCCLGroupStart(); err != nil {
		return c.fail(name, step, err)
	}
	var first error
	for j := range c.group.Size() {
		off := cubind.DevicePtr(j) * piece
		if err := cubind.NCCLSend(send+off, countPerPeer, ndt, j, c.h, s); err != nil && first == nil {
			first = err
		}
		if err := cubind.NCCLRecv(recv+off, countPerPeer, ndt, j, c.h, s); err != nil && first == nil {
			first = err
		}
	}
	end := cubind.NCCLGroupEnd() // always close the group, even after a failed call
	if first != nil {
		return c.finish(name, step, first)
	}
	return c.finish(name, step, end)
}

// Broadcast copies count elements of buf on the group's root (a position in
// Group().Ranks, not a global rank) into buf on every other rank.
func (c *Comm) Broadcast(buf cubind.DevicePtr, count int, dt tensor.DType, root int, s cubind.Stream) error {
	const name = "broadcast"
	step, ndt, err := c.begin(name, count, dt, false)
	if err != nil {
		return err
	}
	if root < 0 || root >= c.group.Size() {
		return c.fail(name, step, fmt.Errorf("root %d out of range for a group of %d", root, c.group.Size()))
	}
	if count == 0 {
		return nil
	}
	return c.finish(name, step, cubind.NCCLBroadcast(buf, buf, count, ndt, root, c.h, s))
}
