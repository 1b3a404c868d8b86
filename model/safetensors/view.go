package safetensors

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"unsafe"

	"github.com/loom-ml/loom/tensor"
)

// ErrShrunk wraps the error of a View whose pages lie past the end of the file as it is now:
// the file was truncated (or rewritten in place) after Open.
var ErrShrunk = errors.New("the file is shorter than when it was opened (truncated or rewritten in place?)")

// View returns one slice of a tensor (see ReadSliceBytes for dim, index and count) as a tensor
// that shares the file's read-only mapping instead of copying it, and true; or nil and false
// where it cannot: the file is not memory-mapped (Parse, or a system without mmap), the slice
// is not one contiguous run of the stored bytes, the dtype's in-memory form is not its stored
// bytes (bool, or a big-endian host), or the data is not aligned to its element size. The
// caller then reads a copy (Slice).
//
// The view is valid until Close and must not be written: the mapping is read-only, and a
// write faults. Page-cache pages that a view touches count once in the process's resident
// memory, so a tensor read both ways would count twice: read each tensor one way only.
//
// Before returning, View maps the slice's pages into the process (MADV_POPULATE_READ, where
// the kernel has it: Linux 5.14 and later), in parallel parts when it is large: a file cut
// short since Open then fails here, with an error that names the file and the tensor and wraps
// ErrShrunk, instead of a fault at the first read. A file truncated after that still faults
// (SIGBUS) when reclaimed pages are read back: a mapped checkpoint must not be rewritten in
// place while a model uses it (replacing it, by rename, is safe). That is the limit of every
// loader that computes from the mapping, llama.cpp's (which maps GGUF files by default) too; a
// rewrite that keeps the size changes the weights under the running model, as it would there.
func (f *File) View(name string, dim, index, count int) (*tensor.Tensor, bool, error) {
	ti, err := f.lookup(name)
	if err != nil {
		return nil, false, err
	}
	dt, ok := ti.DType.Tensor()
	if !ok {
		return nil, false, fmt.Errorf("%s: tensor %q: unsupported dtype %s (supported: BF16, F16, F32, I32, I64, BOOL, F8_E4M3, F8_E5M2)", f.path, name, ti.DType)
	}
	local, err := SliceShape(ti.Shape, dim, index, count)
	if err != nil {
		return nil, false, fmt.Errorf("%s: tensor %q: %w", f.path, name, err)
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.closed {
		return nil, false, fmt.Errorf("%s: tensor %q: %w", f.path, name, ErrClosed)
	}
	if f.fd == nil || !littleEndian || dt == tensor.Bool {
		return nil, false, nil
	}
	src := f.data[ti.Begin:ti.End:ti.End]
	if dim >= 0 && count > 1 {
		if tensor.Numel(ti.Shape[:dim]) > 1 {
			return nil, false, nil // one run per index of the dimensions before dim
		}
		part := len(src) / count
		src = src[index*part : (index+1)*part : (index+1)*part]
	}
	return f.viewOf(name, dt, local, src)
}

// ViewConcat returns the concatenation along dimension 0 of whole tensors that the file stores
// one right after the other, in that order and of one dtype (a fused weight's parts: gate_proj
// and up_proj sort next to each other in a file written by the safetensors library), as one
// view of the mapping of the given shape, and true; or nil and false where it cannot (View's
// reasons, parts that are not adjacent, dtypes or shapes that differ). See View for the
// contract of the view.
func (f *File) ViewConcat(names []string) (*tensor.Tensor, bool, error) {
	if len(names) == 0 {
		return nil, false, nil
	}
	infos := make([]TensorInfo, len(names))
	for i, name := range names {
		ti, err := f.lookup(name)
		if err != nil {
			return nil, false, err
		}
		infos[i] = ti
	}
	first := infos[0]
	dt, ok := first.DType.Tensor()
	if !ok || len(first.Shape) == 0 {
		return nil, false, nil
	}
	shape := slices.Clone(first.Shape)
	for i, ti := range infos[1:] {
		if ti.DType != first.DType || len(ti.Shape) != len(shape) || !slices.Equal(ti.Shape[1:], shape[1:]) || ti.Begin != infos[i].End {
			return nil, false, nil
		}
		shape[0] += ti.Shape[0]
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.closed {
		return nil, false, fmt.Errorf("%s: tensor %q: %w", f.path, names[0], ErrClosed)
	}
	if f.fd == nil || !littleEndian || dt == tensor.Bool {
		return nil, false, nil
	}
	end := infos[len(infos)-1].End
	return f.viewOf(strings.Join(names, `", "`), dt, shape, f.data[first.Begin:end:end])
}

// viewOf makes the view of src, a run of the mapping holding the named tensor's elements of
// dtype dt and the given shape (see View). The caller holds f.mu for reading.
func (f *File) viewOf(name string, dt tensor.DType, shape []int, src []byte) (*tensor.Tensor, bool, error) {
	if len(src) == 0 || len(src) != tensor.Numel(shape)*dt.Size() || uintptr(unsafe.Pointer(&src[0]))%uintptr(dt.Size()) != 0 {
		return nil, false, nil
	}
	if err := populate(src); err != nil {
		if errors.Is(err, ErrShrunk) {
			return nil, false, fmt.Errorf("%s: tensor %q: %w", f.path, name, err)
		}
		return nil, false, fmt.Errorf("%s: tensor %q: map pages: %w", f.path, name, err)
	}
	t, err := tensor.FromBytes(dt, src, shape...)
	if err != nil { // bool
		return nil, false, nil
	}
	return t, true, nil
}

// populateChunk is the size of the parts a large populate is split into, done in parallel.
const populateChunk = 8 << 20

// populate maps b's pages (a slice of a file mapping) into the process, in parts of
// populateChunk in parallel (up to one per CPU).
func populate(b []byte) error {
	return inParts(len(b), populateChunk, func(lo, hi int) error { return populateRange(b[lo:hi]) })
}
