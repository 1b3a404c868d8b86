package model

import (
	"context"
	"fmt"
	"slices"

	"github.com/loom-ml/loom/graph"
	"github.com/loom-ml/loom/model/safetensors"
	"github.com/loom-ml/loom/tensor"
)

// Mapped returns the checkpoint as weights for a backend that computes on host tensors and
// keeps them as long as the checkpoint is open (the CPU backend): Load returns, wherever it
// can, a tensor that shares the file's read-only memory mapping (safetensors.File.View)
// instead of a copy, so loading does no work for it and the process holds its bytes once, as
// page cache. Where it cannot (a quantized or stacked param, a slice that is not one
// contiguous run of the file, a misaligned or non-native dtype, a weight dequantized while
// loading) Load copies, as
// Checkpoint.Load does. LoadInto always reads with pread, never through the mapping, so the
// parts of a concatenation (a fused weight) are not counted twice in resident memory.
//
// The tensors Load returns are read-only (a write faults) and valid until the checkpoint is
// closed: close the checkpoint only after whatever was compiled from them.
func (c *Checkpoint) Mapped() graph.WeightsInto { return mappedCheckpoint{c} }

// BytesMapped is the number of tensor bytes that Mapped weights' Load has returned as views
// of the files' mappings (not counted in BytesRead).
func (c *Checkpoint) BytesMapped() int64 { return c.bytesMapped.Load() }

type mappedCheckpoint struct{ c *Checkpoint }

func (m mappedCheckpoint) Load(ctx context.Context, ref graph.ParamRef) (*tensor.Tensor, error) {
	c := m.c
	if _, quant := c.quantInfo(ref.Key); quant || ref.Stack != 0 || c.dequantizes(ref) {
		return c.Load(ctx, ref)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("load %q: %w", ref.Key, err)
	}
	f, dim, index, count, err := c.resolve(ref)
	if err != nil {
		return nil, err
	}
	t, ok, err := f.View(ref.Key, dim, index, count)
	if err != nil {
		return nil, err
	}
	if !ok {
		return c.Load(ctx, ref)
	}
	if want := ref.LocalShape(); !slices.Equal(t.Shape, want) {
		return nil, fmt.Errorf("%s: tensor %q: mapped shape %v, but the graph expects %v", f.Path(), ref.Key, t.Shape, want)
	}
	c.bytesMapped.Add(int64(t.Numel() * t.DType.Size()))
	return t, nil
}

// ViewConcat returns the concatenation along dimension 0 of the params refs name as one view
// of the mapping, and true, where the checkpoint stores them whole, in one file, one right
// after the other and in that order (gate_proj and up_proj in a file the safetensors library
// wrote); else nil and false, and the caller reads the parts (LoadInto). Each ref is checked
// as Load checks it; errors name the file and the tensor.
func (m mappedCheckpoint) ViewConcat(ctx context.Context, refs []graph.ParamRef) (*tensor.Tensor, bool, error) {
	c := m.c
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	var file *safetensors.File
	names := make([]string, len(refs))
	for i, ref := range refs {
		if _, quant := c.quantInfo(ref.Key); quant || ref.Stack != 0 || c.dequantizes(ref) {
			return nil, false, nil
		}
		f, dim, _, _, err := c.resolve(ref)
		if err != nil {
			return nil, false, err
		}
		if dim >= 0 || (file != nil && f != file) {
			return nil, false, nil
		}
		file, names[i] = f, ref.Key
	}
	if file == nil {
		return nil, false, nil
	}
	t, ok, err := file.ViewConcat(names)
	if ok {
		c.bytesMapped.Add(int64(t.Numel() * t.DType.Size()))
	}
	return t, ok, err
}

func (m mappedCheckpoint) LoadInto(ctx context.Context, ref graph.ParamRef, dst *tensor.Tensor) error {
	return m.c.LoadInto(ctx, ref, dst)
}
