package engine

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/loom-ml/loom/model"
	"github.com/loom-ml/loom/model/safetensors"
	"github.com/loom-ml/loom/model/synth"
	"github.com/loom-ml/loom/tensor"
)

// FP8 mixture-of-experts checkpoints: Hugging Face fp8 with 128x128 block scales, as
// Qwen3-30B-A3B-FP8 ships, written by synth at tiny shapes whose matrices cut blocks: hidden
// 256, experts 192 wide (gate/up rows and down columns end in a partial block, and tp=2 cuts
// them mid-block), 4 query heads of 64 (tp=2 splits q and o on block boundaries) and one KV
// head (replicated over tp).

// fp8MoEShapes are the tiny shapes, by synth shape, with their sparse layers of two.
var fp8MoEShapes = []struct {
	name, from string
	edits      map[string]any
	sparse     int
	ct         bool // stored as compressed-tensors (toCompressedTensors)
}{
	// Layer 0 dense (mlp_only_layers): its MLP is linear_fp8 like the attention.
	{"qwen3moe", "qwen3-30b-a3b", map[string]any{"moe_intermediate_size": 192, "intermediate_size": 256, "head_dim": 64, "mlp_only_layers": []int{0}}, 1, false},
	// block_sparse_moe.experts.N.w1/w2/w3, experts intermediate_size wide.
	{"mixtral", "mixtral-8x7b", map[string]any{"intermediate_size": 192}, 2, false},
	{"qwen3moe-ct", "qwen3-30b-a3b", map[string]any{"moe_intermediate_size": 192, "intermediate_size": 256, "head_dim": 64}, 2, true},
}

// toCompressedTensors turns the Hugging Face fp8 checkpoint in dir into compressed-tensors
// FP8 with the same block scales, as llm-compressor writes it: quantization_config with one
// group of 8-bit float weights, strategy block [128,128], targets Linear, the LM head and the
// routers ignored, and each scale renamed <module>.weight_scale.
func toCompressedTensors(t *testing.T, dir string) {
	t.Helper()
	path := filepath.Join(dir, "config.json")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	cfg["quantization_config"] = map[string]any{"quant_method": "compressed-tensors", "format": "float-quantized",
		"ignore": []string{"lm_head", "re:.*mlp\\.gate$"},
		"config_groups": map[string]any{"group_0": map[string]any{"targets": []string{"Linear"},
			"weights":           map[string]any{"num_bits": 8, "type": "float", "strategy": "block", "block_structure": []int{128, 128}, "dynamic": false, "symmetric": true},
			"input_activations": map[string]any{"num_bits": 8, "type": "float", "strategy": "token", "dynamic": true}}}}
	if data, err = json.Marshal(cfg); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	rewriteEntries(t, dir, dir, func(name string, e *safetensors.Entry) bool {
		e.Name = strings.Replace(name, ".weight_scale_inv", ".weight_scale", 1)
		return true
	})
}

// writeFP8MoE writes the tiny copy of shape from (registered in synth.Shapes under name for
// the test) as bf16 and as --fp8 block from one seed, 2 layers and 4 experts, and returns
// their directories.
func writeFP8MoE(t *testing.T, from, name string, edits map[string]any) (plain, fp8 string) {
	t.Helper()
	cfg := map[string]any{}
	for k, v := range synth.Shapes[from].Config {
		cfg[k] = v
	}
	for k, v := range map[string]any{"vocab_size": 512, "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 1,
		"num_experts_per_tok": 2} {
		cfg[k] = v
	}
	if cfg["bos_token_id"].(int) >= 512 { // Qwen's; Mistral's ids 1 and 2 stay
		cfg["bos_token_id"], cfg["eos_token_id"] = 300, 301
	}
	for k, v := range edits {
		cfg[k] = v
	}
	synth.Shapes[name] = synth.Shape{Name: name, Chat: synth.Shapes[from].Chat, Config: cfg}
	defer delete(synth.Shapes, name)
	plain, fp8 = t.TempDir(), t.TempDir()
	opts := synth.Options{Seed: 11, Layers: 2, Experts: 4}
	if err := synth.Write(context.Background(), name, plain, opts); err != nil {
		t.Fatal(err)
	}
	opts.FP8 = synth.FP8Block
	if err := synth.Write(context.Background(), name, fp8, opts); err != nil {
		t.Fatal(err)
	}
	return plain, fp8
}

