package model

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model/safetensors"
	"github.com/loom-ml/loom/tensor"
)

// Dequantizing while loading. A graph may read a weight that an FP8 checkpoint stores
// quantized (float8 [N,K] and <module>.<ScaleSuffix>) as a plain float param, of dtype bf16,
// f16 or f32: the mixture-of-experts frontends do so for the experts (and any quantized
// router), whose stacked params feed the moe op, which has no fp8 kernels yet. The checkpoint
// then returns the real weight, each value decode(w)·scale computed in f32 and rounded once
// to the param's dtype: exactly what dequantize_fp8 to that dtype gives, so the model is
// bit for bit the one whose checkpoint holds the dequantized weights. A slice (a rank's rows
// or columns of an expert) reads only its fp8 bytes and the whole (small) scale, each value
// taking the scale of its place in the whole weight, so any slice, on a block boundary or
// not, gives the unsliced weight's values. The rule, decided per reference: the config's
// quantization_config quantizes the module, the checkpoint stores its weight in float8 and
// the graph asks for a float dtype; anything else reads as stored.

// dequantizes reports whether ref reads a weight that the checkpoint stores quantized, as a
// float param (see above).
func (c *Checkpoint) dequantizes(ref graph.ParamRef) bool {
	q := c.stored
	if q == nil || ref.Stack != 0 {
		return false
	}
	switch ref.DType {
	case tensor.BF16, tensor.F16, tensor.F32:
	default:
		return false
	}
	f, ok := c.where[ref.Key]
	if !ok {
		return false
	}
	ti, _ := f.Info(ref.Key)
	if dt, ok := ti.DType.Tensor(); !ok || !dt.IsFloat8() {
		return false
	}
	module, ok := strings.CutSuffix(ref.Key, ".weight")
	return ok && q.Quantized(module)
}

// ScaleFits reports whether a stored scale shape fits a weight [n,k] under the config's
// scheme: the shape ScaleShape gives, or for tensor scales any one value ([] or [1]), for
// channel scales [n] as well as [n,1].
func (q *QuantConfig) ScaleFits(scale []int, n, k int) bool {
	want := q.ScaleShape(n, k)
	switch q.Scheme {
	case graph.QuantTensor:
		return len(scale) <= 1 && tensor.Numel(scale) == 1
	case graph.QuantChannel:
		return slices.Equal(scale, want) || slices.Equal(scale, want[:1])
	}
	return slices.Equal(scale, want)
}

// resolveDequant checks a reference that dequantizes (see dequantizes) against the stored
// weight and its scale, and returns the files that hold them and the slice to read (dim -1:
// the whole weight). Errors name the tensor.
func (c *Checkpoint) resolveDequant(ref graph.ParamRef) (w, s *safetensors.File, skey string, dim, index, count int, err error) {
	q := c.stored
	w = c.where[ref.Key]
	ti, _ := w.Info(ref.Key)
	stored, _ := ti.DType.Tensor()
	fail := func(format string, args ...any) (*safetensors.File, *safetensors.File, string, int, int, int, error) {
		return nil, nil, "", 0, 0, 0, fmt.Errorf("%s: tensor %q (dequantized to %s while loading): %s", w.Path(), ref.Key, ref.DType, fmt.Sprintf(format, args...))
	}
	if len(ti.Shape) != 2 || !slices.Equal(ti.Shape, ref.Shape) {
		return fail("stored shape %v, but the graph expects %v", ti.Shape, ref.Shape)
	}
	if stored != q.WeightDType {
		return fail("stored as %s, but quantization_config (%s) quantizes to %s", ti.DType, q, q.WeightDType)
	}
	skey = strings.TrimSuffix(ref.Key, ".weight") + "." + q.ScaleSuffix
	s, ok := c.where[skey]
	if !ok {
		return fail("quantization_config (%s) quantizes it, but the checkpoint has no scale tensor %q (searched %s)", q, skey, c.searched())
	}
	si, _ := s.Info(skey)
	if sdt, ok := si.DType.Tensor(); !ok || !sdt.IsFloat() || sdt.IsFloat8() {
		return fail("scale tensor %q is stored as %s; want bf16, f16 or f32", skey, si.DType)
	}
	n, k := ti.Shape[0], ti.Shape[1]
	if !q.ScaleFits(si.Shape, n, k) {
		return fail("scale tensor %q has shape %v, which does not fit the weight %v under quantization_config (%s): want %v", skey, si.Shape, ti.Shape, q, q.ScaleShape(n, k))
	}
	dim, index, count = ref.SliceDim, ref.SliceIndex, ref.SliceCount
	if dim < 0 || (count == 0 && index == 0) {
		return w, s, skey, -1, 0, 1, nil
	}
	if _, err := safetensors.SliceShape(ti.Shape, dim, index, count); err != nil {
		return fail("%v", err)
	}
	return w, s, skey, dim, index, count, nil
}

