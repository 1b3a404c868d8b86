package model

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model/safetensors"
	"github.com/loom-ml/loom/tensor"
)

// expectedShapes lists tensors a checkpoint of cfg must hold, with their shapes, as the
// Hugging Face modeling code of the fixture families lays them out.
func expectedShapes(cfg *Config) map[string][]int {
	h, hd := cfg.HiddenSize, cfg.HeadDim
	q, kv := cfg.NumAttentionHeads*hd, cfg.NumKeyValueHeads*hd
	last := fmt.Sprintf("model.layers.%d.", cfg.NumHiddenLayers-1)
	want := map[string][]int{
		"model.embed_tokens.weight":              {cfg.VocabSize, h},
		"model.norm.weight":                      {h},
		"model.layers.0.input_layernorm.weight":  {h},
		last + "post_attention_layernorm.weight": {h},
		"model.layers.0.self_attn.q_proj.weight": {q, h},
		"model.layers.0.self_attn.k_proj.weight": {kv, h},
		"model.layers.0.self_attn.v_proj.weight": {kv, h},
		last + "self_attn.o_proj.weight":         {h, q},
	}
	if !cfg.TieWordEmbeddings {
		want["lm_head.weight"] = []int{cfg.VocabSize, h}
	}
	if cfg.IsMoE() {
		e := fmt.Sprintf("experts.%d.", cfg.NumLocalExperts-1)
		blk, w1, w2, w3, width := "block_sparse_moe.", "w1", "w2", "w3", cfg.IntermediateSize
		if cfg.ModelType != "mixtral" { // qwen2_moe, qwen3_moe (whose fixtures' last layer is sparse)
			blk, w1, w2, w3, width = "mlp.", "gate_proj", "down_proj", "up_proj", cfg.MoE.IntermediateSize
		}
		want[last+blk+"gate.weight"] = []int{cfg.NumLocalExperts, h}
		want[last+blk+e+w1+".weight"] = []int{width, h}
		want[last+blk+e+w2+".weight"] = []int{h, width}
		want[last+blk+e+w3+".weight"] = []int{width, h}
	} else {
		want["model.layers.0.mlp.gate_proj.weight"] = []int{cfg.IntermediateSize, h}
		want["model.layers.0.mlp.up_proj.weight"] = []int{cfg.IntermediateSize, h}
		want[last+"mlp.down_proj.weight"] = []int{h, cfg.IntermediateSize}
	}
	switch cfg.ModelType {
	case "qwen2", "qwen2_moe":
		want["model.layers.0.self_attn.q_proj.bias"] = []int{q}
		want["model.layers.0.self_attn.k_proj.bias"] = []int{kv}
	case "qwen3", "qwen3_moe":
		want["model.layers.0.self_attn.q_norm.weight"] = []int{hd}
		want[last+"self_attn.k_norm.weight"] = []int{hd}
	}
	return want
}

// paramGraph builds a graph holding one param node per reference.
func paramGraph(t *testing.T, refs ...graph.ParamRef) *graph.Graph {
	t.Helper()
	g := graph.New("params")
	for _, r := range refs {
		attrs := graph.Attrs{"key": r.Key, "dtype": r.DType, "shape": graph.Dims(r.Shape...)}
		if r.SliceCount > 0 {
			attrs["slice_dim"], attrs["slice_index"], attrs["slice_count"] = r.SliceDim, r.SliceIndex, r.SliceCount
		}
		if _, err := g.Append(graph.OpParam, attrs, nil, ""); err != nil {
			t.Fatal(err)
		}
	}
	return g
}

func whole(key string, dt tensor.DType, shape ...int) graph.ParamRef {
	return graph.ParamRef{Key: key, DType: dt, Shape: shape, SliceDim: -1}
}

