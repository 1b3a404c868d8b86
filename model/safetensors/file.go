package safetensors

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/loom-ml/loom/tensor"
)

// maxHeaderSize bounds the JSON header, as the reference implementation does (100 MB), so
// a corrupt length cannot make a reader allocate or scan gigabytes.
const maxHeaderSize = 100 << 20

// ErrClosed is returned by reads from a closed File.
var ErrClosed = errors.New("file is closed")

// File is an open safetensors file: its validated header and its bytes, memory-mapped
// read-only by Open. A File is safe for concurrent use.
type File struct {
	path   string
	header *Header

	mu     sync.RWMutex
	buf    []byte               // the whole file
	data   []byte               // the data section, a sub-slice of buf
	unmap  func(b []byte) error // releases buf; nil for Parse
	closed bool

	// fd, when set (Open where the file is memory-mapped), is the open file that reads copy
	// tensor bytes from with pread, at dataOff plus a tensor's offset. Reading through the
	// file instead of the mapping leaves the mapped pages untouched, so the page cache's copy of
	// the weights is not counted in the process's resident memory beside the copy a reader
	// makes: loading a checkpoint holds the weights once.
	fd      *os.File
	dataOff int64
}

// Open memory-maps the file at path read-only and validates its header and every tensor
// entry against the file size (see ParseHeader for the checks on each entry). Errors name
// the file and, where one is at fault, the tensor. Tensor reads copy from the file with pread,
// not from the mapping (see File.fd); Raw slices the mapping. Close releases the mapping and
// the file.
func Open(path string) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	keep := false
	defer func() {
		if !keep {
			fd.Close()
		}
	}()
	st, err := fd.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: not a regular file", path)
	}
	size := st.Size()
	if size < 8 {
		return nil, fmt.Errorf("%s: file is %d bytes, too short for a safetensors header", path, size)
	}
	buf, unmap, mapped, err := mapFile(fd, size)
	if err != nil {
		return nil, fmt.Errorf("%s: map file: %w", path, err)
	}
	f, err := parse(path, buf)
	if err != nil {
		_ = unmap(buf)
		return nil, err
	}
	f.unmap = unmap
	if mapped {
		f.fd, f.dataOff, keep = fd, int64(len(buf)-len(f.data)), true
	}
	return f, nil
}

// Parse validates an in-memory safetensors file, as Open does for a file on disk. name is
// used in error messages. buf is not copied and must not change while the File is in use.
func Parse(name string, buf []byte) (*File, error) { return parse(name, buf) }

func parse(name string, buf []byte) (*File, error) {
	if len(buf) < 8 {
		return nil, fmt.Errorf("%s: file is %d bytes, too short for a safetensors header", name, len(buf))
	}
	n := binary.LittleEndian.Uint64(buf[:8])
	if n > uint64(len(buf)-8) {
		return nil, fmt.Errorf("%s: header length %d runs past the end of the file (%d bytes)", name, n, len(buf))
	}
	if n > maxHeaderSize {
		return nil, fmt.Errorf("%s: header length %d exceeds the %d byte limit", name, n, maxHeaderSize)
	}
	h, err := ParseHeader(buf[8 : 8+n])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	data := buf[8+n:]
	for _, t := range h.Tensors {
		if t.End > int64(len(data)) {
			return nil, fmt.Errorf("%s: tensor %q: data_offsets [%d, %d] run past the end of the data section (%d bytes)", name, t.Name, t.Begin, t.End, len(data))
		}
	}
	return &File{path: name, header: h, buf: buf, data: data}, nil
}

// Path is the file's path (or the name given to Parse).
func (f *File) Path() string { return f.path }

// Header is the parsed header. It stays valid after Close.
func (f *File) Header() *Header { return f.header }

// Metadata is the header's "__metadata__" map (nil when absent).
func (f *File) Metadata() map[string]string { return f.header.Metadata }

// Names lists the tensor names, sorted.
func (f *File) Names() []string {
	names := make([]string, len(f.header.Tensors))
	for i, t := range f.header.Tensors {
		names[i] = t.Name
	}
	return names
}

// Info describes a tensor.
func (f *File) Info(name string) (TensorInfo, bool) { return f.header.Lookup(name) }

