package engine

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/loom-ml/loom/tensor"
)

// clockExe runs the model and times each run as a device would: one millisecond of device
// time per run, as cuda.Program reports its own through DeviceTime.
type clockExe struct {
	Executable
	mu     sync.Mutex
	runs   int
	resets int
}

const clockRun = time.Millisecond

func (c *clockExe) Run(ctx context.Context, in map[string]*tensor.Tensor) ([]*tensor.Tensor, error) {
	out, err := c.Executable.Run(ctx, in)
	c.mu.Lock()
	c.runs++
	c.mu.Unlock()
	return out, err
}

func (c *clockExe) DeviceTime() (time.Duration, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Duration(c.runs) * clockRun, c.runs
}

func (c *clockExe) ResetDeviceTime() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.runs = 0
	c.resets++
}

// TestResetStats: ResetStats zeroes the time counters (step, model, sampling and device
// seconds) and starts TimedSteps over, so that a benchmark leaves its warm-up out; the
// totals (steps, tokens) keep counting, and later steps are timed again.
func TestResetStats(t *testing.T) {
	m := cachedModel(t, "tiny-llama")
	exe := &clockExe{Executable: m.Program}
	e, err := NewRanks(context.Background(), []Rank{{Graph: m.Graph, Exe: exe}}, ModelInfo{MaxPositions: 256}, Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	req := Request{Prompt: []int{1, 2, 3}, MaxTokens: 4, IgnoreEOS: true}
	if toks, last := generate(t, e, req); len(toks) != 4 {
		t.Fatalf("warm-up: %v, %+v", toks, last)
	}
	warm := e.Stats()
	if warm.StepsTotal < 4 || warm.TimedSteps != warm.StepsTotal || warm.GeneratedTokensTotal != 4 || warm.PromptTokensTotal != 3 {
		t.Fatalf("after the warm-up: %+v", warm)
	}
	if warm.StepSeconds <= 0 || warm.ModelSeconds <= 0 || warm.SampleSeconds <= 0 || warm.ModelSeconds+warm.SampleSeconds > warm.StepSeconds {
		t.Errorf("after the warm-up: step %gs, model %gs, sample %gs; want each > 0, model + sample <= step", warm.StepSeconds, warm.ModelSeconds, warm.SampleSeconds)
	}
	if want := (time.Duration(warm.StepsTotal) * clockRun).Seconds(); warm.DeviceSeconds != want {
		t.Errorf("after the warm-up: device %gs, want %gs (one run per step)", warm.DeviceSeconds, want)
	}

	e.ResetStats()
	reset := e.Stats()
	if reset.StepSeconds != 0 || reset.ModelSeconds != 0 || reset.SampleSeconds != 0 || reset.DeviceSeconds != 0 || reset.TimedSteps != 0 {
		t.Errorf("after ResetStats: step %gs, model %gs, sample %gs, device %gs over %d steps; want all 0",
			reset.StepSeconds, reset.ModelSeconds, reset.SampleSeconds, reset.DeviceSeconds, reset.TimedSteps)
	}
	if reset.StepsTotal != warm.StepsTotal || reset.GeneratedTokensTotal != warm.GeneratedTokensTotal || reset.PromptTokensTotal != warm.PromptTokensTotal {
		t.Errorf("ResetStats changed the totals: %+v, before %+v", reset, warm)
	}
	if exe.resets != 1 {
		t.Errorf("the executable's device clock was reset %d times, want 1", exe.resets)
	}

	if toks, last := generate(t, e, req); len(toks) != 4 {
		t.Fatalf("after ResetStats: %v, %+v", toks, last)
	}
	after := e.Stats()
	steps := after.StepsTotal - warm.StepsTotal
	if steps < 4 || after.TimedSteps != steps || after.GeneratedTokensTotal != 8 || after.PromptTokensTotal != 6 {
		t.Errorf("after a second request: %+v; want %d timed steps of %d, 8 tokens generated", after, steps, after.StepsTotal)
	}
	if after.StepSeconds <= 0 || after.ModelSeconds <= 0 || after.SampleSeconds <= 0 {
		t.Errorf("after a second request: step %gs, model %gs, sample %gs; want each > 0", after.StepSeconds, after.ModelSeconds, after.SampleSeconds)
	}
	if want := (time.Duration(steps) * clockRun).Seconds(); after.DeviceSeconds != want {
		t.Errorf("after a second request: device %gs, want %gs (the runs since ResetStats)", after.DeviceSeconds, want)
	}
}
