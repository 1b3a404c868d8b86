package transform

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// checkFallback reports a sharding plan's fallbacks, the weights that stay whole on every
// rank because the tp size does not divide them or their attention heads, in one log line
// (each decision at debug level), or with refuse set as an error naming the first reason.
func checkFallback(c *Context, plan *ShardingPlan, refuse bool) error {
	for _, n := range plan.Notes {
		c.Log().Debug("detect_sharding: " + n)
	}
	var whole, gathered, total int
	var reason string
	for _, key := range slices.Sorted(maps.Keys(plan.Weights)) {
		w := plan.Weights[key]
		if w.Source == "embedding" {
			continue
		}
		total++
		fallback := strings.HasPrefix(w.Note, "not split: ") || strings.HasPrefix(w.Note, "attention fallback: ")
		if !fallback {
			continue
		}
		if w.Kind == ShardReplicate {
			whole++
		} else {
			gathered++
		}
		if r := fallbackReason(w.Note); reason == "" || strings.Contains(r, "heads") && !strings.Contains(reason, "heads") {
			reason = r // the heads, when they are why, else the first weight
		}
	}
	if whole == 0 && gathered == 0 {
		// Per-layer notes (KV heads replicated, experts whole): one line per kind.
		counts, order := map[string]int{}, []string(nil)
		for _, n := range plan.Notes {
			_, kind, ok := strings.Cut(n, ": ")
			if !ok {
				kind = n
			}
			if counts[kind]++; counts[kind] == 1 {
				order = append(order, kind)
			}
		}
		for _, k := range order {
			c.Log().Info(fmt.Sprintf("detect_sharding: %s (%d layers)", k, counts[k]))
		}
		return nil
	}
	what := fmt.Sprintf("tp=%d leaves %d of %d weights whole on every rank", plan.Size, whole, total)
	if gathered > 0 {
		what += fmt.Sprintf(" and %d split only by columns with an all_gather", gathered)
	}
	what += " (" + reason + ")"
	copies := "those weights would be held and computed on every rank"
	if whole == total {
		copies = fmt.Sprintf("each of the %d ranks would hold and compute the whole model", plan.Mesh.Size())
	}
	if refuse {
		return fmt.Errorf("%s: %s; pass --allow-replicated (refuse_fallback=false) to run so anyway, or choose a tp size that divides the model's heads and sizes", what, copies)
	}
	c.Log().Warn(fmt.Sprintf("detect_sharding: %s; --log-level debug lists each weight", what))
	return nil
}

// fallbackReason is the why of a fallback note: "not split: KEY [SHAPE]: WHY" or
// "attention fallback: WHY".
func fallbackReason(note string) string {
	if r, ok := strings.CutPrefix(note, "attention fallback: "); ok {
		return r
	}
	return strings.TrimPrefix(note, "not split: ")
}
