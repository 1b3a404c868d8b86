package cuda

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/graph"
)

// OpTime is the GPU time the steps of one op took over the profiled runs.
type OpTime struct {
	Op    string
	Calls int
	Time  time.Duration
}

// profiler times each step between two events on the device's stream (Options.Profile).
type profiler struct {
	ops    map[string]*OpTime
	events []cubind.Event
}

// steps queues the steps with an event after each, waits for them and adds each step's
// time to its op.
func (pr *profiler) steps(p *Program, ctx context.Context, pl *memPlan, vals []*Tensor) error {
	for len(pr.events) < len(p.steps)+1 {
		e, err := cubind.EventCreate(cubind.EventDefault)
		if err != nil {
			return fmt.Errorf("profile: %w", err)
		}
		pr.events = append(pr.events, e)
	}
	d := p.dev
	if err := pr.events[0].Record(d.stream); err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	in, out := []*Tensor{}, []*Tensor{}
	for i, st := range p.steps {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("before %s: %w", nodeText(st.node), err)
		}
		if !st.k.view {
			in, out = p.stepArgs(pl, vals, i, in[:0], out[:0])
			if err := st.k.run(d, st.node, in, out, st.state); err != nil {
				return fmt.Errorf("%s: %w", nodeText(st.node), err)
			}
		}
		if err := pr.events[i+1].Record(d.stream); err != nil {
			return fmt.Errorf("profile: %w", err)
		}
	}
	if err := pr.events[len(p.steps)].Synchronize(); err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	for i, st := range p.steps {
		if st.k.view {
			continue
		}
		el, err := cubind.Elapsed(pr.events[i], pr.events[i+1])
		if err != nil {
			return fmt.Errorf("profile: %w", err)
		}
		key := profileKey(p, st)
		o := pr.ops[key]
		if o == nil {
			o = &OpTime{Op: key}
			pr.ops[key] = o
		}
		o.Calls++
		o.Time += el
	}
	return nil
}

// profileKey names what a step's time is added to: its op, and the shape of each weight it
// reads (a param input), so that the projections of a layer are told apart ("linear
// [5120 2048]").
func profileKey(p *Program, st step) string {
	key := st.node.Op
	for _, in := range st.in {
		if pn := p.values[in].Producer; pn != nil && pn.Op == graph.OpParam {
			key += fmt.Sprint(" ", pn.Out().Type.Shape)
		}
	}
	return key
}

func (pr *profiler) close() error {
	var errs []error
	for _, e := range pr.events {
		errs = append(errs, e.Destroy())
	}
	pr.events = nil
	return errors.Join(errs...)
}

// Profile returns the GPU time per op of the runs so far, most time first, and resets it.
// It is empty unless the program was compiled with Options.Profile.
func (p *Program) Profile() []OpTime {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.prof == nil {
		return nil
	}
	var res []OpTime
	for _, o := range p.prof.ops {
		res = append(res, *o)
	}
	clear(p.prof.ops)
	slices.SortFunc(res, func(a, b OpTime) int { return cmp.Or(cmp.Compare(b.Time, a.Time), cmp.Compare(a.Op, b.Op)) })
	return res
}
