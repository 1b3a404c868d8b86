package model

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model/safetensors"
	"github.com/loom-ml/loom/tensor"
)

// quantizeRowsFP8Reference is the serial quantizer QuantizeRowsFP8 replaced, kept as the
// reference: the matrix widened to f32, each row's amax in float64, each value w/scale
// through tensor.F32ToF8E4M3 (float64 arithmetic).
func quantizeRowsFP8Reference(w *tensor.Tensor) (q, scale *tensor.Tensor, err error) {
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

// randomMatrix is an n x k matrix of dtype dt with normal values of varied row magnitudes,
// and rows that test the edges: zeros (negative ones too), a single value, subnormal
// magnitudes, huge ones (f32), values at ±amax.
func randomMatrix(rng *rand.Rand, dt tensor.DType, n, k int) *tensor.Tensor {
	v := make([]float32, n*k)
	for r := range n {
		row := v[r*k : (r+1)*k]
		mag := math.Ldexp(1, rng.IntN(24)-16)
		switch r % 7 {
		case 3: // zeros, some negative
			for i := range row {
				if i%2 == 1 {
					row[i] = float32(math.Copysign(0, -1))
				}
			}
			continue
		case 5: // one value
			row[rng.IntN(k)] = float32(-mag)
			continue
		case 6:
			if dt == tensor.F32 {
				mag = math.Ldexp(1, 100-rng.IntN(250)) // beyond bf16/f16 range both ways
			} else {
				mag = 1e-6
			}
		}
		for i := range row {
			row[i] = float32(rng.NormFloat64() * mag)
		}
	}
	t := tensor.FromF32(v, n, k)
	if dt != tensor.F32 {
		t = t.Cast(dt)
	}
	return t
}

// withParallelBlocks runs f with small blocks and 4 workers, so that small matrices are split
// over several blocks and workers.
func withParallelBlocks(t *testing.T, blockBytes int, f func()) {
	t.Helper()
	prevBlock, prevProcs := fp8BlockBytes, runtime.GOMAXPROCS(4)
	fp8BlockBytes = blockBytes
	defer func() { fp8BlockBytes = prevBlock; runtime.GOMAXPROCS(prevProcs) }()
	f()
}

// kernelSets are the ways the bf16 rows can run: the AVX2 kernels where the CPU has them, and
// the portable loops.
func kernelSets() []bool {
	if fp8AVX2 {
		return []bool{true, false}
	}
	return []bool{false}
}

// withKernels runs f with the AVX2 kernels on or off.
func withKernels(avx2 bool, f func()) {
	prev := fp8AVX2
	fp8AVX2 = avx2
	defer func() { fp8AVX2 = prev }()
	f()
}

// TestQuantizeRowsFP8MatchesReference compares the parallel quantizer with the serial
// reference, bytes and scales, on odd shapes in bf16, f16 and f32, blocks of one row to whole,
// with the AVX2 kernels and without.
func TestQuantizeRowsFP8MatchesReference(t *testing.T) {
	for _, avx2 := range kernelSets() {
		t.Run(fmt.Sprintf("avx2=%v", avx2), func(t *testing.T) { withKernels(avx2, func() { testQuantizeRowsFP8(t) }) })
	}
}

func testQuantizeRowsFP8(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, dt := range []tensor.DType{tensor.BF16, tensor.F16, tensor.F32} {
		for _, shape := range [][2]int{{1, 1}, {3, 7}, {13, 5}, {17, 1023}, {64, 33}, {97, 130}, {0, 4}, {4, 0}} {
			for _, blockBytes := range []int{1, 200, 1 << 20} {
				t.Run(fmt.Sprintf("%s/%dx%d/block%d", dt, shape[0], shape[1], blockBytes), func(t *testing.T) {
					w := randomMatrix(rng, dt, shape[0], shape[1])
					wantQ, wantS, err := quantizeRowsFP8Reference(w)
					if err != nil {
						t.Fatal(err)
					}
					withParallelBlocks(t, blockBytes, func() {
						q, s, err := QuantizeRowsFP8(w)
						if err != nil {
							t.Fatal(err)
						}
						compareFP8(t, q, s, wantQ, wantS)
					})
				})
			}
		}
	}
}

// TestFP8KernelsBF16 compares the AVX2 kernels with the reference element by element: every
// bf16 pattern divided by scales of every range (0 included: infinities and NaN) through
// tensor.F32ToF8E4M3, and the largest magnitude of random rows, with NaN and infinity patterns,
// against a plain loop.
func TestFP8KernelsBF16(t *testing.T) {
	if !fp8AVX2 {
		t.Skip("no AVX2 on this CPU: the portable loops run (TestQuantizeRowsFP8MatchesReference)")
	}
	row := make([]uint16, 1<<16)
	for i := range row {
		row[i] = uint16(i)
	}
	q := make([]uint8, len(row))
	for _, s := range []float32{1, 0.5, 1.0 / 448, 3.7e-3, 0.013, 5.5, 1e30, 1e-38, 1e-43, 0} {
		if n := encodeBF16Fast(q, row, s); n != len(row) {
			t.Fatalf("encodeBF16Fast took %d of %d", n, len(row))
		}
		for i, h := range row {
			if want := tensor.F32ToF8E4M3(tensor.BF16ToF32(h) / s); q[i] != want {
				t.Errorf("scale %g: bf16 %#04x -> %#02x, reference %#02x", s, h, q[i], want)
				break
			}
		}
	}
	rng := rand.New(rand.NewPCG(9, 10))
	for _, n := range []int{1, 31, 32, 33, 100, 4096} {
		row := make([]uint16, n)
		for i := range row {
			row[i] = uint16(rng.Uint32()) & 0xFF7F // no NaN or infinity but the planted one
		}
		if n > 40 {
			row[rng.IntN(n)] = 0xFF80 // -inf
		}
		want := maxMagnitude16(row) // checked against a plain loop below
		var plain uint16
		for _, h := range row {
			plain = max(plain, h&0x7FFF)
		}
		m, done := maxMagnitudeBF16Fast(row)
		if got := max(m, maxMagnitude16(row[done:])); got != want || want != plain || done != n&^31 {
			t.Errorf("n %d: largest magnitude %#04x (kernel took %d), unrolled loop %#04x, plain loop %#04x", n, got, done, want, plain)
		}
	}
}

// compareFP8 reports the first differing byte and scale.
func compareFP8(t *testing.T, q, s, wantQ, wantS *tensor.Tensor) {
	t.Helper()
	if !slices.Equal(q.Shape, wantQ.Shape) || !slices.Equal(s.Shape, wantS.Shape) {
		t.Fatalf("shapes %v and %v, want %v and %v", q.Shape, s.Shape, wantQ.Shape, wantS.Shape)
	}
	if i := firstDiff(q.U8, wantQ.U8); i >= 0 {
		t.Errorf("byte %d (row %d) = %#02x, reference %#02x", i, i/max(1, q.Shape[1]), q.U8[i], wantQ.U8[i])
	}
	for r := range s.F32 {
		if math.Float32bits(s.F32[r]) != math.Float32bits(wantS.F32[r]) {
			t.Errorf("scale of row %d = %g, reference %g", r, s.F32[r], wantS.F32[r])
			break
		}
	}
}

func firstDiff[E comparable](a, b []E) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}

