package model

import (
	"fmt"
	"slices"
	"sort"
	"sync"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model/safetensors"
	"github.com/loom-ml/loom/tensor"
)

// Quantizing while loading (--quantize fp8, Config.WithLoadQuantization). The checkpoint
// presents each weight it quantizes as f8e4m3 [N,K] and adds its scale tensor f32 [N,1],
// computed from the stored bf16, f16 or f32 weight row by row: scale = amax(|row|)/448 (1 for a
// row of zeros), value = w/scale rounded to the nearest f8e4m3, ties to even, saturating at
// ±448 (tensor.F32ToF8E4M3, computed by tensor.F32ToF8E4M3Fast). Each row's scale is taken
// from the whole stored row before any slice is cut from it, so the ranks of a row-parallel
// split (columns) see the same scales as the unsplit weight, and a column-parallel split
// (rows) reads its rows' scales, which depend on those rows only. The rows are quantized in
// parallel as they are read (quantize_fp8_rows.go).

// loadQuant is the checkpoint's table of weights quantized while loading.
type loadQuant struct {
	scaleOf  map[string]string // weight key -> scale key
	weightOf map[string]string // scale key -> weight key

	// scales keeps the scales computed while quantizing a weight's rows, by weightRows, so
	// that reading the scale does not read the weight again (4 bytes a row).
	mu     sync.Mutex
	scales map[weightRows]*tensor.Tensor
}

// weightRows names the rows of a stored weight that one read quantized: part index of
// count (0 of 1: all).
type weightRows struct {
	key          string
	index, count int
}

