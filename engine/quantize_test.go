package engine

import (
	"context"
	"math"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/loom-ml/loom/internal/parity"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tensor"
)

// quantizedLinear names the weights --quantize fp8 quantizes: the decoder layers' linear
// projections.
var quantizedLinear = regexp.MustCompile(`^model\.layers\.\d+\.(self_attn|mlp)\.[a-z]+_proj\.weight$`)

// dequantizedCopy writes the fixture in dir as an unquantized f32 checkpoint in a temporary
// directory whose decoder-layer projections hold what --quantize fp8 should make of them,
// computed here independently of the loader, row by row: scale = amax(|row|)/448 (1 for a
// zero row), w' = f8e4m3(w/scale) * scale. It returns the directory and the number of
// weights it quantized.
func dequantizedCopy(t *testing.T, dir string) (string, int) {
	t.Helper()
	quantized := 0
	out := rewriteCheckpoint(t, dir, "float32", func(name string, w *tensor.Tensor) *tensor.Tensor {
		w = w.Cast(tensor.F32)
		if !quantizedLinear.MatchString(name) {
			return w
		}
		quantized++
		n, k := w.Shape[0], w.Shape[1]
		deq := tensor.New(tensor.F32, n, k)
		for r := range n {
			amax := 0.0
			for c := range k {
				amax = math.Max(amax, math.Abs(float64(w.F32[r*k+c])))
			}
			scale := float32(amax) / 448
			if amax == 0 {
				scale = 1
			}
			for c := range k {
				deq.F32[r*k+c] = tensor.F8E4M3ToF32(tensor.F32ToF8E4M3(w.F32[r*k+c]/scale)) * scale
			}
		}
		return deq
	})
	return out, quantized
}

