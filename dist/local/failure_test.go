package local

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/loom-ml/loom/dist"
	"github.com/loom-ml/loom/tensor"
)

// asDistError unwraps a *dist.Error or fails the test.
func asDistError(t *testing.T, rank int, err error) *dist.Error {
	t.Helper()
	var de *dist.Error
	if !errors.As(err, &de) {
		t.Fatalf("rank %d: error %v (%T) is not a *dist.Error", rank, err, err)
	}
	return de
}

// TestTimeout: rank 2 never calls; its peers fail after the timeout with an error that
// names rank 2, the collective and the group; when rank 2 comes late, the group is broken.
func TestTimeout(t *testing.T) {
	const timeout = 150 * time.Millisecond
	ctx := context.Background()
	comms := newWorld(t, 4, Options{Timeout: timeout})
	start := time.Now()
	errs := run(t, comms, func(c *Comm) error {
		if c.Rank() == 2 {
			return nil // stops: never arrives
		}
		return c.AllReduce(ctx, worldGroup(4, c.Rank()), dist.Sum, input(tensor.F32, c.Rank(), 64))
	})
	elapsed := time.Since(start)
	if elapsed < timeout || elapsed > timeout+5*time.Second {
		t.Errorf("failed after %v with a timeout of %v", elapsed, timeout)
	}
	for _, r := range []int{0, 1, 3} {
		err := errs[r]
		if !errors.Is(err, dist.ErrTimeout) {
			t.Fatalf("rank %d: %v, want a timeout", r, err)
		}
		de := asDistError(t, r, err)
		if de.Collective != "all_reduce" || de.Rank != r || !slices.Equal(de.Peers, []int{2}) || de.Group.String() != "world[0 1 2 3]" {
			t.Errorf("rank %d: %+v", r, de)
		}
		for _, want := range []string{"all_reduce", "world[0 1 2 3]", "rank 2 did not arrive", "150ms"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("rank %d: %q lacks %q", r, err, want)
			}
		}
	}
	// The late rank and any later call learn that the group broke, and why.
	err := comms[2].AllReduce(ctx, worldGroup(4, 2), dist.Sum, input(tensor.F32, 2, 64))
	if !errors.Is(err, dist.ErrBroken) || !errors.Is(err, dist.ErrTimeout) || !strings.Contains(err.Error(), "rank 2 did not arrive") {
		t.Errorf("late rank 2: %v", err)
	}
	// Groups without the stopped rank are unaffected.
	g := dist.Group{Axis: "tp", Ranks: []int{0, 1}}
	noErrors(t, run(t, comms[:2], func(c *Comm) error {
		g := g
		g.Index = c.Rank()
		return c.Barrier(ctx, g)
	}))
}

// TestAbort: a rank that fails makes its peers fail at once, long before the timeout, with
// an error that names it and wraps its cause.
func TestAbort(t *testing.T) {
	ctx := context.Background()
	boom := errors.New("boom: out of memory")
	for _, before := range []bool{true, false} { // peers already waiting, or arriving after the abort
		comms := newWorld(t, 4, Options{Timeout: time.Minute})
		waitArrived := onArrival(t, comms)
		aborted := make(chan struct{})
		start := time.Now()
		errs := run(t, comms, func(c *Comm) error {
			g := worldGroup(4, c.Rank())
			if c.Rank() == 1 {
				if before && !waitArrived(0, 2, 3) {
					return errors.New("the peers did not arrive")
				}
				c.Abort(boom)
				close(aborted)
				return nil
			}
			if !before {
				<-aborted
			}
			_, err := c.AllGather(ctx, g, input(tensor.BF16, c.Rank(), 3, 2), 1)
			return err
		})
		if d := time.Since(start); d > 10*time.Second {
			t.Errorf("peers failed after %v", d)
		}
		for _, r := range []int{0, 2, 3} {
			err := errs[r]
			if !errors.Is(err, dist.ErrPeerFailed) || !errors.Is(err, boom) {
				t.Fatalf("before=%v rank %d: %v", before, r, err)
			}
			de := asDistError(t, r, err)
			if de.Collective != "all_gather" || !slices.Equal(de.Peers, []int{1}) {
				t.Errorf("before=%v rank %d: %+v", before, r, de)
			}
			if !strings.Contains(err.Error(), "rank 1 aborted: boom") || !strings.Contains(err.Error(), "all_gather over group world[0 1 2 3]") {
				t.Errorf("before=%v rank %d: %v", before, r, err)
			}
		}
		if err := comms[1].Barrier(ctx, worldGroup(4, 1)); !errors.Is(err, dist.ErrAborted) || !errors.Is(err, boom) {
			t.Errorf("aborted rank's own call: %v", err)
		}
		comms[1].Abort(errors.New("again")) // idempotent
		// A group without rank 1 still works; one with it fails at once.
		g := dist.Group{Axis: "dp", Ranks: []int{0, 2}}
		noErrors(t, run(t, []*Comm{comms[0], comms[2]}, func(c *Comm) error {
			g := g
			g.Index = c.Rank() / 2
			return c.Barrier(ctx, g)
		}))
		err := comms[3].Barrier(ctx, dist.Group{Axis: "tp", Ranks: []int{1, 3}, Index: 1})
		if !errors.Is(err, dist.ErrPeerFailed) || !errors.Is(err, boom) {
			t.Errorf("new group with the aborted rank: %v", err)
		}
	}
}

