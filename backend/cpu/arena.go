package cpu

import (
	"log/slog"
	"runtime"
	"slices"
	"sync"
	"unsafe"

	"github.com/loom-ml/loom/tensor"
)

// Activations reused from step to step.
//
// Kernels return new tensors, and a run drops each intermediate after its last reader
// (planFrees). Left to the collector, a 128-token prefill of a 0.5B model allocates about
// 330 MB that way, and with the weights off the Go heap (they are views of the checkpoint's
// mapping) the heap goal is small, so the collector runs a few hundred times a prefill.
// Instead, Program.Run hands each kernel an arena through its Out values (Out.arena), and a
// kernel of this package takes its outputs and scratch from it (newOut, newOutDirty,
// scratchF32); the run gives a buffer back to the program's pool once no live value refers to
// it any more, and the next allocation of that size class takes it again.
//
// Ownership: a buffer is tracked from the moment a kernel takes it. After the kernel, each
// result whose storage lies inside a tracked buffer holds a reference to it (so a result that
// is a view of another value's buffer keeps that buffer alive too); a buffer that no result
// refers to was the kernel's scratch and goes back at once. A reference ends when the run
// releases the value (its last reader ran). Graph outputs are never released: their buffers
// leave the arena with them and belong to the caller, so a later run cannot write into them.
// Inputs, weights and anything a kernel made without the arena are never pooled.
//
// Buffers of offHeapBytes and more are anonymous mappings outside the Go heap (mapZeroed), so
// that the pool does not raise the collector's heap goal (which grows with the live heap):
// in the heap, the pool's 20-30 MB let as much garbage (mostly the logits each step hands to
// the engine) pile up before a collection, and peak RSS grew by that much. Such a buffer
// must never reach a caller: graph outputs are made without the arena, and an output whose
// storage lies in a tracked buffer anyway (a kernel that returned a view) is copied to the
// heap before Run returns. Mapped buffers are unmapped when the pool is full, on
// Program.Release, and when the program is collected.

// arenaMinBytes is the smallest buffer worth pooling; smaller ones come from the Go heap.
const arenaMinBytes = 512

// arenaRetainBytes bounds the free bytes a program's pool keeps (between runs, and during
// one): a buffer given back past it is left to the collector. It is well above the working
// set of a decode step or a prefill of a few hundred tokens of a 0.5-8B model, so those run
// without fresh allocations; a much longer prefill reuses what fits.
const arenaRetainBytes = 128 << 20

// offHeapBytes is the smallest buffer the pool maps outside the Go heap.
const offHeapBytes = 64 << 10

// bufPool is a program's free buffers by size class (in 8-byte words), shared by its runs,
// and the arenas of finished runs.
type bufPool struct {
	mu     sync.Mutex
	free   map[int][]*abuf
	bytes  int // free bytes held
	arenas []*arena
}

// get returns a buffer of class words (contents undefined), nil if none is free.
func (p *bufPool) get(words int) *abuf {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l := p.free[words]; len(l) > 0 {
		b := l[len(l)-1]
		l[len(l)-1] = nil
		p.free[words] = l[:len(l)-1]
		p.bytes -= 8 * words
		return b
	}
	return nil
}

// newPool returns an empty pool whose mapped buffers are unmapped once owner is collected.
func newPool(owner *Program) *bufPool {
	p := &bufPool{}
	runtime.AddCleanup(owner, (*bufPool).drain, p)
	return p
}

// drain frees every free buffer.
func (p *bufPool) drain() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.free {
		for _, b := range l {
			b.drop()
		}
	}
	p.free, p.bytes = nil, 0
}

// put keeps b for a later get, unless the pool is full: then b is freed.
func (p *bufPool) put(b *abuf) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bytes+8*len(b.mem) > arenaRetainBytes {
		b.drop()
		return
	}
	if p.free == nil {
		p.free = map[int][]*abuf{}
	}
	b.refs = 0
	p.free[len(b.mem)] = append(p.free[len(b.mem)], b)
	p.bytes += 8 * len(b.mem)
}

