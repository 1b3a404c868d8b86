package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/loom-ml/loom/tensor"
)

// rawFile assembles a safetensors file from a header text and a data section.
func rawFile(header string, data []byte) []byte {
	var b bytes.Buffer
	binary.Write(&b, binary.LittleEndian, uint64(len(header)))
	b.WriteString(header)
	b.Write(data)
	return b.Bytes()
}

func writeTemp(t *testing.T, name string, content []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, content, 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// wantErr fails unless err is non-nil and its message holds every fragment.
func wantErr(t *testing.T, err error, fragments ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want one naming %q", fragments)
	}
	for _, f := range fragments {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error %q does not mention %q", err, f)
		}
	}
}

func TestParseHeaderErrors(t *testing.T) {
	for _, tc := range []struct {
		name, header string
		want         []string
	}{
		{"not json", `{"a": `, []string{"not valid JSON"}},
		{"not an object", `[1, 2]`, []string{"not a JSON object"}},
		{"empty", ``, []string{"not a JSON object"}},
		{"entry not an object", `{"w": 3}`, []string{`"w"`, "bad entry"}},
		{"no dtype", `{"w": {"shape": [1], "data_offsets": [0, 4]}}`, []string{`"w"`, "no dtype"}},
		{"no shape", `{"w": {"dtype": "F32", "data_offsets": [0, 4]}}`, []string{`"w"`, "no shape"}},
		{"no offsets", `{"w": {"dtype": "F32", "shape": [1]}}`, []string{`"w"`, "no data_offsets"}},
		{"three offsets", `{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 8]}}`, []string{`"w"`, "2 numbers"}},
		{"negative dim", `{"w": {"dtype": "F32", "shape": [-1, 2], "data_offsets": [0, 8]}}`, []string{`"w"`, "negative dimension"}},
		{"negative offset", `{"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}}`, []string{`"w"`, "negative data_offsets"}},
		{"begin after end", `{"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}}`, []string{`"w"`, "begin after end"}},
		{"size mismatch", `{"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}}`, []string{`"w"`, "hold 20 bytes", "needs 24"}},
		{"bf16 size mismatch", `{"w": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 16]}}`, []string{`"w"`, "needs 8"}},
		{"huge shape", `{"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]}}`, []string{`"w"`, "too large"}},
		{"overlap", `{"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}`, []string{`"b"`, `"a"`, "overlap"}},
		{"same range", `{"a": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}, "b": {"dtype": "I8", "shape": [4], "data_offsets": [0, 4]}}`, []string{`"b"`, `"a"`, "overlap"}},
		{"metadata not strings", `{"__metadata__": {"format": 1}}`, []string{"__metadata__", `"format"`}},
		{"float offset", `{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0.5, 4]}}`, []string{`"w"`}},
		{"sub-byte leftover", `{"w": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}`, []string{`"w"`, "whole bytes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseHeader([]byte(tc.header))
			wantErr(t, err, tc.want...)
		})
	}
}

func TestParseHeaderOK(t *testing.T) {
	h, err := ParseHeader([]byte(`{"__metadata__": {"format": "pt"}, "b": {"dtype": "F64", "shape": [2], "data_offsets": [8, 24]},
		"a": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}, "empty": {"dtype": "F32", "shape": [0, 5], "data_offsets": [8, 8]},
		"scalar": {"dtype": "I64", "shape": [], "data_offsets": [24, 32]}, "odd": {"dtype": "X9", "shape": [7], "data_offsets": [32, 33]}}   `))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, ti := range h.Tensors {
		names = append(names, ti.Name)
	}
	if want := []string{"a", "b", "empty", "odd", "scalar"}; !slices.Equal(names, want) {
		t.Errorf("names %v, want %v", names, want)
	}
	if h.Metadata["format"] != "pt" {
		t.Errorf("metadata %v", h.Metadata)
	}
	if ti, ok := h.Lookup("b"); !ok || ti.DType != F64 || ti.Begin != 8 || ti.End != 24 || !slices.Equal(ti.Shape, []int{2}) {
		t.Errorf("b = %+v, %v", ti, ok)
	}
	if h.DataSize() != 33 {
		t.Errorf("DataSize = %d, want 33", h.DataSize())
	}
}