// TestContextCancel: a rank whose context ends while it waits returns the context's error
// and fails its peers, naming it.
func TestContextCancel(t *testing.T) {
	comms := newWorld(t, 3, Options{Timeout: time.Minute})
	waitArrived := onArrival(t, comms)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rank1Done := make(chan struct{})
	errs := run(t, comms, func(c *Comm) error {
		g := worldGroup(3, c.Rank())
		switch c.Rank() {
		case 0:
			go func() { // cancel while ranks 0 and 1 wait for rank 2
				waitArrived(0, 1)
				cancel()
			}()
			return c.Barrier(ctx, g)
		case 1:
			defer close(rank1Done)
			return c.Barrier(context.Background(), g)
		}
		<-rank1Done // arrives after rank 0 left and broke the group
		return c.Barrier(context.Background(), g)
	})
	if !errors.Is(errs[0], context.Canceled) {
		t.Errorf("rank 0: %v", errs[0])
	}
	for _, r := range []int{1, 2} {
		if !errors.Is(errs[r], dist.ErrPeerFailed) || !errors.Is(errs[r], context.Canceled) || !strings.Contains(errs[r].Error(), "rank 0 left barrier") {
			t.Errorf("rank %d: %v", r, errs[r])
		}
	}
	if !errors.Is(errs[2], dist.ErrBroken) {
		t.Errorf("rank 2 came after the group broke: %v", errs[2])
	}
}