// Close releases the mapping and the file. Reads after Close fail with ErrClosed; byte slices returned
// by Raw must not be used after Close.
func (f *File) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil
	}
	f.closed = true
	buf := f.buf
	f.buf, f.data = nil, nil
	var errs []error
	if f.unmap != nil {
		if err := f.unmap(buf); err != nil {
			errs = append(errs, fmt.Errorf("%s: unmap: %w", f.path, err))
		}
	}
	if f.fd != nil {
		if err := f.fd.Close(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.path, err))
		}
	}
	return errors.Join(errs...)
}

func (f *File) lookup(name string) (TensorInfo, error) {
	ti, ok := f.header.Lookup(name)
	if !ok {
		return TensorInfo{}, fmt.Errorf("%s: no tensor %q", f.path, name)
	}
	return ti, nil
}

// Raw returns a tensor's stored bytes (little-endian, any dtype) as a slice of the mapping,
// without copying. The slice is read-only and valid until Close.
func (f *File) Raw(name string) ([]byte, error) {
	ti, err := f.lookup(name)
	if err != nil {
		return nil, err
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.closed {
		return nil, fmt.Errorf("%s: tensor %q: %w", f.path, name, ErrClosed)
	}
	return f.data[ti.Begin:ti.End:ti.End], nil
}

// SliceShape returns the shape of part index of count of dimension dim of shape, or an error
// if the slice does not fit. dim < 0 means no slice: the whole shape.
func SliceShape(shape []int, dim, index, count int) ([]int, error) {
	out := append([]int(nil), shape...)
	if dim < 0 {
		return out, nil
	}
	switch {
	case dim >= len(shape):
		return nil, fmt.Errorf("slice dimension %d out of range for shape %v", dim, shape)
	case count < 1:
		return nil, fmt.Errorf("slice count %d must be positive", count)
	case index < 0 || index >= count:
		return nil, fmt.Errorf("slice index %d out of range [0, %d)", index, count)
	case shape[dim]%count != 0:
		return nil, fmt.Errorf("dimension %d of shape %v (size %d) does not split into %d equal parts", dim, shape, shape[dim], count)
	}
	out[dim] /= count
	return out, nil
}

// ReadSliceBytes copies the stored bytes of one slice of a tensor into dst and returns how
// many it copied: dimension dim is cut into count equal parts and part index is read (dim < 0
// reads the whole tensor). Only the slice's bytes are read from the file, in contiguous
// chunks, one per index of the dimensions before dim. dst must hold at least the slice's
// size. The dtype's elements must be whole bytes.
func (f *File) ReadSliceBytes(name string, dim, index, count int, dst []byte) (int, error) {
	ti, err := f.lookup(name)
	if err != nil {
		return 0, err
	}
	nbits := ti.DType.Bits()
	if nbits == 0 || nbits%8 != 0 {
		return 0, fmt.Errorf("%s: tensor %q: cannot read dtype %s by bytes", f.path, name, ti.DType)
	}
	local, err := SliceShape(ti.Shape, dim, index, count)
	if err != nil {
		return 0, fmt.Errorf("%s: tensor %q: %w", f.path, name, err)
	}
	elem := nbits / 8
	size := tensor.Numel(local) * elem
	if len(dst) < size {
		return 0, fmt.Errorf("%s: tensor %q: destination holds %d bytes, slice needs %d", f.path, name, len(dst), size)
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.closed {
		return 0, fmt.Errorf("%s: tensor %q: %w", f.path, name, ErrClosed)
	}
	src := f.data[ti.Begin:ti.End]
	read := func(dst []byte, off int) error {
		if f.fd == nil {
			copy(dst, src[off:])
			return nil
		}
		return f.pread(dst, f.dataOff+ti.Begin+int64(off))
	}
	if dim < 0 || count == 1 {
		if err := read(dst[:len(src)], 0); err != nil {
			return 0, fmt.Errorf("%s: tensor %q: %w", f.path, name, err)
		}
		return len(src), nil
	}
	outer := tensor.Numel(ti.Shape[:dim])
	row := len(src) / max(outer, 1) // bytes of one index of the dimensions before dim
	chunk := row / count
	if outer == 0 || row == 0 {
		return 0, nil
	}
	for o := range outer {
		if err := read(dst[o*chunk:(o+1)*chunk], o*row+index*chunk); err != nil {
			return 0, fmt.Errorf("%s: tensor %q: %w", f.path, name, err)
		}
	}
	return outer * chunk, nil
}

// preadChunk is the size of the parts a large read is split into, read in parallel.
const preadChunk = 1 << 20

// pread fills dst from the file at off, in parts of preadChunk read in parallel (up to one
// per CPU) when dst is large.
func (f *File) pread(dst []byte, off int64) error {
	return inParts(len(dst), preadChunk, func(lo, hi int) error {
		_, err := f.fd.ReadAt(dst[lo:hi], off+int64(lo))
		return err
	})
}

// inParts calls do on the parts [lo, hi) of [0, n) of at most chunk each, in parallel (up to
// one goroutine per CPU; on the caller's alone when there is one part), and joins their
// errors.
func inParts(n, chunk int, do func(lo, hi int) error) error {
	parts := (n + chunk - 1) / chunk
	if parts <= 1 {
		return do(0, n)
	}
	var (
		next atomic.Int64
		wg   sync.WaitGroup
		errs = make([]error, parts)
	)
	for range min(parts, runtime.GOMAXPROCS(0)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= parts {
					return
				}
				errs[i] = do(i*chunk, min((i+1)*chunk, n))
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Tensor copies a whole tensor out of the file. See Slice.
func (f *File) Tensor(name string) (*tensor.Tensor, error) { return f.Slice(name, -1, 0, 1) }

// Slice copies one slice of a tensor out of the file into a new tensor of the Loom dtype
// that the stored dtype maps to (BF16, F16, F32, I32, I64, BOOL, F8_E4M3, F8_E5M2). Reading a
// tensor of any other dtype (F64, I8, F8_E8M0, ...) is an error that names the tensor and its dtype. See
// ReadSliceBytes for the meaning of dim, index and count.
func (f *File) Slice(name string, dim, index, count int) (*tensor.Tensor, error) {
	ti, err := f.lookup(name)
	if err != nil {
		return nil, err
	}
	dt, ok := ti.DType.Tensor()
	if !ok {
		return nil, fmt.Errorf("%s: tensor %q: unsupported dtype %s (supported: BF16, F16, F32, I32, I64, BOOL, F8_E4M3, F8_E5M2)", f.path, name, ti.DType)
	}
	local, err := SliceShape(ti.Shape, dim, index, count)
	if err != nil {
		return nil, fmt.Errorf("%s: tensor %q: %w", f.path, name, err)
	}
	t := tensor.New(dt, local...)
	if err := f.readInto(name, dim, index, count, t); err != nil {
		return nil, err
	}
	return t, nil
}

// SliceInto reads what Slice would return into dst, which must have the Loom dtype of the
// stored dtype and the slice's shape; its data may be a view into a larger tensor.
func (f *File) SliceInto(name string, dim, index, count int, dst *tensor.Tensor) error {
	ti, err := f.lookup(name)
	if err != nil {
		return err
	}
	dt, ok := ti.DType.Tensor()
	if !ok {
		return fmt.Errorf("%s: tensor %q: unsupported dtype %s (supported: BF16, F16, F32, I32, I64, BOOL, F8_E4M3, F8_E5M2)", f.path, name, ti.DType)
	}
	local, err := SliceShape(ti.Shape, dim, index, count)
	if err != nil {
		return fmt.Errorf("%s: tensor %q: %w", f.path, name, err)
	}
	if dst.DType != dt || !slices.Equal(dst.Shape, local) || dst.Len() != tensor.Numel(local) {
		return fmt.Errorf("%s: tensor %q: destination is %s%v, the slice is %s%v", f.path, name, dst.DType, dst.Shape, dt, local)
	}
	return f.readInto(name, dim, index, count, dst)
}

// readInto fills t, of the slice's dtype and shape, with the slice's bytes.
func (f *File) readInto(name string, dim, index, count int, t *tensor.Tensor) error {
	if dst, ok := nativeBytes(t); ok {
		_, err := f.ReadSliceBytes(name, dim, index, count, dst)
		return err
	}
	buf := make([]byte, t.Numel()*t.DType.Size())
	if _, err := f.ReadSliceBytes(name, dim, index, count, buf); err != nil {
		return err
	}
	decodeLE(t, buf)
	return nil
}