// QuantizeWhileLoading makes the checkpoint quantize the weights named by the keys of scales
// (weight key -> its scale's key) to f8e4m3 with per-row f32 scales as they are read (see
// above). Each weight must be a stored 2-D bf16, f16 or f32 tensor, and no scale key may name
// a stored tensor. Info, Check and Load then see the quantized tensors.
func (c *Checkpoint) QuantizeWhileLoading(scales map[string]string) error {
	q := &loadQuant{scaleOf: map[string]string{}, weightOf: map[string]string{}, scales: map[weightRows]*tensor.Tensor{}}
	keys := make([]string, 0, len(scales))
	for k := range scales {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, w := range keys {
		s := scales[w]
		info, ok := c.Info(w)
		if !ok {
			return fmt.Errorf("checkpoint %s: --quantize: tensor %q not found (searched %s)", c.dir, w, c.searched())
		}
		if !info.DType.IsFloat() || len(info.Shape) != 2 {
			return fmt.Errorf("checkpoint %s: --quantize fp8: tensor %q is %s%v; want a 2-D bf16, f16 or f32 weight", c.dir, w, info.StoredDType, info.Shape)
		}
		if _, dup := c.where[s]; dup {
			return fmt.Errorf("checkpoint %s: --quantize fp8: the checkpoint already holds a tensor %q (the scale of %q)", c.dir, s, w)
		}
		q.scaleOf[w], q.weightOf[s] = s, w
	}
	c.quant = q
	return nil
}

// quantInfo describes a weight quantized while loading, or its scale, as the graph sees it.
func (c *Checkpoint) quantInfo(name string) (TensorInfo, bool) {
	if c.quant == nil {
		return TensorInfo{}, false
	}
	if _, ok := c.quant.scaleOf[name]; ok {
		f := c.where[name]
		ti, _ := f.Info(name)
		return TensorInfo{Name: name, DType: tensor.F8E4M3, StoredDType: "F8_E4M3", Shape: slices.Clone(ti.Shape), File: f.Path()}, true
	}
	if w, ok := c.quant.weightOf[name]; ok {
		f := c.where[w]
		ti, _ := f.Info(w)
		return TensorInfo{Name: name, DType: tensor.F32, StoredDType: "F32", Shape: []int{ti.Shape[0], 1}, File: f.Path()}, true
	}
	return TensorInfo{}, false
}

// resolveQuant is resolve for a tensor of quantInfo: ref against the quantized view.
func (c *Checkpoint) resolveQuant(ref graph.ParamRef, info TensorInfo) error {
	if !slices.Equal(info.Shape, ref.Shape) {
		return fmt.Errorf("%s: tensor %q (--quantize fp8): shape %v, but the graph expects %v", info.File, ref.Key, info.Shape, ref.Shape)
	}
	if info.DType != ref.DType {
		return fmt.Errorf("%s: tensor %q (--quantize fp8): %s, but the graph expects %s", info.File, ref.Key, info.DType, ref.DType)
	}
	if dim, index, count := ref.SliceDim, ref.SliceIndex, ref.SliceCount; dim >= 0 && (count != 0 || index != 0) {
		if _, err := safetensors.SliceShape(info.Shape, dim, index, count); err != nil {
			return fmt.Errorf("%s: tensor %q: %w", info.File, ref.Key, err)
		}
	}
	return nil
}

// loadQuant reads a weight quantized while loading, or its scale (ref checked by
// resolveQuant): the stored rows the slice needs, whole, quantized row by row in parallel as
// they are read, block by block (quantize_fp8_rows.go), into the f8 result: no copy of the
// weight in its stored dtype or in f32. A column slice converts only its columns, with the
// whole rows' scales. A scale read before its weight computes only the scales.
func (c *Checkpoint) loadQuant(ref graph.ParamRef, info TensorInfo) (*tensor.Tensor, error) {
	key, isScale := ref.Key, info.DType == tensor.F32
	if isScale {
		key = c.quant.weightOf[ref.Key]
	}
	f := c.where[key]
	dim, index, count := ref.SliceDim, ref.SliceIndex, ref.SliceCount
	sliced := dim >= 0 && (count != 0 || index != 0)
	rows := weightRows{key, 0, 1}
	if sliced && dim == 0 { // rows: per-row scales depend on those rows only
		rows.index, rows.count = index, count
	}
	if isScale {
		c.quant.mu.Lock()
		s, ok := c.quant.scales[rows]
		c.quant.mu.Unlock()
		if ok {
			return s, nil
		}
	}
	stored, ok := f.Info(key)
	if !ok {
		return nil, fmt.Errorf("%s: tensor %q: not found", f.Path(), key)
	}
	dt, ok := stored.DType.Tensor()
	if !ok || (dt != tensor.BF16 && dt != tensor.F16 && dt != tensor.F32) || len(stored.Shape) != 2 {
		return nil, fmt.Errorf("%s: tensor %q (--quantize fp8): stored as %s%v, want a 2-D bf16, f16 or f32 weight", f.Path(), key, stored.DType, stored.Shape)
	}
	n, k := stored.Shape[0]/rows.count, stored.Shape[1]
	c0, c1 := 0, k
	if sliced && dim == 1 {
		c0, c1 = index*(k/count), (index+1)*(k/count)
	}
	scale := tensor.New(tensor.F32, n, 1)
	j := &fp8Rows{dt: dt, n: n, k: k, c0: c0, c1: c1, scale: scale.F32, rowBase: rows.index * n}
	var q *tensor.Tensor
	if !isScale {
		q = tensor.New(tensor.F8E4M3, n, c1-c0)
		j.q = q.U8
	}
	err := j.run(true, func(i, blocks int, buf []byte) ([]byte, error) {
		// Block i of this part is block rows.index*blocks+i of the stored rows cut into
		// rows.count*blocks equal parts.
		m, err := f.ReadSliceBytes(key, 0, rows.index*blocks+i, rows.count*blocks, buf)
		if err != nil {
			return nil, err
		}
		swapStored(buf[:m], dt.Size())
		return buf[:m], nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: tensor %q (--quantize fp8): %w", f.Path(), key, err)
	}
	c.bytesRead.Add(int64(n * k * dt.Size()))
	c.quant.mu.Lock()
	c.quant.scales[rows] = scale
	c.quant.mu.Unlock()
	if isScale {
		return scale, nil
	}
	if want := ref.LocalShape(); !slices.Equal(q.Shape, want) {
		return nil, fmt.Errorf("%s: tensor %q: quantized shape %v, but the graph expects %v", f.Path(), ref.Key, q.Shape, want)
	}
	return q, nil
}
