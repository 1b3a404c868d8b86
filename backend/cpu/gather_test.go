package cpu

import (
	"strings"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

func TestGather(t *testing.T) {
	// x[2,3,2] = 0..11; gather along axis 1 with indices [2,0,2].
	x := tensor.New(tensor.F32, 2, 3, 2)
	for i := range x.F32 {
		x.F32[i] = float32(i)
	}
	for _, tc := range []struct {
		name string
		x    *tensor.Tensor
		axis int
		idx  []int32
		want []float32
		err  string
	}{
		{"middle axis", x, 1, []int32{2, 0, 2}, []float32{4, 5, 0, 1, 4, 5, 10, 11, 6, 7, 10, 11}, ""},
		{"last axis", x, -1, []int32{1}, []float32{1, 3, 5, 7, 9, 11}, ""},
		{"bf16", x.Cast(tensor.BF16), 0, []int32{1}, []float32{6, 7, 8, 9, 10, 11}, ""},
		{"out of range", x, 1, []int32{3}, nil, "gather index 3 outside axis 1 of size 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := graph.NewBuilder("g")
			xv := b.Input("x", tc.x.DType, graph.Dims(tc.x.Shape...))
			iv := b.Input("i", tensor.I32, graph.Dims(len(tc.idx)))
			b.Output(b.Op("gather", graph.Attrs{"axis": tc.axis}, xv, iv))
			g, err := b.Build()
			if err != nil {
				t.Fatal(err)
			}
			for _, compile := range []func() (*Program, error){
				func() (*Program, error) { return Compile(t.Context(), g, nil) },
				func() (*Program, error) { return CompileReference(t.Context(), g, nil) },
			} {
				p, err := compile()
				if err != nil {
					t.Fatal(err)
				}
				outs, err := p.Run(t.Context(), map[string]*tensor.Tensor{"x": tc.x, "i": tensor.FromI32(tc.idx, len(tc.idx))})
				if tc.err != "" {
					if err == nil || !strings.Contains(err.Error(), tc.err) {
						t.Fatalf("error = %v, want %q", err, tc.err)
					}
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				got := outs[0].Float32s()
				for i := range tc.want {
					if got[i] != tc.want[i] {
						t.Fatalf("gather = %v, want %v", got, tc.want)
					}
				}
			}
		})
	}
}
