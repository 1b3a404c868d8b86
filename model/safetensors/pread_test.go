package safetensors

import (
	"path/filepath"
	"slices"
	"testing"

	"github.com/loom-ml/loom/tensor"
)

// TestReadThroughFile: an opened file's tensors are read with pread, not out of the mapping
// (so the page cache's copy is not counted in the process's resident memory), in parallel
// parts when large; what was read stays valid after Close, and equals what the mapping holds.
func TestReadThroughFile(t *testing.T) {
	big := tensor.New(tensor.I32, 3*preadChunk/4+5) // 3 parts and a bit
	for i := range big.I32 {
		big.I32[i] = int32(i*7919) ^ int32(i>>3)
	}
	small := tensor.FromI32([]int32{1, 2, 3, 4, 5, 6}, 2, 3)
	path := filepath.Join(t.TempDir(), "p.safetensors")
	if err := Write(path, map[string]*tensor.Tensor{"big": big, "small": small}); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if f.fd == nil {
		t.Skip("the file is not memory-mapped here; reads copy from its buffer")
	}
	gotBig, err := f.Tensor("big")
	if err != nil {
		t.Fatal(err)
	}
	col, err := f.Slice("small", 1, 1, 3)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := f.Raw("big")
	if err != nil {
		t.Fatal(err)
	}
	if want := tensor.Bytes(big); !slices.Equal(raw, want) {
		t.Error("the mapping does not hold the written bytes")
	}
	// SliceInto a view of a larger tensor leaves the rest alone.
	dst := tensor.FromI32([]int32{-1, -1, -1, -1}, 4)
	view := &tensor.Tensor{DType: tensor.I32, Shape: []int{2, 1}, I32: dst.I32[1:3:3]}
	if err := f.SliceInto("small", 1, 2, 3, view); err != nil {
		t.Fatal(err)
	}
	if err := f.SliceInto("small", 1, 2, 3, tensor.New(tensor.I32, 1, 2)); err == nil {
		t.Error("SliceInto a destination of the wrong shape: no error")
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(gotBig.I32, big.I32) {
		t.Error("a tensor read in parallel parts differs from the one written")
	}
	if !slices.Equal(col.I32, []int32{2, 5}) {
		t.Errorf("column slice = %v, want [2 5]", col.I32)
	}
	if !slices.Equal(dst.I32, []int32{-1, 3, 6, -1}) {
		t.Errorf("SliceInto a view: %v, want [-1 3 6 -1]", dst.I32)
	}
	if _, err := f.Tensor("small"); err == nil {
		t.Error("read after Close: no error")
	}
}
