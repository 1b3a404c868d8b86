package cuda

import (
	"context"
	"fmt"

	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tensor"
)

// RunSampled runs the program like Run, then chooses one token per row of its first output,
// logits f32 [1,N,V] (as gather_logits leaves them) or [N,V], on the device (SampleRows)
// with draws[i] for row i, and brings back only the N token ids instead of the logits.
func (p *Program) RunSampled(ctx context.Context, inputs map[string]*tensor.Tensor, draws []sample.DeviceDraw) ([]int32, error) {
	var ids []int32
	err := p.execute(ctx, inputs, func(vals []*Tensor) error {
		if len(p.outputs) == 0 {
			return fmt.Errorf("sample: the graph has no outputs")
		}
		logits := vals[p.outputs[0]]
		shape := logits.Shape
		if len(shape) == 3 && shape[0] == 1 {
			shape = shape[1:]
		}
		if logits.DType != tensor.F32 || len(shape) != 2 || shape[0] != len(draws) {
			return fmt.Errorf("sample: the first output is %s%v; want logits f32 [1,N,V] for %d draws", logits.DType, logits.Shape, len(draws))
		}
		N, V := shape[0], shape[1]
		if N == 0 {
			return nil
		}
		rows, err := logits.View(N, V)
		if err != nil {
			return err
		}
		d := p.dev
		out, err := d.allocTensor(tensor.I32, []int{N})
		if err != nil {
			return fmt.Errorf("sample: %w", err)
		}
		defer d.Free(out)
		ws, err := d.allocTensor(tensor.Bool, []int{int(max(SampleWorkspace(N, V), 1))})
		if err != nil {
			return fmt.Errorf("sample: %w", err)
		}
		defer d.Free(ws)
		if allGreedy(draws) {
			// The same tokens as sampleRows gives greedy rows, over many blocks per row.
			if err := d.greedyRows(out, rows, ws); err != nil {
				return err
			}
		} else {
			params, err := d.upload(SampleParams(draws).Tensor())
			if err != nil {
				return fmt.Errorf("sample: %w", err)
			}
			defer d.Free(params)
			if err := d.sampleRows(out, rows, params, ws); err != nil {
				return err
			}
		}
		h, err := d.download(out)
		if err != nil {
			return fmt.Errorf("sample: %w", err)
		}
		ids = h.I32
		return nil
	})
	return ids, err
}

// allGreedy reports whether every draw takes the argmax (temperature <= 0 or NaN, as
// SampleRow defines greedy).
func allGreedy(draws []sample.DeviceDraw) bool {
	for _, d := range draws {
		if d.Temperature > 0 {
			return false
		}
	}
	return true
}
