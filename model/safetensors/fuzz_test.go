package safetensors

import (
	"bytes"
	"encoding/binary"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// fixtureHeaders returns the JSON headers of the fixture checkpoints' safetensors files.
func fixtureHeaders(f *testing.F) [][]byte {
	paths, _ := filepath.Glob("../../testdata/tiny-*/model.safetensors")
	var out [][]byte
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		n := binary.LittleEndian.Uint64(b[:8])
		out = append(out, b[8:8+n])
	}
	return out
}

// maxFuzzData bounds the data section FuzzRoundTrip builds for a header it accepts.
const maxFuzzData = 1 << 20

// reencode writes every tensor of f to a new file, as Encode lays it out.
func reencode(t *testing.T, f *File) []byte {
	t.Helper()
	var entries []Entry
	for _, name := range f.Names() {
		ti, _ := f.Info(name)
		raw, err := f.Raw(name)
		if err != nil {
			t.Fatalf("Raw(%q): %v", name, err)
		}
		entries = append(entries, Entry{Name: name, DType: ti.DType, Shape: ti.Shape, Data: raw})
	}
	var b bytes.Buffer
	if err := Encode(&b, entries, f.Metadata()); err != nil {
		t.Fatalf("Encode of an accepted file: %v", err)
	}
	return b.Bytes()
}

// FuzzRoundTrip takes a header, gives it a data section of the size it asks for (filled
// with a pattern), and checks that what Parse accepts survives a round trip through Encode:
// the re-encoded file parses to the same tensors (names, dtypes, shapes, bytes) and
// metadata, its header is laid out as Encode promises (data section 8-byte aligned, each
// tensor at a multiple of its element size, no gaps), and encoding it again gives the very
// same bytes. Headers naming a dtype this package does not know, or an empty tensor name,
// are only parsed: Encode refuses them by design.
func FuzzRoundTrip(f *testing.F) {
	for _, h := range fixtureHeaders(f) {
		f.Add(h)
	}
	for _, s := range []string{
		`{"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}`,
		`{"__metadata__": {"format": "pt", "k": ""}, "a": {"dtype": "BF16", "shape": [1, 2], "data_offsets": [4, 8]}, "b": {"dtype": "U8", "shape": [4], "data_offsets": [0, 4]}}`,
		`{"a": {"dtype": "F4", "shape": [3, 2], "data_offsets": [0, 3]}, "b": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [3, 6]}}`,
		`{"e": {"dtype": "I64", "shape": [0, 5], "data_offsets": [0, 0]}, "s": {"dtype": "BOOL", "shape": [], "data_offsets": [0, 1]}}`,
		`{"a": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}, "b": {"dtype": "C64", "shape": [1], "data_offsets": [16, 24]}}`,
		`{"__metadata__": null, "x": {"dtype": "I16", "shape": [2, 1], "data_offsets": [0, 4]}}`,
		`{"": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}`,
		`{"u": {"dtype": "Q4", "shape": [7], "data_offsets": [0, 3]}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, header []byte) {
		h, err := ParseHeader(header)
		if err != nil || h.DataSize() > maxFuzzData {
			return
		}
		data := make([]byte, h.DataSize())
		for i := range data {
			data[i] = byte(i*31 + 7)
		}
		file, err := Parse("fuzz", rawFile(string(header), data))
		if err != nil {
			t.Fatalf("ParseHeader accepts the header, Parse with a data section of DataSize() bytes refuses it: %v", err)
		}
		for _, ti := range h.Tensors {
			if ti.DType.Bits() == 0 || ti.Name == "" {
				return
			}
		}
		b1 := reencode(t, file)
		file2, err := Parse("again", b1)
		if err != nil {
			t.Fatalf("the re-encoded file does not parse: %v\n%q", err, b1)
		}
		if !slices.Equal(file.Names(), file2.Names()) || !maps.Equal(file.Metadata(), file2.Metadata()) {
			t.Fatalf("round trip changes names or metadata: %v %v, then %v %v", file.Names(), file.Metadata(), file2.Names(), file2.Metadata())
		}
		n := binary.LittleEndian.Uint64(b1[:8])
		if n%8 != 0 {
			t.Fatalf("header of %d bytes: data section not 8-byte aligned", n)
		}
		var end int64
		for _, name := range file.Names() {
			a, _ := file.Info(name)
			b, _ := file2.Info(name)
			if a.DType != b.DType || !slices.Equal(a.Shape, b.Shape) || a.Size() != b.Size() {
				t.Fatalf("tensor %q: %+v, after the round trip %+v", name, a, b)
			}
			if bits := int64(b.DType.Bits()); bits%8 == 0 && b.Begin%(bits/8) != 0 {
				t.Fatalf("tensor %q of %s starts at %d", name, b.DType, b.Begin)
			}
			ra, _ := file.Raw(name)
			rb, _ := file2.Raw(name)
			if !bytes.Equal(ra, rb) {
				t.Fatalf("tensor %q: bytes change in the round trip", name)
			}
			if tn, ok := a.DType.Tensor(); ok {
				x, err := file.Tensor(name)
				if err != nil || x.DType != tn || !slices.Equal(x.Shape, a.Shape) {
					t.Fatalf("Tensor(%q) = %v, %v", name, x, err)
				}
			}
			end += b.Size()
		}
		if int64(len(b1))-8-int64(n) != end || file2.Header().DataSize() != end {
			t.Fatalf("re-encoded data section of %d bytes, tensors hold %d", int64(len(b1))-8-int64(n), end)
		}
		if b2 := reencode(t, file2); !bytes.Equal(b1, b2) {
			t.Fatalf("encoding is not stable:\n%q\n%q", b1, b2)
		}
	})
}
