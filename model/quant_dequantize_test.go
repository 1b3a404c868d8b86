package model

import (
	"context"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model/safetensors"
	"github.com/loom-ml/loom/tensor"
)

// dequantFixture writes a checkpoint of four "experts" e.E.w.weight, f8e4m3 [10,12], each
// with its scale under q's scheme (block [4,8]: a 3x2 grid, the last row and column of
// blocks partial), and returns it opened with q as its quantization_config, and the
// weights' real values computed here, each value decode(w)*scale in f32, by key.
func dequantFixture(t *testing.T, q *QuantConfig, scaleDT tensor.DType) (*Checkpoint, map[string][]float32) {
	t.Helper()
	const n, k = 10, 12
	rng := rand.New(rand.NewPCG(1, 2))
	tensors := map[string]*tensor.Tensor{}
	real := map[string][]float32{}
	for e := range 4 {
		key := "e." + string(rune('0'+e)) + ".w.weight"
		w := tensor.New(tensor.F8E4M3, n, k)
		for i := range w.U8 {
			for w.U8[i] = uint8(rng.IntN(256)); w.U8[i]&0x7F == 0x7F; w.U8[i] = uint8(rng.IntN(256)) { // no NaN
			}
		}
		var sshape []int
		switch q.Scheme {
		case graph.QuantTensor:
			sshape = []int{1}
		case graph.QuantChannel:
			sshape = []int{n, 1}
		case graph.QuantBlock:
			sshape = []int{3, 2}
		}
		s := tensor.New(tensor.F32, sshape...)
		for i := range s.F32 {
			s.F32[i] = float32(math.Ldexp(1+rng.Float64(), rng.IntN(8)-10))
		}
		s = s.Cast(scaleDT)
		sf := s.Float32s()
		v := make([]float32, n*k)
		for r := range n {
			for c := range k {
				var sc float32
				switch q.Scheme {
				case graph.QuantTensor:
					sc = sf[0]
				case graph.QuantChannel:
					sc = sf[r]
				case graph.QuantBlock:
					sc = sf[(r/4)*2+c/8]
				}
				v[r*k+c] = tensor.F8E4M3ToF32(w.U8[r*k+c]) * sc
			}
		}
		tensors[key], tensors[strings.TrimSuffix(key, "weight")+"weight_scale_inv"], real[key] = w, s, v
	}
	dir := t.TempDir()
	if err := safetensors.Write(filepath.Join(dir, SingleFile), tensors); err != nil {
		t.Fatal(err)
	}
	ck, err := OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	ck.stored = q
	return ck, real
}

// rounded is v rounded to dt, as the dequantized param holds it.
func rounded(v []float32, dt tensor.DType) *tensor.Tensor {
	return tensor.FromF32(slices.Clone(v), len(v)).Cast(dt)
}

// sliceOf cuts part index of count along dim of a row-major [n,k] matrix.
func sliceOf(v []float32, n, k, dim, index, count int) []float32 {
	if dim < 0 {
		return v
	}
	var out []float32
	for r := range n {
		for c := range k {
			if (dim == 0 && r/(n/count) == index) || (dim == 1 && c/(k/count) == index) {
				out = append(out, v[r*k+c])
			}
		}
	}
	return out
}