// arena returns an arena for a run of a program with slots values.
func (p *bufPool) arena(slots int) *arena {
	p.mu.Lock()
	var a *arena
	if n := len(p.arenas); n > 0 {
		a = p.arenas[n-1]
		p.arenas[n-1] = nil
		p.arenas = p.arenas[:n-1]
	}
	p.mu.Unlock()
	if a == nil {
		a = &arena{pool: p}
	}
	if cap(a.held) < slots {
		a.held = make([]*abuf, slots)
	}
	a.held = a.held[:slots]
	return a
}

// done takes back a finished run's arena (finish cleared it) for a later run.
func (p *bufPool) done(a *arena) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.arenas) < 4 {
		p.arenas = append(p.arenas, a)
	}
}

// sizeClass rounds a size in bytes up to a whole number of 8-byte words with at most three
// significant bits (eight classes per power of two: at most 12.5% unused), so that buffers of
// nearby sizes are shared.
func sizeClass(bytes int) int {
	w := (bytes + 7) / 8
	if w <= 8 {
		return w
	}
	shift := 0
	for v := w; v >= 16; v >>= 1 {
		shift++
	}
	unit := 1 << shift
	return (w + unit - 1) / unit * unit
}

// abuf is a pooled buffer handed out during a run.
type abuf struct {
	mem    []uint64
	mapped []byte  // mem's mapping when it is outside the Go heap, else nil
	lo, hi uintptr // its address range
	refs   int     // live values whose storage lies in it
}

// newBuf returns a zeroed buffer of words 8-byte words: mapped outside the heap from
// offHeapBytes up (in the heap if the mapping fails).
func newBuf(words int) *abuf {
	b := &abuf{}
	if 8*words >= offHeapBytes {
		if m, err := mapZeroed(8 * words); err == nil {
			b.mapped = m
			b.mem = unsafe.Slice((*uint64)(unsafe.Pointer(&m[0])), words)
		}
	}
	if b.mem == nil {
		b.mem = make([]uint64, words)
	}
	b.lo = uintptr(unsafe.Pointer(&b.mem[0]))
	b.hi = b.lo + uintptr(8*words)
	return b
}

// drop frees b's memory: unmaps a mapping (the heap's is left to the collector). Nothing
// may refer to b any more.
func (b *abuf) drop() {
	if b.mapped != nil {
		if err := unmap(b.mapped); err != nil {
			slog.Warn("cpu: unmapping an activation buffer", "err", err)
		}
	}
	b.mem, b.mapped = nil, nil
}

// arena is one run's view of its program's pool: the buffers it handed out and who holds
// them. Kernels may call its methods from any goroutine.
type arena struct {
	pool  *bufPool
	mu    sync.Mutex
	fresh []*abuf // taken during the current step
	live  []*abuf // held by live values
	// held maps a slot to the buffer its value's storage lies in, if any (a tensor has one
	// storage slice, so at most one).
	held []*abuf
}

// alloc returns storage for n elements of dt from the pool, or from the Go heap when a is
// nil or the buffer is small. zero clears a reused buffer (a fresh one is already zero).
func (a *arena) alloc(dt tensor.DType, n int, zero bool) *tensor.Tensor {
	bytes := n * dt.Size()
	if a == nil || bytes < arenaMinBytes {
		return tensor.New(dt, n)
	}
	words := sizeClass(bytes)
	b := a.pool.get(words)
	if b == nil {
		b = newBuf(words)
	} else if zero {
		clear(b.mem[:(bytes+7)/8])
	}
	a.mu.Lock()
	a.fresh = append(a.fresh, b)
	a.mu.Unlock()
	p := unsafe.Pointer(&b.mem[0])
	t := &tensor.Tensor{DType: dt}
	switch dt {
	case tensor.F32:
		t.F32 = unsafe.Slice((*float32)(p), n)
	case tensor.BF16, tensor.F16:
		t.Half = unsafe.Slice((*uint16)(p), n)
	case tensor.I32:
		t.I32 = unsafe.Slice((*int32)(p), n)
	case tensor.I64:
		t.I64 = unsafe.Slice((*int64)(p), n)
	case tensor.Bool:
		t.Bool = unsafe.Slice((*bool)(p), n)
	case tensor.F8E4M3, tensor.F8E5M2:
		t.U8 = unsafe.Slice((*uint8)(p), n)
	}
	return t
}

// newOut returns a zeroed tensor of o's dtype and shape, as tensor.New does, from o's arena
// when it has one.
func newOut(o Out) *tensor.Tensor { return newShaped(o.arena, o.DType, o.Shape, true) }

