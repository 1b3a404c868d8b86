package synth

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/loom-ml/loom/engine"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model"
	"github.com/loom-ml/loom/model/safetensors"
	"github.com/loom-ml/loom/tensor"
)

// fp8Quantized names the weights an FP8 checkpoint stores in float8_e4m3fn, written out here
// independently of synth's rule: the attention and MLP projections of each layer and each
// expert's; not the routers (mlp.gate, block_sparse_moe.gate), embeddings, LM head, norms or
// biases.
var fp8Quantized = regexp.MustCompile(`^model\.layers\.\d+\.(self_attn\.[qkvo]_proj|mlp\.(gate|up|down)_proj|mlp\.experts\.\d+\.(gate|up|down)_proj|block_sparse_moe\.experts\.\d+\.w[123])\.weight$`)

// tinyDense registers a small dense copy of a shape whose matrices span several 128x128
// blocks, the last of them partial (hidden 320 = 2.5 blocks, intermediate 400, one KV head
// of 64: k/v [64,320]); the returned func removes it.
func tinyDense(from, name string) func() {
	s := Shapes[from]
	cfg := map[string]any{}
	for k, v := range s.Config {
		cfg[k] = v
	}
	for k, v := range map[string]any{"vocab_size": 512, "hidden_size": 320, "intermediate_size": 400,
		"num_attention_heads": 5, "num_key_value_heads": 1, "num_hidden_layers": 2, "bos_token_id": 300, "eos_token_id": 301} {
		cfg[k] = v
	}
	if _, ok := cfg["head_dim"]; ok {
		cfg["head_dim"] = 64
	}
	Shapes[name] = Shape{Name: name, Chat: s.Chat, Config: cfg}
	return func() { delete(Shapes, name) }
}

// TestFP8Block writes each kind of shape with --fp8 block and without it from one seed and
// checks the fp8 checkpoint against the bf16 one, tensor by tensor: the weights that FP8
// checkpoints quantize are F8_E4M3 with a weight_scale_inv f32 [ceil(N/128), ceil(K/128)]
// holding each block's amax/448 (of the bf16 values), and fp8 * scale is within e4m3's
// rounding of the bf16 value; every other tensor (embeddings, LM head, norms, biases,
// routers) is the same bf16 bytes. The config's quantization_config parses as Hugging Face
// fp8 with 128x128 blocks. Dense shapes then load through engine.Load on the CPU into
// linear_fp8 ops whose logits match a bf16 model holding the dequantized weights in f32.
// Mixture-of-experts shapes are checked on their tensors here; their loading (experts
// dequantized as read) is engine's TestFP8MoECheckpoints. synth's uniform weights give every block nearly the same amax, so the
// scales' layout is checked by TestQuantizeBlocks, on values whose amax differs by block.
func TestFP8Block(t *testing.T) {
	for _, c := range []struct {
		from, name string
		tiny       func(from, name string) func()
		experts    int
		quantized  int // weights quantized: 7 a layer, or 4 + 3 per expert
		routers    int
		load       bool
	}{
		{"llama-3.1-8b", "test-fp8-llama", tinyDense, 0, 14, 0, true},
		{"qwen2.5-0.5b", "test-fp8-qwen2", tinyDense, 0, 14, 0, true}, // tied embeddings, q/k/v biases
		{"qwen3-30b-a3b", "test-fp8-qwen3moe", tinyCopy, 4, 2 * (4 + 3*4), 2, false},
		{"mixtral-8x7b", "test-fp8-mixtral", tinyCopy, 4, 2 * (4 + 3*4), 2, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer c.tiny(c.from, c.name)()
			plain, fp8 := t.TempDir(), t.TempDir()
			opts := Options{Seed: 7, Experts: c.experts}
			if err := Write(context.Background(), c.name, plain, opts); err != nil {
				t.Fatal(err)
			}
			opts.FP8 = FP8Block
			if err := Write(context.Background(), c.name, fp8, opts); err != nil {
				t.Fatal(err)
			}
			checkFP8Config(t, fp8, c.routers)
			dequant := checkFP8Tensors(t, plain, fp8, c.quantized)
			if c.load {
				checkFP8Loads(t, plain, fp8, dequant, c.quantized)
			}
		})
	}
}