// TestDequantizeWhileLoading reads fp8 weights of each scheme as bf16, f16 and f32 params
// (whole, a slice of rows or columns that cuts a block, a stacked param of two of four
// members, each sliced) through Load, LoadInto and the mapped weights, and checks every
// value against decode(w)*scale computed here in f32 and rounded once to the dtype (what
// dequantize_fp8 gives): bit for bit, the slices holding the unsliced weight's values. Each
// read takes only its slice's fp8 bytes (and the small scale).
func TestDequantizeWhileLoading(t *testing.T) {
	const n, k = 10, 12
	for _, qc := range []struct {
		name    string
		q       *QuantConfig
		scaleDT tensor.DType
	}{
		{"block", &QuantConfig{Method: QuantFP8, WeightDType: tensor.F8E4M3, Scheme: graph.QuantBlock, Block: []int{4, 8}, ScaleSuffix: "weight_scale_inv", substring: true}, tensor.F32},
		{"channel", &QuantConfig{Method: QuantFP8, WeightDType: tensor.F8E4M3, Scheme: graph.QuantChannel, ScaleSuffix: "weight_scale_inv", substring: true}, tensor.BF16},
		{"tensor", &QuantConfig{Method: QuantFP8, WeightDType: tensor.F8E4M3, Scheme: graph.QuantTensor, ScaleSuffix: "weight_scale_inv", substring: true}, tensor.F32},
	} {
		for _, dt := range []tensor.DType{tensor.BF16, tensor.F16, tensor.F32} {
			t.Run(qc.name+"/"+dt.String(), func(t *testing.T) {
				ck, real := dequantFixture(t, qc.q, qc.scaleDT)
				scaleBytes := int64(tensor.Numel(qc.q.ScaleShape(n, k)) * qc.scaleDT.Size())
				for _, rc := range []struct {
					name                 string
					ref                  graph.ParamRef
					members              []string
					dim, index, count    int
					fp8Bytes, scaleReads int64
				}{
					{"whole", graph.ParamRef{Key: "e.1.w.weight", DType: dt, Shape: []int{n, k}, SliceDim: -1}, []string{"e.1.w.weight"}, -1, 0, 1, n * k, 1},
					{"rows 2/2", graph.ParamRef{Key: "e.2.w.weight", DType: dt, Shape: []int{n, k}, SliceDim: 0, SliceIndex: 1, SliceCount: 2}, []string{"e.2.w.weight"}, 0, 1, 2, n * k / 2, 1},
					{"columns 2/2", graph.ParamRef{Key: "e.3.w.weight", DType: dt, Shape: []int{n, k}, SliceDim: 1, SliceIndex: 1, SliceCount: 2}, []string{"e.3.w.weight"}, 1, 1, 2, n * k / 2, 1},
					{"columns 2/3", graph.ParamRef{Key: "e.0.w.weight", DType: dt, Shape: []int{n, k}, SliceDim: 1, SliceIndex: 1, SliceCount: 3}, []string{"e.0.w.weight"}, 1, 1, 3, n * k / 3, 1},
					{"members 2/2, columns 1/2", graph.ParamRef{Key: "e.*.w.weight", DType: dt, Shape: []int{4, n, k}, SliceDim: 2, SliceIndex: 0, SliceCount: 2, Stack: 4, MemberPart: 1, MemberParts: 2},
						[]string{"e.2.w.weight", "e.3.w.weight"}, 1, 0, 2, 2 * n * k / 2, 2},
					{"members 1/2", graph.ParamRef{Key: "e.*.w.weight", DType: dt, Shape: []int{4, n, k}, SliceDim: 0, SliceIndex: 0, SliceCount: 2, Stack: 4},
						[]string{"e.0.w.weight", "e.1.w.weight"}, -1, 0, 1, 2 * n * k, 2},
				} {
					var want []uint32
					for _, m := range rc.members {
						w := rounded(sliceOf(real[m], n, k, rc.dim, rc.index, rc.count), dt)
						for i := range w.Numel() {
							want = append(want, math.Float32bits(float32(w.At(i))))
						}
					}
					check := func(how string, got *tensor.Tensor) {
						t.Helper()
						if got.DType != dt || !slices.Equal(got.Shape, rc.ref.LocalShape()) {
							t.Fatalf("%s %s: got %s%v, want %s%v", rc.name, how, got.DType, got.Shape, dt, rc.ref.LocalShape())
						}
						bad := 0
						for i := range got.Numel() {
							if g := math.Float32bits(float32(got.At(i))); g != want[i] {
								if bad++; bad <= 3 {
									t.Errorf("%s %s [%d]: %g, want %g", rc.name, how, i, got.At(i), math.Float32frombits(want[i]))
								}
							}
						}
					}
					before := ck.BytesRead()
					got, err := ck.Load(context.Background(), rc.ref)
					if err != nil {
						t.Fatalf("%s: %v", rc.name, err)
					}
					check("Load", got)
					if read, want := ck.BytesRead()-before, rc.fp8Bytes+rc.scaleReads*scaleBytes; read != want {
						t.Errorf("%s: read %d bytes, want %d (the slice's fp8 bytes and the scales)", rc.name, read, want)
					}
					dst := tensor.New(dt, rc.ref.LocalShape()...)
					if err := ck.LoadInto(context.Background(), rc.ref, dst); err != nil {
						t.Fatalf("%s: LoadInto: %v", rc.name, err)
					}
					check("LoadInto", dst)
					mapped, err := ck.Mapped().Load(context.Background(), rc.ref)
					if err != nil {
						t.Fatalf("%s: mapped Load: %v", rc.name, err)
					}
					check("mapped Load", mapped)
				}
			})
		}
	}
}

// TestDequantizeWhileLoadingErrors: a missing scale, a scale whose shape does not fit, a
// stored dtype the config does not quantize to, and a module the config leaves unquantized
// are errors naming the tensors, from Check (before anything is read) and from Load.
func TestDequantizeWhileLoadingErrors(t *testing.T) {
	block := func() *QuantConfig {
		return &QuantConfig{Method: QuantFP8, WeightDType: tensor.F8E4M3, Scheme: graph.QuantBlock, Block: []int{4, 8}, ScaleSuffix: "weight_scale_inv", substring: true}
	}
	for _, tc := range []struct {
		name string
		edit func(q *QuantConfig)
		key  string
		want []string
	}{
		{"missing scale", func(q *QuantConfig) { q.ScaleSuffix = "weight_scale" }, "e.1.w.weight",
			[]string{`tensor "e.1.w.weight" (dequantized to bf16 while loading)`, `no scale tensor "e.1.w.weight_scale"`}},
		{"scale shape", func(q *QuantConfig) { q.Block = []int{8, 8} }, "e.2.w.weight",
			[]string{`scale tensor "e.2.w.weight_scale_inv" has shape [3 2]`, "want [2 2]"}},
		{"stored dtype", func(q *QuantConfig) { q.WeightDType = tensor.F8E5M2 }, "e.0.w.weight",
			[]string{`tensor "e.0.w.weight"`, "stored as F8_E4M3", "quantizes to f8e5m2"}},
		{"not quantized", func(q *QuantConfig) { q.Ignore = []string{"e.3"} }, "e.3.w.weight",
			[]string{`tensor "e.3.w.weight": stored as f8e4m3, but the graph expects bf16`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := block()
			ck, _ := dequantFixture(t, q, tensor.F32)
			tc.edit(q)
			ref := graph.ParamRef{Key: tc.key, DType: tensor.BF16, Shape: []int{10, 12}, SliceDim: -1}
			errCheck := ck.Check(paramGraph(t, ref))
			_, errLoad := ck.Load(context.Background(), ref)
			for what, err := range map[string]error{"Check": errCheck, "Load": errLoad} {
				if err == nil {
					t.Fatalf("%s: no error", what)
				}
				for _, w := range tc.want {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("%s: %v\nwant %q", what, err, w)
					}
				}
			}
		})
	}
}
