package cpu

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"weak"

	"github.com/loom-ml/loom/tensor"
)

// Resident inputs: the engine's KV caches kept by the program itself (backend.Resident), in
// memory mapped outside the Go heap (offheap_unix.go). The engine then passes shape-only
// tensors (kvcache.NewCacheShapes) and the program binds its own storage of that dtype and
// shape in their place. Two things follow:
//
//   - a cache's pages are the kernel's zero pages until a step writes a slot, so a cache
//     sized for 16 full-context sequences costs the memory of the tokens actually cached,
//     not its full size;
//   - the cache is not in the Go heap, so it does not raise the collector's heap goal: with
//     a 1 GiB cache in the heap, GOGC=100 let a step's dead activations pile up to another
//     GiB before a collection (the 2.1 GB peak RSS of serving 0.99 GB of weights).
//
// The storage belongs to the shape-only tensor passed, not to the input's name: each engine
// on a model has caches of its own (its kvcache.Cache passes the same tensors at every step),
// and the storage is unmapped once that tensor is garbage (runtime.AddCleanup) or at
// Release. A tensor passed with its elements is used as given, as before.

// residentSet is the resident state of a Program: which inputs it keeps, and their storage.
type residentSet struct {
	names []string // sorted
	mu    sync.Mutex
	bufs  map[weak.Pointer[tensor.Tensor]]*offHeap // by the shape-only tensor they stand for
}

// keepResident makes p keep the graph inputs that keep names itself (see Resident).
func (p *Program) keepResident(keep func(name string) bool) {
	if keep == nil {
		return
	}
	var names []string
	for _, in := range p.inputs {
		if keep(in.v.Name) {
			names = append(names, in.v.Name)
		}
	}
	if len(names) == 0 {
		return
	}
	slices.Sort(names)
	p.resident = &residentSet{names: names, bufs: map[weak.Pointer[tensor.Tensor]]*offHeap{}}
}

// Resident names the inputs the program keeps itself (backend.Resident): on a deployment with
// a Resident predicate, the KV caches. The caller may pass shape-only tensors for them.
func (p *Program) Resident() []string {
	if p.resident == nil {
		return nil
	}
	return slices.Clone(p.resident.names)
}

// residentInput returns the tensor to bind for input name given t: t itself unless name is
// resident and t has no elements but its shape needs some, else the storage of t, of t's
// dtype and shape, zeroed when t is first seen.
func (p *Program) residentInput(name string, t *tensor.Tensor) (*tensor.Tensor, error) {
	rs := p.resident
	if rs == nil || t == nil || t.Len() != 0 || t.Numel() == 0 {
		return t, nil
	}
	if _, ok := slices.BinarySearch(rs.names, name); !ok {
		return t, nil
	}
	key := weak.Make(t)
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if b := rs.bufs[key]; b != nil {
		if b.t.DType != t.DType || !slices.Equal(b.t.Shape, t.Shape) {
			return nil, fmt.Errorf("resident input %q: the tensor was %s%v at an earlier run, now %s%v", name, b.t.DType, b.t.Shape, t.DType, t.Shape)
		}
		return b.t, nil
	}
	b, err := newOffHeap(t.DType, t.Shape)
	if err != nil {
		return nil, fmt.Errorf("resident input %q: %w", name, err)
	}
	rs.bufs[key] = b
	runtime.AddCleanup(t, rs.drop, key)
	return b.t, nil
}

// drop unmaps the storage of a shape-only tensor that is gone.
func (rs *residentSet) drop(key weak.Pointer[tensor.Tensor]) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if b := rs.bufs[key]; b != nil {
		_ = b.free() // nothing to report to: the tensor is gone; munmap of our mapping does not fail
		delete(rs.bufs, key)
	}
}

// ResidentBytes is the memory the program's resident inputs reserve (their full sizes; the
// pages no step has written take no memory).
func (p *Program) ResidentBytes() int64 {
	if p.resident == nil {
		return 0
	}
	p.resident.mu.Lock()
	defer p.resident.mu.Unlock()
	var n int64
	for _, b := range p.resident.bufs {
		n += int64(len(b.mem))
	}
	return n
}

// Release unmaps the storage of every resident input and frees the activation buffers the
// program keeps between runs (arena.go). A later run with a shape-only tensor maps zeroed
// storage anew.
func (p *Program) Release() error {
	if p.bufs != nil {
		p.bufs.drain()
	}
	if p.resident == nil {
		return nil
	}
	p.resident.mu.Lock()
	defer p.resident.mu.Unlock()
	var errs []error
	for key, b := range p.resident.bufs {
		if err := b.free(); err != nil {
			errs = append(errs, fmt.Errorf("resident input: %w", err))
		}
		delete(p.resident.bufs, key)
	}
	return errors.Join(errs...)
}

// offHeap is a tensor whose elements live in memory the Go heap does not manage.
type offHeap struct {
	t   *tensor.Tensor
	mem []byte // the mapping (nil where the fallback allocates in the heap)
}

// newOffHeap maps zeroed storage for a float tensor of dtype dt and shape.
func newOffHeap(dt tensor.DType, shape []int) (*offHeap, error) {
	n := tensor.Numel(shape)
	var size int
	switch dt {
	case tensor.F32:
		size = 4
	case tensor.BF16, tensor.F16:
		size = 2
	default:
		return nil, fmt.Errorf("off-heap storage for %s%v: want f32, bf16 or f16", dt, shape)
	}
	mem, err := mapZeroed(n * size)
	if err != nil {
		return nil, fmt.Errorf("off-heap storage for %s%v (%d bytes): %w", dt, shape, n*size, err)
	}
	t, err := tensor.FromBytes(dt, mem, shape...)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("off-heap storage for %s%v: %w", dt, shape, err), unmap(mem))
	}
	return &offHeap{t: t, mem: mem}, nil
}

// free unmaps the storage; the tensor must not be used afterwards.
func (b *offHeap) free() error {
	b.t.F32, b.t.Half = nil, nil
	mem := b.mem
	b.mem = nil
	return unmap(mem)
}