// checkFP8Config checks config.json's quantization_config: as written (the fields of
// Qwen3-*-FP8's) and as Loom parses it.
func checkFP8Config(t *testing.T, dir string, routers int) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Quant map[string]any `json:"quantization_config"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	q := raw.Quant
	if q["quant_method"] != "fp8" || q["fmt"] != "e4m3" || q["activation_scheme"] != "dynamic" || fmt.Sprint(q["weight_block_size"]) != "[128 128]" {
		t.Errorf("quantization_config %v", q)
	}
	skip, _ := q["modules_to_not_convert"].([]any)
	if len(skip) != routers || routers == 0 && len(q) != 4 {
		t.Errorf("quantization_config %v: want the four fields, and modules_to_not_convert listing %d routers", q, routers)
	}
	for _, m := range skip {
		if s, _ := m.(string); !strings.HasSuffix(s, ".gate") {
			t.Errorf("modules_to_not_convert lists %v, not a router", m)
		}
	}
	cfg, err := model.ParseConfig(data, "config.json")
	if err != nil {
		t.Fatal(err)
	}
	qc := cfg.Quant
	if qc == nil || qc.Method != model.QuantFP8 || qc.WeightDType != tensor.F8E4M3 || qc.Scheme != graph.QuantBlock ||
		!slices.Equal(qc.Block, []int{128, 128}) || qc.ScaleSuffix != "weight_scale_inv" || qc.Activations != "dynamic" {
		t.Errorf("parsed quantization_config %+v", qc)
	}
}

// checkFP8Tensors compares the fp8 checkpoint with the bf16 one and returns the dequantized
// weights (fp8 * scale in f32) by name.
//
// The bound: a block's scale s = amax/448 maps its values x = w/s into [-448, 448]. e4m3 has
// 3 mantissa bits, so rounding a normal x (|x| >= 2^-6) to nearest moves it by at most half
// a unit in the last place, 2^-4 of x's power of two: |x - q| <= 2^-4 |x|, so
// |w - q*s| <= 2^-4 |w|. Below 2^-6, e4m3's subnormals are multiples of 2^-9: |x - q| <=
// 2^-10, so |w - q*s| <= 2^-10 s. The f32 division w/s and the product q*s each add a
// relative 2^-24, well inside the slack of 2^-20 allowed.
func checkFP8Tensors(t *testing.T, plainDir, fp8Dir string, wantQuantized int) map[string][]float32 {
	t.Helper()
	plain, err := safetensors.Open(filepath.Join(plainDir, model.SingleFile))
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	fp8, err := safetensors.Open(filepath.Join(fp8Dir, model.SingleFile))
	if err != nil {
		t.Fatal(err)
	}
	defer fp8.Close()
	dequant := map[string][]float32{}
	want := map[string]bool{}
	for _, name := range plain.Names() {
		want[name] = true
		pi, _ := plain.Info(name)
		fi, ok := fp8.Info(name)
		if !ok {
			t.Errorf("%s is missing from the fp8 checkpoint", name)
			continue
		}
		pb, err := plain.Raw(name)
		if err != nil {
			t.Fatal(err)
		}
		fb, err := fp8.Raw(name)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(fi.Shape, pi.Shape) || pi.DType != safetensors.BF16 {
			t.Errorf("%s: shape %v (bf16: %v %s)", name, fi.Shape, pi.Shape, pi.DType)
			continue
		}
		if !fp8Quantized.MatchString(name) {
			if fi.DType != safetensors.BF16 || string(fb) != string(pb) {
				t.Errorf("%s: %s, same bytes %v; want the bf16 tensor unchanged", name, fi.DType, string(fb) == string(pb))
			}
			continue
		}
		skey := strings.TrimSuffix(name, ".weight") + ".weight_scale_inv"
		want[skey] = true
		si, ok := fp8.Info(skey)
		n, k := pi.Shape[0], pi.Shape[1]
		bn, bk := (n+127)/128, (k+127)/128
		if fi.DType != safetensors.F8E4M3 || !ok || si.DType != safetensors.F32 || !slices.Equal(si.Shape, []int{bn, bk}) {
			t.Errorf("%s: %s, scale %v %s %v; want F8_E4M3 and an F32 scale [%d %d]", name, fi.DType, ok, si.DType, si.Shape, bn, bk)
			continue
		}
		sb, err := fp8.Raw(skey)
		if err != nil {
			t.Fatal(err)
		}
		w := make([]float32, n*k)
		for i := range w {
			w[i] = tensor.BF16ToF32(binary.LittleEndian.Uint16(pb[2*i:]))
		}
		deq := make([]float32, n*k)
		bad := 0
		for b := range bn * bk {
			r0, c0 := b/bk*128, b%bk*128
			s := math.Float32frombits(binary.LittleEndian.Uint32(sb[4*b:]))
			var amax float32
			for r := r0; r < min(r0+128, n); r++ {
				for _, v := range w[r*k+c0 : r*k+min(c0+128, k)] {
					amax = max(amax, float32(math.Abs(float64(v))))
				}
			}
			if s != amax/448 || amax == 0 {
				t.Errorf("%s block %d: scale %g, want amax/448 = %g/448", name, b, s, amax)
			}
			full := false // a value at ±448: the block's range is used
			for r := r0; r < min(r0+128, n); r++ {
				for col := c0; col < min(c0+128, k); col++ {
					i := r*k + col
					q := tensor.F8E4M3ToF32(fb[i])
					full = full || math.Abs(float64(q)) == 448
					deq[i] = q * s
					err, v := math.Abs(float64(deq[i]-w[i])), math.Abs(float64(w[i]))
					tol := math.Ldexp(v, -4)
					if v/float64(s) < 1.0/64 {
						tol = math.Ldexp(float64(s), -10)
					}
					if !(err <= tol*(1+math.Ldexp(1, -20))) {
						if bad++; bad <= 5 {
							t.Errorf("%s[%d,%d]: fp8 %v * scale %g = %g, bf16 %g: off by %g > %g", name, r, col, q, s, deq[i], w[i], err, tol)
						}
					}
				}
			}
			if !full {
				t.Errorf("%s block %d: no value at ±448", name, b)
			}
		}
		dequant[name] = deq
	}
	for _, name := range fp8.Names() {
		if !want[name] {
			t.Errorf("unexpected tensor %s in the fp8 checkpoint", name)
		}
	}
	if len(dequant) != wantQuantized {
		t.Errorf("%d weights quantized, want %d", len(dequant), wantQuantized)
	}
	return dequant
}

// checkFP8Loads loads the fp8 checkpoint through engine.Load on the CPU: every quantized
// weight is a linear_fp8 op, and the logits equal those of the same model with the
// dequantized weights stored in f32 (written next to the bf16 checkpoint's config): both
// compute the same real-valued model in f32, one dequantizing inside linear_fp8, so they
// differ only by rounding in the order of the sums. The bound, 1e-5 of the largest logit, is
// over ten times the 7e-7 measured (sums of a few hundred f32 terms); quantizing itself moves
// the logits much further from the bf16 model's, which the check requires, so that it
// tells the two apart.
func checkFP8Loads(t *testing.T, plainDir, fp8Dir string, dequant map[string][]float32, quantized int) {
	t.Helper()
	deqDir := t.TempDir()
	for _, f := range []string{"config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} {
		data, err := os.ReadFile(filepath.Join(plainDir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(deqDir, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	plain, err := safetensors.Open(filepath.Join(plainDir, model.SingleFile))
	if err != nil {
		t.Fatal(err)
	}
	var entries []safetensors.Entry
	for _, name := range plain.Names() {
		info, _ := plain.Info(name)
		data, err := plain.Raw(name)
		if err != nil {
			t.Fatal(err)
		}
		e := safetensors.Entry{Name: name, DType: info.DType, Shape: info.Shape, Data: slices.Clone(data)}
		if d, ok := dequant[name]; ok {
			e.DType, e.Data = safetensors.F32, make([]byte, 4*len(d))
			for i, v := range d {
				binary.LittleEndian.PutUint32(e.Data[4*i:], math.Float32bits(v))
			}
		}
		entries = append(entries, e)
	}
	plain.Close()
	if err := safetensors.WriteEntries(filepath.Join(deqDir, model.SingleFile), entries, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}

	logits := map[string][]float32{}
	for _, dir := range []string{fp8Dir, deqDir, plainDir} {
		m, err := engine.Load(context.Background(), dir, engine.LoadOptions{})
		if err != nil {
			t.Fatal(err)
		}
		fp8Ops := 0
		for _, n := range m.Graph.Nodes {
			if n.Op == "linear_fp8" {
				fp8Ops++
			}
		}
		if want := map[string]int{fp8Dir: quantized}[dir]; fp8Ops != want {
			t.Errorf("%s: %d linear_fp8 ops, want %d", dir, fp8Ops, want)
		}
		outs, err := m.Program.Run(context.Background(), map[string]*tensor.Tensor{
			"input_ids": tensor.FromI32([]int32{1, 2, 3, 4}, 1, 4),
			"positions": tensor.FromI32([]int32{0, 1, 2, 3}, 1, 4),
		})
		m.Close()
		if err != nil {
			t.Fatal(err)
		}
		logits[dir] = outs[0].Float32s()
	}
	got, want, bf16 := logits[fp8Dir], logits[deqDir], logits[plainDir]
	if len(got) != len(want) || len(got) != len(bf16) {
		t.Fatalf("%d, %d and %d logits", len(got), len(want), len(bf16))
	}
	var diff, fromBF16, scale float64
	for i := range want {
		diff = math.Max(diff, math.Abs(float64(got[i]-want[i])))
		fromBF16 = math.Max(fromBF16, math.Abs(float64(got[i]-bf16[i])))
		if math.IsNaN(float64(got[i])) {
			diff = math.Inf(1)
		}
		scale = math.Max(scale, math.Abs(float64(want[i])))
	}
	t.Logf("logits: max |fp8 - dequantized| %.3g, max |fp8 - bf16| %.3g, max |logit| %.3g", diff, fromBF16, scale)
	if scale == 0 || !(diff <= 1e-5*scale) {
		t.Errorf("logits of the fp8 checkpoint differ from the dequantized model's by %g (max |logit| %g)", diff, scale)
	}
	if !(fromBF16 > 10*1e-5*scale) {
		t.Errorf("logits of the fp8 checkpoint are within %g of the bf16 model's: the check cannot tell them apart", fromBF16)
	}
}

// An unknown --fp8 format is refused before anything is written, naming the flag.
func TestFP8UnknownFormat(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	err := Write(context.Background(), "qwen2.5-0.5b", dir, Options{Layers: 1, FP8: "bogus"})
	if err == nil || !strings.Contains(err.Error(), "--fp8") || !strings.Contains(err.Error(), `"bogus"`) || !strings.Contains(err.Error(), "block") {
		t.Errorf("error %v, want one naming --fp8, the value and the formats", err)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Error("the folder was created")
	}
}

// quantizeBlocks on a matrix made to hit every branch: a block of zeros (scale 1), values
// beyond e4m3's normal range relative to the block, exact powers of two, and a partial
// block; checked against the reference encoder tensor.F32ToF8E4M3 (float64 arithmetic).
func TestQuantizeBlocks(t *testing.T) {
	for _, c := range []struct {
		dt   tensor.DType
		n, k int
	}{{tensor.BF16, 130, 257}, {tensor.F16, 128, 128}, {tensor.F32, 3, 300}} {
		w := make([]float32, c.n*c.k)
		for i := range w {
			r, col := i/c.k, i%c.k
			if col < 128 && r < 128 {
				continue // block (0,0) stays zero
			}
			w[i] = float32(math.Ldexp(float64(i%17)-8, -(i%23))) * float32(1+(i%5)) / 3
		}
		data := make([]byte, len(w)*c.dt.Size())
		for i, v := range w {
			switch c.dt {
			case tensor.BF16:
				binary.LittleEndian.PutUint16(data[2*i:], tensor.F32ToBF16(v))
				w[i] = tensor.BF16ToF32(tensor.F32ToBF16(v))
			case tensor.F16:
				binary.LittleEndian.PutUint16(data[2*i:], tensor.F32ToF16(v))
				w[i] = tensor.F16ToF32(tensor.F32ToF16(v))
			case tensor.F32:
				binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(v))
			}
		}
		bn, bk := (c.n+127)/128, (c.k+127)/128
		q, sb := make([]byte, c.n*c.k), make([]byte, 4*bn*bk)
		quantizeBlocks(data, c.dt, c.n, c.k, q, sb)
		for b := range bn * bk {
			s := math.Float32frombits(binary.LittleEndian.Uint32(sb[4*b:]))
			r0, c0 := b/bk*128, b%bk*128
			var amax float32
			for r := r0; r < min(r0+128, c.n); r++ {
				for col := c0; col < min(c0+128, c.k); col++ {
					amax = max(amax, float32(math.Abs(float64(w[r*c.k+col]))))
				}
			}
			want := amax / 448
			if amax == 0 {
				want = 1
			}
			if s != want {
				t.Errorf("%s %dx%d block %d: scale %g, want %g", c.dt, c.n, c.k, b, s, want)
			}
			for r := r0; r < min(r0+128, c.n); r++ {
				for col := c0; col < min(c0+128, c.k); col++ {
					i := r*c.k + col
					if wantQ := tensor.F32ToF8E4M3(w[i] / s); q[i] != wantQ {
						t.Fatalf("%s [%d,%d] = %g: fp8 %#x, want %#x", c.dt, r, col, w[i], q[i], wantQ)
					}
				}
			}
		}
	}
}

// BenchmarkQuantizeBlocks quantizes one of Llama-3.1-8B's MLP weights [14336, 4096] (bf16).
func BenchmarkQuantizeBlocks(b *testing.B) {
	n, k := 14336, 4096
	w := make([]byte, 2*n*k)
	fillParallel(w, tensor.BF16, 1, 0, 0.0346)
	q, s := make([]byte, n*k), make([]byte, 4*(n/128)*(k/128))
	b.SetBytes(int64(n * k))
	for b.Loop() {
		quantizeBlocks(w, tensor.BF16, n, k, q, s)
	}
}
