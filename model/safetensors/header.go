// Package safetensors reads and writes the safetensors checkpoint format of Hugging Face.
//
// A file is an 8-byte little-endian header length N, then N bytes of JSON, then the data
// section. The JSON maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]},
// offsets relative to the start of the data section; an optional "__metadata__" entry maps
// strings to strings.
//
// Open memory-maps a file read-only and validates every entry before it returns, so a file
// that opened cleanly can be read without further bounds surprises. Reads copy out only the
// bytes asked for: a slice of a tensor (one part of a dimension cut into equal parts) is
// gathered in contiguous chunks straight from the mapping.
package safetensors

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"math/bits"
	"sort"

	"github.com/loom-ml/loom/tensor"
)

// DType is a safetensors element type name as it appears in the header, such as "BF16".
type DType string

// The element types of the safetensors format. BF16, F16, F32, I32, I64, BOOL, F8_E4M3 and
// F8_E5M2 map to Loom dtypes; the others may appear in a file, but reading such a tensor is an
// error.
const (
	BOOL    DType = "BOOL"
	U8      DType = "U8"
	I8      DType = "I8"
	I16     DType = "I16"
	U16     DType = "U16"
	F16     DType = "F16"
	BF16    DType = "BF16"
	I32     DType = "I32"
	U32     DType = "U32"
	F32     DType = "F32"
	F64     DType = "F64"
	I64     DType = "I64"
	U64     DType = "U64"
	F8E4M3  DType = "F8_E4M3"
	F8E5M2  DType = "F8_E5M2"
	F8E8M0  DType = "F8_E8M0"
	F4      DType = "F4"
	F6E2M3  DType = "F6_E2M3"
	F6E3M2  DType = "F6_E3M2"
	C64     DType = "C64"
	unknown DType = ""
)

// dtypeBits is the element width in bits of each known safetensors dtype.
var dtypeBits = map[DType]int{
	BOOL: 8, U8: 8, I8: 8, F8E4M3: 8, F8E5M2: 8, F8E8M0: 8,
	I16: 16, U16: 16, F16: 16, BF16: 16,
	I32: 32, U32: 32, F32: 32,
	F64: 64, I64: 64, U64: 64, C64: 64,
	F4: 4, F6E2M3: 6, F6E3M2: 6,
}

var toTensor = map[DType]tensor.DType{
	BF16: tensor.BF16, F16: tensor.F16, F32: tensor.F32, I32: tensor.I32, I64: tensor.I64, BOOL: tensor.Bool,
	F8E4M3: tensor.F8E4M3, F8E5M2: tensor.F8E5M2,
}

// Bits is the element width in bits, or 0 for a dtype this package does not know.
func (d DType) Bits() int { return dtypeBits[d] }

// Tensor returns the Loom dtype that d maps to, and whether there is one.
func (d DType) Tensor() (tensor.DType, bool) {
	t, ok := toTensor[d]
	return t, ok
}

// FromTensor returns the safetensors dtype of a Loom dtype, and whether there is one.
func FromTensor(dt tensor.DType) (DType, bool) {
	for s, t := range toTensor {
		if t == dt {
			return s, true
		}
	}
	return unknown, false
}

// TensorInfo describes one tensor of a header. Begin and End are byte offsets into the data
// section, End exclusive.
type TensorInfo struct {
	Name  string
	DType DType
	Shape []int
	Begin int64
	End   int64
}

// Size is the tensor's size in bytes.
func (ti TensorInfo) Size() int64 { return ti.End - ti.Begin }

// Numel is the number of elements (1 for a scalar).
func (ti TensorInfo) Numel() int64 {
	n := int64(1)
	for _, d := range ti.Shape {
		n *= int64(d)
	}
	return n
}

// Header is a parsed and validated safetensors header.
type Header struct {
	// Tensors lists the entries sorted by name.
	Tensors []TensorInfo
	// Metadata is the optional "__metadata__" map (nil when absent).
	Metadata map[string]string

	index map[string]int
}

// Lookup finds a tensor by name.
func (h *Header) Lookup(name string) (TensorInfo, bool) {
	i, ok := h.index[name]
	if !ok {
		return TensorInfo{}, false
	}
	return h.Tensors[i], true
}

// DataSize is the smallest data section that holds every tensor: the largest end offset.
func (h *Header) DataSize() int64 {
	var n int64
	for _, t := range h.Tensors {
		n = max(n, t.End)
	}
	return n
}

// maxBytes bounds sizes and offsets so that arithmetic on them cannot overflow.
const maxBytes = math.MaxInt64 / 16

// rawEntry is one tensor entry as it appears in the JSON header.
type rawEntry struct {
	DType       *string  `json:"dtype"`
	Shape       *[]int64 `json:"shape"`
	DataOffsets *[]int64 `json:"data_offsets"`
}

