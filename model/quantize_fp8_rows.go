package model

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/loom-ml/loom/tensor"
)

// The kernels and the parallel driver of quantizing to f8e4m3 row by row (quantize_load.go
// says what is computed). Rows are split into blocks; GOMAXPROCS workers each take the next
// block, fill their own buffer with its stored rows (read from the checkpoint, or a view of a
// tensor in memory), compute each row's scale from the stored bits and write the row's f8
// bytes. No copy of the weight is made in f32 or in its stored dtype: a worker holds one block
// of stored rows (fp8BlockBytes) at a time.

// fp8BlockBytes is the most stored bytes of the rows of one block (a variable for tests).
var fp8BlockBytes = 1 << 20

// fp8Rows is one quantization: n rows of k stored elements (bf16, f16 or f32), converting
// columns [c0, c1) of each into q (n x (c1-c0) bytes; nil: scales only) and each row's scale
// into scale (n values).
type fp8Rows struct {
	dt      tensor.DType
	n, k    int
	c0, c1  int
	q       []uint8
	scale   []float32
	rowBase int // the stored index of row 0, for errors
}

// fp8BadRow is a row holding a NaN or an infinity.
type fp8BadRow struct {
	row int
	val float32
}

// blockRows is the rows of a block: the largest divisor of n whose rows fit in fp8BlockBytes
// (at least 1), so that a block is an equal part of the rows (ReadSliceBytes reads equal
// parts).
func (j *fp8Rows) blockRows() int {
	target := max(1, fp8BlockBytes/max(1, j.k*j.dt.Size()))
	for b := min(target, j.n); b > 1; b-- {
		if j.n%b == 0 {
			return b
		}
	}
	return 1
}

// run quantizes the rows: fill writes block i of count (rows [i*b, (i+1)*b)) as stored bytes
// in the host's order into buf, which is that block's size (nil unless withBuf), and returns
// them (buf, or a view of the same bytes).
// The first error in row order is returned: a read's error, or a row's NaN or infinity.
func (j *fp8Rows) run(withBuf bool, fill func(i, count int, buf []byte) ([]byte, error)) error {
	if j.n == 0 || j.k == 0 {
		for r := range j.scale {
			j.scale[r] = 1
		}
		return nil
	}
	b := j.blockRows()
	blocks := j.n / b
	workers := min(runtime.GOMAXPROCS(0), blocks)
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		mu    sync.Mutex
		first = -1 // block of the first error
		err   error
	)
	fail := func(block int, e error) {
		mu.Lock()
		if first < 0 || block < first {
			first, err = block, e
		}
		mu.Unlock()
	}
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []byte
			if withBuf {
				buf = make([]byte, b*j.k*j.dt.Size())
			}
			for {
				i := int(next.Add(1)) - 1
				if i >= blocks {
					return
				}
				src, e := fill(i, blocks, buf)
				if e != nil {
					fail(i, e)
					continue
				}
				if bad, ok := j.block(i*b, b, src); !ok {
					fail(i, fmt.Errorf("row %d holds %v", j.rowBase+bad.row, bad.val))
				}
			}
		}()
	}
	wg.Wait()
	return err
}

// block quantizes rows [r0, r0+count) from their stored bytes src.
func (j *fp8Rows) block(r0, count int, src []byte) (fp8BadRow, bool) {
	w := j.c1 - j.c0
	for r := range count {
		var q []uint8
		if j.q != nil {
			q = j.q[(r0+r)*w : (r0+r+1)*w]
		}
		var (
			s   float32
			bad int
		)
		switch j.dt {
		case tensor.BF16:
			s, bad = quantizeRowBF16(halves(src[r*j.k*2:(r+1)*j.k*2]), j.c0, q)
		case tensor.F16:
			s, bad = quantizeRowF16(halves(src[r*j.k*2:(r+1)*j.k*2]), j.c0, q)
		default:
			s, bad = quantizeRowF32(floats(src[r*j.k*4:(r+1)*j.k*4]), j.c0, q)
		}
		if bad >= 0 {
			return fp8BadRow{r0 + r, storedValue(j.dt, src[r*j.k*j.dt.Size():], bad)}, false
		}
		j.scale[r0+r] = s
	}
	return fp8BadRow{}, true
}

// rowScale is a row's scale from its largest magnitude: amax/448, 1 for a row of zeros.
func rowScale(amax float32) float32 {
	if amax == 0 {
		return 1
	}
	return amax / tensor.F8E4M3Max
}

// quantizeRowBF16 computes the scale of a bf16 row and, when q is set, converts row[c0:] into
// q. The largest magnitude is found on the bits (sign cleared, their order is the values'); an
// infinity or NaN has larger bits than any finite value, and bad is the index of the first one
// (-1: none).
func quantizeRowBF16(row []uint16, c0 int, q []uint8) (s float32, bad int) {
	m, done := maxMagnitudeBF16Fast(row)
	m = max(m, maxMagnitude16(row[done:]))
	if m >= 0x7F80 {
		return 0, firstBad(len(row), func(i int) bool { return row[i]&0x7F80 == 0x7F80 })
	}
	s = rowScale(tensor.BF16ToF32(m))
	row = row[c0 : c0+len(q)]
	q = q[:len(row)]
	done = encodeBF16Fast(q, row, s)
	for i, h := range row[done:] {
		q[done+i] = tensor.F32ToF8E4M3Fast(math.Float32frombits(uint32(h)<<16) / s)
	}
	return s, -1
}

