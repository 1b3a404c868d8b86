package cuda

import (
	"fmt"
	"slices"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/graph"
)

// The embedding lookup (graph op embedding, kernels/embedding.cu).

func init() {
	opKernels["embedding"] = &opKernel{run: func(d *Device, n *graph.Node, in, out []*Tensor, _ any) error {
		return embedding(d, out[0], in[0], in[1])
	}}
}

// Embedding gathers rows of table[V,D] (f32 or bf16) by ids[...] (i32 or i64) into
// out[...,D] (f32 or bf16: the table's dtype as the graph op has it, or the other one,
// which fuses a cast). An id outside [0, V) gives a zero row and an error at the next Sync
// or Download.
func Embedding(d *Device, out, table, ids *Tensor) error {
	return d.do(func() error { return embedding(d, out, table, ids) })
}

func embedding(d *Device, out, table, ids *Tensor) error {
	if err := checkLive(out, table, ids); err != nil {
		return fmt.Errorf("cuda: embedding: %w", err)
	}
	tn, err := floatName("table", table.DType)
	if err != nil {
		return fmt.Errorf("cuda: embedding: %w", err)
	}
	on, err := floatName("output", out.DType)
	if err != nil {
		return fmt.Errorf("cuda: embedding: %w", err)
	}
	in, err := intName("ids", ids.DType)
	if err != nil {
		return fmt.Errorf("cuda: embedding: %w", err)
	}
	if len(table.Shape) != 2 {
		return fmt.Errorf("cuda: embedding: table must be [V,D], got %v", table.Shape)
	}
	V, D := table.Shape[0], table.Shape[1]
	if err := checkOut("output", out, out.DType, append(slices.Clone(ids.Shape), D)); err != nil {
		return fmt.Errorf("cuda: embedding: %w", err)
	}
	rows := ids.Numel()
	if rows == 0 || D == 0 {
		return nil
	}
	return d.launch("embedding.cu", "embedding_"+tn+"_"+on+"_"+in, cubind.Dim3{X: rows, Y: 1, Z: 1}, rowBlock(D), 0, func(a *cubind.Args) {
		a.Ptr(out.ptr).Ptr(table.ptr).Ptr(ids.ptr).I32(int32(V)).I32(int32(D)).Ptr(d.errWord)
	})
}