// loadDequantInto reads the weight (or slice) that ref names, which dequantizes, into dst of
// ref.DType and ref.LocalShape(): the slice's float8 bytes and the whole scale, each value
// decode(w)·scale in f32 rounded once to dst's dtype, rows shared among GOMAXPROCS workers.
func (c *Checkpoint) loadDequantInto(ref graph.ParamRef, dst *tensor.Tensor) error {
	wf, sf, skey, dim, index, count, err := c.resolveDequant(ref)
	if err != nil {
		return err
	}
	w, err := wf.Slice(ref.Key, dim, index, count)
	if err != nil {
		return err
	}
	st, err := sf.Tensor(skey)
	if err != nil {
		return err
	}
	c.bytesRead.Add(int64(w.Numel()*w.DType.Size() + st.Numel()*st.DType.Size()))
	if want := ref.LocalShape(); !slices.Equal(w.Shape, want) || !slices.Equal(dst.Shape, want) {
		return fmt.Errorf("%s: tensor %q: read shape %v into %v, but the graph expects %v", wf.Path(), ref.Key, w.Shape, dst.Shape, want)
	}
	d := dequantRows{q: c.stored, w: w.U8, scale: st.Float32s(), N: ref.Shape[0], K: ref.Shape[1], n: w.Shape[0], k: w.Shape[1], dst: dst}
	d.table = tensor.F8E4M3Table()
	if w.DType == tensor.F8E5M2 {
		d.table = tensor.F8E5M2Table()
	}
	switch dim {
	case 0:
		d.r0 = index * d.n
	case 1:
		d.c0 = index * d.k
	}
	d.run()
	return nil
}

// dequantRows dequantizes rows [0,n) and columns [0,k) of a slice w that starts at row r0 and
// column c0 of the whole weight [N,K], into dst.
type dequantRows struct {
	q      *QuantConfig
	w      []uint8
	table  *[256]float32
	scale  []float32
	N, K   int
	n, k   int
	r0, c0 int
	dst    *tensor.Tensor
}

// run shares the rows among the workers (one when the weight is small).
func (d *dequantRows) run() {
	workers := min(runtime.GOMAXPROCS(0), max(d.n*d.k/(1<<16), 1), d.n)
	if workers <= 1 {
		d.rows(0, d.n, make([]float32, d.k))
		return
	}
	var wg sync.WaitGroup
	per := (d.n + workers - 1) / workers
	for lo := 0; lo < d.n; lo += per {
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			d.rows(lo, hi, make([]float32, d.k))
		}(lo, min(lo+per, d.n))
	}
	wg.Wait()
}

// rows dequantizes local rows [lo,hi), each through buf (k values).
func (d *dequantRows) rows(lo, hi int, buf []float32) {
	q := d.q
	kb := 0
	if q.Scheme == graph.QuantBlock {
		kb = (d.K + q.Block[1] - 1) / q.Block[1]
	}
	for i := lo; i < hi; i++ {
		src, r := d.w[i*d.k:(i+1)*d.k], d.r0+i
		switch q.Scheme {
		case graph.QuantTensor, graph.QuantChannel:
			s := d.scale[0]
			if q.Scheme == graph.QuantChannel {
				s = d.scale[r]
			}
			for j, b := range src {
				buf[j] = d.table[b] * s
			}
		case graph.QuantBlock:
			ss := d.scale[(r/q.Block[0])*kb : (r/q.Block[0]+1)*kb]
			for j, b := range src {
				buf[j] = d.table[b] * ss[(d.c0+j)/q.Block[1]]
			}
		}
		out := i * d.k
		switch d.dst.DType {
		case tensor.BF16:
			for j, v := range buf {
				d.dst.Half[out+j] = tensor.F32ToBF16(v)
			}
		case tensor.F16:
			for j, v := range buf {
				d.dst.Half[out+j] = tensor.F32ToF16(v)
			}
		case tensor.F32:
			copy(d.dst.F32[out:out+d.k], buf)
		}
	}
}
