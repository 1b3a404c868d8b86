package cuda

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/backend/cpu"
	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/tensor"
)

// intoWeights serves MapWeights through LoadInto (graph.WeightsInto) and counts the calls,
// as a checkpoint reads straight into the caller's memory.
type intoWeights struct {
	cpu.MapWeights
	into int
}

func (w *intoWeights) LoadInto(ctx context.Context, ref graph.ParamRef, dst *tensor.Tensor) error {
	t, err := w.Load(ctx, ref)
	if err != nil {
		return err
	}
	if t.DType != dst.DType || !slices.Equal(t.Shape, dst.Shape) {
		return fmt.Errorf("load %q into %s%v: is %s%v", ref.Key, dst.DType, dst.Shape, t.DType, t.Shape)
	}
	w.into++
	tensor.CopyRange(dst, 0, t, 0, t.Numel())
	return nil
}

// Every param of a compiled program holds its weights' bytes, whether read into pinned
// buffers (through LoadInto, or Load and a copy), or, larger than maxStaging, through Go
// memory; a missing weight is an error naming it.
func TestUploadParams(t *testing.T) {
	d := gpu(t)
	rng := rand.New(rand.NewPCG(7, 7))
	weights := cpu.MapWeights{
		"a.bf16":   randTensor(rng, tensor.BF16, []int{1000, 37}, -2, 2),
		"b.f32":    randTensor(rng, tensor.F32, []int{3, 5}, -2, 2),
		"c.i32":    randInts(rng, tensor.I32, []int{7}, 1000),
		"d.f8":     {DType: tensor.F8E4M3, Shape: []int{129}, U8: make([]uint8, 129)},
		"e.big":    randTensor(rng, tensor.BF16, []int{3, 1 << 20}, -1, 1),
		"f.empty":  tensor.New(tensor.F32, 0, 4),
		"g.f16":    randTensor(rng, tensor.F16, []int{64, 64}, -1, 1),
		"h.bf16x2": randTensor(rng, tensor.BF16, []int{5, 5, 5}, -1, 1),
	}
	for i := range weights["d.f8"].U8 {
		weights["d.f8"].U8[i] = uint8(rng.IntN(0x7f)) // finite, positive
	}
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range weights {
			if !yield(k) {
				return
			}
		}
	})
	build := func(keys []string, extra ...string) *graph.Graph {
		b := graph.NewBuilder("params")
		for _, k := range append(keys, extra...) {
			h := weights[k]
			if h == nil {
				h = weights["b.f32"]
			}
			b.Output(b.Param(k, h.DType, graph.Dims(h.Shape...)))
		}
		g, err := b.Build()
		if err != nil {
			t.Fatal(err)
		}
		return g
	}
	check := func(t *testing.T, w backend.Weights) {
		p, err := Compile(context.Background(), d, build(keys), w, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Close()
		seen := 0
		for i, v := range p.values {
			if v.Producer == nil || v.Producer.Op != graph.OpParam {
				continue
			}
			seen++
			k := v.Producer.Attrs.String("key")
			got, want := down(t, d, p.fixed[i]), weights[k]
			if !slices.Equal(tensor.Bytes(got), tensor.Bytes(want)) || !slices.Equal(got.Shape, want.Shape) {
				t.Errorf("param %s: device holds other bytes than the weight", k)
			}
		}
		if seen != len(keys) {
			t.Errorf("%d params on the device, want %d", seen, len(keys))
		}
	}
	t.Run("load", func(t *testing.T) { check(t, weights) })
	t.Run("load_into", func(t *testing.T) {
		w := &intoWeights{MapWeights: weights}
		check(t, w)
		if want := len(keys) - 1; w.into != want { // all but the empty one
			t.Errorf("%d params read through LoadInto, want %d", w.into, want)
		}
	})
	t.Run("larger_than_staging", func(t *testing.T) {
		defer func(m int) { maxStaging = m }(maxStaging)
		maxStaging = 1 << 20 // e.big (6 MiB) goes through Go memory
		w := &intoWeights{MapWeights: weights}
		check(t, w)
		if want := len(keys) - 2; w.into != want {
			t.Errorf("%d params read through LoadInto, want %d", w.into, want)
		}
	})
	t.Run("missing", func(t *testing.T) {
		_, err := Compile(context.Background(), d, build(keys, "z.missing"), weights, nil)
		if err == nil || !strings.Contains(err.Error(), `"z.missing" not found`) {
			t.Errorf("compile with a missing weight: %v", err)
		}
	})
}
