package graph

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/loom-ml/loom/tensor"
)

func TestStackedParamRef(t *testing.T) {
	ref := ParamRef{Key: "l.experts.*.w", DType: tensor.F32, Shape: []int{4, 2, 6}, Stack: 4, SliceDim: -1}
	if got := ref.Keys(); !slices.Equal(got, []string{"l.experts.0.w", "l.experts.1.w", "l.experts.2.w", "l.experts.3.w"}) {
		t.Errorf("Keys %v", got)
	}
	// Members hold value 100*e + i at element i of member e.
	load := func(_ context.Context, m ParamRef) (*tensor.Tensor, error) {
		var e int
		if _, err := fmt.Sscanf(m.Key, "l.experts.%d.w", &e); err != nil || e == 3 {
			return nil, fmt.Errorf("tensor %q not found", m.Key)
		}
		x := tensor.New(tensor.F32, m.LocalShape()...)
		for i := range x.F32 {
			r, c := i/x.Shape[1], i%x.Shape[1]
			if dim, index, _, ok := m.sliced(); ok && dim == 0 {
				r += index * x.Shape[0]
			} else if ok {
				c += index * x.Shape[1]
			}
			x.F32[i] = float32(100*e + r*6 + c)
		}
		return x, nil
	}
	for _, tc := range []struct {
		dim, index, count int
		first             float32 // the value of the first element read
		shape             []int
	}{
		{0, 0, 2, 0, []int{2, 2, 6}},
		{0, 1, 4, 100, []int{1, 2, 6}},
		{2, 1, 3, 2, []int{4, 2, 2}},
		{1, 1, 2, 6, []int{4, 1, 6}},
	} {
		r := ref
		r.SliceDim, r.SliceIndex, r.SliceCount = tc.dim, tc.index, tc.count
		if tc.dim != 0 || tc.index*4/tc.count+4/tc.count > 3 {
			if _, err := LoadStack(context.Background(), r, load); err == nil || !strings.Contains(err.Error(), `member 3 of 4: tensor "l.experts.3.w" not found`) {
				t.Errorf("%v: error %v, want member 3 named", r, err)
			}
			continue
		}
		x, err := LoadStack(context.Background(), r, load)
		if err != nil {
			t.Fatalf("%v: %v", r, err)
		}
		if !slices.Equal(x.Shape, tc.shape) || x.F32[0] != tc.first {
			t.Errorf("%v: %v first %v, want %v first %v", r, x.Shape, x.F32[0], tc.shape, tc.first)
		}
	}
	// Expert 1 of a dim-2 slice: member 1, columns 2..3 of each row.
	r := ref
	r.SliceDim, r.SliceIndex, r.SliceCount = 2, 1, 3
	members, first, err := r.Members()
	if err != nil || first != 0 || len(members) != 4 || members[1].Key != "l.experts.1.w" || members[1].SliceDim != 1 || !slices.Equal(members[1].LocalShape(), []int{2, 2}) {
		t.Errorf("Members %v %d %v", members, first, err)
	}
	// Member run 0 of 2 (an ep rank's experts 0 and 1), each cut along its columns (tp):
	// members 0 and 1, columns 3..5 of each.
	r.SliceDim, r.SliceIndex, r.SliceCount, r.MemberPart, r.MemberParts = 2, 1, 2, 0, 2
	x, err := LoadStack(context.Background(), r, load)
	if err != nil || !slices.Equal(x.Shape, []int{2, 2, 3}) || x.F32[0] != 3 || x.F32[6] != 103 {
		t.Errorf("member run 0/2, slice 1/2 of dim 2: %v %v", x, err)
	}
	r.MemberPart = 1 // members 2 and 3: 3 is missing, and named
	if _, err := LoadStack(context.Background(), r, load); err == nil || !strings.Contains(err.Error(), `member 3 of 4: tensor "l.experts.3.w" not found`) {
		t.Errorf("member run 1/2: error %v, want member 3 named", err)
	}
	for _, bad := range []ParamRef{
		{Key: "a.*", Shape: []int{4, 2}, Stack: 4, SliceDim: -1, MemberPart: 0, MemberParts: 3},
		{Key: "a.*", Shape: []int{4, 2}, Stack: 4, SliceDim: -1, MemberPart: 2, MemberParts: 2},
		{Key: "a.*", Shape: []int{4, 2}, Stack: 4, SliceDim: 0, SliceIndex: 0, SliceCount: 2, MemberPart: 0, MemberParts: 2},
		{Key: "w", Shape: []int{4, 2}, Stack: 4},
		{Key: "a.*.*", Shape: []int{4, 2}, Stack: 4},
		{Key: "a.*", Shape: []int{3, 2}, Stack: 4},
		{Key: "a.*", Shape: []int{4, 2}, Stack: 4, SliceDim: 0, SliceIndex: 0, SliceCount: 3},
	} {
		if _, _, err := bad.Members(); err == nil {
			t.Errorf("%v: no error", bad)
		}
	}
}

// LoadStackInto hands each member a view of its own rows of the destination, so that the
// members are read in place: the stack's bytes are the members' in order, each member's
// view aliases dst, and a destination of the wrong shape or a failing member is an error
// naming it.
func TestLoadStackInto(t *testing.T) {
	ref := ParamRef{Key: "l.experts.*.w", DType: tensor.BF16, Shape: []int{3, 2, 4}, Stack: 3, SliceDim: -1}
	dst := tensor.New(tensor.BF16, 3, 2, 4)
	var seen []string
	loadInto := func(_ context.Context, m ParamRef, v *tensor.Tensor) error {
		var e int
		if _, err := fmt.Sscanf(m.Key, "l.experts.%d.w", &e); err != nil {
			return err
		}
		if !slices.Equal(v.Shape, []int{2, 4}) || &v.Half[0] != &dst.Half[e*8] {
			return fmt.Errorf("member %d got %v, not a view of its rows of dst", e, v.Shape)
		}
		for i := range v.Half {
			v.Half[i] = uint16(100*e + i)
		}
		seen = append(seen, m.Key)
		return nil
	}
	if err := LoadStackInto(context.Background(), ref, dst, loadInto); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(seen, ref.Keys()) {
		t.Errorf("members read %v, want %v", seen, ref.Keys())
	}
	for i, v := range dst.Half {
		if want := uint16(100*(i/8) + i%8); v != want {
			t.Fatalf("element %d = %d, want %d", i, v, want)
		}
	}
	if err := LoadStackInto(context.Background(), ref, tensor.New(tensor.BF16, 3, 8), loadInto); err == nil || !strings.Contains(err.Error(), "destination is bf16[3 8]") {
		t.Errorf("wrong destination shape: error %v", err)
	}
	failing := func(_ context.Context, m ParamRef, _ *tensor.Tensor) error {
		if m.Key == "l.experts.2.w" {
			return fmt.Errorf("tensor %q not found", m.Key)
		}
		return nil
	}
	if err := LoadStackInto(context.Background(), ref, dst, failing); err == nil || !strings.Contains(err.Error(), `member 2 of 3: tensor "l.experts.2.w" not found`) {
		t.Errorf("failing member: error %v, want member 2 named", err)
	}
}