// rewriteEntries writes the checkpoint in src to dst (which may be src), its other files
// copied and each tensor of model.safetensors passed through edit (false drops it).
func rewriteEntries(t *testing.T, src, dst string, edit func(name string, e *safetensors.Entry) bool) {
	t.Helper()
	if dst != src {
		entries, err := os.ReadDir(src)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.Name() == model.SingleFile || e.IsDir() {
				continue
			}
			data, err := os.ReadFile(filepath.Join(src, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dst, e.Name()), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	f, err := safetensors.Open(filepath.Join(src, model.SingleFile))
	if err != nil {
		t.Fatal(err)
	}
	var kept []safetensors.Entry
	for _, name := range f.Names() {
		info, _ := f.Info(name)
		data, err := f.Raw(name)
		if err != nil {
			t.Fatal(err)
		}
		e := safetensors.Entry{Name: name, DType: info.DType, Shape: info.Shape, Data: slices.Clone(data)}
		if edit(name, &e) {
			kept = append(kept, e)
		}
	}
	f.Close()
	tmp := filepath.Join(dst, model.SingleFile+".tmp")
	if err := safetensors.WriteEntries(tmp, kept, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dst, model.SingleFile)); err != nil {
		t.Fatal(err)
	}
}

// varyScales multiplies each block scale of every expert of the fp8 checkpoint in dir by its
// own factor in [0.5, 1.5). synth's uniform weights give every block nearly the same amax, so
// a scale taken from the wrong block (or expert) would otherwise go unseen.
func varyScales(t *testing.T, dir string) {
	t.Helper()
	i := 0
	rewriteEntries(t, dir, dir, func(name string, e *safetensors.Entry) bool {
		if strings.HasSuffix(name, ".weight_scale_inv") && expertWeight.MatchString(strings.TrimSuffix(name, "_scale_inv")) {
			for b := 0; b < len(e.Data); b += 4 {
				s := math.Float32frombits(binary.LittleEndian.Uint32(e.Data[b:]))
				i++
				binary.LittleEndian.PutUint32(e.Data[b:], math.Float32bits(s*(0.5+float32(i*37%64)/64)))
			}
		}
		return true
	})
}

// expertWeight matches the experts' weights of both families.
var expertWeight = regexp.MustCompile(`\.experts\.\d+\.(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$`)

// dequantizedExperts copies the fp8 checkpoint in dir with every expert weight stored in
// bf16, its real value dequantized here (each fp8 value times its 128x128 block's
// weight_scale_inv in f32, rounded once to bf16), and without the experts' scales; the
// attention's and the dense MLP's fp8 weights and scales are copied as they are. It returns
// the directory and how many expert weights it dequantized.
func dequantizedExperts(t *testing.T, dir, scaleSuffix string) (string, int) {
	t.Helper()
	out := t.TempDir()
	f, err := safetensors.Open(filepath.Join(dir, model.SingleFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	rewriteEntries(t, dir, out, func(name string, e *safetensors.Entry) bool {
		switch {
		case strings.HasSuffix(name, "."+scaleSuffix) && expertWeight.MatchString(strings.TrimSuffix(name, "."+scaleSuffix)+".weight"):
			return false
		case expertWeight.MatchString(name):
			if e.DType != safetensors.F8E4M3 {
				t.Fatalf("%s is %s, want F8_E4M3", name, e.DType)
			}
			scale, err := f.Raw(strings.TrimSuffix(name, "weight") + scaleSuffix)
			if err != nil {
				t.Fatal(err)
			}
			rows, cols := e.Shape[0], e.Shape[1]
			kb := (cols + 127) / 128
			q := e.Data
			e.DType, e.Data = safetensors.BF16, make([]byte, 2*rows*cols)
			for r := range rows {
				for c := range cols {
					s := math.Float32frombits(binary.LittleEndian.Uint32(scale[4*((r/128)*kb+c/128):]))
					v := tensor.F8E4M3ToF32(q[r*cols+c]) * s
					binary.LittleEndian.PutUint16(e.Data[2*(r*cols+c):], tensor.F32ToBF16(v))
				}
			}
			n++
		}
		return true
	})
	return out, n
}

// fp8MoEPrompts are the prompts the tests feed, in chunks of 7 tokens.
var fp8MoEPrompts = [][]int{
	{300, 17, 44, 260, 9, 131, 402, 77, 58, 3, 211},
	{300, 5, 99, 498, 320, 12, 12, 87, 140, 256, 33, 64, 1, 450, 190, 71, 8, 222, 19, 301},
}

// fp8MoELogits loads dir optimized on mesh meshText ("" for one rank), checks its graphs
// (fused moe ops over bf16 experts, linear_fp8 for the rest, ep collectives) and returns the
// last-position logits of each prompt from the cached engine.
func fp8MoELogits(t *testing.T, dir, meshText string, sparse int) [][]float32 {
	t.Helper()
	mesh := mustMeshFor(t, 1, "")
	if meshText != "" {
		mesh = mustMeshFor(t, 0, meshText)
	}
	m, err := Load(context.Background(), dir, LoadOptions{Optimize: true, Mesh: mesh})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	checkMoEGraph(t, m, meshText)
	ranks := max(mesh.Size(), 1)
	if got := countOps(m, "moe"); got != sparse*ranks {
		t.Errorf("%s %s: %d moe ops over %d ranks, want %d a rank", filepath.Base(dir), meshText, got, ranks, sparse)
	}
	if countOps(m, "linear_fp8") == 0 || countOps(m, "dequantize_fp8") != 0 {
		t.Errorf("%s %s: %d linear_fp8 and %d dequantize_fp8 ops; want the attention in linear_fp8, nothing dequantized at run time",
			filepath.Base(dir), meshText, countOps(m, "linear_fp8"), countOps(m, "dequantize_fp8"))
	}
	for _, n := range m.Graph.Nodes {
		if n.Op == "moe" {
			for _, w := range n.Inputs[2:5] {
				if w.Type.DType != tensor.BF16 {
					t.Errorf("%s: the moe op's stacked %s is %s, want bf16", meshText, w, w.Type.DType)
				}
			}
		}
	}
	e, err := New(context.Background(), m, Options{Logger: quiet, MaxTokensPerStep: 16, KVBlocks: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var out [][]float32
	for _, p := range fp8MoEPrompts {
		out = append(out, cachedPromptLogits(t, e, p, 7))
	}
	return out
}

// TestFP8MoECheckpoints loads FP8 mixture-of-experts checkpoints (Qwen3-MoE with a dense
// layer, Mixtral) through engine.Load on the CPU and holds them, bit for bit, to the same
// model with its experts' real values stored in bf16 (dequantizedExperts; the experts' block
// scales varied first, varyScales): the plain graph at
// every position, and the optimized graph (fused moe ops) on the cached engine unsharded and
// at tp=2, ep=2 and tp=2,ep=2. The loader dequantizes each expert's fp8 weight with its block
// scale while loading (model/quant_dequantize.go), rounding once to bf16 as dequantize_fp8
// does, so both load the same weights and run the same graph: any difference is a wrong
// value, scale or slice. With ep alone the logits are also the unsharded ones, bit for bit.
// Quantization must show: the fp8 model's logits are not the bf16 checkpoint's.
func TestFP8MoECheckpoints(t *testing.T) {
	for _, s := range fp8MoEShapes {
		t.Run(s.name, func(t *testing.T) {
			plain, fp8 := writeFP8MoE(t, s.from, "test-fp8-moe-"+s.name, s.edits)
			varyScales(t, fp8)
			suffix := "weight_scale_inv"
			if s.ct {
				toCompressedTensors(t, fp8)
				suffix = "weight_scale"
			}
			deq, n := dequantizedExperts(t, fp8, suffix)
			if n != s.sparse*3*4 {
				t.Fatalf("%d expert weights dequantized, want %d", n, s.sparse*3*4)
			}
			t.Run("plain", func(t *testing.T) {
				var logits [3][]float32
				for i, dir := range []string{fp8, deq, plain} {
					m, err := Load(context.Background(), dir, LoadOptions{})
					if err != nil {
						t.Fatal(err)
					}
					if i < 2 && countOps(m, "linear_fp8") == 0 {
						t.Errorf("%s: no linear_fp8 in the plain graph", dir)
					}
					logits[i], _ = runAll(t, m.Program, fp8MoEPrompts[1])
					m.Close()
				}
				if d, at := maxAbsDiff(logits[0], logits[1]); !bitsEqual(logits[0], logits[1]) {
					t.Errorf("fp8 and dequantized experts differ by %.3g at %d", d, at)
				}
				if bitsEqual(logits[0], logits[2]) {
					t.Error("the fp8 checkpoint gives the bf16 checkpoint's logits: nothing was quantized")
				}
			})
			var unsharded [][]float32
			for _, meshText := range []string{"", "tp=2", "ep=2", "tp=2,ep=2"} {
				if meshText != "" && testing.Short() {
					continue
				}
				t.Run("cached/"+strings.ReplaceAll(meshText, ",", "+"), func(t *testing.T) {
					got, want := fp8MoELogits(t, fp8, meshText, s.sparse), fp8MoELogits(t, deq, meshText, s.sparse)
					if meshText == "" {
						unsharded = got
					}
					for i := range got {
						if d, at := maxAbsDiff(got[i], want[i]); !bitsEqual(got[i], want[i]) {
							t.Errorf("prompt %d: fp8 and dequantized experts differ by %.3g at %d", i, d, at)
						}
						if meshText == "ep=2" && unsharded != nil && !bitsEqual(got[i], unsharded[i]) {
							d, at := maxAbsDiff(got[i], unsharded[i])
							t.Errorf("prompt %d: ep=2 differs from the unsharded engine by %.3g at %d", i, d, at)
						}
					}
				})
			}
		})
	}
}

// TestFP8MoEBadCheckpoints: an expert without its weight_scale_inv, and one whose scale does
// not fit its weight, are errors naming the tensors, raised while the graph is built.
func TestFP8MoEBadCheckpoints(t *testing.T) {
	_, fp8 := writeFP8MoE(t, "qwen3-30b-a3b", "test-fp8-moe-bad", fp8MoEShapes[0].edits)
	const w = "model.layers.1.mlp.experts.2.up_proj.weight"
	for _, tc := range []struct {
		name string
		edit func(name string, e *safetensors.Entry) bool // false drops the entry
		want []string
	}{
		{"missing scale", func(name string, _ *safetensors.Entry) bool { return name != w+"_scale_inv" },
			[]string{`quantizes "` + w + `", but the checkpoint has no scale tensor "` + w + `_scale_inv"`}},
		{"scale shape", func(name string, e *safetensors.Entry) bool {
			if name == w+"_scale_inv" {
				e.Shape, e.Data = []int{1, 2}, e.Data[:8]
			}
			return true
		}, []string{`scale tensor "` + w + `_scale_inv" has shape [1 2]`, "want [2 2]"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			rewriteEntries(t, fp8, dir, tc.edit)
			m, err := Load(context.Background(), dir, LoadOptions{Optimize: true})
			if err == nil {
				m.Close()
				t.Fatal("loaded")
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %v\nwants %q", err, want)
				}
			}
		})
	}
}
