package safetensors

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/loom-ml/loom/tensor"
)

// TestView: a view shares the mapping (the bytes Raw returns) and holds what was written,
// for a whole tensor and for a slice that is one contiguous run; where a view cannot be made
// (a slice of many runs, bool, a misaligned tensor, a file that is not mapped) View says so
// and the tensor reads as a copy. Views fail after Close.
func TestView(t *testing.T) {
	w := tensor.New(tensor.BF16, 4, 6)
	for i := range w.Half {
		w.Half[i] = uint16(1000 + i)
	}
	ids := &tensor.Tensor{DType: tensor.I64, Shape: []int{4}, I64: []int64{5, -6, 7, 1 << 40}}
	mask := &tensor.Tensor{DType: tensor.Bool, Shape: []int{3}, Bool: []bool{true, false, true}}
	path := filepath.Join(t.TempDir(), "v.safetensors")
	if err := Write(path, map[string]*tensor.Tensor{"w": w, "ids": ids, "mask": mask}); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if f.fd == nil {
		t.Skip("the file is not memory-mapped here")
	}
	raw, err := f.Raw("w")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name              string
		key               string
		dim, index, count int
		view              bool
		wantShape         []int
		wantHalf          []uint16 // for "w"
		at                int      // byte offset of the view into Raw("w")
	}{
		{name: "whole", key: "w", dim: -1, count: 1, view: true, wantShape: []int{4, 6}, wantHalf: w.Half},
		{name: "rows 2-3 of 4", key: "w", dim: 0, index: 1, count: 2, view: true, wantShape: []int{2, 6}, wantHalf: w.Half[12:], at: 24},
		{name: "columns", key: "w", dim: 1, index: 1, count: 2, view: false},
		{name: "int64", key: "ids", dim: -1, count: 1, view: true, wantShape: []int{4}},
		{name: "bool", key: "mask", dim: -1, count: 1, view: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, ok, err := f.View(tc.key, tc.dim, tc.index, tc.count)
			if err != nil {
				t.Fatal(err)
			}
			if ok != tc.view {
				t.Fatalf("View ok = %v, want %v", ok, tc.view)
			}
			if !ok {
				return
			}
			if !slices.Equal(v.Shape, tc.wantShape) {
				t.Errorf("shape %v, want %v", v.Shape, tc.wantShape)
			}
			switch tc.key {
			case "w":
				if !slices.Equal(v.Half, tc.wantHalf) {
					t.Errorf("view holds %v, want %v", v.Half, tc.wantHalf)
				}
				if unsafe.Pointer(&v.Half[0]) != unsafe.Pointer(&raw[tc.at]) {
					t.Error("the view is not the mapping's memory")
				}
			case "ids":
				if !slices.Equal(v.I64, ids.I64) {
					t.Errorf("view holds %v, want %v", v.I64, ids.I64)
				}
			}
		})
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.View("w", -1, 0, 1); !errors.Is(err, ErrClosed) {
		t.Errorf("View after Close: %v, want ErrClosed", err)
	}

	// A header of odd length puts the data at an odd offset: no view of its int32 tensor
	// (one of the f8 tensor, whose elements are bytes), and Slice still reads both.
	header := `{"a":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F8_E4M3","shape":[3],"data_offsets":[8,11]}} `
	if (8+len(header))%2 == 0 {
		header += " "
	}
	data := make([]byte, 11)
	binary.LittleEndian.PutUint32(data[0:], 7)
	binary.LittleEndian.PutUint32(data[4:], 9)
	copy(data[8:], []byte{1, 2, 3})
	odd, err := Open(writeTemp(t, "odd.safetensors", rawFile(header, data)))
	if err != nil {
		t.Fatal(err)
	}
	defer odd.Close()
	if _, ok, err := odd.View("a", -1, 0, 1); ok || err != nil {
		t.Errorf("View of a misaligned int32 tensor: ok=%v err=%v, want neither", ok, err)
	}
	if v, ok, err := odd.View("b", -1, 0, 1); !ok || err != nil || !slices.Equal(v.U8, []byte{1, 2, 3}) {
		t.Errorf("View of an f8 tensor at an odd offset: %v ok=%v err=%v", v, ok, err)
	}
	if a, err := odd.Tensor("a"); err != nil || !slices.Equal(a.I32, []int32{7, 9}) {
		t.Errorf("Tensor of the misaligned tensor: %v, %v", a, err)
	}

	// A parsed buffer is not a mapping: no views.
	buf, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	parsed, err := Parse("mem", buf)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := parsed.View("w", -1, 0, 1); ok || err != nil {
		t.Errorf("View of a parsed buffer: ok=%v err=%v, want neither", ok, err)
	}
}