func TestFixtureCheckpoints(t *testing.T) {
	dirs, _ := filepath.Glob(filepath.Join(fixtures, "tiny-*"))
	if len(dirs) == 0 {
		t.Fatal("no fixtures")
	}
	for _, dir := range dirs {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			m, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if m.Generation == nil || len(m.EOSTokenIDs()) == 0 {
				t.Errorf("generation config %+v, eos %v", m.Generation, m.EOSTokenIDs())
			}
			ck := m.Checkpoint
			var refs []graph.ParamRef
			for name, shape := range expectedShapes(m.Config) {
				info, ok := ck.Info(name)
				if !ok {
					t.Errorf("%s missing", name)
					continue
				}
				wantDT, wantStored := tensor.BF16, "BF16"
				if module, ok := strings.CutSuffix(name, ".weight"); ok && m.Config.Quant.Quantized(module) && len(shape) == 2 && !strings.Contains(name, "embed_tokens") {
					wantDT, wantStored = tensor.F8E4M3, "F8_E4M3" // the FP8 fixtures' linears
				}
				if !slices.Equal(info.Shape, shape) || info.DType != wantDT || info.StoredDType != wantStored || info.File != filepath.Join(dir, SingleFile) {
					t.Errorf("%s: %+v, want shape %v", name, info, shape)
				}
				refs = append(refs, whole(name, info.DType, shape...))
			}
			if err := ck.Check(paramGraph(t, refs...)); err != nil {
				t.Error(err)
			}
			layer := fmt.Sprintf("model.layers.%d.input_layernorm.weight", m.Config.NumHiddenLayers)
			if _, ok := ck.Info(layer); ok {
				t.Errorf("checkpoint has more than %d layers", m.Config.NumHiddenLayers)
			}
			if _, ok := ck.Info("lm_head.weight"); ok && m.Config.TieWordEmbeddings {
				t.Errorf("tied embeddings but lm_head.weight present")
			}
			// Every tensor loads, and BytesRead counts exactly their bytes.
			var total int64
			for _, name := range ck.Names() {
				info, _ := ck.Info(name)
				x, err := ck.Load(context.Background(), whole(name, info.DType, info.Shape...))
				if err != nil {
					t.Fatal(err)
				}
				if err := x.Validate(); err != nil || !slices.Equal(x.Shape, info.Shape) {
					t.Fatalf("%s: %v %v", name, x.Shape, err)
				}
				total += int64(x.Numel() * x.DType.Size())
			}
			if ck.BytesRead() != total {
				t.Errorf("BytesRead %d, want %d", ck.BytesRead(), total)
			}
		})
	}
}

// shard splits a checkpoint's tensors over two files in a new directory and writes an
// index; it returns the directory and the weight map.
func shard(t *testing.T, src string, writeIndex bool) (string, map[string]string) {
	t.Helper()
	f, err := safetensors.Open(filepath.Join(src, SingleFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dir := t.TempDir()
	parts := [2][]safetensors.Entry{}
	weightMap := map[string]string{}
	for i, name := range f.Names() {
		info, _ := f.Info(name)
		raw, err := f.Raw(name)
		if err != nil {
			t.Fatal(err)
		}
		parts[i%2] = append(parts[i%2], safetensors.Entry{Name: name, DType: info.DType, Shape: info.Shape, Data: slices.Clone(raw)})
		weightMap[name] = fmt.Sprintf("model-%05d-of-00002.safetensors", i%2+1)
	}
	for i, p := range parts {
		path := filepath.Join(dir, fmt.Sprintf("model-%05d-of-00002.safetensors", i+1))
		if err := safetensors.WriteEntries(path, p, map[string]string{"format": "pt"}); err != nil {
			t.Fatal(err)
		}
	}
	if writeIndex {
		writeJSON(t, filepath.Join(dir, IndexFile), map[string]any{"metadata": map[string]any{"total_size": 0}, "weight_map": weightMap})
	}
	for _, n := range []string{"config.json", "generation_config.json"} {
		data, err := os.ReadFile(filepath.Join(src, n))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, n), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir, weightMap
}

func writeJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestShardedMatchesSingle(t *testing.T) {
	src := filepath.Join(fixtures, "tiny-llama")
	single, err := OpenCheckpoint(src)
	if err != nil {
		t.Fatal(err)
	}
	defer single.Close()
	withIndex, weightMap := shard(t, src, true)
	noIndex, _ := shard(t, src, false)
	for _, tc := range []struct{ name, dir string }{{"index", withIndex}, {"glob", noIndex}} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Open(tc.dir)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			ck := m.Checkpoint
			if len(ck.Files()) != 2 {
				t.Errorf("files %v", ck.Files())
			}
			if !slices.Equal(ck.Names(), single.Names()) {
				t.Fatalf("names differ: %v vs %v", ck.Names(), single.Names())
			}
			for _, name := range single.Names() {
				info, _ := ck.Info(name)
				if want := filepath.Join(tc.dir, weightMap[name]); info.File != want {
					t.Errorf("%s in %s, want %s", name, info.File, want)
				}
				ref := whole(name, info.DType, info.Shape...)
				a, err := single.Load(context.Background(), ref)
				if err != nil {
					t.Fatal(err)
				}
				b, err := ck.Load(context.Background(), ref)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(a.Half, b.Half) || !slices.Equal(a.Shape, b.Shape) {
					t.Errorf("%s differs between single and sharded checkpoints", name)
				}
			}
		})
	}
}