func TestParseFileErrors(t *testing.T) {
	good := `{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}`
	hugeLen := make([]byte, 16)
	binary.LittleEndian.PutUint64(hugeLen, 1<<40)
	for _, tc := range []struct {
		name    string
		content []byte
		want    []string
	}{
		{"empty file", nil, []string{"too short"}},
		{"truncated length", []byte{1, 2, 3}, []string{"too short"}},
		{"header longer than file", rawFile(good, nil)[:20], []string{"header length", "past the end"}},
		{"huge header length", hugeLen, []string{"header length", "past the end"}},
		{"data truncated", rawFile(good, make([]byte, 4)), []string{`"w"`, "past the end of the data section"}},
		{"offsets past end", rawFile(`{"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}`, make([]byte, 8)), []string{`"w"`, "[8, 16]", "past the end"}},
		{"bad json", rawFile(`{"w": nope}`, nil), []string{"not valid JSON"}},
		{"size mismatch", rawFile(`{"w": {"dtype": "F16", "shape": [3], "data_offsets": [0, 8]}}`, make([]byte, 8)), []string{`"w"`, "needs 6"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeTemp(t, "bad.safetensors", tc.content)
			_, err := Open(path)
			wantErr(t, err, append([]string{path}, tc.want...)...)
			_, err = Parse("mem.safetensors", tc.content)
			wantErr(t, err, append([]string{"mem.safetensors"}, tc.want...)...)
		})
	}
	_, err := Open(filepath.Join(t.TempDir(), "missing.safetensors"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: got %v, want ErrNotExist", err)
	}
	_, err = Open(t.TempDir())
	wantErr(t, err, "not a regular file")
}

func TestWriteRoundTrip(t *testing.T) {
	f32 := tensor.FromF32([]float32{1, 2, 3, 4, 5, 6}, 2, 3)
	bf := tensor.New(tensor.BF16, 3)
	for i := range bf.Half {
		bf.Half[i] = tensor.F32ToBF16(float32(i) + 0.5)
	}
	i64 := &tensor.Tensor{DType: tensor.I64, Shape: []int{2}, I64: []int64{-7, 1 << 40}}
	b := &tensor.Tensor{DType: tensor.Bool, Shape: []int{3}, Bool: []bool{true, false, true}}
	i32 := tensor.FromI32([]int32{42}) // scalar
	in := map[string]*tensor.Tensor{"f32": f32, "bf": bf, "i64": i64, "b": b, "i32": i32}
	path := filepath.Join(t.TempDir(), "rt.safetensors")
	if err := Write(path, in); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(path)
	if n := binary.LittleEndian.Uint64(raw); n%8 != 0 {
		t.Errorf("header length %d is not a multiple of 8", n)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Metadata()["format"] != "pt" {
		t.Errorf("metadata = %v", f.Metadata())
	}
	if got, want := f.Names(), []string{"b", "bf", "f32", "i32", "i64"}; !slices.Equal(got, want) {
		t.Errorf("names %v, want %v", got, want)
	}
	for name, want := range in {
		ti, _ := f.Info(name)
		if ti.Begin%int64(max(1, ti.DType.Bits()/8)) != 0 {
			t.Errorf("%s starts at %d, not aligned to its element size", name, ti.Begin)
		}
		got, err := f.Tensor(name)
		if err != nil {
			t.Fatal(err)
		}
		if got.DType != want.DType || !slices.Equal(got.Shape, want.Shape) || !slices.Equal(got.Float32s(), want.Float32s()) {
			t.Errorf("%s: got %v, want %v", name, got, want)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Tensor("f32"); !errors.Is(err, ErrClosed) {
		t.Errorf("read after close: %v", err)
	}
	if _, err := f.Raw("f32"); !errors.Is(err, ErrClosed) {
		t.Errorf("raw after close: %v", err)
	}
}

func TestWriteErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name    string
		entries []Entry
		want    string
	}{
		{"short data", []Entry{{Name: "w", DType: F32, Shape: []int{2}, Data: make([]byte, 7)}}, `"w"`},
		{"unknown dtype", []Entry{{Name: "w", DType: "Q3", Shape: []int{2}, Data: make([]byte, 2)}}, `"Q3"`},
		{"duplicate", []Entry{{Name: "w", DType: U8, Shape: []int{1}, Data: []byte{1}}, {Name: "w", DType: U8, Shape: []int{1}, Data: []byte{1}}}, "duplicate"},
		{"reserved name", []Entry{{Name: "__metadata__", DType: U8, Shape: []int{1}, Data: []byte{1}}}, "__metadata__"},
		{"negative dim", []Entry{{Name: "w", DType: U8, Shape: []int{-1}}}, "negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.name+".safetensors")
			wantErr(t, WriteEntries(path, tc.entries, nil), path, tc.want)
			if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("failed write left %s behind", path)
			}
		})
	}
	wantErr(t, Write(filepath.Join(dir, "x.safetensors"), map[string]*tensor.Tensor{"bad": {DType: tensor.F32, Shape: []int{3}, F32: []float32{1}}}), `"bad"`)
}