// maxMagnitude16 is the largest of a row's 16-bit float patterns with the sign cleared, in
// four independent maxima (the loop runs at the throughput of max, not its latency).
func maxMagnitude16(row []uint16) uint16 {
	var m0, m1, m2, m3 uint16
	i := 0
	for ; i+4 <= len(row); i += 4 {
		r := row[i : i+4 : i+4]
		m0, m1, m2, m3 = max(m0, r[0]&0x7FFF), max(m1, r[1]&0x7FFF), max(m2, r[2]&0x7FFF), max(m3, r[3]&0x7FFF)
	}
	for ; i < len(row); i++ {
		m0 = max(m0, row[i]&0x7FFF)
	}
	return max(m0, m1, m2, m3)
}

// quantizeRowF16 is quantizeRowBF16 for f16.
func quantizeRowF16(row []uint16, c0 int, q []uint8) (s float32, bad int) {
	m := maxMagnitude16(row)
	if m >= 0x7C00 {
		return 0, firstBad(len(row), func(i int) bool { return row[i]&0x7C00 == 0x7C00 })
	}
	s = rowScale(tensor.F16ToF32(m))
	row = row[c0 : c0+len(q)]
	for i, h := range row {
		q[i] = tensor.F32ToF8E4M3Fast(tensor.F16ToF32(h) / s)
	}
	return s, -1
}

// quantizeRowF32 is quantizeRowBF16 for f32.
func quantizeRowF32(row []float32, c0 int, q []uint8) (s float32, bad int) {
	var m uint32
	for _, x := range row {
		m = max(m, math.Float32bits(x)&0x7FFFFFFF)
	}
	if m >= 0x7F800000 {
		return 0, firstBad(len(row), func(i int) bool { return math.Float32bits(row[i])&0x7F800000 == 0x7F800000 })
	}
	s = rowScale(math.Float32frombits(m))
	row = row[c0 : c0+len(q)]
	for i, x := range row {
		q[i] = tensor.F32ToF8E4M3Fast(x / s)
	}
	return s, -1
}

// firstBad is the first index below n where bad holds (-1: none).
func firstBad(n int, bad func(int) bool) int {
	for i := range n {
		if bad(i) {
			return i
		}
	}
	return -1
}

// storedValue is element i of a row's bytes in the host's order.
func storedValue(dt tensor.DType, row []byte, i int) float32 {
	switch dt {
	case tensor.BF16:
		return tensor.BF16ToF32(halves(row)[i])
	case tensor.F16:
		return tensor.F16ToF32(halves(row)[i])
	}
	return floats(row)[i]
}

// hostLittleEndian reports whether the host's integers are little-endian, as stored bytes
// are; elsewhere the buffers are swapped after a read (swapStored).
var hostLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// halves views little-endian stored bytes (2-aligned) as uint16 elements.
func halves(b []byte) []uint16 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*uint16)(unsafe.Pointer(&b[0])), len(b)/2)
}

// floats views little-endian stored bytes (4-aligned) as float32 elements.
func floats(b []byte) []float32 {
	if len(b) == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

// swapStored turns little-endian stored elements of size bytes into the host's order, in
// place (nothing to do on a little-endian host).
func swapStored(b []byte, size int) {
	if hostLittleEndian {
		return
	}
	for i := 0; i+size <= len(b); i += size {
		for l, h := i, i+size-1; l < h; l, h = l+1, h-1 {
			b[l], b[h] = b[h], b[l]
		}
	}
}

// tensorBytes views the storage of a bf16, f16 or f32 tensor as bytes in the host's order.
func tensorBytes(t *tensor.Tensor) []byte {
	switch t.DType {
	case tensor.F32:
		if len(t.F32) == 0 {
			return nil
		}
		return unsafe.Slice((*byte)(unsafe.Pointer(&t.F32[0])), 4*len(t.F32))
	default:
		if len(t.Half) == 0 {
			return nil
		}
		return unsafe.Slice((*byte)(unsafe.Pointer(&t.Half[0])), 2*len(t.Half))
	}
}

// QuantizeRowsFP8 quantizes a float matrix w [N,K] (bf16, f16 or f32) row by row: q f8e4m3
// [N,K] and scale f32 [N,1], scale = amax(|row|)/448 (1 for a row of zeros), q = w/scale
// rounded to the nearest f8e4m3, ties to even, saturating at ±448. A NaN or an infinity is an
// error naming its row (the first such row). The rows are quantized in parallel, from w's
// storage without a widened copy.
func QuantizeRowsFP8(w *tensor.Tensor) (q, scale *tensor.Tensor, err error) {
	if len(w.Shape) != 2 {
		return nil, nil, fmt.Errorf("quantize fp8: want a matrix, got shape %v", w.Shape)
	}
	if w.DType != tensor.BF16 && w.DType != tensor.F16 && w.DType != tensor.F32 {
		return nil, nil, fmt.Errorf("quantize fp8: want a bf16, f16 or f32 matrix, got %s", w.DType)
	}
	n, k := w.Shape[0], w.Shape[1]
	if w.Len() != n*k {
		return nil, nil, fmt.Errorf("quantize fp8: a %v matrix holds %d elements, want %d", w.Shape, w.Len(), n*k)
	}
	q, scale = tensor.New(tensor.F8E4M3, n, k), tensor.New(tensor.F32, n, 1)
	j := &fp8Rows{dt: w.DType, n: n, k: k, c0: 0, c1: k, q: q.U8, scale: scale.F32}
	all := tensorBytes(w)
	if err := j.run(false, func(i, count int, _ []byte) ([]byte, error) {
		size := len(all) / count
		return all[i*size : (i+1)*size], nil
	}); err != nil {
		return nil, nil, err
	}
	return q, scale, nil
}
