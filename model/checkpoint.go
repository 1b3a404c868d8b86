package model

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model/safetensors"
	"github.com/loom-ml/loom/tensor"
)

// IndexFile is the name of the index of a sharded checkpoint.
const IndexFile = "model.safetensors.index.json"

// SingleFile is the name of an unsharded checkpoint.
const SingleFile = "model.safetensors"

// TensorInfo describes one checkpoint tensor.
type TensorInfo struct {
	Name string
	// DType is the Loom dtype of the stored data; Invalid when the stored dtype (StoredDType)
	// has no Loom equivalent, in which case loading the tensor fails.
	DType       tensor.DType
	StoredDType string // the safetensors dtype, e.g. "BF16"
	Shape       []int
	File        string // path of the file that holds it
}

// Checkpoint is the weights of a model: one or more safetensors files, memory-mapped and
// validated when opened, read lazily tensor by tensor (or slice by slice). It implements
// graph.Weights and is safe for concurrent use.
type Checkpoint struct {
	dir   string
	index string // path of the index file; "" when there is none
	files []*safetensors.File
	where map[string]*safetensors.File
	names []string // sorted

	bytesRead   atomic.Int64
	bytesMapped atomic.Int64 // see Mapped
	// quant, when set, quantizes weights as they are read (QuantizeWhileLoading).
	quant *loadQuant
	// stored is the quantization_config of a checkpoint stored quantized (set by Open): a
	// quantized weight that a graph reads as a float param is dequantized as it is read
	// (quant_dequantize.go).
	stored *QuantConfig
}

var _ graph.WeightsInto = (*Checkpoint)(nil)

// OpenCheckpoint opens the weights in dir: the files that model.safetensors.index.json names
// (each must exist), else model.safetensors, else every *.safetensors file in dir. Every file
// is validated up front; a tensor found in two files is an error.
func OpenCheckpoint(dir string) (*Checkpoint, error) {
	c := &Checkpoint{dir: dir, where: map[string]*safetensors.File{}}
	paths, weightMap, err := c.locate()
	if err != nil {
		return nil, err
	}
	for _, p := range paths {
		f, err := safetensors.Open(p)
		if err != nil {
			c.Close()
			if perr := lfsPointer(p); perr != nil {
				err = perr
			}
			return nil, fmt.Errorf("checkpoint %s: %w", dir, err)
		}
		c.files = append(c.files, f)
		for _, name := range f.Names() {
			if prev, dup := c.where[name]; dup {
				c.Close()
				return nil, fmt.Errorf("checkpoint %s: tensor %q is in both %s and %s", dir, name, prev.Path(), f.Path())
			}
			c.where[name] = f
			c.names = append(c.names, name)
		}
	}
	sort.Strings(c.names)
	for _, name := range sortedKeys(weightMap) {
		file := filepath.Join(dir, weightMap[name])
		if f, ok := c.where[name]; !ok || f.Path() != file {
			c.Close()
			return nil, fmt.Errorf("checkpoint %s: index %s puts tensor %q in %s, but that file does not hold it", dir, c.index, name, file)
		}
	}
	return c, nil
}

// locate finds the files to open and, with an index, its weight map.
func (c *Checkpoint) locate() ([]string, map[string]string, error) {
	indexPath := filepath.Join(c.dir, IndexFile)
	data, err := os.ReadFile(indexPath)
	switch {
	case err == nil:
		c.index = indexPath
		return c.readIndex(data)
	case !errors.Is(err, os.ErrNotExist):
		return nil, nil, fmt.Errorf("checkpoint %s: %w", c.dir, err)
	}
	single := filepath.Join(c.dir, SingleFile)
	if _, err := os.Stat(single); err == nil {
		return []string{single}, nil, nil
	}
	entries, err := os.ReadDir(c.dir)
	if err != nil {
		return nil, nil, fmt.Errorf("checkpoint %s: %w", c.dir, err)
	}
	var paths []string
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".safetensors") && !e.IsDir() {
			paths = append(paths, filepath.Join(c.dir, e.Name()))
		}
	}
	if len(paths) == 0 {
		return nil, nil, noSafetensors(c.dir)
	}
	sort.Strings(paths)
	return paths, nil, nil
}