// TestMismatch: calls that disagree fail on every rank with the same error, move no data,
// and leave the group usable.
func TestMismatch(t *testing.T) {
	ctx := context.Background()
	comms := newWorld(t, 2, Options{})
	x := func(dt tensor.DType, r int, shape ...int) *tensor.Tensor { return input(dt, r, shape...) }
	for _, tc := range []struct {
		name string
		call func(c *Comm, g dist.Group) error
		want string
	}{
		{"collective", func(c *Comm, g dist.Group) error {
			if c.Rank() == 0 {
				return c.AllReduce(ctx, g, dist.Sum, x(tensor.F32, 0, 4))
			}
			_, err := c.AllGather(ctx, g, x(tensor.F32, 1, 4), 0)
			return err
		}, "rank 0 called all_reduce f32[4] op=sum strategy=auto on axis \"world\", rank 1 called all_gather f32[4] axis=0"},
		{"dtype", func(c *Comm, g dist.Group) error {
			return c.AllReduce(ctx, g, dist.Sum, x([]tensor.DType{tensor.F32, tensor.BF16}[c.Rank()], 0, 4))
		}, "rank 1 called all_reduce bf16[4]"},
		{"shape", func(c *Comm, g dist.Group) error {
			_, err := c.AllGather(ctx, g, x(tensor.F32, 0, 2, 2+c.Rank()), 0)
			return err
		}, "rank 0 called all_gather f32[2 2] axis=0"},
		{"op", func(c *Comm, g dist.Group) error {
			return c.AllReduce(ctx, g, []dist.ReduceOp{dist.Sum, dist.Max}[c.Rank()], x(tensor.I32, 0, 4))
		}, "op=max"},
		{"strategy", func(c *Comm, g dist.Group) error {
			return c.AllReduceStrategy(ctx, g, dist.Sum, []string{"oneshot", "twoshot"}[c.Rank()], x(tensor.I32, 0, 4))
		}, "strategy=twoshot"},
		{"axis", func(c *Comm, g dist.Group) error {
			_, err := c.ReduceScatter(ctx, g, dist.Sum, x(tensor.F32, 0, 4, 4), c.Rank())
			return err
		}, "reduce_scatter f32[4 4] op=sum axis=1"},
		{"root", func(c *Comm, g dist.Group) error {
			return c.Broadcast(ctx, g, x(tensor.F32, c.Rank(), 4), c.Rank())
		}, "broadcast f32[4] root=1"},
		{"group axis", func(c *Comm, g dist.Group) error {
			g.Axis = []string{"tp", "dp"}[c.Rank()]
			return c.Barrier(ctx, g)
		}, `barrier on axis "dp"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := run(t, comms, func(c *Comm) error { return tc.call(c, worldGroup(2, c.Rank())) })
			for r, err := range errs {
				if !errors.Is(err, dist.ErrMismatch) || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("rank %d: %v, want a mismatch with %q", r, err, tc.want)
				}
			}
			if c0, c1 := asDistError(t, 0, errs[0]).Err.Error(), asDistError(t, 1, errs[1]).Err.Error(); c0 != c1 {
				t.Errorf("ranks report different causes:\n%s\n%s", c0, c1)
			}
			noErrors(t, run(t, comms, func(c *Comm) error { return c.Barrier(ctx, worldGroup(2, c.Rank())) }))
		})
	}
	// The same tensor on two ranks of an in-place collective is refused.
	shared := x(tensor.F32, 0, 4)
	for r, err := range run(t, comms, func(c *Comm) error { return c.AllReduce(ctx, worldGroup(2, c.Rank()), dist.Sum, shared) }) {
		if !errors.Is(err, dist.ErrMismatch) || !strings.Contains(err.Error(), "ranks 0 and 1 pass the same tensor storage") {
			t.Errorf("rank %d: %v", r, err)
		}
	}
	if shared.F32[0] != x(tensor.F32, 0, 4).F32[0] {
		t.Error("a refused all_reduce changed data")
	}
}

// TestInvalidCall: an invalid call fails at once on its rank and fails its peers naming it;
// a call with an invalid group fails on its rank, and its peers time out naming it.
func TestInvalidCall(t *testing.T) {
	ctx := context.Background()
	comms := newWorld(t, 2, Options{Timeout: 100 * time.Millisecond})
	for _, tc := range []struct {
		name string
		bad  func(c *Comm, g dist.Group) error
		own  string // rank 1's error
		peer string // rank 0's error
	}{
		{"dtype", func(c *Comm, g dist.Group) error { return c.AllReduce(ctx, g, dist.Sum, input(tensor.I64, 1, 4)) },
			"cannot reduce i64", "rank 1 made an invalid all_reduce call: cannot reduce i64"},
		{"op", func(c *Comm, g dist.Group) error { return c.AllReduce(ctx, g, 0, input(tensor.F32, 1, 4)) },
			"invalid reduce op reduceop(0)", "rank 1 made an invalid all_reduce call"},
		{"nil", func(c *Comm, g dist.Group) error { return c.AllReduce(ctx, g, dist.Sum, nil) },
			"nil tensor", "rank 1 made an invalid all_reduce call: nil tensor"},
		{"storage", func(c *Comm, g dist.Group) error {
			return c.AllReduce(ctx, g, dist.Sum, &tensor.Tensor{DType: tensor.F32, Shape: []int{4}, F32: make([]float32, 3)})
		}, "holds 3 elements, shape needs 4", "invalid all_reduce call"},
		{"strategy", func(c *Comm, g dist.Group) error {
			return c.AllReduceStrategy(ctx, g, dist.Sum, "nccl", input(tensor.F32, 1, 4))
		},
			`cannot run strategy "nccl"`, "invalid all_reduce call"},
		{"gather axis", func(c *Comm, g dist.Group) error {
			_, err := c.AllGather(ctx, g, input(tensor.F32, 1, 4), 1)
			return err
		},
			"axis 1 out of range for a tensor of rank 1", "invalid all_gather call"},
		{"scatter divisible", func(c *Comm, g dist.Group) error {
			_, err := c.ReduceScatter(ctx, g, dist.Sum, input(tensor.F32, 1, 3), 0)
			return err
		}, "axis 0 of [3] is not divisible by the group size 2", "invalid reduce_scatter call"},
		{"all_to_all axis", func(c *Comm, g dist.Group) error {
			_, err := c.AllToAll(ctx, g, input(tensor.F32, 1, 4), 0, -2)
			return err
		}, "concat_axis -2 out of range", "invalid all_to_all call"},
		{"all_to_all divisible", func(c *Comm, g dist.Group) error {
			_, err := c.AllToAll(ctx, g, input(tensor.F32, 1, 3), 0, 0)
			return err
		}, "split_axis 0 of [3] is not divisible", "invalid all_to_all call"},
		{"root", func(c *Comm, g dist.Group) error { return c.Broadcast(ctx, g, input(tensor.F32, 1, 4), 2) },
			"root 2 out of range for a group of 2", "invalid broadcast call"},
		{"dtype invalid", func(c *Comm, g dist.Group) error {
			return c.Broadcast(ctx, g, &tensor.Tensor{Shape: []int{0}}, 0)
		}, "tensor of dtype invalid", "invalid broadcast call"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms := newWorld(t, 2, Options{Timeout: time.Minute})
			errs := run(t, comms, func(c *Comm) error {
				g := worldGroup(2, c.Rank())
				if c.Rank() == 1 {
					return tc.bad(c, g)
				}
				return c.Barrier(ctx, g)
			})
			if errs[1] == nil || !strings.Contains(errs[1].Error(), tc.own) {
				t.Errorf("rank 1: %v, want %q", errs[1], tc.own)
			}
			if !errors.Is(errs[0], dist.ErrPeerFailed) || !strings.Contains(errs[0].Error(), tc.peer) {
				t.Errorf("rank 0: %v, want %q", errs[0], tc.peer)
			}
			if de := asDistError(t, 0, errs[0]); !slices.Equal(de.Peers, []int{1}) {
				t.Errorf("rank 0 blames %v", de.Peers)
			}
			noErrors(t, run(t, comms, func(c *Comm) error { return c.Barrier(ctx, worldGroup(2, c.Rank())) }))
		})
	}
	// A group the caller is not in, or that does not fit the world, fails at once on that
	// rank without reaching its peers, which time out naming it.
	for _, g := range []dist.Group{
		{Axis: "tp", Ranks: []int{0, 1}, Index: 0},
		{Axis: "tp", Ranks: []int{0, 1, 2}, Index: 1},
		{Axis: "", Ranks: []int{0, 1}, Index: 1},
	} {
		errs := run(t, comms, func(c *Comm) error {
			if c.Rank() == 1 {
				return c.Barrier(ctx, g)
			}
			return c.Barrier(ctx, worldGroup(2, 0))
		})
		if errs[1] == nil || errors.Is(errs[1], dist.ErrTimeout) {
			t.Errorf("group %+v: rank 1: %v", g, errs[1])
		}
		if !errors.Is(errs[0], dist.ErrTimeout) || !strings.Contains(errs[0].Error(), "rank 1 did not arrive at barrier") {
			t.Errorf("group %+v: rank 0: %v", g, errs[0])
		}
		comms = newWorld(t, 2, Options{Timeout: 100 * time.Millisecond})
	}
}