func TestLoadSlices(t *testing.T) {
	ck, err := OpenCheckpoint(filepath.Join(fixtures, "tiny-llama"))
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	ctx := context.Background()
	const key = "model.layers.0.mlp.gate_proj.weight" // bf16[160, 64]
	full, err := ck.Load(ctx, whole(key, tensor.BF16, 160, 64))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ dim, index, count int }{
		{0, 0, 2}, {0, 1, 2}, {0, 3, 4}, {1, 0, 2}, {1, 1, 2}, {1, 3, 4}, {1, 7, 8}, {0, 0, 1}, {0, 4, 5},
	} {
		t.Run(fmt.Sprintf("dim%d_%dof%d", tc.dim, tc.index, tc.count), func(t *testing.T) {
			ref := graph.ParamRef{Key: key, DType: tensor.BF16, Shape: []int{160, 64}, SliceDim: tc.dim, SliceIndex: tc.index, SliceCount: tc.count}
			before := ck.BytesRead()
			got, err := ck.Load(ctx, ref)
			if err != nil {
				t.Fatal(err)
			}
			local := ref.LocalShape()
			if !slices.Equal(got.Shape, local) || got.DType != tensor.BF16 {
				t.Fatalf("got %s%v, want bf16%v", got.DType, got.Shape, local)
			}
			if read, want := ck.BytesRead()-before, int64(tensor.Numel(local)*2); read != want {
				t.Errorf("BytesRead grew by %d, want %d (the slice's bytes only)", read, want)
			}
			for r := range local[0] {
				for c := range local[1] {
					fr, fc := r, c
					if tc.dim == 0 {
						fr += tc.index * local[0]
					} else {
						fc += tc.index * local[1]
					}
					if got.Half[r*local[1]+c] != full.Half[fr*64+fc] {
						t.Fatalf("element (%d,%d) = %#x, want full (%d,%d) = %#x", r, c, got.Half[r*local[1]+c], fr, fc, full.Half[fr*64+fc])
					}
				}
			}
		})
	}
}

