package nccl

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/tensor"
)

// MaxExchangeBytes is the most bytes a rank hands to AllGatherBytes.
const MaxExchangeBytes = 4096

// AllGatherBytes hands mine (at most MaxExchangeBytes) to every rank of the world and
// returns every rank's bytes in rank order, its own included, through an NCCL all-gather on
// this rank's GPU (no other channel is needed). Every rank of the world must call it, in
// the same order relative to the world's other collectives. Ranks use it to trade small
// descriptions, such as the CUDA IPC handles of backend/cuda's one-shot all-reduce. It
// locks the calling goroutine to its thread for the call and makes the GPU's context
// current there.
func (w *World) AllGatherBytes(ctx context.Context, mine []byte) ([][]byte, error) {
	if len(mine) > MaxExchangeBytes {
		return nil, fmt.Errorf("nccl: rank %d: exchange of %d bytes; at most %d", w.rank, len(mine), MaxExchangeBytes)
	}
	fail := func(err error) ([][]byte, error) {
		return nil, fmt.Errorf("nccl: rank %d: exchange bytes: %w", w.rank, err)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := w.cuctx.SetCurrent(); err != nil {
		return fail(err)
	}
	// Each rank's slot: an 8-byte length, then the bytes, padded to MaxExchangeBytes.
	const slot = 8 + MaxExchangeBytes
	host := make([]byte, slot*w.size)
	binary.LittleEndian.PutUint64(host[w.rank*slot:], uint64(len(mine)))
	copy(host[w.rank*slot+8:], mine)
	buf, err := cubind.MemAlloc(uint64(len(host)))
	if err != nil {
		return fail(err)
	}
	defer cubind.MemFree(buf)
	s, err := cubind.StreamCreate(cubind.StreamNonBlocking)
	if err != nil {
		return fail(err)
	}
	defer s.Destroy()
	own := buf + cubind.DevicePtr(w.rank*slot)
	if err := cubind.MemcpyHtoDAsync(own, host[w.rank*slot:(w.rank+1)*slot], s); err != nil {
		return fail(err)
	}
	if err := w.world.AllGather(own, buf, slot, tensor.Bool, s); err != nil {
		return fail(err)
	}
	if err := w.Sync(ctx, s); err != nil {
		return fail(err)
	}
	if err := cubind.MemcpyDtoHAsync(host, buf, s); err != nil {
		return fail(err)
	}
	if err := s.Synchronize(); err != nil {
		return fail(err)
	}
	all := make([][]byte, w.size)
	for r := range all {
		n := binary.LittleEndian.Uint64(host[r*slot:])
		if n > MaxExchangeBytes {
			return fail(errors.New("a rank's length is corrupt"))
		}
		all[r] = append([]byte(nil), host[r*slot+8:r*slot+8+int(n)]...)
	}
	return all, nil
}