// readIndex parses an index file and checks that every file it names exists.
func (c *Checkpoint) readIndex(data []byte) ([]string, map[string]string, error) {
	var idx struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(data, &idx); err != nil {
		return nil, nil, fmt.Errorf("checkpoint %s: index %s: invalid JSON: %w", c.dir, c.index, err)
	}
	if len(idx.WeightMap) == 0 {
		return nil, nil, fmt.Errorf("checkpoint %s: index %s has no weight_map entries", c.dir, c.index)
	}
	seen := map[string]bool{}
	var paths []string
	for _, name := range sortedKeys(idx.WeightMap) {
		file := idx.WeightMap[name]
		if seen[file] {
			continue
		}
		seen[file] = true
		if !filepath.IsLocal(file) {
			return nil, nil, fmt.Errorf("checkpoint %s: index %s names file %q (for tensor %q) outside the checkpoint directory", c.dir, c.index, file, name)
		}
		p := filepath.Join(c.dir, file)
		if _, err := os.Stat(p); err != nil {
			return nil, nil, fmt.Errorf("checkpoint %s: index %s names file %s (for tensor %q), which cannot be opened: %w", c.dir, c.index, file, name, err)
		}
		paths = append(paths, p)
	}
	sort.Strings(paths)
	return paths, idx.WeightMap, nil
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// Dir is the checkpoint directory.
func (c *Checkpoint) Dir() string { return c.dir }

// Files lists the paths of the checkpoint's files, sorted.
func (c *Checkpoint) Files() []string {
	out := make([]string, len(c.files))
	for i, f := range c.files {
		out[i] = f.Path()
	}
	return out
}

// Names lists every tensor name, sorted.
func (c *Checkpoint) Names() []string { return slices.Clone(c.names) }

// Info describes a tensor.
func (c *Checkpoint) Info(name string) (TensorInfo, bool) {
	if qi, ok := c.quantInfo(name); ok {
		return qi, true
	}
	f, ok := c.where[name]
	if !ok {
		return TensorInfo{}, false
	}
	ti, _ := f.Info(name)
	dt, _ := ti.DType.Tensor()
	return TensorInfo{Name: name, DType: dt, StoredDType: string(ti.DType), Shape: slices.Clone(ti.Shape), File: f.Path()}, true
}

// BytesRead is the number of tensor bytes Load has copied out of the files so far.
func (c *Checkpoint) BytesRead() int64 { return c.bytesRead.Load() }

// Close releases every file. Tensors already loaded stay valid: Load copies (but not the
// views that Mapped weights return).
func (c *Checkpoint) Close() error {
	var errs []error
	for _, f := range c.files {
		errs = append(errs, f.Close())
	}
	return errors.Join(errs...)
}

// searched describes where a missing tensor was looked for.
func (c *Checkpoint) searched() string {
	var names []string
	for _, f := range c.files {
		names = append(names, filepath.Base(f.Path()))
	}
	const shown = 6
	s := strings.Join(names[:min(len(names), shown)], ", ")
	if len(names) > shown {
		s += fmt.Sprintf(" and %d more", len(names)-shown)
	}
	if c.index != "" {
		return fmt.Sprintf("%s, the files %s lists", s, filepath.Base(c.index))
	}
	return s
}

// resolve checks a reference against the checkpoint and returns the file that holds it and
// the slice to read (dim -1: the whole tensor). A ref with SliceDim < 0 or SliceCount 0
// reads the whole tensor, as ParamRef.LocalShape treats it.
func (c *Checkpoint) resolve(ref graph.ParamRef) (f *safetensors.File, dim, index, count int, err error) {
	if c.dequantizes(ref) {
		f, _, _, dim, index, count, err = c.resolveDequant(ref)
		return f, dim, index, count, err
	}
	if qi, ok := c.quantInfo(ref.Key); ok {
		return c.where[qi.Name], -1, 0, 1, c.resolveQuant(ref, qi)
	}
	f, ok := c.where[ref.Key]
	if !ok {
		return nil, 0, 0, 0, fmt.Errorf("checkpoint %s: tensor %q not found (searched %s)", c.dir, ref.Key, c.searched())
	}
	ti, _ := f.Info(ref.Key)
	stored, ok := ti.DType.Tensor()
	if !ok {
		return nil, 0, 0, 0, fmt.Errorf("%s: tensor %q: unsupported dtype %s (supported: BF16, F16, F32, I32, I64, BOOL, F8_E4M3, F8_E5M2)", f.Path(), ref.Key, ti.DType)
	}
	if !slices.Equal(ti.Shape, ref.Shape) {
		return nil, 0, 0, 0, fmt.Errorf("%s: tensor %q: stored shape %v, but the graph expects %v", f.Path(), ref.Key, ti.Shape, ref.Shape)
	}
	if stored != ref.DType {
		return nil, 0, 0, 0, fmt.Errorf("%s: tensor %q: stored as %s, but the graph expects %s", f.Path(), ref.Key, stored, ref.DType)
	}
	dim, index, count = ref.SliceDim, ref.SliceIndex, ref.SliceCount
	if dim < 0 || (count == 0 && index == 0) {
		return f, -1, 0, 1, nil
	}
	if _, err := safetensors.SliceShape(ti.Shape, dim, index, count); err != nil {
		return nil, 0, 0, 0, fmt.Errorf("%s: tensor %q: %w", f.Path(), ref.Key, err)
	}
	return f, dim, index, count, nil
}

// Load reads the tensor, or the slice of it, that ref names: it checks the stored dtype and
// full shape against ref, then copies only the slice's bytes out of the mapping. The result
// has ref.DType and ref.LocalShape(). Errors name the file and the tensor.
//
// A stacked ref (ref.Stack > 0) reads its members one by one, each straight into its rows of
// the result (graph.LoadStackInto): only the members its slice selects, each only its part.
// An error names the member.
func (c *Checkpoint) Load(ctx context.Context, ref graph.ParamRef) (*tensor.Tensor, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("load %q: %w", ref.Key, err)
	}
	if ref.Stack != 0 {
		out := tensor.New(ref.DType, ref.LocalShape()...)
		if err := graph.LoadStackInto(ctx, ref, out, c.LoadInto); err != nil {
			return nil, err
		}
		return out, nil
	}
	if c.dequantizes(ref) {
		out := tensor.New(ref.DType, ref.LocalShape()...)
		if err := c.loadDequantInto(ref, out); err != nil {
			return nil, err
		}
		return out, nil
	}
	if qi, ok := c.quantInfo(ref.Key); ok {
		if err := c.resolveQuant(ref, qi); err != nil {
			return nil, err
		}
		return c.loadQuant(ref, qi)
	}
	f, dim, index, count, err := c.resolve(ref)
	if err != nil {
		return nil, err
	}
	t, err := f.Slice(ref.Key, dim, index, count)
	if err != nil {
		return nil, err
	}
	c.bytesRead.Add(int64(t.Numel() * t.DType.Size()))
	if want := ref.LocalShape(); !slices.Equal(t.Shape, want) {
		return nil, fmt.Errorf("%s: tensor %q: read shape %v, but the graph expects %v", f.Path(), ref.Key, t.Shape, want)
	}
	return t, nil
}

