package engine

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"

	"github.com/loom-ml/loom/backend"
	"github.com/loom-ml/loom/sample"
	"github.com/loom-ml/loom/tensor"
)

// Overlapped steps. When every rank can queue a step on its device and collect it later
// (a backend.Launcher) and the step's tokens are chosen on the device, the engine queues step
// n+1 before step n's tokens reach the host: step n+1's input_ids are step n's sampled ids,
// copied on each rank's device (every rank samples the same ids from the same gathered
// logits and draws). The host's share of a step (scheduling, inputs, launches, delivering
// tokens) then runs while the device computes, instead of between steps.
//
// Step n+1 is queued ahead only when it is exactly what the scheduler would plan next: every
// sequence of step n takes a token and goes on decoding (none reaches its token limit with
// this token, none is cancelled), nothing waits that the scheduler could admit, and the
// cache has the blocks. A sequence that step n's token stops (a stop token) has a row of
// step n+1 computed for nothing: its result is dropped, and its cache blocks, freed at once,
// are written by that row before any later step (one stream per device) uses them.

// launcherOf returns exe as a backend.Launcher, or nil.
func launcherOf(exe Executable) backend.Launcher {
	l, _ := exe.(backend.Launcher)
	return l
}

// launchers returns every rank's backend.Launcher, or nil unless all ranks have one.
func (rs *rankSet) launchers() []backend.Launcher {
	ls := make([]backend.Launcher, len(rs.ranks))
	for r, rank := range rs.ranks {
		if ls[r] = launcherOf(rank.Exe); ls[r] == nil {
			return nil
		}
	}
	return ls
}

// rankFlight is a step queued on every rank.
type rankFlight struct {
	pend []backend.Pending
	errs []error // a rank's failure to queue
}

// launch queues a step on every rank (concurrently when there are several) with the
// shared step inputs and each rank's caches. Only rank 0 brings its ids back.
func (rs *rankSet) launch(ctx context.Context, ls []backend.Launcher, shared map[string]*tensor.Tensor, draws []sample.DeviceDraw, feed bool) *rankFlight {
	f := &rankFlight{pend: make([]backend.Pending, len(ls)), errs: make([]error, len(ls))}
	eachRank(len(ls), func(r int) {
		defer func() {
			if p := recover(); p != nil { // a bug must not take the engine down
				f.errs[r] = fmt.Errorf("rank %d: panic in launch: %v\n%s", r, p, debug.Stack())
			}
		}()
		in := rs.rankInputs(r, shared)
		if f.pend[r], f.errs[r] = ls[r].LaunchStep(ctx, in, draws, feed, r == 0); f.errs[r] != nil && len(ls) > 1 {
			f.errs[r] = fmt.Errorf("rank %d: %w", r, f.errs[r])
		}
	})
	return f
}

// wait collects a step from every rank and returns rank 0's ids. When a rank failed to
// queue the step or fails in it, the others' waits are cancelled, so that none waits for
// it in a collective, and the error is the failed rank's.
func (rs *rankSet) wait(ctx context.Context, f *rankFlight) ([]int32, error) {
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := slices.Clone(f.errs)
	if errors.Join(errs...) != nil {
		cancel()
	}
	var ids []int32
	eachRank(len(f.pend), func(r int) {
		defer func() {
			if p := recover(); p != nil {
				errs[r] = fmt.Errorf("rank %d: panic in wait: %v\n%s", r, p, debug.Stack())
				cancel()
			}
		}()
		if f.pend[r] == nil {
			return
		}
		got, err := f.pend[r].Wait(ctx)
		if err != nil {
			if len(f.pend) > 1 {
				err = fmt.Errorf("rank %d: %w", r, err)
			}
			errs[r] = err
			cancel()
		}
		if r == 0 {
			ids = got
		}
	})
	if err := rankErrors(parent, errs); err != nil {
		return nil, err
	}
	return ids, nil
}

// launchAhead queues the step after cur, whose tokens are not yet known, when it is what
// the scheduler would plan (see the comment at the top of this file); nil when it is not.
// cur has been launched on the ranks and not collected.
func (e *Engine) launchAhead(cur *flight) *flight {
	if e.launchers == nil || cur.ranks == nil || e.opts.SyncSteps || len(cur.plan) > e.opts.MaxTokensPerStep {
		return nil
	}
	e.mu.Lock()
	plan := make([]stepSeq, len(cur.plan))
	draws := make([]sample.DeviceDraw, len(cur.plan))
	ok := !e.abort && !e.closing && !(len(e.waiting) > 0 && len(e.running) < e.opts.MaxBatch)
	for i, p := range cur.plan {
		if !ok {
			break
		}
		s := cur.seqs[i]
		if s == nil {
			ok = false
			break
		}
		next := p.from + p.n
		d, dev := s.sampler.DeviceDraw()
		ok = dev && !s.finished && s.ctx.Err() == nil && s.computed == p.from && next == len(s.tokens) &&
			s.generated()+1 < s.req.MaxTokens && e.alloc.Reserve(s.id, next+1) == nil
		d.Counter++ // cur's token is drawn with Counter, this one with the next
		plan[i], draws[i] = stepSeq{seq: s.id, tokens: s.tokens, from: next, n: 1, fed: true}, d
	}
	var in map[string]*tensor.Tensor
	var err error
	if ok {
		in, err = stepInputs(e.alloc, plan, e.layout.LogitRows)
		if err == nil {
			e.counters.AheadStepsTotal++
		}
	}
	e.mu.Unlock()
	if !ok || err != nil {
		return nil
	}
	f := &flight{plan: plan, seqs: cur.seqs, ahead: true}
	f.ranks = e.ranks.launch(e.loopCtx, e.launchers, in, draws, true)
	return f
}