// newOutDirty is newOut for a kernel that writes every element: a reused buffer keeps
// whatever it held.
func newOutDirty(o Out) *tensor.Tensor { return newShaped(o.arena, o.DType, o.Shape, false) }

// newShaped returns a tensor of dtype dt and the given shape (copied) from a (nil: the Go
// heap), zeroed if zero.
func newShaped(a *arena, dt tensor.DType, shape []int, zero bool) *tensor.Tensor {
	t := a.alloc(dt, tensor.Numel(shape), zero)
	t.Shape = slices.Clone(shape)
	if t.Shape == nil {
		t.Shape = []int{}
	}
	return t
}

// scratchF32 returns n float32s from o's arena (the Go heap without one), contents undefined
// when reused: a kernel's result before a cast, say. A buffer no result refers to goes back
// to the pool after the step.
func (o Out) scratchF32(n int) []float32 { return o.arena.alloc(tensor.F32, n, false).F32 }

// storage returns the address of t's first element, 0 for an empty tensor.
func storage(t *tensor.Tensor) uintptr {
	switch {
	case len(t.F32) > 0:
		return uintptr(unsafe.Pointer(&t.F32[0]))
	case len(t.Half) > 0:
		return uintptr(unsafe.Pointer(&t.Half[0]))
	case len(t.I32) > 0:
		return uintptr(unsafe.Pointer(&t.I32[0]))
	case len(t.I64) > 0:
		return uintptr(unsafe.Pointer(&t.I64[0]))
	case len(t.Bool) > 0:
		return uintptr(unsafe.Pointer(&t.Bool[0]))
	case len(t.U8) > 0:
		return uintptr(unsafe.Pointer(&t.U8[0]))
	}
	return 0
}

// owner returns the tracked buffer that holds address at, or nil.
func (a *arena) owner(at uintptr) *abuf {
	for _, bs := range [][]*abuf{a.fresh, a.live} {
		for _, b := range bs {
			if b.lo <= at && at < b.hi {
				return b
			}
		}
	}
	return nil
}

// stepDone records that res (the results of a step, written to slots) now hold references
// to the buffers their storage lies in, and gives back the buffers the step took that no
// result refers to.
func (a *arena) stepDone(slots []int, res []*tensor.Tensor) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.fresh) == 0 && len(a.live) == 0 {
		return
	}
	for i, t := range res {
		if at := storage(t); at != 0 {
			if b := a.owner(at); b != nil {
				b.refs++
				a.held[slots[i]] = b
			}
		}
	}
	for _, b := range a.fresh {
		if b.refs == 0 {
			a.pool.put(b)
		} else {
			a.live = append(a.live, b)
		}
	}
	clear(a.fresh)
	a.fresh = a.fresh[:0]
}

// release ends slot's reference; a buffer that nothing refers to any more goes back to the
// pool.
func (a *arena) release(slot int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.releaseLocked(slot)
}

func (a *arena) releaseLocked(slot int) {
	b := a.held[slot]
	if b == nil {
		return
	}
	a.held[slot] = nil
	if b.refs--; b.refs == 0 {
		if i := slices.Index(a.live, b); i >= 0 {
			a.live = slices.Delete(a.live, i, i+1)
		}
		a.pool.put(b)
	}
}

// finish ends a run: the values of keep (the graph outputs, in vals) that lie in a tracked
// buffer are copied to the Go heap (a mapped buffer must not reach the caller, and a pooled
// one would be reused under it); then every buffer goes back to the pool, and the arena to
// the pool for a later run. After an error, keep is nil: nothing is returned to a caller.
func (a *arena) finish(keep []int, vals []*tensor.Tensor) {
	a.mu.Lock()
	for _, s := range keep {
		if a.held[s] != nil && vals[s] != nil {
			vals[s] = vals[s].Clone()
		}
	}
	for s := range a.held {
		a.releaseLocked(s)
	}
	for _, b := range a.fresh { // none after a completed step; kept for safety
		if b.refs == 0 {
			a.pool.put(b)
		}
	}
	clear(a.fresh)
	clear(a.live)
	a.fresh, a.live = a.fresh[:0], a.live[:0]
	a.mu.Unlock()
	a.pool.done(a)
}
