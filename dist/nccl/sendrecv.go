package nccl

import (
	"fmt"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/tensor"
)

// SendRecv sends count elements of send to the group's rank to and receives count elements
// from its rank from into recv (to and from are positions in Group().Ranks, as AllToAll's
// peers), as one NCCL group of an ncclSend and an ncclRecv, so that a ring of ranks that
// each send to the next and receive from the previous (graph op ring_shift) cannot
// deadlock. send and recv must not overlap; to and from may be this rank.
func (c *Comm) SendRecv(send, recv cubind.DevicePtr, count int, dt tensor.DType, to, from int, s cubind.Stream) error {
	const name = "send_recv"
	step, ndt, err := c.begin(name, count, dt, false)
	if err != nil {
		return err
	}
	if n := c.group.Size(); to < 0 || to >= n || from < 0 || from >= n {
		return c.fail(name, step, fmt.Errorf("peers %d and %d out of range for a group of %d", to, from, n))
	}
	if count == 0 {
		return nil
	}
	if err := cubind.NCCLGroupStart(); err != nil {
		return c.fail(name, step, err)
	}
	first := cubind.NCCLSend(send, count, ndt, to, c.h, s)
	if err := cubind.NCCLRecv(recv, count, ndt, from, c.h, s); err != nil && first == nil {
		first = err
	}
	end := cubind.NCCLGroupEnd() // always close the group, even after a failed call
	if first != nil {
		return c.finish(name, step, first)
	}
	return c.finish(name, step, end)
}