// TestViewConcat: tensors stored one right after the other, in order, of one dtype and one
// row shape, give their concatenation along dimension 0 as one view of the mapping; any other
// list gives no view, a missing tensor an error naming it.
func TestViewConcat(t *testing.T) {
	mk := func(dt tensor.DType, base uint16, shape ...int) *tensor.Tensor {
		x := tensor.New(dt, shape...)
		for i := range x.Half {
			x.Half[i] = base + uint16(i)
		}
		return x
	}
	ts := map[string]*tensor.Tensor{ // laid out a, b, c, d, e (one element size, by name)
		"a": mk(tensor.BF16, 100, 2, 3),
		"b": mk(tensor.BF16, 200, 1, 3),
		"c": mk(tensor.F16, 300, 2, 3),
		"d": mk(tensor.BF16, 400, 2, 4),
		"e": mk(tensor.BF16, 500, 1, 4),
	}
	path := filepath.Join(t.TempDir(), "c.safetensors")
	if err := Write(path, ts); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if f.fd == nil {
		t.Skip("the file is not memory-mapped here")
	}
	for _, tc := range []struct {
		names []string
		shape []int // nil: no view
	}{
		{[]string{"a", "b"}, []int{3, 3}},
		{[]string{"d", "e"}, []int{3, 4}},
		{[]string{"a"}, []int{2, 3}},
		{[]string{"b", "a"}, nil},      // out of order
		{[]string{"b", "c"}, nil},      // dtypes differ
		{[]string{"c", "d"}, nil},      // rows differ
		{[]string{"a", "b", "d"}, nil}, // c lies between
		{nil, nil},
	} {
		t.Run(strings.Join(tc.names, ","), func(t *testing.T) {
			v, ok, err := f.ViewConcat(tc.names)
			if err != nil {
				t.Fatal(err)
			}
			if ok != (tc.shape != nil) {
				t.Fatalf("ViewConcat ok = %v, want %v", ok, tc.shape != nil)
			}
			if !ok {
				return
			}
			var want []uint16
			for _, n := range tc.names {
				want = append(want, ts[n].Half...)
			}
			if !slices.Equal(v.Shape, tc.shape) || !slices.Equal(v.Half, want) || v.DType != ts[tc.names[0]].DType {
				t.Errorf("view %s%v %v, want %v %v", v.DType, v.Shape, v.Half, tc.shape, want)
			}
			raw, _ := f.Raw(tc.names[0])
			if unsafe.Pointer(&v.Half[0]) != unsafe.Pointer(&raw[0]) {
				t.Error("the view is not the mapping's memory")
			}
		})
	}
	if _, _, err := f.ViewConcat([]string{"a", "zz"}); err == nil || !strings.Contains(err.Error(), `"zz"`) {
		t.Errorf("ViewConcat of a missing tensor: %v, want an error naming it", err)
	}
	f.Close()
	if _, _, err := f.ViewConcat([]string{"a", "b"}); !errors.Is(err, ErrClosed) {
		t.Errorf("ViewConcat after Close: %v, want ErrClosed", err)
	}
}
