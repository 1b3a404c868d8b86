package engine

import (
	"slices"
)

// schedule decides the next step. It ends cancelled requests (and, on abort, every
// request), then plans, within MaxBatch sequences and MaxTokensPerStep tokens:
//
//  1. one token for every running sequence that is decoding, in the order they started;
//  2. the next chunk of every running sequence still in its prompt (or recomputing after a
//     preemption), as far as the token budget goes;
//  3. new sequences from the front of the queue, while there are free blocks for their
//     whole prompt (beyond its cached prefix, which they share: prefix.go).
//
// Each planned sequence gets cache blocks for its tokens. When the cache is out of blocks,
// a sequence of steps 1-2 first shrinks its chunk to what fits, else preempts the most
// recently started running sequence not yet planned (or itself when there is none). It
// returns the plan (empty: nothing to do now) and whether the loop should exit (closing and
// nothing left).
func (e *Engine) schedule() (plan []stepSeq, exit bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range slices.Concat(e.running, e.waiting) {
		switch {
		case e.abort:
			e.finishLocked(s, Event{Finish: FinishError, Err: ErrClosed, PromptTokens: s.promptLen, GeneratedTokens: s.generated()})
		case s.ctx.Err() != nil:
			e.finishLocked(s, Event{Finish: FinishCancelled, Err: s.ctx.Err(), PromptTokens: s.promptLen, GeneratedTokens: s.generated()})
		}
	}
	if len(e.running) == 0 && len(e.waiting) == 0 {
		return nil, e.closing
	}
	budget := e.opts.MaxTokensPerStep
	planned := map[*sequence]bool{}
	add := func(s *sequence, n int) {
		plan = append(plan, stepSeq{seq: s.id, tokens: s.tokens, from: s.computed, n: n})
		planned[s] = true
		budget -= n
	}
	var decoding, prefilling []*sequence
	for _, s := range e.running {
		if len(s.tokens)-s.computed == 1 {
			decoding = append(decoding, s)
		} else {
			prefilling = append(prefilling, s)
		}
	}
	for _, s := range slices.Concat(decoding, prefilling) {
		if budget == 0 {
			break
		}
		if !slices.Contains(e.running, s) {
			continue // preempted by an earlier sequence of this step
		}
		n := min(len(s.tokens)-s.computed, budget)
		for {
			if e.kv.Reserve(s.id, s.computed+n) == nil {
				add(s, n)
				break
			}
			// Shrink a prompt chunk to the slots its blocks and the free blocks hold.
			fit := fitTokens(e.kv, s.id, s.computed, s.computed+n) - s.computed
			if fit > 0 && fit < n {
				n = fit
				continue
			}
			victim := s
			for i := len(e.running) - 1; i >= 0; i-- {
				if r := e.running[i]; r != s && !planned[r] {
					victim = r
					break
				}
			}
			e.preemptLocked(victim)
			if victim == s {
				break
			}
		}
	}
	for len(e.waiting) > 0 && len(e.running) < e.opts.MaxBatch && budget > 0 {
		s := e.waiting[0]
		n := e.reserveAdmission(s, budget) // from its cached prefix, see prefix.go
		if n == 0 {
			break // first come, first served: wait for blocks
		}
		e.waiting = e.waiting[1:]
		e.roomLocked()
		e.running = append(e.running, s)
		if !s.started {
			s.started = true
			e.counters.PromptTokensTotal += int64(s.promptLen)
		}
		add(s, n)
	}
	return plan, false
}

// preemptLocked frees a running sequence's blocks and puts it back at the front of the
// queue, to be recomputed from its first token. The caller holds e.mu.
func (e *Engine) preemptLocked(s *sequence) {
	e.kv.Free(s.id)
	s.computed = 0
	e.running = slices.DeleteFunc(e.running, func(x *sequence) bool { return x == s })
	e.waiting = slices.Insert(e.waiting, 0, s)
	e.counters.PreemptionsTotal++
	e.log.Debug("request preempted", "id", s.req.ID, "tokens", len(s.tokens), "kv_blocks_free", e.kv.Stats().Free)
}
