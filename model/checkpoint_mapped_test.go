package model

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// TestMappedLoad: Mapped weights load every tensor of a fixture equal to Load; whole tensors
// come as views of the mapping (BytesMapped, not BytesRead), a slice of many runs and
// LoadInto as copies (BytesRead); errors are Load's, naming the tensor.
func TestMappedLoad(t *testing.T) {
	ck, err := OpenCheckpoint(filepath.Join(fixtures, "tiny-llama"))
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	ctx := context.Background()
	mw := ck.Mapped()
	var mapped int64
	for _, name := range ck.Names() {
		info, _ := ck.Info(name)
		ref := whole(name, info.DType, info.Shape...)
		want, err := ck.Load(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		read := ck.BytesRead()
		got, err := mw.Load(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		if !tensorsEqual(got, want) {
			t.Errorf("%s: the mapped tensor differs from Load's", name)
		}
		if ck.BytesRead() != read {
			t.Errorf("%s: a whole %s tensor was copied, not mapped", name, info.DType)
		}
		mapped += int64(got.Numel() * got.DType.Size())
	}
	if ck.BytesMapped() != mapped || mapped == 0 {
		t.Errorf("BytesMapped = %d, want %d", ck.BytesMapped(), mapped)
	}

	const key = "model.layers.0.mlp.gate_proj.weight" // bf16[160, 64]
	cols := graph.ParamRef{Key: key, DType: tensor.BF16, Shape: []int{160, 64}, SliceDim: 1, SliceIndex: 1, SliceCount: 4}
	rows := graph.ParamRef{Key: key, DType: tensor.BF16, Shape: []int{160, 64}, SliceDim: 0, SliceIndex: 3, SliceCount: 4}
	for _, tc := range []struct {
		name   string
		ref    graph.ParamRef
		copied bool
	}{
		{"columns: 160 runs", cols, true},
		{"rows: one run", rows, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, err := ck.Load(ctx, tc.ref)
			if err != nil {
				t.Fatal(err)
			}
			read := ck.BytesRead()
			got, err := mw.Load(ctx, tc.ref)
			if err != nil {
				t.Fatal(err)
			}
			if !tensorsEqual(got, want) {
				t.Error("the mapped slice differs from Load's")
			}
			if copied := ck.BytesRead() > read; copied != tc.copied {
				t.Errorf("copied = %v, want %v", copied, tc.copied)
			}
		})
	}

	read := ck.BytesRead()
	dst := tensor.New(tensor.BF16, 160, 64)
	if err := mw.LoadInto(ctx, whole(key, tensor.BF16, 160, 64), dst); err != nil {
		t.Fatal(err)
	}
	if ck.BytesRead()-read != int64(160*64*2) {
		t.Errorf("LoadInto read %d bytes, want %d", ck.BytesRead()-read, 160*64*2)
	}
	if _, err := mw.Load(ctx, whole(key, tensor.F32, 160, 64)); err == nil || !strings.Contains(err.Error(), key) {
		t.Errorf("Load of the wrong dtype: %v, want an error naming %s", err, key)
	}
	if _, err := mw.Load(ctx, whole("no.such.weight", tensor.F32, 1)); err == nil || !strings.Contains(err.Error(), "no.such.weight") {
		t.Errorf("Load of a missing tensor: %v", err)
	}
}

// TestMappedViewConcat: gate_proj and up_proj, one after the other in the fixture's file,
// give their concatenation as one view equal to the two loaded; q and k (not adjacent), a
// slice, or the parts in the other order give none; a tensor of the wrong shape is an error
// naming it.
func TestMappedViewConcat(t *testing.T) {
	ck, err := OpenCheckpoint(filepath.Join(fixtures, "tiny-llama"))
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	ctx := context.Background()
	mw := ck.Mapped().(interface {
		ViewConcat(context.Context, []graph.ParamRef) (*tensor.Tensor, bool, error)
	})
	ref := func(name string) graph.ParamRef {
		info, ok := ck.Info(name)
		if !ok {
			t.Fatalf("no tensor %s", name)
		}
		return whole(name, info.DType, info.Shape...)
	}
	gate, up := ref("model.layers.0.mlp.gate_proj.weight"), ref("model.layers.0.mlp.up_proj.weight")
	q, k := ref("model.layers.0.self_attn.q_proj.weight"), ref("model.layers.0.self_attn.k_proj.weight")
	half := gate
	half.SliceDim, half.SliceIndex, half.SliceCount = 0, 0, 2
	for _, tc := range []struct {
		name string
		refs []graph.ParamRef
		view bool
	}{
		{"gate, up", []graph.ParamRef{gate, up}, true},
		{"up, gate", []graph.ParamRef{up, gate}, false},
		{"q, k", []graph.ParamRef{q, k}, false},
		{"half of gate, up", []graph.ParamRef{half, up}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := ck.BytesMapped()
			v, ok, err := mw.ViewConcat(ctx, tc.refs)
			if err != nil {
				t.Fatal(err)
			}
			if ok != tc.view {
				t.Fatalf("ViewConcat ok = %v, want %v", ok, tc.view)
			}
			if !ok {
				if ck.BytesMapped() != before {
					t.Error("BytesMapped grew without a view")
				}
				return
			}
			var want []uint16
			rows := 0
			for _, r := range tc.refs {
				part, err := ck.Load(ctx, r)
				if err != nil {
					t.Fatal(err)
				}
				want = append(want, part.Half...)
				rows += part.Shape[0]
			}
			if !slices.Equal(v.Half, want) || v.Shape[0] != rows {
				t.Error("the view differs from the loaded parts' concatenation")
			}
			if got := ck.BytesMapped() - before; got != int64(len(want)*2) {
				t.Errorf("BytesMapped grew by %d, want %d", got, len(want)*2)
			}
		})
	}
	bad := up
	bad.Shape = []int{1, 2}
	if _, _, err := mw.ViewConcat(ctx, []graph.ParamRef{gate, bad}); err == nil || !strings.Contains(err.Error(), up.Key) {
		t.Errorf("ViewConcat with a wrong shape: %v, want an error naming %s", err, up.Key)
	}
}

func tensorsEqual(a, b *tensor.Tensor) bool {
	return a.DType == b.DType && slices.Equal(a.Shape, b.Shape) && slices.Equal(a.F32, b.F32) &&
		slices.Equal(a.Half, b.Half) && slices.Equal(a.I32, b.I32) && slices.Equal(a.I64, b.I64) &&
		slices.Equal(a.Bool, b.Bool) && slices.Equal(a.U8, b.U8)
}