// TestQuantizeRowsFP8Errors checks that a NaN or an infinity names the first row holding one,
// as the reference does, however the rows are split, and that a tensor that is not a float
// matrix is refused.
func TestQuantizeRowsFP8Errors(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(-1))
	for _, tc := range []struct {
		name string
		dt   tensor.DType
		bad  map[int]float32 // element index -> value, in a 9 x 5 matrix
	}{
		{"bf16 nan", tensor.BF16, map[int]float32{7*5 + 2: nan}},
		{"f16 -inf and a later nan", tensor.F16, map[int]float32{4*5 + 4: inf, 8*5 + 1: nan}},
		{"f32 two rows", tensor.F32, map[int]float32{2 * 5: inf, 6*5 + 3: nan}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := make([]float32, 9*5)
			for i := range v {
				v[i] = float32(i%11) - 5
			}
			for i, x := range tc.bad {
				v[i] = x
			}
			w := tensor.FromF32(v, 9, 5).Cast(tc.dt)
			_, _, want := quantizeRowsFP8Reference(w)
			if want == nil {
				t.Fatal("the reference took the bad value")
			}
			for _, blockBytes := range []int{1, 30, 1 << 20} {
				withParallelBlocks(t, blockBytes, func() {
					_, _, err := QuantizeRowsFP8(w)
					if err == nil || err.Error() != want.Error() {
						t.Errorf("block %d bytes: error %v, want %q", blockBytes, err, want)
					}
				})
			}
		})
	}
	for _, w := range []*tensor.Tensor{tensor.New(tensor.BF16, 4), tensor.New(tensor.I32, 2, 2)} {
		if _, _, err := QuantizeRowsFP8(w); err == nil {
			t.Errorf("QuantizeRowsFP8(%s%v): no error", w.DType, w.Shape)
		}
	}
}