func TestUnsupportedDType(t *testing.T) {
	f64 := make([]byte, 16)
	path := filepath.Join(t.TempDir(), "f64.safetensors")
	err := WriteEntries(path, []Entry{
		{Name: "double", DType: F64, Shape: []int{2}, Data: f64},
		{Name: "e8m0", DType: F8E8M0, Shape: []int{4}, Data: []byte{1, 2, 3, 4}},
		{Name: "ok", DType: F32, Shape: []int{1}, Data: make([]byte, 4)},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	f, err := Open(path) // allowed in the header
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, name := range []string{"double", "e8m0"} {
		ti, _ := f.Info(name)
		_, err := f.Tensor(name)
		wantErr(t, err, path, `"`+name+`"`, "unsupported dtype "+string(ti.DType))
		_, err = f.Slice(name, 0, 0, 2)
		wantErr(t, err, path, `"`+name+`"`, string(ti.DType))
	}
	if raw, err := f.Raw("e8m0"); err != nil || !bytes.Equal(raw, []byte{1, 2, 3, 4}) {
		t.Errorf("Raw(e8m0) = %v, %v", raw, err)
	}
	if _, err := f.Tensor("ok"); err != nil {
		t.Error(err)
	}
	_, err = f.Tensor("nope")
	wantErr(t, err, path, `"nope"`)
}

func TestSlice(t *testing.T) {
	// A [2,4,6] f32 tensor whose element at (i,j,k) is 100i+10j+k.
	shape := []int{2, 4, 6}
	data := make([]float32, 48)
	for i := range 2 {
		for j := range 4 {
			for k := range 6 {
				data[(i*4+j)*6+k] = float32(100*i + 10*j + k)
			}
		}
	}
	path := filepath.Join(t.TempDir(), "s.safetensors")
	if err := Write(path, map[string]*tensor.Tensor{"x": tensor.FromF32(data, shape...)}); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, tc := range []struct{ dim, index, count int }{
		{-1, 0, 1}, {0, 0, 2}, {0, 1, 2}, {1, 1, 2}, {1, 3, 4}, {2, 2, 3}, {2, 0, 6}, {2, 5, 6}, {1, 0, 1},
	} {
		got, err := f.Slice("x", tc.dim, tc.index, tc.count)
		if err != nil {
			t.Fatalf("slice %+v: %v", tc, err)
		}
		local := slices.Clone(shape)
		lo := []int{0, 0, 0}
		if tc.dim >= 0 {
			local[tc.dim] /= tc.count
			lo[tc.dim] = tc.index * local[tc.dim]
		}
		var want []float32
		for i := range local[0] {
			for j := range local[1] {
				for k := range local[2] {
					want = append(want, float32(100*(lo[0]+i)+10*(lo[1]+j)+lo[2]+k))
				}
			}
		}
		if !slices.Equal(got.Shape, local) || !slices.Equal(got.F32, want) {
			t.Errorf("slice %+v: got %v %v, want %v %v", tc, got.Shape, got.F32, local, want)
		}
	}
	for _, tc := range []struct {
		dim, index, count int
		want              string
	}{
		{3, 0, 1, "dimension 3 out of range"},
		{1, 0, 3, "does not split into 3"},
		{1, 2, 2, "index 2 out of range"},
		{1, -1, 2, "index -1 out of range"},
		{0, 0, 0, "count 0 must be positive"},
	} {
		_, err := f.Slice("x", tc.dim, tc.index, tc.count)
		wantErr(t, err, path, `"x"`, tc.want)
	}
	_, err = f.ReadSliceBytes("x", 0, 0, 2, make([]byte, 10))
	wantErr(t, err, `"x"`, "destination holds 10 bytes")
}

// TestFixtures opens the weights of every fixture checkpoint (testdata/tiny-*) and reads
// each tensor. The fixtures are checked in: none found, or one without weights, fails.
func TestFixtures(t *testing.T) {
	dirs, err := filepath.Glob("../../testdata/tiny-*")
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) == 0 {
		t.Fatal("no fixture checkpoints in testdata/tiny-* (tools/make_fixtures.py writes them)")
	}
	for _, dir := range dirs {
		p := filepath.Join(dir, "model.safetensors")
		f, err := Open(p)
		if err != nil {
			t.Errorf("%s: %v", p, err)
			continue
		}
		ti, ok := f.Info("model.embed_tokens.weight")
		if !ok || ti.DType != BF16 || len(ti.Shape) != 2 {
			t.Errorf("%s: embed_tokens = %+v, %v", p, ti, ok)
		}
		for _, n := range f.Names() {
			if _, err := f.Tensor(n); err != nil {
				t.Errorf("%s: %v", p, err)
			}
		}
		f.Close()
	}
}

// FuzzParseHeader checks that no header makes ParseHeader or Parse panic, and that whatever
// ParseHeader accepts is consistent.
func FuzzParseHeader(f *testing.F) {
	f.Add([]byte(`{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}`))
	f.Add([]byte(`{"__metadata__": {"format": "pt"}, "a": {"dtype": "BF16", "shape": [1, 2], "data_offsets": [0, 4]}}`))
	f.Add([]byte(`{"a": {"dtype": "F4", "shape": [3, 2], "data_offsets": [0, 3]}, "b": {"dtype": "X", "shape": [], "data_offsets": [3, 9]}}`))
	f.Add([]byte(`{"w": {"dtype": "F32", "shape": [-1], "data_offsets": [8, 0]}}`))
	f.Add([]byte(`{"w": {"dtype": "F32", "shape": [9223372036854775807, 2], "data_offsets": [0, 8]}}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := ParseHeader(data)
		if err == nil {
			for i, ti := range h.Tensors {
				if ti.Begin < 0 || ti.Begin > ti.End {
					t.Fatalf("accepted bad offsets %+v", ti)
				}
				if got, ok := h.Lookup(ti.Name); !ok || got.Name != ti.Name {
					t.Fatalf("lookup %q failed", ti.Name)
				}
				if i > 0 && h.Tensors[i-1].Name >= ti.Name {
					t.Fatalf("tensors not sorted")
				}
			}
		}
		// The same header as a whole file, with a small data section, must not panic either.
		file, err := Parse("fuzz", rawFile(string(data), make([]byte, 64)))
		if err == nil {
			for _, n := range file.Names() {
				_, _ = file.Tensor(n)
				_, _ = file.Slice(n, 0, 0, 2)
			}
		}
	})
}

// TestFP8 reads F8_E4M3 and F8_E5M2 tensors, whole and sliced, as Loom's f8 dtypes (raw
// bytes), and writes them back.
func TestFP8(t *testing.T) {
	data := []byte{0x38, 0xB8, 0x7E, 0x01, 0x40, 0x3C}
	path := filepath.Join(t.TempDir(), "fp8.safetensors")
	if err := WriteEntries(path, []Entry{
		{Name: "e4m3", DType: F8E4M3, Shape: []int{2, 3}, Data: data},
		{Name: "e5m2", DType: F8E5M2, Shape: []int{6}, Data: data},
	}, nil); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	x, err := f.Tensor("e4m3")
	if err != nil {
		t.Fatal(err)
	}
	if x.DType != tensor.F8E4M3 || !bytes.Equal(x.U8, data) {
		t.Errorf("e4m3 read as %s %v", x.DType, x.U8)
	}
	if got := x.Float32s(); got[0] != 1 || got[1] != -1 || got[2] != 448 {
		t.Errorf("e4m3 values %v", got)
	}
	col, err := f.Slice("e4m3", 1, 2, 3)
	if err != nil || !bytes.Equal(col.U8, []byte{0x7E, 0x3C}) {
		t.Errorf("column slice: %v, %v", col, err)
	}
	y, err := f.Tensor("e5m2")
	if err != nil || y.DType != tensor.F8E5M2 || y.Float32s()[0] != 0.5 {
		t.Errorf("e5m2: %v, %v", y, err)
	}
	back := filepath.Join(t.TempDir(), "back.safetensors")
	if err := Write(back, map[string]*tensor.Tensor{"e4m3": x}); err != nil {
		t.Fatal(err)
	}
	g, err := Open(back)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if ti, _ := g.Info("e4m3"); ti.DType != F8E4M3 {
		t.Errorf("written as %s", ti.DType)
	}
}