// dequantizedReference runs the dequantized f32 copy (plain graph) on the fixture's prompts
// and returns its logits at every position and its greedy continuations with their margins,
// as a parity reference for the quantized load.
func dequantizedReference(t *testing.T, fixture, refDir string) *parity.Reference {
	t.Helper()
	hf := loadReference(t, fixture)
	m, err := Load(context.Background(), refDir, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ref := &parity.Reference{Model: hf.Model + " (dequantized --quantize fp8)"}
	for _, hp := range hf.Prompts {
		p := parity.Prompt{Text: hp.Text, IDs: hp.IDs}
		logits, V := runAll(t, m.Program, p.IDs)
		for i := range len(p.IDs) {
			p.AllLogits = append(p.AllLogits, logits[i*V:(i+1)*V])
		}
		p.LastLogits = p.AllLogits[len(p.IDs)-1]
		res, err := GreedyRecompute(context.Background(), m.Program, p.IDs, len(hp.GreedyNewIDs))
		if err != nil {
			t.Fatal(err)
		}
		p.GreedyNewIDs = res.NewIDs
		seq := slices.Concat(p.IDs, p.GreedyNewIDs[:len(p.GreedyNewIDs)-1])
		all, _ := runAll(t, m.Program, seq)
		for i := range p.GreedyNewIDs {
			row := all[(len(p.IDs)-1+i)*V : (len(p.IDs)+i)*V]
			best := sample.Argmax(row)
			second := math.Inf(-1)
			for j, v := range row {
				if j != best {
					second = math.Max(second, float64(v))
				}
			}
			p.GreedyMargins = append(p.GreedyMargins, float64(row[best])-second)
		}
		ref.Prompts = append(ref.Prompts, p)
	}
	return ref
}

// TestQuantizeFP8 loads tiny-llama and tiny-qwen3 with Quantize "fp8" and holds them to the
// same model in f32 with the dequantized weights (dequantizedCopy): logits within
// parity.LogitTol and greedy tokens equal up to near ties, plain and on the cached engine at
// tp=1 and tp=2; the graph runs linear_fp8 on f8e4m3 weights.
func TestQuantizeFP8(t *testing.T) {
	for _, name := range []string{"tiny-llama", "tiny-qwen3"} {
		t.Run(name, func(t *testing.T) {
			fixture := filepath.Join("..", "testdata", name)
			refDir, quantized := dequantizedCopy(t, fixture)
			ref := dequantizedReference(t, fixture, refDir)
			hf := loadReference(t, fixture)
			if d, _ := maxAbsDiff(ref.Prompts[0].LastLogits, hf.Prompts[0].LastLogits); d <= 10*logitTol {
				t.Fatalf("the dequantized copy's logits differ from the bf16 model's by only %.2e: the comparison could not tell quantized from unquantized weights", d)
			}

			t.Run("plain", func(t *testing.T) {
				m, err := Load(context.Background(), fixture, LoadOptions{Quantize: "fp8"})
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				if got := countOps(m, "linear_fp8"); got != quantized {
					t.Errorf("%d linear_fp8 ops, want %d", got, quantized)
				}
				checkQuantizedParams(t, m)
				plain, err := Load(context.Background(), fixture, LoadOptions{})
				if err != nil {
					t.Fatal(err)
				}
				defer plain.Close()
				t.Logf("weight bytes: bf16 %d, --quantize fp8 %d; bytes read %d, %d", plain.dep.WeightBytes, m.dep.WeightBytes, plain.Checkpoint.BytesRead(), m.Checkpoint.BytesRead())
				checkQuantizedBytes(t, plain, m)
				for _, p := range ref.Prompts {
					logits, _ := runAll(t, m.Program, p.IDs)
					checkLogits(t, logits, p)
					checkGreedy(t, forcedGen(t, m.Program, p), p)
				}
			})
			for _, meshText := range []string{"tp=1", "tp=2"} {
				t.Run("cached/"+meshText, func(t *testing.T) {
					mesh := mustMeshFor(t, 0, meshText)
					if meshText == "tp=1" {
						mesh = mustMeshFor(t, 1, "")
					}
					m, err := Load(context.Background(), fixture, LoadOptions{Optimize: true, Mesh: mesh, Quantize: "fp8"})
					if err != nil {
						t.Fatal(err)
					}
					defer m.Close()
					if countOps(m, "linear_fp8") == 0 {
						t.Error("the optimized graph has no linear_fp8")
					}
					checkQuantizedParams(t, m)
					if meshText == "tp=2" {
						checkFP8Sliced(t, m)
					}
					checkCachedParity(t, m, ref)
				})
			}
		})
	}
}

// checkQuantizedParams: every linear_fp8 reads an f8e4m3 weight of a decoder-layer
// projection and an f32 channel scale.
func checkQuantizedParams(t *testing.T, m *Model) {
	t.Helper()
	for _, g := range append(slices.Clone(m.Graphs), m.Graph) {
		for _, n := range g.Nodes {
			if n.Op != "linear_fp8" {
				continue
			}
			ws, ss := fp8Params(t, n)
			for i, w := range ws {
				s, key := ss[i], w.Attrs.String("key")
				if w.Attrs.DType("dtype") != tensor.F8E4M3 || s.Attrs.DType("dtype") != tensor.F32 || n.Attrs.String("scheme") != "channel" {
					t.Errorf("%s: weight %s, scale %s, scheme %s; want f8e4m3, f32, channel", key, w.Attrs.DType("dtype"), s.Attrs.DType("dtype"), n.Attrs.String("scheme"))
				}
				if !quantizedLinear.MatchString(key) {
					t.Errorf("%s is quantized: only the decoder layers' projections should be", key)
				}
			}
		}
	}
}

// checkQuantizedBytes: the quantized model holds its projections in one byte per weight
// (plus 4 per row of scale) where the bf16 model holds two.
func checkQuantizedBytes(t *testing.T, plain, q *Model) {
	t.Helper()
	var elems, rows int
	for _, n := range q.Graph.Nodes {
		if n.Op == "linear_fp8" {
			shape := n.Inputs[1].Type.Shape
			elems += shape[0].Size * shape[1].Size
			rows += shape[0].Size
		}
	}
	if want := plain.dep.WeightBytes - elems + 4*rows; q.dep.WeightBytes != want {
		t.Errorf("--quantize fp8 holds %d weight bytes, want %d (bf16 %d less one byte per projection weight plus 4 per scale)", q.dep.WeightBytes, want, plain.dep.WeightBytes)
	}
	// On the CPU a weight kept as stored is a view of the mapping (BytesMapped), one that is
	// quantized or fused is read (BytesRead): either way, once.
	loaded := func(m *Model) int64 { return m.Checkpoint.BytesRead() + m.Checkpoint.BytesMapped() }
	if got, want := loaded(q), loaded(plain); got != want {
		t.Errorf("--quantize fp8 read %d bytes of the checkpoint, the bf16 load %d: each stored weight should be read once", got, want)
	}
}

// TestQuantizeBadOptions: an unknown method and an FP8 checkpoint are errors naming the
// option and the reason, before any weight is read.
func TestQuantizeBadOptions(t *testing.T) {
	for _, tc := range []struct {
		fixture, method string
		want            []string
	}{
		{"tiny-llama", "int4", []string{`--quantize "int4" is not supported (want fp8)`}},
		{"tiny-llama", "FP8x", []string{`--quantize "FP8x"`}},
		{"tiny-llama-fp8", "fp8", []string{"--quantize fp8: the checkpoint is already quantized", "fp8 block [16 16]"}},
		{"tiny-qwen3-fp8-ct", "fp8", []string{"--quantize fp8: the checkpoint is already quantized"}},
		{"tiny-mixtral", "fp8", []string{"--quantize fp8", "mixture-of-experts"}},
	} {
		t.Run(tc.fixture+"/"+tc.method, func(t *testing.T) {
			m, err := Load(context.Background(), filepath.Join("..", "testdata", tc.fixture), LoadOptions{Quantize: tc.method})
			if err == nil {
				m.Close()
				t.Fatal("loaded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q\nwants %q", err, w)
				}
			}
		})
	}
}