// TestPerRankLoading loads every weight of tiny-llama as two tensor-parallel ranks would,
// concurrently: column-parallel weights split on dim 0, row-parallel ones on dim 1, the rest
// replicated. Together the ranks read each split tensor exactly once.
func TestPerRankLoading(t *testing.T) {
	ck, err := OpenCheckpoint(filepath.Join(fixtures, "tiny-llama"))
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	const ranks = 2
	var want int64
	var refs [ranks][]graph.ParamRef
	for _, name := range ck.Names() {
		info, _ := ck.Info(name)
		size := int64(tensor.Numel(info.Shape) * 2)
		dim := -1
		switch {
		case strings.HasSuffix(name, "q_proj.weight"), strings.HasSuffix(name, "k_proj.weight"), strings.HasSuffix(name, "v_proj.weight"),
			strings.HasSuffix(name, "gate_proj.weight"), strings.HasSuffix(name, "up_proj.weight"):
			dim = 0
		case strings.HasSuffix(name, "o_proj.weight"), strings.HasSuffix(name, "down_proj.weight"):
			dim = 1
		}
		if dim < 0 {
			want += ranks * size
		} else {
			want += size
		}
		for r := range ranks {
			ref := graph.ParamRef{Key: name, DType: info.DType, Shape: info.Shape, SliceDim: dim, SliceIndex: r, SliceCount: ranks}
			if dim < 0 {
				ref.SliceIndex, ref.SliceCount = 0, 1
			}
			refs[r] = append(refs[r], ref)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, ranks)
	for r := range ranks {
		wg.Go(func() {
			for _, ref := range refs[r] {
				if _, err := ck.Load(context.Background(), ref); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if ck.BytesRead() != want {
		t.Errorf("BytesRead %d, want %d", ck.BytesRead(), want)
	}
}

// badCheckpoint writes a small checkpoint with one BF16 [4,6] tensor "w", one F64 tensor
// "d" and an I8 tensor "q", and opens it.
func badCheckpoint(t *testing.T) (*Checkpoint, string) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, SingleFile)
	err := safetensors.WriteEntries(path, []safetensors.Entry{
		{Name: "w", DType: safetensors.BF16, Shape: []int{4, 6}, Data: make([]byte, 48)},
		{Name: "d", DType: safetensors.F64, Shape: []int{3}, Data: make([]byte, 24)},
		{Name: "q", DType: safetensors.I8, Shape: []int{2, 2}, Data: make([]byte, 4)},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ck.Close() })
	return ck, path
}

func TestLoadErrors(t *testing.T) {
	ck, path := badCheckpoint(t)
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		ref  graph.ParamRef
		want []string
	}{
		{"missing", nil, whole("nope", tensor.BF16, 4), []string{ck.Dir(), `"nope"`, "not found", "searched model.safetensors"}},
		{"shape", nil, whole("w", tensor.BF16, 6, 4), []string{path, `"w"`, "[4 6]", "[6 4]"}},
		{"rank", nil, whole("w", tensor.BF16, 24), []string{path, `"w"`, "[4 6]", "[24]"}},
		{"dtype", nil, whole("w", tensor.F32, 4, 6), []string{path, `"w"`, "stored as bf16", "expects f32"}},
		{"unsupported F64", nil, whole("d", tensor.F32, 3), []string{path, `"d"`, "unsupported dtype F64"}},
		{"unsupported I8", nil, whole("q", tensor.I32, 2, 2), []string{path, `"q"`, "unsupported dtype I8"}},
		{"slice does not divide", nil, graph.ParamRef{Key: "w", DType: tensor.BF16, Shape: []int{4, 6}, SliceDim: 1, SliceIndex: 0, SliceCount: 4},
			[]string{path, `"w"`, "does not split into 4"}},
		{"slice index", nil, graph.ParamRef{Key: "w", DType: tensor.BF16, Shape: []int{4, 6}, SliceDim: 0, SliceIndex: 2, SliceCount: 2},
			[]string{path, `"w"`, "index 2 out of range"}},
		{"slice dim", nil, graph.ParamRef{Key: "w", DType: tensor.BF16, Shape: []int{4, 6}, SliceDim: 2, SliceIndex: 0, SliceCount: 2},
			[]string{path, `"w"`, "dimension 2 out of range"}},
		{"canceled", canceled, whole("w", tensor.BF16, 4, 6), []string{`"w"`, "canceled"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := tc.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			x, err := ck.Load(ctx, tc.ref)
			if x != nil {
				t.Error("got a tensor with the error")
			}
			wantErr(t, err, tc.want...)
		})
	}
	if ck.BytesRead() != 0 {
		t.Errorf("failed loads read %d bytes", ck.BytesRead())
	}
	// A zero ParamRef slice (SliceCount 0) reads the whole tensor, as LocalShape says.
	x, err := ck.Load(context.Background(), graph.ParamRef{Key: "w", DType: tensor.BF16, Shape: []int{4, 6}})
	if err != nil || !slices.Equal(x.Shape, []int{4, 6}) {
		t.Errorf("zero slice: %v, %v", x, err)
	}
}

func TestCheck(t *testing.T) {
	dir := filepath.Join(fixtures, "tiny-llama")
	ck, err := OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	file := filepath.Join(dir, SingleFile)

	// A config that disagrees with the checkpoint: hidden_size 32 instead of 64.
	cfg, err := ParseConfig(configJSON(t, map[string]any{"hidden_size": 32, "head_dim": 8}), "config.json")
	if err != nil {
		t.Fatal(err)
	}
	var refs []graph.ParamRef
	for name, shape := range expectedShapes(cfg) {
		refs = append(refs, whole(name, tensor.BF16, shape...))
	}
	err = ck.Check(paramGraph(t, refs...))
	wantErr(t, err, dir, file, `"model.embed_tokens.weight"`, "stored shape [512 64], but the graph expects [512 32]",
		`"model.layers.0.self_attn.q_proj.weight"`, "stored shape [64 64], but the graph expects [32 32]")

	for _, tc := range []struct {
		name string
		refs []graph.ParamRef
		want []string
	}{
		{"ok with slices", []graph.ParamRef{
			whole("model.norm.weight", tensor.BF16, 64),
			{Key: "model.layers.1.self_attn.k_proj.weight", DType: tensor.BF16, Shape: []int{32, 64}, SliceDim: 0, SliceIndex: 1, SliceCount: 2},
		}, nil},
		{"missing", []graph.ParamRef{whole("model.layers.2.mlp.up_proj.weight", tensor.BF16, 160, 64)},
			[]string{`"model.layers.2.mlp.up_proj.weight"`, "not found", "searched model.safetensors"}},
		{"dtype", []graph.ParamRef{whole("model.norm.weight", tensor.F16, 64)}, []string{file, `"model.norm.weight"`, "stored as bf16", "expects f16"}},
		{"several", []graph.ParamRef{
			whole("model.norm.weight", tensor.BF16, 32),
			whole("lm_head.weight", tensor.BF16, 512, 64),
			whole("absent.weight", tensor.BF16, 1),
		}, []string{"(2 of 3 params)", `"model.norm.weight"`, "[64]", "[32]", `"absent.weight"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ck.Check(paramGraph(t, tc.refs...))
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			wantErr(t, err, tc.want...)
		})
	}

	bad, path := badCheckpoint(t)
	wantErr(t, bad.Check(paramGraph(t, whole("d", tensor.F32, 3))), path, `"d"`, "unsupported dtype F64")
}

func TestOpenCheckpointErrors(t *testing.T) {
	src := filepath.Join(fixtures, "tiny-llama")
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string) // edits a sharded copy of tiny-llama
		want  func(dir string) []string
	}{
		{"index names missing file", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "model-00002-of-00002.safetensors"))
		}, func(dir string) []string {
			return []string{filepath.Join(dir, IndexFile), "model-00002-of-00002.safetensors", "cannot be opened"}
		}},
		{"index malformed", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, IndexFile), []byte(`{"weight_map": {`), 0o644)
		}, func(dir string) []string { return []string{filepath.Join(dir, IndexFile), "invalid JSON"} }},
		{"index empty", func(t *testing.T, dir string) {
			writeJSON(t, filepath.Join(dir, IndexFile), map[string]any{"metadata": map[string]any{}})
		}, func(dir string) []string { return []string{filepath.Join(dir, IndexFile), "no weight_map"} }},
		{"index outside dir", func(t *testing.T, dir string) {
			writeJSON(t, filepath.Join(dir, IndexFile), map[string]any{"weight_map": map[string]string{"model.norm.weight": "../x.safetensors"}})
		}, func(dir string) []string {
			return []string{filepath.Join(dir, IndexFile), `"../x.safetensors"`, "outside"}
		}},
		{"index wrong file", func(t *testing.T, dir string) {
			data, _ := os.ReadFile(filepath.Join(dir, IndexFile))
			var idx map[string]map[string]string
			json.Unmarshal(data, &idx)
			wm := idx["weight_map"]
			if wm["model.norm.weight"] == "model-00001-of-00002.safetensors" {
				wm["model.norm.weight"] = "model-00002-of-00002.safetensors"
			} else {
				wm["model.norm.weight"] = "model-00001-of-00002.safetensors"
			}
			writeJSON(t, filepath.Join(dir, IndexFile), idx)
		}, func(dir string) []string {
			return []string{filepath.Join(dir, IndexFile), `"model.norm.weight"`, "does not hold it"}
		}},
		{"tensor in two files", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, IndexFile))
			dup := []safetensors.Entry{{Name: "model.norm.weight", DType: safetensors.BF16, Shape: []int{64}, Data: make([]byte, 128)}}
			if err := safetensors.WriteEntries(filepath.Join(dir, "extra.safetensors"), dup, nil); err != nil {
				t.Fatal(err)
			}
		}, func(dir string) []string {
			return []string{`"model.norm.weight"`, "in both", "extra.safetensors", "model-0000"}
		}},
		{"truncated shard", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "model-00001-of-00002.safetensors")
			data, _ := os.ReadFile(p)
			os.WriteFile(p, data[:len(data)-100], 0o644)
		}, func(dir string) []string {
			return []string{filepath.Join(dir, "model-00001-of-00002.safetensors"), "past the end of the data section"}
		}},
		{"no weights", func(t *testing.T, dir string) {
			for _, n := range []string{IndexFile, "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"} {
				os.Remove(filepath.Join(dir, n))
			}
		}, func(dir string) []string {
			return []string{dir, "no model.safetensors.index.json, model.safetensors or *.safetensors files"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, _ := shard(t, src, true)
			tc.setup(t, dir)
			ck, err := OpenCheckpoint(dir)
			if ck != nil {
				t.Error("got a checkpoint with the error")
			}
			wantErr(t, err, append([]string{"checkpoint " + dir}, tc.want(dir)...)...)
			_, err = Open(dir)
			wantErr(t, err, append([]string{"open model " + dir}, tc.want(dir)...)...)
		})
	}
	_, err := OpenCheckpoint(filepath.Join(t.TempDir(), "absent"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("absent dir: %v", err)
	}
}

func TestOpenErrors(t *testing.T) {
	src := filepath.Join(fixtures, "tiny-llama")
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string)
		want  func(dir string) []string
	}{
		{"no config", func(t *testing.T, dir string) { os.Remove(filepath.Join(dir, "config.json")) },
			func(dir string) []string { return []string{filepath.Join(dir, "config.json")} }},
		{"malformed config", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"hidden_size": 64,,}`), 0o644)
		}, func(dir string) []string { return []string{filepath.Join(dir, "config.json"), "invalid JSON"} }},
		{"invalid config", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "config.json"), configJSON(t, map[string]any{"num_attention_heads": 0}), 0o644)
		}, func(dir string) []string {
			return []string{filepath.Join(dir, "config.json") + ": num_attention_heads must be positive, got 0"}
		}},
		{"bad generation config", func(t *testing.T, dir string) {
			os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(`{"top_p": 2}`), 0o644)
		}, func(dir string) []string { return []string{filepath.Join(dir, "generation_config.json"), "top_p"} }},
		{"header longer than file", func(t *testing.T, dir string) {
			p := filepath.Join(dir, "model-00002-of-00002.safetensors")
			data, _ := os.ReadFile(p)
			os.WriteFile(p, data[:100], 0o644)
		}, func(dir string) []string {
			return []string{filepath.Join(dir, "model-00002-of-00002.safetensors"), "header length", "past the end of the file"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, _ := shard(t, src, true)
			tc.setup(t, dir)
			m, err := Open(dir)
			if m != nil {
				t.Error("got a model with the error")
			}
			wantErr(t, err, append([]string{"open model " + dir}, tc.want(dir)...)...)
		})
	}

	// Without generation_config.json the model opens and falls back to config ids.
	dir, _ := shard(t, src, true)
	os.Remove(filepath.Join(dir, "generation_config.json"))
	m, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.Generation != nil || !slices.Equal(m.EOSTokenIDs(), []int{4}) {
		t.Errorf("generation %+v eos %v", m.Generation, m.EOSTokenIDs())
	}
}