// TestLoadQuantizedSlices reads a weight quantized while loading from a checkpoint, whole, by
// rows and by columns, scale before and after its weight, through Load and LoadInto, and
// compares each with the reference quantization of the whole stored weight, sliced.
func TestLoadQuantizedSlices(t *testing.T) {
	const n, k = 21, 45
	rng := rand.New(rand.NewPCG(5, 6))
	for _, dt := range []tensor.DType{tensor.BF16, tensor.F32} {
		w := randomMatrix(rng, dt, n, k)
		wantQ, wantS, err := quantizeRowsFP8Reference(w)
		if err != nil {
			t.Fatal(err)
		}
		dir := writeWeight(t, w)
		for _, tc := range []struct {
			name             string
			dim, index, cnt  int
			scaleFirst, into bool
		}{
			{"whole", -1, 0, 0, false, false},
			{"whole/scale first", -1, 0, 0, true, true},
			{"rows 1 of 3", 0, 1, 3, false, true},
			{"rows 2 of 7/scale first", 0, 2, 7, true, false},
			{"columns 2 of 3", 1, 2, 3, false, false},
			{"columns 0 of 5/scale first", 1, 0, 5, true, true},
		} {
			t.Run(fmt.Sprintf("%s/%s", dt, tc.name), func(t *testing.T) {
				ck := openQuantizing(t, dir)
				wref := graph.ParamRef{Key: "w", DType: tensor.F8E4M3, Shape: []int{n, k}, SliceDim: tc.dim, SliceIndex: tc.index, SliceCount: tc.cnt}
				sref := graph.ParamRef{Key: "w_scale", DType: tensor.F32, Shape: []int{n, 1}, SliceDim: -1}
				if tc.dim == 0 {
					sref.SliceDim, sref.SliceIndex, sref.SliceCount = 0, tc.index, tc.cnt
				}
				load := func(ref graph.ParamRef) *tensor.Tensor {
					t.Helper()
					if !tc.into {
						got, err := ck.Load(context.Background(), ref)
						if err != nil {
							t.Fatal(err)
						}
						return got
					}
					got := tensor.New(ref.DType, ref.LocalShape()...)
					if err := ck.LoadInto(context.Background(), ref, got); err != nil {
						t.Fatal(err)
					}
					return got
				}
				var q, s *tensor.Tensor
				withParallelBlocks(t, 3*k*dt.Size(), func() {
					if tc.scaleFirst {
						s = load(sref)
						q = load(wref)
					} else {
						q = load(wref)
						s = load(sref)
					}
				})
				r0, r1, c0, c1 := 0, n, 0, k
				switch tc.dim {
				case 0:
					r0, r1 = tc.index*n/tc.cnt, (tc.index+1)*n/tc.cnt
				case 1:
					c0, c1 = tc.index*k/tc.cnt, (tc.index+1)*k/tc.cnt
				}
				sliceQ := tensor.New(tensor.F8E4M3, r1-r0, c1-c0)
				for r := r0; r < r1; r++ {
					copy(sliceQ.U8[(r-r0)*(c1-c0):], wantQ.U8[r*k+c0:r*k+c1])
				}
				compareFP8(t, q, s, sliceQ, tensor.FromF32(wantS.F32[r0:r1], r1-r0, 1))
			})
		}
	}
}

