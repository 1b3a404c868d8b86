package model

import (
	"fmt"
	"math"
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
// ±448 (tensor.F32ToF8E4M3). Each row is quantized whole before any slice is cut from it, so
// the ranks of a row-parallel split see the same scales as the unsplit weight, and a
// column-parallel split (rows) reads its rows' scales, which depend on those rows only.

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
// resolveQuant): the stored rows the slice needs, whole, quantized row by row.
func (c *Checkpoint) loadQuant(ref graph.ParamRef, info TensorInfo) (*tensor.Tensor, error) {
	key, isScale := ref.Key, info.DType == tensor.F32
	if isScale {
		key = c.quant.weightOf[ref.Key]
	}
	f := c.where[key]
	dim, index, count := ref.SliceDim, ref.SliceIndex, ref.SliceCount
	sliced := dim >= 0 && (count != 0 || index != 0)
	rows, readDim := weightRows{key, 0, 1}, -1
	if sliced && dim == 0 { // rows: per-row scales depend on those rows only
		rows.index, rows.count, readDim = index, count, 0
	}
	if isScale {
		c.quant.mu.Lock()
		s, ok := c.quant.scales[rows]
		c.quant.mu.Unlock()
		if ok {
			return s, nil
		}
	}
	w, err := f.Slice(key, readDim, rows.index, rows.count)
	if err != nil {
		return nil, err
	}
	c.bytesRead.Add(int64(w.Numel() * w.DType.Size()))
	q, s, err := QuantizeRowsFP8(w)
	if err != nil {
		return nil, fmt.Errorf("%s: tensor %q: %w", f.Path(), key, err)
	}
	if isScale {
		return s, nil
	}
	c.quant.mu.Lock()
	c.quant.scales[rows] = s
	c.quant.mu.Unlock()
	if sliced && dim == 1 {
		q = sliceCols(q, index, count)
	}
	if want := ref.LocalShape(); !slices.Equal(q.Shape, want) {
		return nil, fmt.Errorf("%s: tensor %q: quantized shape %v, but the graph expects %v", f.Path(), ref.Key, q.Shape, want)
	}
	return q, nil
}

// QuantizeRowsFP8 quantizes a float matrix w [N,K] row by row: q f8e4m3 [N,K] and scale f32
// [N,1], scale = amax(|row|)/448 (1 for a row of zeros), q = w/scale rounded to the nearest
// f8e4m3, ties to even, saturating at ±448. A NaN or an infinity is an error naming its row.
func QuantizeRowsFP8(w *tensor.Tensor) (q, scale *tensor.Tensor, err error) {
	if len(w.Shape) != 2 {
		return nil, nil, fmt.Errorf("quantize fp8: want a matrix, got shape %v", w.Shape)
	}
	n, k := w.Shape[0], w.Shape[1]
	v := w.Float32s()
	q, scale = tensor.New(tensor.F8E4M3, n, k), tensor.New(tensor.F32, n, 1)
	for r := range n {
		row := v[r*k : (r+1)*k]
		var amax float32
		for _, x := range row {
			if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
				return nil, nil, fmt.Errorf("row %d holds %v", r, x)
			}
			amax = max(amax, float32(math.Abs(float64(x))))
		}
		s := amax / tensor.F8E4M3Max
		if amax == 0 {
			s = 1
		}
		scale.F32[r] = s
		out := q.U8[r*k : (r+1)*k]
		for i, x := range row {
			out[i] = tensor.F32ToF8E4M3(x / s)
		}
	}
	return q, scale, nil
}

// sliceCols cuts part index of count along the columns of an 8-bit matrix.
func sliceCols(t *tensor.Tensor, index, count int) *tensor.Tensor {
	n, k := t.Shape[0], t.Shape[1]
	part := k / count
	out := tensor.New(t.DType, n, part)
	for r := range n {
		copy(out.U8[r*part:(r+1)*part], t.U8[r*k+index*part:r*k+(index+1)*part])
	}
	return out
}
