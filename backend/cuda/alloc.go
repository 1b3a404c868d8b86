package cuda

import (
	"fmt"
	"math/bits"
	"sync"

	"github.com/loom-ml/loom/cubind"
)

// Allocator is a pooling allocator of device memory. Sizes are rounded up to a size class
// (powers of two up to 1 MiB, then four classes per power of two, so at most 25% is
// wasted), and freed blocks wait on a free list per class for the next request of that
// class instead of going back to the driver. When the driver runs out of memory the cached
// blocks are released and the request tried once more.
//
// The allocator does not order memory reuse against the GPU: a block freed while a kernel
// still reads it may be handed out again at once. That is safe as long as all work runs on
// one stream, as it does in a Device, since the next user's work is queued after the old.
// Its methods must run with the device's context current (Device does this).
type Allocator struct {
	mu    sync.Mutex
	free  map[uint64][]cubind.DevicePtr
	stats AllocStats
}

// AllocStats counts an allocator's activity.
type AllocStats struct {
	InUse     uint64 // bytes handed out and not yet freed (rounded to size classes)
	Cached    uint64 // bytes held on free lists
	Peak      uint64 // the largest InUse seen
	Allocs    int    // requests served
	Reused    int    // requests served from a free list
	DriverMem int    // calls to cuMemAlloc
}

func newAllocator() *Allocator { return &Allocator{free: map[uint64][]cubind.DevicePtr{}} }

// minClass is the smallest block: 512 bytes keeps every block aligned for any vector access.
const minClass = 512

// sizeClass rounds n up to its size class.
func sizeClass(n uint64) uint64 {
	if n <= minClass {
		return minClass
	}
	if n <= 1<<20 {
		return 1 << bits.Len64(n-1)
	}
	// Four classes between consecutive powers of two: p, 1.25p, 1.5p, 1.75p.
	p := uint64(1) << (bits.Len64(n) - 1)
	step := p / 4
	return (n + step - 1) / step * step
}

// block is one allocation of the pool.
type block struct {
	ptr  cubind.DevicePtr
	size uint64 // the class size
}

// alloc returns a block of at least n bytes.
func (a *Allocator) alloc(n uint64) (*block, error) {
	c := sizeClass(n)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stats.Allocs++
	if l := a.free[c]; len(l) > 0 {
		p := l[len(l)-1]
		a.free[c] = l[:len(l)-1]
		a.stats.Cached -= c
		a.stats.Reused++
		a.use(c)
		return &block{ptr: p, size: c}, nil
	}
	p, err := cubind.MemAlloc(c)
	if cubind.IsOutOfMemory(err) && a.stats.Cached > 0 {
		a.trimLocked()
		p, err = cubind.MemAlloc(c)
	}
	if err != nil {
		return nil, fmt.Errorf("cuda: allocate %d bytes (%d in use, %d cached): %w", c, a.stats.InUse, a.stats.Cached, err)
	}
	a.stats.DriverMem++
	a.use(c)
	return &block{ptr: p, size: c}, nil
}

func (a *Allocator) use(c uint64) {
	a.stats.InUse += c
	a.stats.Peak = max(a.stats.Peak, a.stats.InUse)
}

// release puts a block on its free list.
func (a *Allocator) release(b *block) {
	if b == nil || b.ptr == 0 {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.free[b.size] = append(a.free[b.size], b.ptr)
	a.stats.InUse -= b.size
	a.stats.Cached += b.size
	b.ptr = 0
}

// Trim returns every cached block to the driver.
func (a *Allocator) Trim() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.trimLocked()
}

func (a *Allocator) trimLocked() error {
	var first error
	for c, l := range a.free {
		for _, p := range l {
			if err := cubind.MemFree(p); err != nil && first == nil {
				first = err
			}
			a.stats.Cached -= c
		}
		delete(a.free, c)
	}
	return first
}

// Stats returns a snapshot of the counters.
func (a *Allocator) Stats() AllocStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stats
}

// MemInfo returns the device's free and total memory in bytes, as the driver counts them
// (memory the pool holds for reuse counts as used).
func (d *Device) MemInfo() (free, total uint64, err error) {
	err = d.do(func() error {
		var err error
		free, total, err = cubind.MemGetInfo()
		return err
	})
	return free, total, err
}