// TestLoadQuantizedBadValue checks that a NaN in a stored weight fails its load with an error
// naming the file, the tensor and the stored row.
func TestLoadQuantizedBadValue(t *testing.T) {
	w := tensor.FromF32(make([]float32, 12*4), 12, 4).Cast(tensor.BF16)
	w.Half[9*4+1] = tensor.F32ToBF16(float32(math.NaN()))
	ck := openQuantizing(t, writeWeight(t, w))
	for _, ref := range []graph.ParamRef{
		{Key: "w", DType: tensor.F8E4M3, Shape: []int{12, 4}, SliceDim: -1},
		{Key: "w_scale", DType: tensor.F32, Shape: []int{12, 1}, SliceDim: 0, SliceIndex: 2, SliceCount: 3},
	} {
		_, err := ck.Load(context.Background(), ref)
		if err == nil || !strings.Contains(err.Error(), `tensor "w"`) || !strings.Contains(err.Error(), "row 9 holds NaN") || !strings.Contains(err.Error(), SingleFile) {
			t.Errorf("Load(%s): error %v, want one naming the file, tensor \"w\" and row 9", ref.Key, err)
		}
	}
}

// BenchmarkQuantizeFP8 quantizes a bf16 [14336, 4096] weight (Llama-3.1-8B's gate_proj):
// the serial reference, QuantizeRowsFP8 (parallel over GOMAXPROCS), and quantizing while
// loading it from a checkpoint file (the page cache warm). The parallel cases report their
// speedup over the reference of the same run.
//
//	go test ./model -run '^$' -bench BenchmarkQuantizeFP8 -benchtime 3x
func BenchmarkQuantizeFP8(b *testing.B) {
	const n, k = 14336, 4096
	w := randomMatrix(rand.New(rand.NewPCG(7, 8)), tensor.BF16, n, k)
	var reference float64 // ns per quantization
	speedup := func(b *testing.B) {
		if reference > 0 {
			b.ReportMetric(reference/(float64(b.Elapsed().Nanoseconds())/float64(b.N)), "x_reference")
		}
	}
	b.Run("reference", func(b *testing.B) {
		b.SetBytes(int64(n * k * 2))
		for b.Loop() {
			if _, _, err := quantizeRowsFP8Reference(w); err != nil {
				b.Fatal(err)
			}
		}
		reference = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
	})
	b.Run("parallel", func(b *testing.B) {
		b.SetBytes(int64(n * k * 2))
		for b.Loop() {
			if _, _, err := QuantizeRowsFP8(w); err != nil {
				b.Fatal(err)
			}
		}
		speedup(b)
	})
	b.Run("load", func(b *testing.B) {
		ck := openQuantizing(b, writeWeight(b, w))
		ref := graph.ParamRef{Key: "w", DType: tensor.F8E4M3, Shape: []int{n, k}, SliceDim: -1}
		b.SetBytes(int64(n * k * 2))
		for b.Loop() {
			if _, err := ck.Load(context.Background(), ref); err != nil {
				b.Fatal(err)
			}
		}
		speedup(b)
	})
}

// writeWeight writes w as the tensor "w" of a one-file checkpoint in a new folder and returns
// the folder.
func writeWeight(tb testing.TB, w *tensor.Tensor) string {
	tb.Helper()
	dir := tb.TempDir()
	if err := safetensors.Write(filepath.Join(dir, SingleFile), map[string]*tensor.Tensor{"w": w}); err != nil {
		tb.Fatal(err)
	}
	return dir
}

// openQuantizing opens the checkpoint in dir, closed when the test ends, quantizing "w" while
// loading with its scale "w_scale".
func openQuantizing(tb testing.TB, dir string) *Checkpoint {
	tb.Helper()
	ck, err := OpenCheckpoint(dir)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ck.Close() })
	if err := ck.QuantizeWhileLoading(map[string]string{"w": "w_scale"}); err != nil {
		tb.Fatal(err)
	}
	return ck
}
