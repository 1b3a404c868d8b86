package cuda

import (
	"context"
	"errors"
	"fmt"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tensor"
)

// Launch and Wait split a run in two, so that a caller can queue the next step before the
// current one has finished: Launch copies the inputs in, queues the kernels (a CUDA graph
// replay) and the sampling of the next tokens, and returns; Launched.Wait waits for that
// work and brings the ids back. With LaunchOptions.FeedIDs
// the step's input_ids are the ids the previous Launch sampled, copied on the device, so
// that step n+1 can be queued before step n's tokens are known on the host: the GPU then
// never waits for the host between steps.
//
// At most two launches are in flight: each uses one of two launch slots (the device buffer
// of its ids, its events), and a Launch whose slot is still in flight fails. The kernels of
// both run on the device's one stream, in order, over the same arena, so that the second
// reuses the first's memory only after it. Inputs are copied from Go memory, which the
// driver stages before the call returns; the ids come back, once the step is done, by a
// copy on a side stream, which does not wait for the step queued behind. (Copies through
// pinned host memory were tried: on the GPU host, run under gVisor, they now and then
// moved stale bytes.)

// LaunchOptions say what Launch does besides running the graph.
type LaunchOptions struct {
	// Draws, one per row of the first output (logits f32 [1,N,V] or [N,V]), choose the
	// next tokens on the device, as RunSampled does. Without draws nothing is sampled.
	Draws []sample.DeviceDraw
	// FeedIDs takes input_ids (i32 [1,S]) from the ids the previous Launch of this program
	// sampled, row i into token i (S must equal that launch's N); the host tensor passed
	// for input_ids is then ignored (it must still have the right shape).
	FeedIDs bool
	// Download brings the sampled ids back for Wait to return. Ranks whose ids nobody
	// reads (they sample only to feed their next step) leave it off.
	Download bool
}

// Launched is a step Launch queued; Wait collects it. Wait must be called exactly once.
type Launched struct {
	p    *Program
	slot *launchSlot
	n    int // sampled rows
	down bool
}

// launchSlot is what one launch in flight holds apart from the other: the device buffer of
// its ids and its events.
type launchSlot struct {
	ids               *Tensor // i32 [>= N] on the device
	done              cubind.Event
	begin, end        cubind.Event
	inFlight, clocked bool
}

// launchState is a Program's launch slots and what feeds the next launch.
type launchState struct {
	slots [2]launchSlot
	next  int
	// last is the ids the previous launch sampled (a slot's ids) and lastN their count.
	last  *Tensor
	lastN int
	// ws is the sampling workspace, shared by the launches (they run in stream order).
	ws *Tensor
}