// TestLoadInto: LoadInto reads a whole or sliced tensor into a view of a larger tensor,
// equal to Load, leaving the rest alone; what it read stays valid after Close.
func TestLoadInto(t *testing.T) {
	ck, err := OpenCheckpoint(filepath.Join(fixtures, "tiny-llama"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const key = "model.layers.0.mlp.gate_proj.weight" // bf16[160, 64]
	var want []uint16
	refs := []graph.ParamRef{
		whole(key, tensor.BF16, 160, 64),
		{Key: key, DType: tensor.BF16, Shape: []int{160, 64}, SliceDim: 1, SliceIndex: 1, SliceCount: 4},
	}
	for _, ref := range refs {
		got, err := ck.Load(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, got.Half...)
	}
	all := tensor.New(tensor.BF16, len(want)+2)
	all.Half[0], all.Half[len(all.Half)-1] = 7, 9
	off := 1
	for _, ref := range refs {
		n := tensor.Numel(ref.LocalShape())
		view := &tensor.Tensor{DType: tensor.BF16, Shape: ref.LocalShape(), Half: all.Half[off : off+n : off+n]}
		if err := ck.LoadInto(ctx, ref, view); err != nil {
			t.Fatal(err)
		}
		off += n
	}
	if err := ck.LoadInto(ctx, refs[0], tensor.New(tensor.BF16, 64, 160)); err == nil {
		t.Error("LoadInto a destination of the wrong shape: no error")
	}
	if err := ck.Close(); err != nil {
		t.Fatal(err)
	}
	if all.Half[0] != 7 || all.Half[len(all.Half)-1] != 9 || !slices.Equal(all.Half[1:len(all.Half)-1], want) {
		t.Error("LoadInto into views differs from Load, or wrote outside them")
	}
}
