package safetensors

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"github.com/loom-ml/loom/tensor"
)

// Entry is one tensor to write: name, dtype, shape and its raw little-endian bytes.
type Entry struct {
	Name  string
	DType DType
	Shape []int
	Data  []byte
}

// EntryOf wraps a tensor as an Entry. On little-endian hosts Data aliases the tensor's
// storage.
func EntryOf(name string, t *tensor.Tensor) (Entry, error) {
	if err := t.Validate(); err != nil {
		return Entry{}, fmt.Errorf("tensor %q: %w", name, err)
	}
	dt, ok := FromTensor(t.DType)
	if !ok {
		return Entry{}, fmt.Errorf("tensor %q: dtype %s has no safetensors equivalent", name, t.DType)
	}
	return Entry{Name: name, DType: dt, Shape: append([]int(nil), t.Shape...), Data: encodeLE(t)}, nil
}

// Write writes tensors to a safetensors file at path, with the metadata {"format": "pt"}
// that Hugging Face writes. See WriteEntries.
func Write(path string, tensors map[string]*tensor.Tensor) error {
	entries := make([]Entry, 0, len(tensors))
	for name, t := range tensors {
		e, err := EntryOf(name, t)
		if err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		entries = append(entries, e)
	}
	return WriteEntries(path, entries, map[string]string{"format": "pt"})
}

// WriteEntries writes a safetensors file at path. The file is written under a temporary
// name in the same directory and renamed into place, so readers never see half a file.
func WriteEntries(path string, entries []Entry, metadata map[string]string) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	w := bufio.NewWriterSize(tmp, 1<<20)
	err = Encode(w, entries, metadata)
	if err == nil {
		err = w.Flush()
	}
	if err == nil {
		err = tmp.Chmod(0o644)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// Encode writes a safetensors file to w. As Hugging Face does, tensors are laid out by
// decreasing element size, then by name, so every tensor starts at a multiple of its element
// size, and the JSON header is padded with spaces to a multiple of 8 bytes so the data
// section starts 8-byte aligned. Every entry must have a known dtype and exactly the bytes
// its shape needs.
func Encode(w io.Writer, entries []Entry, metadata map[string]string) error {
	order := make([]Entry, len(entries))
	copy(order, entries)
	sort.Slice(order, func(i, j int) bool {
		if bi, bj := order[i].DType.Bits(), order[j].DType.Bits(); bi != bj {
			return bi > bj
		}
		return order[i].Name < order[j].Name
	})
	type jsonEntry struct {
		DType       DType    `json:"dtype"`
		Shape       []int    `json:"shape"`
		DataOffsets [2]int64 `json:"data_offsets"`
	}
	header := make(map[string]any, len(order)+1)
	if metadata != nil {
		header["__metadata__"] = metadata
	}
	var off int64
	for _, e := range order {
		if e.Name == "" || e.Name == "__metadata__" {
			return fmt.Errorf("invalid tensor name %q", e.Name)
		}
		if _, dup := header[e.Name]; dup {
			return fmt.Errorf("tensor %q: duplicate name", e.Name)
		}
		nbits := e.DType.Bits()
		if nbits == 0 {
			return fmt.Errorf("tensor %q: unknown dtype %q", e.Name, e.DType)
		}
		for _, d := range e.Shape {
			if d < 0 {
				return fmt.Errorf("tensor %q: negative dimension in shape %v", e.Name, e.Shape)
			}
		}
		numel, ok := numElements(e.Shape)
		if !ok || numel*uint64(nbits)%8 != 0 || uint64(len(e.Data)) != numel*uint64(nbits)/8 {
			return fmt.Errorf("tensor %q: %d bytes of data do not fit %s%v", e.Name, len(e.Data), e.DType, e.Shape)
		}
		shape := e.Shape
		if shape == nil {
			shape = []int{}
		}
		header[e.Name] = jsonEntry{DType: e.DType, Shape: shape, DataOffsets: [2]int64{off, off + int64(len(e.Data))}}
		off += int64(len(e.Data))
	}
	js, err := json.Marshal(header)
	if err != nil {
		return fmt.Errorf("encode header: %w", err)
	}
	if pad := (8 - len(js)%8) % 8; pad > 0 {
		js = append(js, bytes.Repeat([]byte{' '}, pad)...)
	}
	var n [8]byte
	binary.LittleEndian.PutUint64(n[:], uint64(len(js)))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	if _, err := w.Write(js); err != nil {
		return err
	}
	for _, e := range order {
		if _, err := w.Write(e.Data); err != nil {
			return err
		}
	}
	return nil
}
