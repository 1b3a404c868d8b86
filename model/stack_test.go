package model

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"testing"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model/safetensors"
	"github.com/loom-ml/loom/tensor"
)

// A stacked param reads its members lazily: the experts of tiny-qwen3moe's sparse layer
// stacked along dimension 0, whole, by expert (an ep rank's experts) and by feature (a tp
// rank's part of every expert), each member's bytes read once and only those selected.
func TestLoadStacked(t *testing.T) {
	ck, err := OpenCheckpoint(filepath.Join(fixtures, "tiny-qwen3moe"))
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	ctx := context.Background()
	const key = "model.layers.1.mlp.experts.*.gate_proj.weight" // 4 experts of bf16[48,64]
	members := make([]*tensor.Tensor, 4)
	for e := range members {
		if members[e], err = ck.Load(ctx, whole(fmt.Sprintf("model.layers.1.mlp.experts.%d.gate_proj.weight", e), tensor.BF16, 48, 64)); err != nil {
			t.Fatal(err)
		}
	}
	at := func(e, r, c int) uint16 { return members[e].Half[r*64+c] }
	for _, tc := range []struct{ dim, index, count int }{{-1, 0, 1}, {0, 1, 2}, {0, 3, 4}, {1, 1, 2}, {2, 0, 4}} {
		t.Run(fmt.Sprintf("dim%d_%dof%d", tc.dim, tc.index, tc.count), func(t *testing.T) {
			ref := graph.ParamRef{Key: key, DType: tensor.BF16, Shape: []int{4, 48, 64}, Stack: 4, SliceDim: tc.dim, SliceIndex: tc.index, SliceCount: tc.count}
			before := ck.BytesRead()
			got, err := ck.Load(ctx, ref)
			if err != nil {
				t.Fatal(err)
			}
			local := ref.LocalShape()
			if !slices.Equal(got.Shape, local) {
				t.Fatalf("shape %v, want %v", got.Shape, local)
			}
			if read := ck.BytesRead() - before; read != int64(tensor.Numel(local)*2) {
				t.Errorf("read %d bytes, want %d (the selected part only)", read, tensor.Numel(local)*2)
			}
			for i := range got.Numel() {
				e, r, c := i/(local[1]*local[2]), i/local[2]%local[1], i%local[2]
				switch tc.dim {
				case 0:
					e += tc.index * local[0]
				case 1:
					r += tc.index * local[1]
				case 2:
					c += tc.index * local[2]
				}
				if got.Half[i] != at(e, r, c) {
					t.Fatalf("element %d: expert %d (%d,%d) differs", i, e, r, c)
				}
			}
		})
	}
	if err := ck.Check(stackedGraph(t, key, 4)); err != nil {
		t.Errorf("Check: %v", err)
	}
}

// stackedGraph is a graph of one stacked param of tiny-qwen3moe's expert shape.
func stackedGraph(t *testing.T, key string, n int) *graph.Graph {
	t.Helper()
	b := graph.NewBuilder("stacked")
	w := b.Named("w", graph.OpParam, graph.Attrs{"key": key, "dtype": tensor.BF16, "shape": graph.Dims(n, 48, 64), "stack": n})
	b.Output(w)
	g, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// A missing expert tensor fails the load and Check (which reads nothing) naming it; so does
// a member of the wrong shape.
func TestLoadStackedErrors(t *testing.T) {
	src := filepath.Join(fixtures, "tiny-qwen3moe", SingleFile)
	f, err := safetensors.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	kept := map[string]*tensor.Tensor{}
	for _, n := range f.Names() {
		if n != "model.layers.1.mlp.experts.2.up_proj.weight" {
			if kept[n], err = f.Tensor(n); err != nil {
				t.Fatal(err)
			}
		}
	}
	f.Close()
	dir := t.TempDir()
	if err := safetensors.Write(filepath.Join(dir, SingleFile), kept); err != nil {
		t.Fatal(err)
	}
	ck, err := OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	const key = "model.layers.1.mlp.experts.*.up_proj.weight"
	ref := graph.ParamRef{Key: key, DType: tensor.BF16, Shape: []int{4, 48, 64}, Stack: 4, SliceDim: -1}
	_, err = ck.Load(context.Background(), ref)
	wantErr(t, err, `"model.layers.1.mlp.experts.2.up_proj.weight" not found`, "member 2 of 4", key)
	// Expert-parallel rank 0 of 2 reads experts 0 and 1 only: it does not need expert 2.
	ref.SliceDim, ref.SliceIndex, ref.SliceCount = 0, 0, 2
	if _, err := ck.Load(context.Background(), ref); err != nil {
		t.Errorf("rank 0 of 2: %v", err)
	}
	err = ck.Check(stackedGraph(t, key, 4))
	wantErr(t, err, `"model.layers.1.mlp.experts.2.up_proj.weight" not found`, "member 2 of 4")
	// A stack whose members are not of the stacked shape.
	_, err = ck.Load(context.Background(), graph.ParamRef{Key: "model.layers.1.mlp.experts.*.down_proj.weight", DType: tensor.BF16, Shape: []int{4, 48, 64}, Stack: 4, SliceDim: -1})
	wantErr(t, err, "member 0 of 4", "stored shape [64 48]", "expects [48 64]")
	// Keys without a wildcard, or a shape that does not count the members.
	_, err = ck.Load(context.Background(), graph.ParamRef{Key: "model.layers.1.mlp.gate.weight", DType: tensor.BF16, Shape: []int{4, 64}, Stack: 4, SliceDim: -1})
	wantErr(t, err, "exactly one *")
	_, err = ck.Load(context.Background(), graph.ParamRef{Key: key, DType: tensor.BF16, Shape: []int{3, 48, 64}, Stack: 4, SliceDim: -1})
	wantErr(t, err, "does not start with the 4 stacked members")
}