// LoadInto reads what Load would return straight into dst (graph.WeightsInto), which must have
// ref.DType and ref.LocalShape(): a plain or sliced tensor is read from the file into dst's
// memory without an intermediate copy, a stacked one member by member into its rows, a
// dequantized one (quant_dequantize.go) computed into dst; a quantized one is loaded and
// copied.
func (c *Checkpoint) LoadInto(ctx context.Context, ref graph.ParamRef, dst *tensor.Tensor) error {
	if want := ref.LocalShape(); dst.DType != ref.DType || !slices.Equal(dst.Shape, want) || dst.Len() != tensor.Numel(want) {
		return fmt.Errorf("load %q: destination is %s%v, the graph expects %s%v", ref.Key, dst.DType, dst.Shape, ref.DType, want)
	}
	if ref.Stack != 0 {
		return graph.LoadStackInto(ctx, ref, dst, c.LoadInto)
	}
	if c.dequantizes(ref) {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("load %q: %w", ref.Key, err)
		}
		return c.loadDequantInto(ref, dst)
	}
	if _, quant := c.quantInfo(ref.Key); quant {
		t, err := c.Load(ctx, ref)
		if err != nil {
			return err
		}
		tensor.CopyRange(dst, 0, t, 0, t.Numel())
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("load %q: %w", ref.Key, err)
	}
	f, dim, index, count, err := c.resolve(ref)
	if err != nil {
		return err
	}
	if err := f.SliceInto(ref.Key, dim, index, count, dst); err != nil {
		return err
	}
	c.bytesRead.Add(int64(dst.Numel() * dst.DType.Size()))
	return nil
}

// Check validates every param node of g against the checkpoint before anything runs: each
// tensor must exist, have a supported dtype equal to the node's, the node's full shape, and
// a slice that fits (every member of a stacked param likewise). It reports every problem,
// each naming the file and the tensor.
func (c *Checkpoint) Check(g *graph.Graph) error {
	var errs []error
	params := g.Params()
	for _, n := range params {
		ref, err := graph.ParamOf(n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if ref.Stack != 0 {
			members, first, err := ref.Members()
			if err != nil {
				errs = append(errs, err)
				continue
			}
			for i, m := range members {
				if _, _, _, _, err := c.resolve(m); err != nil {
					errs = append(errs, fmt.Errorf("stacked param %q, member %d of %d: %w", ref.Key, first+i, ref.Stack, err))
				}
			}
			continue
		}
		if _, _, _, _, err := c.resolve(ref); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("checkpoint %s does not fit graph %s (%d of %d params): %w", c.dir, g.Name, len(errs), len(params), errors.Join(errs...))
}
