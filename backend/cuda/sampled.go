package cuda

import (
	"context"

	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tensor"
)

// RunSampled runs the program like Run, then chooses one token per row of its first output,
// logits f32 [1,N,V] (as gather_logits leaves them) or [N,V], on the device (SampleRows)
// with draws[i] for row i, and brings back only the N token ids instead of the logits. It
// is Launch with the draws and Download, then Wait.
func (p *Program) RunSampled(ctx context.Context, inputs map[string]*tensor.Tensor, draws []sample.DeviceDraw) ([]int32, error) {
	l, err := p.Launch(ctx, inputs, LaunchOptions{Draws: draws, Download: true})
	if err != nil {
		return nil, err
	}
	ids, err := l.Wait(ctx)
	if err != nil {
		return nil, err
	}
	if ids == nil {
		ids = []int32{}
	}
	return ids, nil
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