// Launch queues one step (see the comment above LaunchOptions) and returns without waiting
// for it. inputs are as for Run.
func (p *Program) Launch(ctx context.Context, inputs map[string]*tensor.Tensor, o LaunchOptions) (*Launched, error) {
	if p == nil || p.dev == nil || p.fixed == nil {
		return nil, errors.New("cuda: launch: program was not compiled or is closed")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("cuda: launch %s: %w", p.g.Name, err)
	}
	env, err := p.bind(inputs)
	if err != nil {
		return nil, fmt.Errorf("cuda: launch %s: %w", p.g.Name, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.loadResident(inputs); err != nil {
		return nil, fmt.Errorf("cuda: launch %s: %w", p.g.Name, err)
	}
	pl, err := p.plan(env)
	if err != nil {
		return nil, fmt.Errorf("cuda: launch %s: %w", p.g.Name, err)
	}
	ls := &p.launches
	slot := &ls.slots[ls.next]
	if slot.inFlight {
		return nil, fmt.Errorf("cuda: launch %s: two launches are in flight; wait for the older one first", p.g.Name)
	}
	l := &Launched{p: p, slot: slot, n: len(o.Draws), down: o.Download && len(o.Draws) > 0}
	err = p.dev.do(func() error {
		err := p.launch(ctx, pl, inputs, o, l)
		if err != nil {
			ls.last, ls.lastN = nil, 0 // nothing may feed from a failed launch
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cuda: launch %s: %w", p.g.Name, err)
	}
	slot.inFlight = true
	ls.next ^= 1
	return l, nil
}

// launch queues the step's copies, kernels, sampling and copies back on the stream and
// records the slot's events; the device is locked and p.mu held.
func (p *Program) launch(ctx context.Context, pl *memPlan, inputs map[string]*tensor.Tensor, o LaunchOptions, l *Launched) error {
	d, ls, slot := p.dev, &p.launches, l.slot
	if err := p.ensureArena(pl); err != nil {
		return err
	}
	vals := p.layout(pl)
	feed := -1
	for _, s := range p.inputs {
		if vals[s] != nil && p.fixed[s] == nil && o.FeedIDs && p.values[s].Name == "input_ids" {
			feed = s
		}
	}
	N, V, rows, err := p.sampledRows(vals, o.Draws)
	if err != nil {
		return err
	}
	if slot.done == 0 {
		if err := createEvents(&slot.done, &slot.begin, &slot.end); err != nil {
			return err
		}
	}
	slot.clocked = slot.begin.Record(d.stream) == nil
	if feed >= 0 {
		if in := vals[feed]; in.DType != tensor.I32 || ls.last == nil || ls.lastN != in.Numel() {
			return fmt.Errorf("feed input_ids %s%v from the previous launch's %d sampled ids: want i32 and as many", in.DType, in.Shape, ls.lastN)
		}
		if err := d.copyDtoD(vals[feed].ptr, ls.last.ptr, uint64(4*ls.lastN)); err != nil {
			return fmt.Errorf("feed input_ids: %w", err)
		}
	}
	for _, s := range p.inputs {
		if v := p.values[s]; vals[s] != nil && p.fixed[s] == nil && s != feed {
			if err := copyIn(d, vals[s], inputs[v.Name]); err != nil {
				return fmt.Errorf("input %q: %w", v.Name, err)
			}
		}
	}
	if err := p.runSteps(ctx, pl, vals); err != nil {
		return err
	}
	slot.clocked = slot.clocked && slot.end.Record(d.stream) == nil
	if N > 0 {
		if err := p.queueSample(slot, rows, N, V, o.Draws); err != nil {
			return err
		}
		ls.last, ls.lastN = slot.ids, N
	} else {
		ls.last, ls.lastN = nil, 0
	}
	return slot.done.Record(d.stream)
}

// sampledRows checks the first output against draws and returns its rows as [N,V] (N = 0
// without draws).
func (p *Program) sampledRows(vals []*Tensor, draws []sample.DeviceDraw) (N, V int, rows *Tensor, err error) {
	if len(draws) == 0 {
		return 0, 0, nil, nil
	}
	if len(p.outputs) == 0 {
		return 0, 0, nil, fmt.Errorf("sample: the graph has no outputs")
	}
	logits := vals[p.outputs[0]]
	shape := logits.Shape
	if len(shape) == 3 && shape[0] == 1 {
		shape = shape[1:]
	}
	if logits.DType != tensor.F32 || len(shape) != 2 || shape[0] != len(draws) {
		return 0, 0, nil, fmt.Errorf("sample: the first output is %s%v; want logits f32 [1,N,V] for %d draws", logits.DType, logits.Shape, len(draws))
	}
	N, V = shape[0], shape[1]
	rows, err = logits.View(N, V)
	return N, V, rows, err
}

// queueSample queues the choice of N tokens from rows [N,V] into slot.ids: greedy when every
// draw is, else with the draws' SampleParams.
func (p *Program) queueSample(slot *launchSlot, rows *Tensor, N, V int, draws []sample.DeviceDraw) error {
	d, ls := p.dev, &p.launches
	if slot.ids == nil || slot.ids.Numel() < N {
		d.Free(slot.ids)
		slot.ids = nil
		t, err := d.allocTensor(tensor.I32, []int{N})
		if err != nil {
			return fmt.Errorf("sample: %w", err)
		}
		slot.ids = t
	}
	ids := &Tensor{DType: tensor.I32, Shape: []int{N}, ptr: slot.ids.ptr, dev: d} // its first N
	if need := max(SampleWorkspace(N, V), 1); ls.ws == nil || int64(ls.ws.Bytes()) < need {
		d.Free(ls.ws)
		ls.ws = nil
		t, err := d.allocTensor(tensor.Bool, []int{int(need)})
		if err != nil {
			return fmt.Errorf("sample: %w", err)
		}
		ls.ws = t
	}
	if allGreedy(draws) {
		return greedyRows(d, ids, rows, ls.ws)
	}
	pt, err := d.upload(SampleParams(draws).Tensor())
	if err != nil {
		return fmt.Errorf("sample: %w", err)
	}
	defer d.Free(pt) // stream-ordered: the next user of the block runs after sample_rows
	return sampleRows(d, ids, rows, pt, ls.ws)
}

// Wait waits for the launched step (watching the other ranks through the communicator when
// the graph has collectives, bounded by ctx) and returns the ids it sampled when Download
// was set (nil otherwise), or the step's error.
func (l *Launched) Wait(ctx context.Context) ([]int32, error) {
	p, slot := l.p, l.slot
	p.mu.Lock()
	waited := !slot.inFlight
	p.mu.Unlock()
	if waited {
		return nil, errors.New("cuda: wait: the launch was already waited for")
	}
	var ids []int32
	// The wait holds no lock of the device, so that the next step can be launched from
	// another goroutine meanwhile (a follower launches as it reads rank 0's frames and
	// waits as it replies).
	err := p.dev.unlocked(func() error {
		if p.comm != nil && p.hasCollectives {
			if err := p.comm.Wait(ctx, slot.done); err != nil {
				return errors.Join(fmt.Errorf("rank %d", p.rank), err)
			}
		} else if err := slot.done.Synchronize(); err != nil {
			return err
		}
		return nil
	})
	if err == nil {
		err = p.dev.do(func() error { return l.collect(&ids) })
	}
	p.mu.Lock()
	slot.inFlight = false
	p.mu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("cuda: wait %s: %w", p.g.Name, err)
	}
	return ids, nil
}

// collect reads a finished launch's error word and, with Download, its ids into *ids, on
// the side stream, which does not wait for the next step queued behind this one on the
// device's stream; the device is locked.
func (l *Launched) collect(ids *[]int32) error {
	p, slot := l.p, l.slot
	side, err := p.dev.sideStream()
	if err != nil {
		return err
	}
	var w [4]int32
	if err := cubind.MemcpyDtoHAsync(w[:], p.dev.errWord, side); err != nil {
		return fmt.Errorf("copy the error word back: %w", err)
	}
	if err := p.dev.wordError(w); err != nil {
		return err
	}
	if slot.clocked {
		p.busy.addSpan(slot.begin, slot.end)
	}
	if l.down {
		*ids = make([]int32, l.n)
		if err := cubind.MemcpyDtoHAsync(*ids, slot.ids.ptr, side); err != nil {
			return fmt.Errorf("sample: copy the ids back: %w", err)
		}
	}
	return nil
}

// createEvents creates events without timing for the first and with timing for the rest.
func createEvents(done *cubind.Event, timed ...*cubind.Event) error {
	e, err := cubind.EventCreate(cubind.EventDisableTiming)
	if err != nil {
		return err
	}
	for i, t := range timed {
		if *t, err = cubind.EventCreate(cubind.EventDefault); err != nil {
			for _, u := range timed[:i] {
				u.Destroy()
				*u = 0
			}
			e.Destroy()
			return err
		}
	}
	*done = e
	return nil
}

// release frees the slots' memory and events; the device is locked and idle.
func (ls *launchState) release(d *Device) error {
	var errs []error
	for i := range ls.slots {
		s := &ls.slots[i]
		d.Free(s.ids)
		for _, e := range []*cubind.Event{&s.done, &s.begin, &s.end} {
			if *e != 0 {
				errs = append(errs, e.Destroy())
				*e = 0
			}
		}
		*s = launchSlot{}
	}
	d.Free(ls.ws)
	*ls = launchState{}
	return errors.Join(errs...)
}