// ParseHeader parses and validates the JSON header of a safetensors file (the bytes after
// the 8-byte length, trailing padding included). It checks each entry on its own (dtype and
// shape present, no negative dimension, 0 <= begin <= end, byte size = elements × dtype size
// for known dtypes) and the entries together (no two overlap). Offsets are not checked
// against a data section here; File does that. Errors name the offending tensor. ParseHeader
// never panics, whatever its input.
func ParseHeader(data []byte) (*Header, error) {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, fmt.Errorf("header is not a JSON object")
	}
	var entries map[string]json.RawMessage
	if err := json.Unmarshal(data, &entries); err != nil {
		return nil, fmt.Errorf("header is not valid JSON: %w", err)
	}
	h := &Header{index: make(map[string]int, len(entries))}
	for name, raw := range entries {
		if name == "__metadata__" {
			md, err := parseMetadata(raw)
			if err != nil {
				return nil, err
			}
			h.Metadata = md
			continue
		}
		ti, err := parseEntry(name, raw)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", name, err)
		}
		h.Tensors = append(h.Tensors, ti)
	}
	sort.Slice(h.Tensors, func(i, j int) bool { return h.Tensors[i].Name < h.Tensors[j].Name })
	for i, t := range h.Tensors {
		h.index[t.Name] = i
	}
	if err := checkOverlap(h.Tensors); err != nil {
		return nil, err
	}
	return h, nil
}

func parseMetadata(raw json.RawMessage) (map[string]string, error) {
	if string(bytes.TrimSpace(raw)) == "null" {
		return nil, nil
	}
	var md map[string]any
	if err := json.Unmarshal(raw, &md); err != nil {
		return nil, fmt.Errorf("__metadata__ must be an object of strings: %w", err)
	}
	out := make(map[string]string, len(md))
	for k, v := range md {
		s, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("__metadata__ entry %q must be a string, got %T", k, v)
		}
		out[k] = s
	}
	return out, nil
}

func parseEntry(name string, raw json.RawMessage) (TensorInfo, error) {
	var e rawEntry
	if err := json.Unmarshal(raw, &e); err != nil {
		return TensorInfo{}, fmt.Errorf("bad entry: %w", err)
	}
	switch {
	case e.DType == nil:
		return TensorInfo{}, fmt.Errorf("entry has no dtype")
	case e.Shape == nil:
		return TensorInfo{}, fmt.Errorf("entry has no shape")
	case e.DataOffsets == nil:
		return TensorInfo{}, fmt.Errorf("entry has no data_offsets")
	case len(*e.DataOffsets) != 2:
		return TensorInfo{}, fmt.Errorf("data_offsets must hold 2 numbers, got %d", len(*e.DataOffsets))
	}
	ti := TensorInfo{Name: name, DType: DType(*e.DType), Begin: (*e.DataOffsets)[0], End: (*e.DataOffsets)[1]}
	if ti.DType == unknown {
		return TensorInfo{}, fmt.Errorf("empty dtype")
	}
	ti.Shape = make([]int, len(*e.Shape))
	for i, d := range *e.Shape {
		if d < 0 {
			return TensorInfo{}, fmt.Errorf("negative dimension %d in shape %v", d, *e.Shape)
		}
		if d > maxBytes {
			return TensorInfo{}, fmt.Errorf("dimension %d in shape %v is too large", d, *e.Shape)
		}
		ti.Shape[i] = int(d)
	}
	numel, ok := numElements(ti.Shape)
	if !ok {
		return TensorInfo{}, fmt.Errorf("shape %v is too large", ti.Shape)
	}
	if ti.Begin < 0 || ti.End < 0 {
		return TensorInfo{}, fmt.Errorf("negative data_offsets [%d, %d]", ti.Begin, ti.End)
	}
	if ti.Begin > ti.End {
		return TensorInfo{}, fmt.Errorf("data_offsets [%d, %d] begin after end", ti.Begin, ti.End)
	}
	if ti.End > maxBytes {
		return TensorInfo{}, fmt.Errorf("data_offsets [%d, %d] are too large", ti.Begin, ti.End)
	}
	// Unknown dtypes are tolerated (reading them fails later), but their size cannot be checked.
	if nbits := ti.DType.Bits(); nbits > 0 {
		totalBits := numel * uint64(nbits)
		if totalBits%8 != 0 {
			return TensorInfo{}, fmt.Errorf("shape %v of %s does not fill whole bytes", ti.Shape, ti.DType)
		}
		if want := totalBits / 8; uint64(ti.Size()) != want {
			return TensorInfo{}, fmt.Errorf("data_offsets [%d, %d] hold %d bytes, but %s%v needs %d", ti.Begin, ti.End, ti.Size(), ti.DType, ti.Shape, want)
		}
	}
	return ti, nil
}

// numElements multiplies the dimensions, reporting false when the product exceeds maxBytes
// (a shape with a zero dimension has no elements, however large the others).
func numElements(shape []int) (uint64, bool) {
	for _, d := range shape {
		if d == 0 {
			return 0, true
		}
	}
	n := uint64(1)
	for _, d := range shape {
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > maxBytes {
			return 0, false
		}
		n = lo
	}
	return n, true
}

// checkOverlap reports two non-empty tensors whose byte ranges overlap.
func checkOverlap(ts []TensorInfo) error {
	order := make([]int, 0, len(ts))
	for i, t := range ts {
		if t.Size() > 0 {
			order = append(order, i)
		}
	}
	sort.Slice(order, func(a, b int) bool {
		ta, tb := ts[order[a]], ts[order[b]]
		if ta.Begin != tb.Begin {
			return ta.Begin < tb.Begin
		}
		return ta.Name < tb.Name
	})
	for k := 1; k < len(order); k++ {
		prev, cur := ts[order[k-1]], ts[order[k]]
		if cur.Begin < prev.End {
			return fmt.Errorf("tensor %q: data_offsets [%d, %d] overlap tensor %q at [%d, %d]", cur.Name, cur.Begin, cur.End, prev.Name, prev.Begin, prev.End)
		}
	}
	return nil
}
